"""Tokenizer + Transformer + beam search in one saveable ``keras.Model``.

``Translator(tokenizer, transformer).translate(["..."])`` returns a list of
strings. Saved with ``translator.save("t.keras")`` the file holds the
transformer's weights and the tokenizer's vocabulary (as the asset
``vocabulary.spm``), and ``keras.saving.load_model("t.keras")`` rebuilds it on
any backend without ``custom_objects``.

Decoding (the search itself is ``keras_transformer.search.decoding``):

- Beam search with 4 beams and length penalty α = 0.6 by default, as in the
  paper (§6.1); ``beam_size=1`` is greedy search. A key/value cache makes
  each step cost one decoder position; ``use_cache=False`` reruns the whole
  model on the prefix instead (the same tokens, slower).
- Sources are encoded with ``END_ID`` at the end (``encode``'s convention,
  the one training uses), padded with 0 to a bucket length from
  ``bucket_length(..., step=2)`` (8, 16, 32, ... up to the model's
  ``max_length``). The output width (and cache length) takes the same
  buckets, and batches have a power-of-two number of rows (padding rows are
  all 0 and generate nothing), so the compiled decoding loop is built once
  per (rows, source bucket, output bucket, beam size), not once per call.
  Padding does not change the result: the encoder's padding mask hides
  padded sources from cross-attention, and the causal mask hides positions
  after the prefix.
- The decoder starts from ``[START_ID]``. ``PAD_ID`` and ``START_ID`` are
  never generated: neither can occur inside a target sentence. A hypothesis
  ends at ``END_ID`` or at its maximum output length: by default the source
  length (in tokens, without ``END_ID``) + 50, as in the paper (§6.1); never
  more than the model's ``max_length``.
- A source longer than the model's ``max_length`` (``END_ID`` included) is
  cut to its first ``max_length - 1`` tokens plus ``END_ID``, with a
  ``UserWarning`` that names the limit: translating the beginning is more
  useful than failing a whole batch for one long line, and the warning says
  that it happened. Text the tokenizer cannot spell becomes ``<unk>``, also
  with a ``UserWarning``.
- The search's settings are one ``SearchOptions``, checked once before a
  sentence is read, and every sentence must be a ``str`` with a UTF-8
  encoding: ``None``, bytes or a number raise ``TypeError`` (rather than
  being translated as the words "None", "b'...'" or "42"), a lone surrogate
  ``ValueError``, each naming the sentence's index.

keras-hub 0.32 reads the vocabulary asset with ``open()`` and no ``close()``,
so ``load_model`` emits a ``ResourceWarning`` (harmless; an error only where
warnings are turned into errors, e.g. under this project's pytest settings).
"""

import warnings

import keras
import numpy as np

from keras_transformer.search import decoding
from keras_transformer._guards.inputs import check_texts
from keras_transformer.data.batching import bucket_length
from keras_transformer.data.tokenizer import (
    END_ID,
    PAD_ID,
    UNK_ID,
    decode,
    encode,
    special_ids,
)
from keras_transformer.progress import Progress
from keras_transformer.search.options import (
    SearchOptions,
    check_length,
    check_n_best,
)

# Paper §6.1: "We set the maximum output length during inference to input
# length + 50".
EXTRA_OUTPUT_LENGTH = 50
SEARCH_DTYPES = ("float32", "policy")
# Source and output widths are padded to lengths 8, 16, 32, ...: a new
# input length rarely means a new compilation of the search.
_WIDTHS = {"min_length": 8, "step": 2, "multiple": 8}


def inference_copy(transformer):
    """A new ``Transformer`` with ``transformer``'s architecture and weights,
    and nothing of its training: no compile settings, no optimizer.

    A ``.keras`` file saves every object a model refers to, so a
    ``Translator`` around the trained model would carry the optimizer's
    state (Adam's two moments: twice the weights again) and the compile
    settings of the backend it was trained on. What translates is the copy;
    checkpoints keep the optimizer, for resuming.
    """
    copy = type(transformer).from_config(transformer.get_config())
    copy.set_weights(transformer.get_weights())
    return copy


@keras.saving.register_keras_serializable(package="keras_transformer")
class Translator(keras.Model):
    """A tokenizer and a Transformer that translate text (beam search).

    Args:
        tokenizer: a ``SentencePieceTokenizer`` from
            ``keras_transformer.data.tokenizer.make_tokenizer`` (reserved ids
            0 pad, 1 start, 2 end, 3 unknown).
        transformer: the model from ``build_model``, trained on that
            tokenizer's ids (its vocabularies must hold all of them).
        max_output_length: optional int, a fixed maximum number of generated
            tokens (``END_ID`` included) instead of source length + 50. It is
            capped by the model's ``max_length``.
        search_dtype: ``"float32"`` (default) or ``"policy"``: the precision
            the searches compute in. A transformer trained under a mixed
            policy (``mixed_bfloat16``) keeps float32 weights; with
            ``"float32"`` it translates with a float32 copy of them, which on
            a CPU is both faster than bfloat16 and exact; ``"policy"`` keeps
            the model's own compute dtype (faster on GPUs with bfloat16 or
            float16 units). ``translator.search_compute_dtype`` says which
            is in use.
        **kwargs: passed to ``keras.Model`` (e.g. ``name``).

    Calling the model gives the transformer's logits, so it is a valid
    ``keras.Model`` (``translator({"encoder_inputs": ..., "decoder_inputs":
    ...})``).
    """

    def __init__(
        self,
        tokenizer,
        transformer,
        max_output_length=None,
        search_dtype="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.max_output_length = check_length(max_output_length, "max_output_length")
        if search_dtype not in SEARCH_DTYPES:
            raise ValueError(
                f"search_dtype must be one of {SEARCH_DTYPES}. "
                f"Received: search_dtype={search_dtype!r}"
            )
        self.search_dtype = search_dtype
        self.source_max_length = self.target_max_length = transformer.max_length
        self._source_vocabulary_size = transformer.src_vocab_size
        # A tokenizer loaded from a .keras file has no vocabulary until its
        # asset is read (after from_config); check the sizes when it has one.
        if getattr(tokenizer, "proto", None) is not None:
            self.check_tokenizer()
        self.built = True

    def check_tokenizer(self):
        """Check that the tokenizer has a vocabulary that fits the transformer.

        A translator loaded from a ``.keras`` file whose vocabulary asset is
        missing loads without one; this names the problem (``ValueError``).
        """
        if getattr(self.tokenizer, "proto", None) is None:
            raise ValueError(
                "the tokenizer has no vocabulary (a translator loaded from a "
                ".keras file reads it from the asset vocabulary.spm: is it "
                "missing from the archive?)"
            )
        vocab = self.tokenizer.vocabulary_size()
        if vocab > self._source_vocabulary_size:
            raise ValueError(
                f"The tokenizer has {vocab} ids but the transformer's source "
                f"vocabulary only {self._source_vocabulary_size}."
            )

    def call(self, inputs, training=None):
        return self.transformer(inputs, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            tokenizer=keras.saving.serialize_keras_object(self.tokenizer),
            transformer=keras.saving.serialize_keras_object(self.transformer),
            max_output_length=self.max_output_length,
            search_dtype=self.search_dtype,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        config["transformer"] = keras.saving.deserialize_keras_object(
            config["transformer"]
        )
        return cls(**config)

    def export(self, path, search=None, **options):
        """Write the translator as a TensorFlow SavedModel whose signature
        ``translate`` maps ``texts`` (``tf.string``, shape ``[None]``) to
        ``{"translations": tf.string}``; loading it needs TensorFlow and
        tensorflow-text only. See ``keras_transformer.export.saved_model``.

        Args:
            path: the SavedModel's directory.
            search: optional ``SearchOptions``, fixed in the export (default:
                4 beams, α = 0.6).
            **options: its fields; ``overwrite=True`` to replace what is
                at ``path``; ``jit_compile=False`` for searches without XLA
                (for servers that have none).

        Returns:
            str: the SavedModel's absolute path.
        """
        from keras_transformer.export.saved_model import export_saved_model

        return export_saved_model(self, path, search=search, **options)

    # -- decoding ------------------------------------------------------------

    @property
    def engine(self):
        """What translates, in words: ``"keras <backend> <dtype>"``."""
        return f"keras {keras.backend.backend()} {self.search_compute_dtype}"

    @property
    def search_compute_dtype(self):
        """The dtype the searches compute in (see ``search_dtype``)."""
        if self.search_dtype == "float32":
            return "float32"
        return self._policy_dtype()

    def _policy_dtype(self):
        # The functional model's own policy stays float32; its layers carry
        # the policy it was built with.
        layer = getattr(self.transformer, "target_embedding", self.transformer)
        return layer.compute_dtype

    def _search_model(self):
        """The transformer the searches run: itself, or a float32 copy of a
        mixed-precision one, its weights refreshed for every call (the
        translator's own model may have been trained since)."""
        if self.search_compute_dtype == self._policy_dtype():
            return self.transformer
        copy = getattr(self, "_float32_copy", None)
        if copy is None:
            config = dict(self.transformer.get_config(), dtype="float32")
            copy = type(self.transformer).from_config(config)
            # Past Keras' tracking: a copy to compute with, not state to save.
            object.__setattr__(self, "_float32_copy", copy)
        # Variable to variable, on the device: no round trip through NumPy.
        for target, source in zip(copy.weights, self.transformer.weights, strict=True):
            target.assign(source.value)
        return copy

    def warm_up(self, search=None, **options):
        """Compile the search of ``translate`` for every source and output
        width a batch of ``batch_size`` rows can have, so that no later call
        with these options waits for a compilation (with ``fixed_batch=True``
        every batch has that many rows; a server's warm-up).

        Returns:
            int: the searches run, one per (source width, output width).
        """
        search = SearchOptions.of(search, **options)
        max_output_length = search.max_output_length or self.max_output_length
        shapes = {}
        for length in range(1, (self.source_max_length or 256) + 1):
            limit = self._output_limit(length - 1, max_output_length)
            key = (
                bucket_length(length, self.source_max_length, **_WIDTHS),
                bucket_length(limit, self.target_max_length, **_WIDTHS),
            )
            shapes.setdefault(key, length)
        model = self._search_model()
        rows = search.batch_size
        for length in shapes.values():
            # Any ids compile the same program; the output width comes from
            # the largest limit, and the other rows stop after one token.
            source = [UNK_ID] * (length - 1) + [END_ID]
            limits = [self._output_limit(length - 1, max_output_length)]
            self._decode_batch(
                model, [source] * rows, limits + [1] * (rows - 1), search, top_n=1
            )
        return len(shapes)

    def translate(self, texts, search=None, **options):
        """Translate sentences with beam search (greedy with ``beam_size=1``).

        Args:
            texts: list (or other iterable) of str; anything else, or text
                with no UTF-8 encoding (a lone surrogate), is refused.
            search: optional ``SearchOptions``.
            **options: its fields, replacing ``search``'s: ``beam_size``
                (4), ``length_penalty`` (0.6), ``max_output_length``,
                ``batch_size`` (64), ``use_cache`` (True), ``verbose`` (0).

        Returns:
            list of str, one per input (``""`` where the model ends at once).

        Raises:
            TypeError, ValueError: a bad argument, before any sentence is
                read.
        """
        best = self.translate_ids(texts, SearchOptions.of(search, **options))
        return decode(self.tokenizer, best)

    def translate_ids(self, texts, search=None, **options):
        """Like ``translate`` but returns the generated token ids.

        Returns:
            list of lists of int: the tokens after ``START_ID``, ending with
            ``END_ID`` unless the maximum output length was reached first.
        """
        search = SearchOptions.of(search, **options)
        hypotheses = self._decode(self.encode_sources(texts), search, top_n=1)
        return [row[0][0] for row in hypotheses]

    def n_best(self, texts, n=None, search=None, **options):
        """The ``n`` best translations of each sentence, with their scores.

        Args:
            texts: list of str.
            n: int, at most ``beam_size`` (default: ``beam_size``).
            search, **options: as for ``translate``.

        Returns:
            list (one per input) of lists of ``(translation, score)``, best
            first; the score is the search's ``log P(Y | X) / lp(Y)``, the
            quantity it ranks by.
        """
        # The search first: n defaults to beam_size and is bounded by it.
        search = SearchOptions.of(search, **options)
        n = check_n_best(n, search.beam_size)
        results = []
        for row in self._decode(self.encode_sources(texts), search, top_n=n):
            row = row[:n]
            texts_out = decode(self.tokenizer, [ids for ids, _ in row])
            results.append(
                [(text, score) for text, (_, score) in zip(texts_out, row, strict=True)]
            )
        return results

    def encode_sources(self, texts):
        """Source ids ending with ``END_ID``, cut to the model's ``max_length``.

        A source that is too long keeps its first ``max_length - 1`` tokens
        and ``END_ID``, with a ``UserWarning``. A source with text the
        tokenizer cannot spell (``UNK_ID``) also gives a ``UserWarning``: it
        is translated, but the model has not seen those characters.

        Raises:
            TypeError: ``texts`` is one string, or an item is not a str
                (the message names its index and type).
            ValueError: an item has no UTF-8 encoding (e.g. a lone
                surrogate), or the tokenizer has no vocabulary.
        """
        texts = check_texts(texts)
        self.check_tokenizer()
        ids = encode(self.tokenizer, texts)
        unknown = [i for i, row in enumerate(ids) if UNK_ID in row]
        if unknown:
            example = texts[unknown[0]]
            warnings.warn(
                f"{len(unknown)} of {len(ids)} sources contain characters the "
                f"tokenizer has never seen (read as <unk>), e.g. source "
                f"{unknown[0]}: {example[:60]!r}. Their translations may be "
                "poor there.",
                UserWarning,
                stacklevel=3,
            )
        limit = self.source_max_length
        if limit is None:
            return ids
        too_long = sum(len(row) > limit for row in ids)
        if too_long:
            warnings.warn(
                f"{too_long} of {len(ids)} sources are longer than the model's "
                f"max_length={limit} tokens (end token included); each is "
                f"truncated to its first {limit - 1} tokens and the end token.",
                UserWarning,
                stacklevel=3,
            )
            ids = [
                row if len(row) <= limit else row[: limit - 1] + [END_ID] for row in ids
            ]
        return ids

    def _output_limit(self, source_length, max_output_length):
        if max_output_length is None:
            max_output_length = source_length + EXTRA_OUTPUT_LENGTH
        if self.target_max_length is not None:
            max_output_length = min(max_output_length, self.target_max_length)
        return max_output_length

    def decode_ids(self, source_ids, search=None, **options):
        """Search for the translations of encoded sources.

        Args:
            source_ids: list of lists of int, each ending with ``END_ID`` (as
                ``encode`` gives them), no padding, at most the model's
                ``max_length`` long.
            search, **options: as for ``translate``.

        Returns:
            list (one per source) of ``beam_size`` hypotheses ``(ids,
            score)``, best first: ids as in ``translate_ids``, the score
            the search's ``log P(Y | X) / lp(Y)``.
        """
        return self._decode(source_ids, SearchOptions.of(search, **options))

    def _decode(self, source_ids, search, top_n=None):
        max_output_length = search.max_output_length
        if max_output_length is None:
            max_output_length = self.max_output_length
        sources = [[int(i) for i in row] for row in source_ids]
        for row in sources:
            if self.source_max_length is not None and len(row) > self.source_max_length:
                raise ValueError(
                    f"A source has {len(row)} tokens, more than the model's "
                    f"max_length={self.source_max_length}."
                )
            if PAD_ID in row:
                raise ValueError("Source ids must not contain padding (0).")
        limits = [
            self._output_limit(
                len(row) - (1 if row and row[-1] == END_ID else 0), max_output_length
            )
            for row in sources
        ]
        # Sort by length so that a batch shares one source bucket.
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        results = [None] * len(sources)
        model = self._search_model() if sources else self.transformer
        progress = Progress(len(sources)) if search.verbose else None
        for start in range(0, len(order), search.batch_size):
            chunk = order[start : start + search.batch_size]
            outputs = self._decode_batch(
                model,
                [sources[i] for i in chunk],
                [limits[i] for i in chunk],
                search,
                top_n,
            )
            for i, output in zip(chunk, outputs, strict=True):
                results[i] = output
            if progress is not None:
                progress.update(start + len(chunk))
        return results

    def _decode_batch(self, model, sources, limits, search, top_n=None):
        rows = len(sources)
        # A power of two of rows (capped by batch_size), or batch_size itself,
        # and bucketed widths keep the compiled loop's shapes few.
        padded_rows = min(1 << (rows - 1).bit_length(), search.batch_size)
        if search.fixed_batch:
            padded_rows = search.batch_size
        src_width = bucket_length(
            max(max(len(r) for r in sources), 1), self.source_max_length, **_WIDTHS
        )
        src = np.zeros((padded_rows, src_width), "int32")
        for i, row in enumerate(sources):
            src[i, : len(row)] = row
        # Padding rows generate nothing (limit 0).
        max_lengths = np.zeros(padded_rows, "int32")
        max_lengths[:rows] = limits
        width = bucket_length(max(limits), self.target_max_length, **_WIDTHS)
        ids = special_ids(self.tokenizer)
        if search.beam_size == 1:
            tokens, log_probs = decoding.greedy_search(
                model, src, max_lengths, width, search.use_cache, **ids
            )
            tokens, log_probs, scores = tokens[:, None], log_probs[:, None], None
        else:
            tokens, scores, log_probs = decoding.beam_search(
                model,
                src,
                max_lengths,
                search.beam_size,
                search.length_penalty,
                width,
                search.use_cache,
                **ids,
                top_n=top_n,
            )
        outputs = []
        for i in range(rows):
            hypotheses = []
            for j, (row, log_prob) in enumerate(
                zip(tokens[i], log_probs[i], strict=True)
            ):
                if hypotheses and log_prob < decoding.IMPOSSIBLE / 2:
                    continue  # an empty beam slot (vocabulary < beam)
                # Generated tokens are never PAD_ID: the first 0 ends a row.
                row = row.tolist()
                row = row[: row.index(PAD_ID)] if PAD_ID in row else row
                if scores is None:  # greedy search ranks by log P alone
                    score = float(log_prob) / decoding.length_penalty(
                        len(row), search.length_penalty
                    )
                else:
                    score = float(scores[i, j])
                hypotheses.append((row, score))
            outputs.append(hypotheses)
        return outputs
