"""The Keras engine of the translator interface: tokenizer + Transformer +
beam search in one saveable ``keras.Model``.

``Translator(tokenizer, transformer).translate(["..."])`` returns a list of
strings. Saved with ``translator.save("t.keras")`` the file holds the
transformer's weights and the tokenizer's vocabulary (as the asset
``vocabulary.spm``), and ``keras.saving.load_model("t.keras")`` rebuilds it on
any backend without ``custom_objects``. What every engine shares (text
checks, output limits, ``translate`` / ``n_best`` / ``decode_ids``) is
``translate.base.TranslatorBase``, and sorting and batching are
``translate.scheduler``'s; this module searches a batch on the model
(``keras_transformer.search``):

- Beam search with 4 beams and length penalty α = 0.6 by default, as in the
  paper (§6.1); ``beam_size=1`` is greedy search. A key/value cache makes
  each step cost one decoder position; ``use_cache=False`` reruns the whole
  model on the prefix instead (the same tokens, slower).
- Sources are padded with 0 to a width of ``search.shapes`` (8, 16, 32, ...
  up to the model's ``max_length``). The output width (and cache length)
  takes the same widths, and batches have a power-of-two number of rows
  (padding rows are all 0 and generate nothing), so the compiled decoding
  loop is built once per (rows, source width, output width, beam size), not
  once per call; ``attention_maps`` pads a sentence pair to these widths
  too. Padding does not change the result: the encoder's padding
  mask hides padded sources from cross-attention, and the causal mask hides
  positions after the prefix.
- The decoder starts from ``START_ID``. ``PAD_ID`` and ``START_ID`` are
  never generated: neither can occur inside a target sentence.

The tokenizer is the package's (``data.sentencepiece_layer``) or an imported
checkpoint's (``pretrained.marian_tokenizer``); both answer the tokenizer
contract (``data.contract``) and run without TensorFlow. Files of 0.1.0 to
0.3.0 name keras-hub's tokenizer class: ``from_config`` reads that name as
the package's, with or without keras-hub installed.
"""

import dataclasses
import threading

import keras
import numpy as np

from keras_transformer import backend
from keras_transformer.data.contract import TextTokenizer
from keras_transformer.data.languages import check_languages
from keras_transformer.data.sentencepiece_layer import OLD_NAMES
from keras_transformer.data.tokenizer import special_ids
from keras_transformer.search import decoding, shapes
from keras_transformer.search.emission import IMPOSSIBLE
from keras_transformer.search.options import SearchOptions, check_length
from keras_transformer.translate.base import Batch, TranslatorBase

SEARCH_DTYPES = ("float32", "policy")
# Sentences per batch when a call gives no batch_size.
DEFAULT_BATCH_SIZE = 64
# Two threads translating at once must not both make the float32 copy.
_COPY_LOCK = threading.Lock()


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
class Translator(TranslatorBase, keras.Model):
    """A tokenizer and a Transformer that translate text (beam search).

    Args:
        tokenizer: a ``TextTokenizer`` layer: the ``SentencePieceTokenizer``
            of ``keras_transformer.data.tokenizer.make_tokenizer`` (reserved
            ids 0 pad, 1 start, 2 end, 3 unknown), or an imported
            checkpoint's ``MarianTokenizer``.
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
        search: optional ``SearchOptions`` (or a dict of its fields): the
            search of a call that gives none (``default_search``); by
            default the paper's. Saved with the translator.
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
        search=None,
        languages=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(tokenizer, TextTokenizer):
            raise TypeError(
                "tokenizer must answer the TextTokenizer contract "
                "(keras_transformer.data.contract): make_tokenizer's "
                "SentencePieceTokenizer or an imported checkpoint's "
                f"MarianTokenizer. Received: {type(tokenizer).__name__}"
            )
        self.languages = check_languages(languages)
        if isinstance(search, dict):
            search = SearchOptions(**search)
        self.default_search = SearchOptions.of(search)
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.max_output_length = check_length(max_output_length, "max_output_length")
        if search_dtype not in SEARCH_DTYPES:
            raise ValueError(
                f"search_dtype must be one of {SEARCH_DTYPES}. "
                f"Received: search_dtype={search_dtype!r}"
            )
        self.search_dtype = search_dtype
        self._float32_copy = _Unsaved()
        self.source_max_length = self.target_max_length = transformer.max_length
        self.source_vocabulary_size = transformer.src_vocab_size
        # A tokenizer loaded from a .keras file has no vocabulary until its
        # asset is read (after from_config); check the sizes when it has one.
        if tokenizer.has_vocabulary:
            self.check_tokenizer()
        self.built = True

    def check_tokenizer(self):
        """Check that the tokenizer has a vocabulary that fits the transformer.

        A translator loaded from a ``.keras`` file whose vocabulary asset is
        missing loads without one; this names the problem (``ValueError``).
        """
        if not self.tokenizer.has_vocabulary:
            raise ValueError(
                "the tokenizer has no vocabulary (a translator loaded from a "
                ".keras file reads it from the tokenizer's assets, "
                f"{', '.join(self.tokenizer.asset_names)}: missing from the "
                "archive?)"
            )
        vocab = self.tokenizer.vocabulary_size()
        if vocab > self.source_vocabulary_size:
            raise ValueError(
                f"The tokenizer has {vocab} ids but the transformer's source "
                f"vocabulary only {self.source_vocabulary_size}."
            )

    gives_attention = True

    def attention_maps(self, source, target=None):
        """``kt.attention_maps(self, source, target)``: the weights of every
        attention sub-layer for one sentence pair (target: the greedy
        translation by default)."""
        from keras_transformer.translate.attention_maps import attention_maps

        return attention_maps(self, source, target)

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
        if self.default_search != SearchOptions():
            config["search"] = dataclasses.asdict(self.default_search)
        if self.languages is not None:
            config["languages"] = list(self.languages)
        return config

    @classmethod
    def from_config(cls, config):
        from keras_transformer import saving

        saving.register()  # the transformer's classes, its loss and schedule
        config = dict(config)
        # A scope, not custom_objects=: Keras looks a scope up before the
        # names libraries register, so the package's class answers for
        # keras-hub's old name even where keras-hub is installed and imported.
        with keras.saving.CustomObjectScope(OLD_NAMES):
            config["tokenizer"] = keras.saving.deserialize_keras_object(
                config["tokenizer"]
            )
        config["transformer"] = keras.saving.deserialize_keras_object(
            config["transformer"]
        )
        return cls(**config)

    @classmethod
    def from_preset(cls, source, dtype=None, **kwargs):
        """A translator from a pretrained checkpoint folder.

        Args:
            source: a Marian / OPUS-MT checkpoint folder in Hugging Face's
                layout (``config.json``, ``model.safetensors`` or
                ``pytorch_model.bin``, ``source.spm``, ``target.spm``,
                ``vocab.json``), or ``hf://owner/name``: such a folder from
                the Hugging Face cache, downloaded into it if need be.
            dtype: optional dtype policy for the transformer.
            **kwargs: ``Translator`` arguments (``max_output_length``, ...).

        The checkpoint's weights are mapped onto this package's Transformer
        (``keras_transformer.pretrained.marian`` says how); the translator
        translates, trains and saves like one built here. It searches as
        the checkpoint's generation config asks (``default_search``:
        transformers' beam search and length penalty, its beam size and
        output limit) unless ``search`` and ``max_output_length`` say
        otherwise. Its ``languages`` come from the checkpoint's
        ``tokenizer_config.json`` (``source_lang``, ``target_lang``) or its
        folder's name (``opus-mt-de-en``), unless ``languages`` is given.
        """
        from keras_transformer.pretrained.hub import local_folder
        from keras_transformer.pretrained.preset import (
            checkpoint_languages,
            generation_search,
            marian_parts,
        )

        folder = local_folder(source)
        tokenizer, transformer = marian_parts(folder, dtype=dtype)
        search, limit = generation_search(folder, transformer.max_length)
        kwargs.setdefault("languages", checkpoint_languages(folder))
        kwargs.setdefault("search", search)
        kwargs.setdefault("max_output_length", limit)
        return cls(tokenizer, transformer, **kwargs)

    def export(self, filepath, format="tf_saved_model", **kwargs):
        """Keras' ``Model.export``: the model's call (the transformer's
        logits) as an inference artifact, as Keras documents it.

        The string-to-string translator (tokenizer and beam search in the
        graph) is another thing:
        ``keras_transformer.export.saved_model.export_saved_model(translator,
        path)`` or ``kt-export --format saved_model``; a call with its
        search options is refused with a message that names it.
        """
        # export_saved_model's arguments; verbose is Keras' too.
        theirs = {field.name for field in dataclasses.fields(SearchOptions)}
        theirs = (theirs - {"verbose"}) | {"search", "overwrite", "jit_compile"}
        refused = sorted(set(kwargs) & theirs)
        if refused:
            raise TypeError(
                "Translator.export is keras.Model.export (the logits). For the "
                "string-to-string SavedModel with the search, call "
                "keras_transformer.export.saved_model.export_saved_model("
                "translator, path, ...) or kt-export --format saved_model. "
                f"Received: {refused}"
            )
        # The translator's call is the transformer's, whose functional
        # inputs give Keras the signature a never-called subclass lacks.
        return self.transformer.export(filepath, format=format, **kwargs)

    # -- decoding ------------------------------------------------------------

    @property
    def engine(self):
        """What translates, in words: ``"keras <backend> <dtype>"``."""
        return f"keras {keras.backend.backend()} {self.search_compute_dtype}"

    @property
    def default_batch_size(self):
        """Sentences per batch when a call gives no ``batch_size``."""
        return DEFAULT_BATCH_SIZE

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
        with _COPY_LOCK:
            copy = self._float32_copy.model
            if copy is None:
                config = dict(self.transformer.get_config(), dtype="float32")
                copy = type(self.transformer).from_config(config)
                self._float32_copy.model = copy
            # Variable to variable, on the device: no round trip through NumPy.
            for target, source in zip(
                copy.weights, self.transformer.weights, strict=True
            ):
                target.assign(source.value)
        return copy

    def warm_up(self, search=None, constraint_tokens=0, **options):
        """Compile the search of ``translate`` for every source and output
        width a batch of ``batch_size`` rows can have, so that no later call
        with these options waits for a compilation (with ``fixed_batch=True``
        every batch has that many rows; a server's warm-up).

        Args:
            search, **options: as for ``translate``.
            constraint_tokens: int, the most constraint tokens (glossary
                terms' pieces) a sentence may bring: the constrained
                searches of every constraint width up to it are compiled
                too (0, the default: none).

        Returns:
            int: the searches run, one per (source width, output width,
            constraint width).
        """
        search = self.search_options(search, **options)
        sizes = self._search_shapes(search)
        model = self._search_model()
        rows = search.batch_size_or(self.default_batch_size)
        constraint_widths = [None]
        if constraint_tokens:
            top = shapes.constraint_width(constraint_tokens)
            constraint_widths += [w for w in shapes.widths(top) if w <= top]
        with backend.deliberate_retracing():
            self._warm_up_sizes(model, sizes, rows, search, constraint_widths)
        return len(sizes) * len(constraint_widths)

    def _warm_up_sizes(self, model, sizes, rows, search, constraint_widths):
        for length, limit in sizes.values():
            # Any ids compile the same program; the output width comes from
            # the largest limit, and the other rows stop after one token.
            source = [self.unk_id] * (length - 1) + [self.end_id]
            for width in constraint_widths:
                wanted = None if width is None else [[[self.unk_id] * width]]
                batch = Batch([source] * rows, [limit] + [1] * (rows - 1), wanted)
                self._decode_batch(model, batch, search, top_n=1)

    def _search_shapes(self, search):
        """``{(source width, output width): (source length, output limit)}``
        of every source a search with these options can be given."""
        sizes = {}
        # An empty source (length 1: the end id) is never searched.
        for length in range(2, (self.source_max_length or 256) + 1):
            limit = self.output_limit(length - 1, search.max_output_length)
            key = (
                shapes.width(length, self.source_max_length),
                shapes.width(limit, self.target_max_length),
            )
            sizes.setdefault(key, (length, limit))
        return sizes

    def warm_up_attention(self):
        """Compile ``attention_maps``' program for every source width, so
        that no map compiles while a server's requests wait (``/explain``).
        The decoder input is padded to the model's whole width: one
        program per source width serves every target.

        Returns:
            int: the programs run, one per source width.
        """
        from keras_transformer.translate.attention_maps import attention_weights

        model = self._search_model()
        lengths = _length_per_width(self.source_max_length)
        for length in lengths:
            # Any ids compile the same program.
            attention_weights(
                model,
                [self.unk_id] * (length - 1) + [self.end_id],
                [self.start_id],
                self.source_max_length,
                self.target_max_length,
                target_length=self.target_max_length or 0,
            )
        return len(lengths)

    takes_constraints = True

    def _search_batches(self, batches, search, top_n):
        model = self._search_model()
        for batch in batches:
            yield self._decode_batch(model, batch, search, top_n)

    def _decode_batch(self, model, batch, search, top_n=None):
        sources, limits, constraints = batch
        rows = len(sources)
        batch_size = search.batch_size_or(self.default_batch_size)
        # A power of two of rows (capped by batch_size), or batch_size itself,
        # and bucketed widths keep the compiled loop's shapes few.
        padded_rows = min(1 << (rows - 1).bit_length(), batch_size)
        if search.fixed_batch:
            padded_rows = batch_size
        src_width = shapes.width(
            max(max(len(r) for r in sources), 1), self.source_max_length
        )
        src = np.zeros((padded_rows, src_width), "int32")
        for i, row in enumerate(sources):
            src[i, : len(row)] = row
        # Padding rows generate nothing (limit 0).
        max_lengths = np.zeros(padded_rows, "int32")
        max_lengths[:rows] = limits
        width = shapes.width(max(limits), self.target_max_length)
        ids = special_ids(self.tokenizer)
        form = search.length_penalty_form
        # A batch with no constraint searches as it would without any.
        constraints = constraints if constraints and any(constraints) else None
        if search.beam_size == 1 and constraints is None:
            tokens, log_probs = decoding.greedy_search(
                model, src, max_lengths, width, search.use_cache, **ids,
                forced_end=form == "transformers",
            )  # fmt: skip
            tokens, log_probs, scores = tokens[:, None], log_probs[:, None], None
        else:
            tokens, scores, log_probs = decoding.beam_search(
                model, src, max_lengths, search.beam_size, search.length_penalty,
                width, search.use_cache, **ids, top_n=top_n,
                length_penalty_form=form, constraints=constraints,
            )  # fmt: skip
        outputs = []
        for i in range(rows):
            hypotheses = []
            for j, (row, log_prob) in enumerate(
                zip(tokens[i], log_probs[i], strict=True)
            ):
                if hypotheses and log_prob < IMPOSSIBLE / 2:
                    continue  # an empty beam slot (vocabulary < beam)
                # Generated tokens are never the pad id: the first ends a row.
                row = row.tolist()
                row = row[: row.index(self.pad_id)] if self.pad_id in row else row
                if scores is None:  # greedy search ranks by log P alone
                    score = float(log_prob) / search.penalty(len(row))
                else:
                    score = float(scores[i, j])
                hypotheses.append((row, score))
            outputs.append(hypotheses)
        return outputs


class _Unsaved:
    """A model to compute with that is not the translator's state: Keras
    tracks and saves the models a translator's attributes name, never one
    this plain object holds."""

    __slots__ = ("model",)

    def __init__(self):
        self.model = None


def _length_per_width(max_length):
    """The longest length (from 1 to ``max_length``) of each padded width."""
    lengths = {}
    for length in range(1, (max_length or 256) + 1):
        lengths[shapes.width(length, max_length)] = length
    return sorted(lengths.values())
