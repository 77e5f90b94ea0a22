"""The translator of a CTranslate2 export: ``Translator``'s calls, run by
CTranslate2 (``load_ctranslate2(directory).translate([...])``).

``CTranslate2Translator`` reads the directory with ``ctranslate2.Translator``
and the ``sentencepiece`` package (not keras-hub: this path does not import
TensorFlow). Its inputs are checked, cut and warned about by the code of
``Translator.encode_sources`` itself: the same ``TypeError``/``ValueError``
for a bad sentence, the same ``UserWarning`` for a source longer than
``max_length`` (cut to its first ``max_length - 1`` tokens and ``</s>``) or
with characters the tokenizer cannot spell. Sources are given to CTranslate2
as pieces ending with ``</s>``, as the model was trained.

Decoding matches ``keras_transformer.search.decoding``:

- The output-length rule is the Translator's: at most the source length
  (``</s>`` excluded) + 50 tokens, or ``max_output_length``, never more than
  ``max_length``, the end token included. CTranslate2's
  ``max_decoding_length`` is one number per call, so sentences are sorted
  by length and decoded in batches with their batch's largest limit; a
  sentence whose result reaches its own limit is decoded again alone with
  it (greedy: an output longer than its limit; beam: any hypothesis as long
  as its limit, since the last step ends every hypothesis of the beam). The
  results are those of per-sentence limits; in practice few sentences are
  decoded twice.
- ``min_decoding_length=0``: the end token may come first (an empty
  translation), as in ours. ``<pad>`` and ``<s>`` are never generated
  (``suppress_sequences``; the log-softmax is taken over the other tokens,
  as ours does); ``<unk>`` may be, as in ours.
- ``beam_size=1`` is CTranslate2's greedy search: the argmax chain, the
  same tokens as ours; its score is ``log P(Y | X) / lp(Y)`` as in ours.

Beam search and the length penalty. Ours ranks every candidate, at every
step, by ``log P(Y | X) / lp(Y)`` with GNMT's ``lp(Y) = ((5 + |Y|) / 6) ** α``
(|Y| counting ``</s>``); a finished hypothesis keeps its place in the beam
and competes with the unfinished ones, and a sentence is done when its whole
beam is finished. CTranslate2's beam search ranks the unfinished hypotheses
by ``log P`` alone; a hypothesis that ends moves to a list of finished ones
and its place in the beam goes to the next best unfinished candidate, so
the beam always keeps ``beam_size`` live hypotheses; a sentence is done when
``round(beam_size · patience)`` hypotheses have finished (or at the length
limit), and its length penalty ``log P / |Y| ** α`` (|Y| without ``</s>``)
only orders the finished list at the end (``α = 0`` also stops at the
first finished best hypothesis). So no value of CTranslate2's α changes
which hypotheses are found, only their order; and its ``|Y| ** α`` is not
GNMT's penalty. The mapping used here: CTranslate2 runs with
``length_penalty=1`` (any value but 0, which would stop early; it is
undone exactly: the score times |Y|, ``</s>`` included via
``return_end_token``, is ``log P``), returns every finished hypothesis
(``num_hypotheses = round(beam_size · patience)``), and they are re-ranked
by ours, ``log P / ((5 + |Y|) / 6) ** α``, with the α asked for
(``translate(..., length_penalty=0.6)`` is the paper's GNMT α). The scores
of ``n_best`` are that quantity, as ours. What differs is which hypotheses
the two searches find: a finished hypothesis takes a place in our beam and
not in CTranslate2's, and CTranslate2 stops after a fixed count of finished
hypotheses (its patience 1 often stops before our best hypothesis has
finished). ``patience`` (default ``PATIENCE`` = 2: ``2 · beam_size``
hypotheses) lets it collect more before it stops.

Threads and batches: ``inter_threads=2`` (two batches decoded at once, one
per core), ``intra_threads=1``, and batches of 128 sentences for float32
weights and 32 for int8 ones (``DEFAULT_BATCH_SIZES``), the fastest on two
CPU cores (``benchmarks/ctranslate2_parity.py``; figures in
``docs/results.md``). A ``batch_size`` given to a call (or to the
constructor) replaces them.
"""

import json
import math
import numbers
import os

# How CTranslate2's beam search collects hypotheses to re-rank: it stops
# once round(beam_size * PATIENCE) hypotheses have finished.
PATIENCE = 2.0
# Sentences per batch, by the kind of weights (measured on two CPU cores).
DEFAULT_BATCH_SIZES = {"float32": 128, "int8": 32}
DEFAULT_INTER_THREADS = 2
DEFAULT_INTRA_THREADS = 1
# CTranslate2's length penalty while it searches: any value but 0 (which
# stops a sentence at its first finished best hypothesis); undone exactly.
_SEARCH_LENGTH_PENALTY = 1.0

FORMAT = "keras_transformer.ctranslate2"
FORMAT_VERSION = 1
METADATA_FILE = "keras_transformer.json"
TOKENIZER_FILE = "tokenizer.model"
_INSTALL = (
    'pip install "keras-transformer-aiayn[ctranslate2]" (or pip install ctranslate2)'
)


def _import_ctranslate2():
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            f"The CTranslate2 export needs the ctranslate2 package: {_INSTALL}"
        ) from error
    return ctranslate2


def _vocabulary(pieces, size):
    """``size`` distinct names: the pieces in id order, then placeholders for
    the ids the model has and the tokenizer not."""
    vocabulary = list(pieces[:size])
    taken = set(vocabulary)
    for i in range(len(vocabulary), size):
        name = f"<keras_transformer_unused_{i}>"
        while name in taken:
            name = f"<{name}>"
        vocabulary.append(name)
        taken.add(name)
    return vocabulary


# -- the translator -----------------------------------------------------------------


class _SentencePiece:
    """The calls of keras-hub's ``SentencePieceTokenizer`` that the package's
    helpers make (``encode``, ``decode``), with ``sentencepiece`` alone."""

    def __init__(self, proto):
        import sentencepiece as spm

        self.proto = proto
        # As keras-hub builds it for Python (no bos, no eos, no sampling).
        self._processor = spm.SentencePieceProcessor(model_proto=proto, out_type=int)

    def tokenize(self, texts):
        return self._processor.Encode(list(texts))

    def detokenize(self, ids):
        return self._processor.Decode([list(row) for row in ids])

    def vocabulary_size(self):
        return self._processor.get_piece_size()

    def id_to_token(self, i):
        return self._processor.id_to_piece(int(i))

    def token_to_id(self, piece):
        return self._processor.piece_to_id(piece)


class CTranslate2Translator:
    """A translator from ``export_ctranslate2``'s directory, run by CTranslate2.

    Args:
        path: the directory.
        compute_type: CTranslate2's compute type ("default": that of the
            saved weights; "int8", "float32", ...).
        inter_threads: batches decoded at once (CTranslate2 workers).
        intra_threads: threads per batch (0: CTranslate2's choice).
        batch_size: optional int, sentences per batch; by default 128 for
            float32 weights and 32 for int8 ones (``DEFAULT_BATCH_SIZES``).
            A ``batch_size`` given to a call replaces it for that call.
        patience: float >= 1, how many hypotheses (``beam_size ·
            patience``) CTranslate2's beam search collects for the
            re-ranking by the GNMT score (module docstring).
        device: "cpu" (default) or "cuda".

    The calls are ``Translator``'s: ``translate``, ``translate_ids``,
    ``n_best``, ``decode_ids``, ``encode_sources``, with ``SearchOptions``
    (``use_cache`` and ``fixed_batch`` are accepted and change nothing:
    nothing is compiled; ``verbose=1`` reports
    progress on stderr). ``translator`` is the ``ctranslate2.Translator``,
    ``tokenizer`` the SentencePiece model, ``metadata`` the export's
    ``keras_transformer.json``, ``engine`` says what translates.
    """

    def __init__(
        self,
        path,
        compute_type="default",
        inter_threads=DEFAULT_INTER_THREADS,
        intra_threads=DEFAULT_INTRA_THREADS,
        batch_size=None,
        patience=PATIENCE,
        device="cpu",
    ):
        from keras_transformer.search.options import check_length

        ctranslate2 = _import_ctranslate2()
        path = os.path.abspath(os.fspath(path))
        metadata_path = os.path.join(path, METADATA_FILE)
        if not os.path.isfile(metadata_path):
            raise ValueError(
                f"{path} is not a directory written by export_ctranslate2 (it "
                f"has no {METADATA_FILE})."
            )
        with open(metadata_path, encoding="utf-8") as file:
            self.metadata = json.load(file)
        if self.metadata.get("format") != FORMAT:
            raise ValueError(f"{metadata_path} is not a {FORMAT} description.")
        if self.metadata.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"{path} was written by a newer keras_transformer (format "
                f"{self.metadata['format_version']}); update keras_transformer."
            )
        if isinstance(patience, bool) or not isinstance(patience, numbers.Real):
            raise TypeError(f"patience must be a number. Received: {patience!r}")
        if not (patience >= 1 and math.isfinite(patience)):
            raise ValueError(f"patience must be >= 1. Received: patience={patience}")
        self.patience = float(patience)
        self.batch_size = check_length(batch_size, "batch_size")
        with open(os.path.join(path, self.metadata["tokenizer"]["file"]), "rb") as f:
            self.tokenizer = _SentencePiece(f.read())
        self.path = path
        self.source_max_length = self.target_max_length = int(
            self.metadata["max_length"]
        )
        self.max_output_length = self.metadata.get("max_output_length")
        self.extra_output_length = int(self.metadata["extra_output_length"])
        special = self.metadata["special_ids"]
        self._pad, self._start, self._end = (
            special["pad"],
            special["start"],
            special["end"],
        )
        model = self.metadata["model"]
        pieces = [
            self.tokenizer.id_to_token(i)
            for i in range(self.tokenizer.vocabulary_size())
        ]
        self._source_pieces = _vocabulary(pieces, model["src_vocab_size"])
        self._target_pieces = _vocabulary(pieces, model["tgt_vocab_size"])
        self._target_ids = {piece: i for i, piece in enumerate(self._target_pieces)}
        self._suppressed = [
            [self._target_pieces[self._pad]],
            [self._target_pieces[self._start]],
        ]
        self.translator = ctranslate2.Translator(
            path,
            device=device,
            compute_type=compute_type,
            inter_threads=int(inter_threads),
            intra_threads=int(intra_threads),
        )

    def __repr__(self):
        return f"<CTranslate2Translator {self.path!r} ({self.engine})>"

    # -- what Translator.encode_sources asks of its translator ---------------------

    def check_tokenizer(self):
        """Nothing to check: the export wrote the tokenizer with the model."""

    @property
    def engine(self):
        """What translates, in words: ``"ctranslate2 <compute type>"``
        (``"ctranslate2 float32"``, ``"ctranslate2 int8_float32"``, ...)."""
        return f"ctranslate2 {self.translator.compute_type}"

    @property
    def default_batch_size(self):
        """Sentences per batch when no call gives ``batch_size``."""
        if self.batch_size is not None:
            return self.batch_size
        kind = "int8" if "int8" in str(self.translator.compute_type) else "float32"
        return DEFAULT_BATCH_SIZES[kind]

    def encode_sources(self, texts):
        """As ``Translator.encode_sources`` (the same code): ids ending with
        ``END_ID``, cut to ``max_length``, with the same warnings."""
        from keras_transformer.translate.keras_translator import Translator

        return Translator.encode_sources(self, texts)

    # -- the calls of Translator ----------------------------------------------------

    def translate(self, texts, search=None, **options):
        """As ``Translator.translate``: a list of str, one per sentence."""
        from keras_transformer.data.tokenizer import decode

        best = self.translate_ids(texts, search, **options)
        return decode(self.tokenizer, best)

    def translate_ids(self, texts, search=None, **options):
        """As ``Translator.translate_ids``: the generated ids, ending with
        ``END_ID`` unless the output-length limit came first."""
        search, explicit = self._search(search, options)
        hypotheses = self._decode(self.encode_sources(texts), search, explicit)
        return [row[0][0] for row in hypotheses]

    def n_best(self, texts, n=None, search=None, **options):
        """As ``Translator.n_best``: per sentence, the ``n`` best
        ``(translation, score)``, the score ``log P(Y | X) / lp(Y)`` (GNMT)."""
        from keras_transformer.data.tokenizer import decode
        from keras_transformer.search.options import check_n_best

        search, explicit = self._search(search, options)
        n = check_n_best(n, search.beam_size)
        results = []
        for row in self._decode(self.encode_sources(texts), search, explicit):
            row = row[:n]
            texts_out = decode(self.tokenizer, [ids for ids, _ in row])
            results.append(
                [(text, score) for text, (_, score) in zip(texts_out, row, strict=True)]
            )
        return results

    def warm_up(self, search=None, **options):
        """As ``Translator.warm_up``, but CTranslate2 compiles nothing: one
        translation (of an empty text) loads what it loads on first use.

        Returns:
            int: 0, the searches compiled.
        """
        self.translate([""], search, **options)
        return 0

    def decode_ids(self, source_ids, search=None, **options):
        """As ``Translator.decode_ids``: ``beam_size`` hypotheses ``(ids,
        score)`` per encoded source, best first."""
        search, explicit = self._search(search, options)
        return self._decode(source_ids, search, explicit)

    # -- decoding -------------------------------------------------------------------

    @staticmethod
    def _search(search, options):
        from keras_transformer.search.options import SearchOptions

        checked = SearchOptions.of(search, **options)
        # SearchOptions' default batch size is the Keras translator's; here
        # the measured defaults apply unless one was given.
        explicit = "batch_size" in options or (
            search is not None and search.batch_size != SearchOptions.batch_size
        )
        return checked, explicit

    def _output_limit(self, source_length, max_output_length):
        if max_output_length is None:
            max_output_length = source_length + self.extra_output_length
        return min(max_output_length, self.target_max_length)

    def _decode(self, source_ids, search, explicit_batch_size):
        from keras_transformer.progress import Progress

        max_output_length = search.max_output_length
        if max_output_length is None:
            max_output_length = self.max_output_length
        sources = [[int(i) for i in row] for row in source_ids]
        vocabulary = len(self._source_pieces)
        for row in sources:
            if len(row) > self.source_max_length:
                raise ValueError(
                    f"A source has {len(row)} tokens, more than the model's "
                    f"max_length={self.source_max_length}."
                )
            if self._pad in row:
                raise ValueError(f"Source ids must not contain padding ({self._pad}).")
            if any(not 0 <= i < vocabulary for i in row):
                raise ValueError(
                    f"Source ids must be in [0, {vocabulary}). Received: {row}"
                )
        limits = [
            self._output_limit(
                len(row) - (1 if row and row[-1] == self._end else 0),
                max_output_length,
            )
            for row in sources
        ]
        batch_size = (
            search.batch_size if explicit_batch_size else self.default_batch_size
        )
        progress = Progress(len(sources)) if search.verbose else None
        # Sorted by length, so that a batch has little padding; one
        # asynchronous call per batch, so that CTranslate2 decodes
        # inter_threads batches at once. A batch decodes with its largest
        # output limit.
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        batches = [
            (chunk, max(limits[i] for i in chunk))
            for chunk in (
                order[start : start + batch_size]
                for start in range(0, len(order), batch_size)
            )
        ]
        results = [None] * len(sources)
        again = {}
        done = 0
        for chunk, limit, outputs in self._run(sources, batches, search):
            for i, output in zip(chunk, outputs, strict=True):
                pool = self._hypotheses(output.result(), search)
                if limits[i] < limit and self._reaches(pool, limits[i], search):
                    again.setdefault(limits[i], []).append(i)
                else:
                    results[i] = pool[: search.beam_size]
                    done += 1
            if progress is not None:
                progress.update(done)
        # A result that may depend on the sentence's own limit: decoded again
        # with it, in batches of one limit.
        batches = [
            (rows[start : start + batch_size], limit)
            for limit, rows in sorted(again.items())
            for start in range(0, len(rows), batch_size)
        ]
        for chunk, _, outputs in self._run(sources, batches, search):
            for i, output in zip(chunk, outputs, strict=True):
                results[i] = self._hypotheses(output.result(), search)[
                    : search.beam_size
                ]
                done += 1
            if progress is not None:
                progress.update(done)
        return results

    def _run(self, sources, batches, search):
        """``(chunk, limit, outputs)`` per batch, all submitted at once."""
        submitted = [
            (chunk, limit, self._submit([sources[i] for i in chunk], limit, search))
            for chunk, limit in batches
        ]
        yield from submitted

    def _submit(self, sources, limit, search):
        tokens = [[self._source_pieces[i] for i in row] for row in sources]
        beam = search.beam_size
        options = dict(
            max_batch_size=0,
            asynchronous=True,
            beam_size=beam,
            max_input_length=0,  # sources are cut by encode_sources
            max_decoding_length=int(limit),
            min_decoding_length=0,
            return_scores=True,
            return_end_token=True,
            suppress_sequences=self._suppressed,
        )
        if beam == 1:
            options.update(num_hypotheses=1, length_penalty=0.0)
        else:
            options.update(
                patience=self.patience,
                num_hypotheses=self._pool(beam),
                length_penalty=_SEARCH_LENGTH_PENALTY,
            )
        return self.translator.translate_batch(tokens, **options)

    def _pool(self, beam_size):
        """How many finished hypotheses CTranslate2's beam search collects:
        ``std::round(beam_size * patience)`` (halves away from zero, unlike
        Python's ``round``). All of them are asked for: the re-ranking, and
        ``_reaches``, need every one."""
        return max(math.floor(beam_size * self.patience + 0.5), beam_size)

    def _hypotheses(self, result, search):
        """``[(ids, score)]`` best first by our score, from CTranslate2's."""
        from keras_transformer.search.decoding import length_penalty

        alpha = search.length_penalty
        ranked = []
        for tokens, score in zip(result.hypotheses, result.scores, strict=True):
            ids = [self._target_ids[token] for token in tokens]
            length = len(ids)
            # Undo CTranslate2's score / |Y| ** length_penalty (|Y| with </s>).
            if search.beam_size > 1 and length:
                score = score * length**_SEARCH_LENGTH_PENALTY
            ranked.append((ids, float(score) / length_penalty(length, alpha)))
        # Stable: ties keep CTranslate2's order.
        ranked.sort(key=lambda item: -item[1])
        return ranked

    def _reaches(self, hypotheses, limit, search):
        """Whether a result found with a larger limit may differ from the
        one its own ``limit`` gives: greedy, if it is longer; beam search, if
        any finished hypothesis is as long (the last step ends the whole
        beam, so the search would have stopped there)."""
        longest = max(len(ids) for ids, _ in hypotheses)
        if search.beam_size == 1:
            return longest > limit
        return longest >= limit


def load_ctranslate2(path, **kwargs):
    """``CTranslate2Translator(path, **kwargs)``: the translator of an
    ``export_ctranslate2`` directory."""
    return CTranslate2Translator(path, **kwargs)
