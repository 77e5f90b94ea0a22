"""The CTranslate2 engine of the translator interface: the translator of an
export folder, run by CTranslate2
(``load_ctranslate2(directory).translate([...])``).

``CTranslate2Translator`` reads the directory with ``ctranslate2.Translator``
and the ``sentencepiece`` package (not keras-hub), and imports neither Keras
nor a backend. Its inputs are checked, cut and warned about by
``translate.base.TranslatorBase``, as every engine's: the same
``TypeError``/``ValueError`` for a bad sentence, the same ``UserWarning``
for a source longer than ``max_length`` (cut to its first ``max_length - 1``
tokens and ``</s>``) or with characters the tokenizer cannot spell. Sources
are given to CTranslate2 as pieces ending with ``</s>``, as the model was
trained.

Decoding matches ``keras_transformer.search.decoding``:

- The output-length rule is every engine's: at most the source length
  (``</s>`` excluded) + 50 tokens, or ``max_output_length``, never more than
  ``max_length``, the end token included. CTranslate2's
  ``max_decoding_length`` is one number per call, so sentences are sorted
  by length (``translate.scheduler``) and decoded in batches with their
  batch's largest limit; a sentence whose result reaches its own limit is
  decoded again with it, beside its batch's other sentences of that limit
  (greedy: an output longer than its limit; beam: any hypothesis as long
  as its limit, since the last step ends every hypothesis of the beam). The
  results are those of per-sentence limits; in practice few sentences are
  decoded twice.
- ``min_decoding_length=0``: the end token may come first (an empty
  translation), as in ours. ``<pad>`` and ``<s>`` are never generated
  (``suppress_sequences``; the log-softmax is taken over the other tokens,
  as ours does); ``<unk>`` may be, as in ours.
- ``beam_size=1`` is CTranslate2's greedy search: the argmax chain, the
  same tokens as ours; its score is ``log P(Y | X) / lp(Y)`` as in ours.
  With ``length_penalty_form="transformers"`` (an imported checkpoint's
  greedy search) the end token takes the limit's last place, as in ours and
  in transformers' ``forced_eos_token_id``: CTranslate2 decodes one token
  fewer than the limit, and an output that has not ended by then ends
  there (the forced token's probability is 1, so the score is unchanged
  but for the penalty, ``|Y| ** α``). transformers' beam search is not
  CTranslate2's: refused.

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

import collections
import json
import math
import numbers
import os

from keras_transformer.data.languages import check_languages
from keras_transformer.data.sentencepiece import MODEL_FILE, SentencePiece
from keras_transformer.search.options import (
    SearchOptions,
    check_length,
    refuse_transformers_form,
)
from keras_transformer.translate.base import TranslatorBase

# How CTranslate2's beam search collects hypotheses to re-rank: it stops
# once round(beam_size * PATIENCE) hypotheses have finished.
PATIENCE = 2.0
# Sentences per batch, by the kind of weights (measured on two CPU cores).
DEFAULT_BATCH_SIZES = {"float32": 128, "int8": 32}
DEFAULT_INTER_THREADS = 2
DEFAULT_INTRA_THREADS = 1
# CTranslate2's length penalty while it searches: any value but 0 (which
# stops a sentence at its first finished best hypothesis); undone exactly.
SEARCH_LENGTH_PENALTY = 1.0

FORMAT = "keras_transformer.ctranslate2"
# 2: the tokenizer's kind, files and settings, the default search.
FORMAT_VERSION = 2
METADATA_FILE = "keras_transformer.json"
TOKENIZER_FILE = MODEL_FILE
_INSTALL = (
    'pip install "keras-transformer-aiayn[ctranslate2]" (or pip install ctranslate2)'
)


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            f"The CTranslate2 export needs the ctranslate2 package: {_INSTALL}"
        ) from error
    return ctranslate2


def vocabulary_names(pieces, size):
    """``size`` distinct names, one per model id: the pieces in id order (a
    piece already taken by a lower id, as when several ids share a piece,
    is renamed), then placeholders for the ids the model has and the
    tokenizer not. CTranslate2 is handed these names and gives them back:
    they only need to be distinct."""
    vocabulary, taken = [], set()
    for i in range(size):
        name = pieces[i] if i < len(pieces) else f"<keras_transformer_unused_{i}>"
        while name in taken:
            name = f"<keras_transformer_id_{i}:{name}>"
        vocabulary.append(name)
        taken.add(name)
    return vocabulary


def read_tokenizer(path, description):
    """The tokenizer an export holds: ``description`` is the metadata's
    ``tokenizer`` entry (its kind, files and settings; an export without a
    kind has the package's SentencePiece model as ``tokenizer.model``)."""
    kind = description.get("kind", SentencePiece.kind)
    names = description.get("files", [description.get("file", TOKENIZER_FILE)])
    files = {}
    for name in names:
        with open(os.path.join(path, name), "rb") as file:
            files[name] = file.read()
    if kind == SentencePiece.kind:
        return SentencePiece.from_export(files)
    if kind == "marian":
        from keras_transformer.pretrained.marian_vocabularies import (
            MarianVocabularies,
        )

        return MarianVocabularies.from_export(files, description["settings"])
    raise ValueError(
        f"{path}: a tokenizer of kind {kind!r}, which this keras_transformer "
        "cannot read; update keras_transformer."
    )


# -- the translator -----------------------------------------------------------------


class CTranslate2Translator(TranslatorBase):
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

    The calls are the interface's (``TranslatorBase``): ``translate``,
    ``translate_ids``, ``n_best``, ``decode_ids``, ``encode_sources``, with
    ``SearchOptions`` (``use_cache`` and ``fixed_batch`` are accepted and
    change nothing: nothing is compiled; ``verbose=1`` reports progress on
    stderr). ``translator`` is the ``ctranslate2.Translator``,
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
        ctranslate2 = import_ctranslate2()
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
        self.tokenizer = read_tokenizer(path, self.metadata["tokenizer"])
        self.path = path
        self.source_max_length = self.target_max_length = int(
            self.metadata["max_length"]
        )
        self.max_output_length = self.metadata.get("max_output_length")
        self.extra_output_length = int(self.metadata["extra_output_length"])
        # Exports written before the codes were recorded have none.
        self.languages = check_languages(self.metadata.get("languages"))
        special = self.metadata["special_ids"]
        if any(special[name] != i for name, i in self.tokenizer.special_ids().items()):
            raise ValueError(
                f"{metadata_path}: special ids {special}, the tokenizer's "
                f"{self.tokenizer.special_ids()}."
            )
        if "default_search" in self.metadata:
            self.default_search = SearchOptions(**self.metadata["default_search"])
        model = self.metadata["model"]
        self._source_pieces = vocabulary_names(
            self.tokenizer.source_pieces(), model["src_vocab_size"]
        )
        self.source_vocabulary_size = len(self._source_pieces)
        self._target_pieces = vocabulary_names(
            self.tokenizer.target_pieces(), model["tgt_vocab_size"]
        )
        self._target_ids = {piece: i for i, piece in enumerate(self._target_pieces)}
        self._suppressed = [
            [self._target_pieces[self.pad_id]],
            [self._target_pieces[self.start_id]],
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

    # -- what the interface asks of an engine ----------------------------------------

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

    def _search_batches(self, batches, search, top_n):
        # CTranslate2 finds every hypothesis of the beam: top_n changes nothing.
        if search.beam_size > 1:
            what = "the CTranslate2 engine, beyond greedy search,"
            refuse_transformers_form(search, what)
        # Asynchronous calls, so that CTranslate2's workers decode several
        # batches at once: one per worker, and one more waiting for the
        # first that is free.
        running = collections.deque()
        for batch in batches:
            outputs = self._submit(batch.sources, max(batch.limits), search)
            running.append((batch, outputs))
            if len(running) > self.translator.num_translators:
                yield self._results(*running.popleft(), search)
        while running:
            yield self._results(*running.popleft(), search)

    def _results(self, batch, outputs, search):
        """A batch's hypotheses, from ``outputs`` decoded with its largest
        limit; a sentence whose result may depend on its own, smaller limit
        is decoded again with it, together with the batch's other sentences
        of that limit."""
        sources, limits, _ = batch
        largest = max(limits)
        pools = [
            self._hypotheses(output.result(), search, largest) for output in outputs
        ]
        again = {}
        for i, pool in enumerate(pools):
            if limits[i] < largest and self._reaches(pool, limits[i], search):
                again.setdefault(limits[i], []).append(i)
        redone = [
            (rows, limit, self._submit([sources[i] for i in rows], limit, search))
            for limit, rows in sorted(again.items())
        ]
        for rows, limit, outputs in redone:
            for i, output in zip(rows, outputs, strict=True):
                pools[i] = self._hypotheses(output.result(), search, limit)
        return [pool[: search.beam_size] for pool in pools]

    def _submit(self, sources, limit, search):
        tokens = [[self._source_pieces[i] for i in row] for row in sources]
        beam = search.beam_size
        options = dict(
            max_batch_size=0,
            asynchronous=True,
            beam_size=beam,
            max_input_length=0,  # sources are cut by encode_sources
            # A forced end's place is not decoded (_hypotheses fills it);
            # CTranslate2 decodes at least one token.
            max_decoding_length=max(int(limit) - int(forced_end(search)), 1),
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
                length_penalty=SEARCH_LENGTH_PENALTY,
            )
        return self.translator.translate_batch(tokens, **options)

    def _pool(self, beam_size):
        """How many finished hypotheses CTranslate2's beam search collects:
        ``std::round(beam_size * patience)`` (halves away from zero, unlike
        Python's ``round``). All of them are asked for: the re-ranking, and
        ``_reaches``, need every one."""
        return max(math.floor(beam_size * self.patience + 0.5), beam_size)

    def _hypotheses(self, result, search, limit):
        """``[(ids, score)]`` best first by our score, from CTranslate2's
        (decoded for an output ``limit``)."""
        ranked = []
        for tokens, score in zip(result.hypotheses, result.scores, strict=True):
            ids = [self._target_ids[token] for token in tokens]
            if forced_end(search) and (limit == 1 or ids[-1:] != [self.end_id]):
                # The end token in the limit's last place, the one token
                # allowed there (probability 1); at a limit of 1 the only
                # place, whatever CTranslate2's one decoded token was.
                ids = ids[: limit - 1] + [self.end_id]
                score = score if limit > 1 else 0.0
            length = len(ids)
            # Undo CTranslate2's score / |Y| ** length_penalty (|Y| with </s>).
            if search.beam_size > 1 and length:
                score = score * length**SEARCH_LENGTH_PENALTY
            ranked.append((ids, float(score) / search.penalty(length)))
        # Stable: ties keep CTranslate2's order.
        ranked.sort(key=lambda item: -item[1])
        return ranked

    def _reaches(self, hypotheses, limit, search):
        """Whether a result found with a larger limit may differ from the
        one its own ``limit`` gives: greedy, if it is longer, or as long
        where the end is forced at the limit (which would have put the end
        token there); beam search, if any finished hypothesis is as long
        (the last step ends the whole beam, so the search would have
        stopped there)."""
        longest = max(len(ids) for ids, _ in hypotheses)
        if search.beam_size == 1 and not forced_end(search):
            return longest > limit
        return longest >= limit


def forced_end(search):
    """Whether ``search`` puts the end token in the last place its limit
    allows (transformers' rule; this engine runs it for greedy search)."""
    return search.length_penalty_form == "transformers"


def load_ctranslate2(path, **kwargs):
    """``CTranslate2Translator(path, **kwargs)``: the translator of an
    ``export_ctranslate2`` directory."""
    return CTranslate2Translator(path, **kwargs)
