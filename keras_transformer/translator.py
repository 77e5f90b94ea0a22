"""Tokenizer + Transformer + greedy decoding in one saveable ``keras.Model``.

``Translator(tokenizer, transformer).translate(["..."])`` returns a list of
strings. Saved with ``translator.save("t.keras")`` the file holds the
transformer's weights and the tokenizer's vocabulary (as the asset
``vocabulary.spm``), and ``keras.saving.load_model("t.keras")`` rebuilds it on
any backend without ``custom_objects``.

Decoding (uncached; each step re-runs the whole decoder on the prefix):

- Sources are encoded with ``END_ID`` at the end (``encode``'s convention,
  the one training uses), padded with 0 to a bucket length from
  ``bucket_boundaries(..., step=2)`` (8, 16, 32, ... up to the model's
  ``max_length``). The decoder input grows by the same buckets and batches
  have a power-of-two number of rows (padding rows are all 0), so a compiled
  forward pass is traced once per (rows, source bucket, decoder bucket), not
  once per step. Padding does not change the result: the encoder's padding
  mask hides padded sources from cross-attention, and position ``t`` of the
  decoder only sees positions ``<= t`` (the causal mask), so decoder padding
  after the prefix is never looked at.
- The decoder starts from ``[START_ID]``; each step appends the argmax of the
  logits at the last position of the prefix. ``PAD_ID`` and ``START_ID`` are
  never chosen: neither can occur inside a target sentence (a fed-back 0
  would even be masked out as padding). A row stops at ``END_ID`` or at its
  maximum output length: by default the source length (in tokens, without
  ``END_ID``) + 50, as in the paper (§6.1); never more than the model's
  ``max_length`` (the decoder input of the last step holds all but the last
  generated token, after ``START_ID``).
- The forward pass is the transformer's ``predict_on_batch``: inference mode
  (no dropout), jitted on JAX, a ``tf.function`` on TensorFlow, ``no_grad``
  on PyTorch.
- A source longer than the model's ``max_length`` (``END_ID`` included) is
  cut to its first ``max_length - 1`` tokens plus ``END_ID``, with a
  ``UserWarning`` that names the limit: translating the beginning is more
  useful than failing a whole batch for one long line, and the warning says
  that it happened.

keras-hub 0.32 reads the vocabulary asset with ``open()`` and no ``close()``,
so ``load_model`` emits a ``ResourceWarning`` (harmless; an error only where
warnings are turned into errors, e.g. under this project's pytest settings).
"""

import numbers
import warnings

import keras
import numpy as np

from keras_transformer.data.batching import bucket_boundaries
from keras_transformer.data.tokenizer import (
    END_ID,
    PAD_ID,
    START_ID,
    decode,
    encode,
)

# Paper §6.1: "We set the maximum output length during inference to input
# length + 50".
EXTRA_OUTPUT_LENGTH = 50


def _check_length(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None. Received: {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1. Received: {name}={value}")
    return int(value)


def _bucket(length, boundaries):
    """The smallest boundary >= length (boundaries double from 8 without end)."""
    for boundary in boundaries:
        if boundary >= length:
            return boundary
    # No model max_length: keep doubling.
    boundary = boundaries[-1] if boundaries else 8
    while boundary < length:
        boundary *= 2
    return boundary


def _boundaries(max_length):
    if max_length is None:
        return [8]
    return bucket_boundaries(max_length, min_length=8, step=2, multiple=8)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Translator(keras.Model):
    """A tokenizer and a Transformer that translate text greedily.

    Args:
        tokenizer: a ``SentencePieceTokenizer`` from
            ``keras_transformer.data.tokenizer.make_tokenizer`` (reserved ids
            0 pad, 1 start, 2 end, 3 unknown).
        transformer: the model from ``build_model``, trained on that
            tokenizer's ids (its vocabularies must hold all of them).
        max_output_length: optional int, a fixed maximum number of generated
            tokens (``END_ID`` included) instead of source length + 50. It is
            capped by the model's ``max_length``.
        **kwargs: passed to ``keras.Model`` (e.g. ``name``).

    Calling the model gives the transformer's logits, so it is a valid
    ``keras.Model`` (``translator({"encoder_inputs": ..., "decoder_inputs":
    ...})``).
    """

    def __init__(self, tokenizer, transformer, max_output_length=None, **kwargs):
        super().__init__(**kwargs)
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.max_output_length = _check_length(max_output_length, "max_output_length")
        limits = transformer._limits()
        src_vocab, self.source_max_length = limits["encoder_inputs"]
        _, self.target_max_length = limits["decoder_inputs"]
        # A tokenizer loaded from a .keras file has no vocabulary until its
        # asset is read (after from_config); check the sizes when it has one.
        if getattr(tokenizer, "proto", None) is not None:
            vocab = tokenizer.vocabulary_size()
            if vocab > src_vocab:
                raise ValueError(
                    f"The tokenizer has {vocab} ids but the transformer's source "
                    f"vocabulary only {src_vocab}."
                )
        self._source_boundaries = _boundaries(self.source_max_length)
        self._target_boundaries = _boundaries(self.target_max_length)
        self.built = True

    def call(self, inputs, training=None):
        return self.transformer(inputs, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            tokenizer=keras.saving.serialize_keras_object(self.tokenizer),
            transformer=keras.saving.serialize_keras_object(self.transformer),
            max_output_length=self.max_output_length,
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

    # -- decoding ------------------------------------------------------------

    def translate(self, texts, max_output_length=None, batch_size=64):
        """Translate sentences greedily.

        Args:
            texts: list of str.
            max_output_length: optional int, maximum number of generated
                tokens per sentence (``END_ID`` included); overrides the
                constructor's value and the default source length + 50. Capped
                by the model's ``max_length``.
            batch_size: int, most sentences decoded together.

        Returns:
            list of str, one per input (``""`` where the model ends at once).
        """
        ids = self.translate_ids(texts, max_output_length, batch_size)
        return decode(self.tokenizer, ids)

    def translate_ids(self, texts, max_output_length=None, batch_size=64):
        """Like ``translate`` but returns the generated token ids.

        Returns:
            list of lists of int: the tokens after ``START_ID``, ending with
            ``END_ID`` unless the maximum output length was reached first.
        """
        return self.greedy_ids(
            self.encode_sources(texts), max_output_length, batch_size
        )

    def encode_sources(self, texts):
        """Source ids ending with ``END_ID``, cut to the model's ``max_length``.

        A source that is too long keeps its first ``max_length - 1`` tokens
        and ``END_ID``, with a ``UserWarning``.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("texts must be a list of sentences, not one string.")
        ids = encode(self.tokenizer, [str(text) for text in texts])
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

    def greedy_ids(self, source_ids, max_output_length=None, batch_size=64):
        """Greedy decoding of encoded sources.

        Args:
            source_ids: list of lists of int, each ending with ``END_ID`` (as
                ``encode`` gives them), no padding, at most the model's
                ``max_length`` long.
            max_output_length: see ``translate``.
            batch_size: int, most sources decoded together.

        Returns:
            list of lists of int, see ``translate_ids``.
        """
        max_output_length = _check_length(max_output_length, "max_output_length")
        if max_output_length is None:
            max_output_length = self.max_output_length
        batch_size = _check_length(batch_size, "batch_size")
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
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            outputs = self._greedy_batch(
                [sources[i] for i in chunk], [limits[i] for i in chunk], batch_size
            )
            for i, output in zip(chunk, outputs, strict=True):
                results[i] = output
        return results

    def _greedy_batch(self, sources, limits, batch_size):
        rows = len(sources)
        # A power of two of rows (capped by batch_size) keeps shapes few.
        padded_rows = min(1 << (rows - 1).bit_length(), batch_size)
        src_width = _bucket(
            max(max(len(r) for r in sources), 1), self._source_boundaries
        )
        src = np.zeros((padded_rows, src_width), "int32")
        for i, row in enumerate(sources):
            src[i, : len(row)] = row
        steps = max(limits)
        dec = np.zeros((padded_rows, _bucket(steps, self._target_boundaries)), "int32")
        dec[:, 0] = START_ID
        done = np.ones(padded_rows, bool)
        done[:rows] = False
        outputs = [[] for _ in range(rows)]
        for step in range(steps):
            width = _bucket(step + 1, self._target_boundaries)
            logits = self.transformer.predict_on_batch(
                {"encoder_inputs": src, "decoder_inputs": dec[:, :width]}
            )
            logits = np.asarray(logits)[:, step].copy()
            logits[:, [PAD_ID, START_ID]] = -np.inf
            next_ids = logits.argmax(-1).astype("int32")
            for i in range(rows):
                if done[i]:
                    continue
                token = int(next_ids[i])
                outputs[i].append(token)
                if token == END_ID or len(outputs[i]) >= limits[i]:
                    done[i] = True
                elif step + 1 < dec.shape[1]:
                    dec[i, step + 1] = token
            if done.all():
                break
        return outputs
