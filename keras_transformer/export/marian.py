"""A translator as a Marian checkpoint folder (Hugging Face's ``MarianMTModel``).

``write_marian(translator, folder)`` writes what
``transformers.MarianMTModel.from_pretrained(folder)`` and
``transformers.MarianTokenizer.from_pretrained(folder)`` load, and what
``Translator.from_preset(folder)`` imports back. It is
``pretrained/marian.py`` run backwards, with NumPy and ``safetensors`` alone
(no PyTorch, no transformers):

- **The residual stream's coordinates** are put back in Marian's order (all
  sines, then all cosines) by the inverse of
  ``pretrained.marian.residual_order``: the rows of every matrix that reads
  the stream, the columns of every one that writes it, the embeddings'
  columns and the layer norms' vectors.
- **The vocabulary.** Marian decodes from its ``<pad>`` row; this package
  from its start id's. So the start row becomes Marian's ``<pad>``, the end
  row ``</s>`` (0), the unknown row ``<unk>`` (1), the other ids follow in
  order and ``<pad>`` comes last, as in OPUS-MT's vocabularies: Marian's
  ids are this package's less two, and a vocabulary one row smaller. The
  pad row (id 0) is left out: it is only ever embedded at padded positions,
  whose outputs nothing reads (the padding mask hides a padded source
  position from the encoder's self-attention and the decoder's
  cross-attention; target padding comes after a sentence's last token,
  which the causal mask hides it from, and the loss skips it), and the
  searches never emit it. Imported back, the pad id gets a copy of the
  start row: the model computes the same logits everywhere but in the pad
  column, which no search reads. (``generation_config.json`` forbids
  ``<pad>`` as the searches here forbid the start id.) When the source and
  target vocabularies differ in size, ``<pad>`` is the last id of the
  smaller one and the same id in the other, since a checkpoint has one pad
  id; the larger one then has a ``target_vocab.json`` of its own.
- **The tokenizer**: this package's single SentencePiece model serves as
  both ``source.spm`` and ``target.spm``, and ``vocab.json`` names each
  Marian id by its piece (placeholders for ids the model has and the
  tokenizer not). A translator imported from a Marian checkpoint is written
  back with its own files and its own order of the ids: the folder is the
  checkpoint it came from, with the weights it has now.
- **The layer norm's epsilon.** transformers' ``MarianMTModel`` computes
  with PyTorch's default, 1e-5, and has no setting for it; the paper's
  models here use 1e-6. ``config.json`` carries the model's as
  ``layer_norm_epsilon``, which transformers keeps but ignores and
  ``pretrained.marian.read_config`` honours: the round trip through
  ``from_preset`` is exact, while transformers' logits differ from this
  package's by what the epsilon changes: for the number-task model of
  tests/fixtures (1e-6), 2e-5 at most on logits of up to 8 (3e-6 of their
  scale), where the same weights with 1e-5 agree within float32 rounding
  (3e-6, 4e-7 of it).
- **The search** (``generation_config.json``): the translator's default
  search (the paper's: 4 beams, α = 0.6; ``search=`` replaces it) as
  ``num_beams`` and ``length_penalty`` (transformers ranks finished
  hypotheses by ``log P / |Y| ** α``, not GNMT's ``((5 + |Y|) / 6) ** α``),
  ``renormalize_logits``, ``<pad>`` forbidden, and ``max_length`` one more
  than the most tokens this translator generates, since transformers counts
  the decoder's start token in it.

What Marian cannot express raises ``ValueError`` naming it: pre-LN
(``norm_first=True``; Marian normalises after each residual sum),
``max_length=None`` (Marian's position table has a size), a position base
other than 10000, a feed-forward activation other than ReLU, GELU and
swish, a tokenizer that is neither this package's SentencePiece tokenizer
nor an imported checkpoint's, and weights the architecture has no place for
(a Keras model quantised in place, for one).

CTranslate2's own converter (``ct2-transformers-converter``) reads the
folder, but its Marian loader starts the decoder from a zero vector rather
than the ``<pad>`` row (Marian's own models keep that row at zero): it
computes this model only where the start row is zero. ``kt-export --format
ctranslate2`` writes this package's models for CTranslate2 exactly.
"""

import dataclasses
import json
import os

import numpy as np

from keras_transformer import atomic
from keras_transformer.data.sentencepiece import MODEL_FILE
from keras_transformer.pretrained.marian import residual_order, vocabulary_order
from keras_transformer.pretrained.marian_vocabularies import (
    SOURCE_MODEL,
    TARGET_MODEL,
    TARGET_VOCABULARY,
    VOCABULARY,
)
from keras_transformer.search.options import SearchOptions
from keras_transformer.special_tokens import START_ID

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Keras' names of the feed-forward activations and Hugging Face's for the
# same functions (GELU exact in both; swish is SiLU).
MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish", "swish": "swish"}
# The pieces Marian's tokenizer looks its special ids up by.
MARIAN_PIECES = {"pad": "<pad>", "end": "</s>", "unk": "<unk>"}
# Marian's sinusoid has this base and no setting for another.
POSITION_BASE = 10000.0


@dataclasses.dataclass(frozen=True)
class MarianVocabulary:
    """How a translator's ids become a Marian checkpoint's.

    Attributes:
        special: Marian's ``{"pad", "start", "end", "unk"}`` ids.
        sizes: Marian's source and target vocabulary sizes.
        rows: per side (source, target), an int array: entry ``m`` is the
            row of this package's embedding that Marian's id ``m`` gets.
        files: the tokenizer's files, by name (bytes).
    """

    special: dict
    sizes: tuple
    rows: tuple
    files: dict


def write_marian(translator, folder, overwrite=False, search=None):
    """Write ``translator`` as a Marian checkpoint folder.

    Args:
        translator: a ``Translator`` (this package's SentencePiece tokenizer
            and a post-LN ``Transformer``, or one from
            ``Translator.from_preset``).
        folder: the folder to write. It must not exist, or be empty, unless
            ``overwrite``.
        overwrite: replace an existing non-empty ``folder`` (it is replaced
            only once the new one is complete).
        search: optional ``SearchOptions`` for ``generation_config.json``;
            by default the translator's own default search.

    Returns:
        str, the absolute path of ``folder``.

    Raises:
        ValueError: a model or tokenizer Marian cannot express (the message
            says what).
        FileExistsError: ``folder`` exists and is not empty, and
            ``overwrite`` is False (it is left as it was).
        ImportError: ``safetensors`` or ``sentencepiece`` is missing.
        atomic.DiskFullError: no room for the checkpoint; nothing is left.
    """
    folder = os.path.abspath(os.fspath(folder))
    _check_folder(folder, overwrite)
    model = _checked_model(translator)
    vocabulary = marian_vocabulary(translator)
    files = {
        WEIGHTS: _safetensors_bytes(marian_tensors(model, vocabulary)),
        CONFIG: _json(marian_config(model, vocabulary)),
        GENERATION_CONFIG: _json(
            generation_config(translator, vocabulary, _search(translator, search))
        ),
        TOKENIZER_CONFIG: _json(
            tokenizer_config(model, vocabulary, translator.languages)
        ),
        **vocabulary.files,
    }
    _write_folder(folder, files, overwrite)
    return folder


# -- what Marian can express -----------------------------------------------------------


def _checked_model(translator):
    """The translator's Transformer, or ``ValueError`` naming what Marian
    cannot express."""
    model = getattr(translator, "transformer", None)
    if model is None or not hasattr(model, "config"):
        raise TypeError(
            "translator must be a keras_transformer Translator (a tokenizer and "
            f"a Transformer). Received: {type(translator).__name__}"
        )
    config = model.config
    problems = []
    if config.norm_first:
        problems.append(
            "norm_first=True (pre-LN): Marian's layers normalise after each "
            "residual sum (post-LN) and have no final norms"
        )
    if config.max_length is None:
        problems.append(
            "max_length=None: Marian's position table has a fixed size "
            "(rebuild the Transformer with a max_length; its weights do not "
            "depend on it)"
        )
    if config.activation not in MARIAN_ACTIVATIONS:
        problems.append(
            f"activation={config.activation!r}: Marian's feed-forward "
            f"activations are {sorted(MARIAN_ACTIVATIONS)}"
        )
    for layer in (model.encoder_position, model.decoder_position):
        if float(getattr(layer, "base", POSITION_BASE)) != POSITION_BASE:
            problems.append(
                f"{layer.name} has the base {layer.base}; Marian's sinusoid has "
                f"{POSITION_BASE:g}"
            )
    if problems:
        raise ValueError(
            "cannot write a Marian checkpoint: " + "; ".join(problems) + "."
        )
    return model


def _search(translator, search):
    if search is not None:
        return SearchOptions.of(search)
    own = getattr(translator, "search_options", None)
    return own() if callable(own) else SearchOptions()


# -- the vocabulary --------------------------------------------------------------------


def marian_vocabulary(translator):
    """The ``MarianVocabulary`` of a translator, from its tokenizer's
    contract: one SentencePiece model's pieces in the model's id order, or
    the files and order of an imported checkpoint's."""
    tokenizer = translator.tokenizer
    if tokenizer.kind == "marian":
        return _imported_vocabulary(tokenizer)
    if tokenizer.kind != "sentencepiece":
        raise ValueError(
            f"cannot write a Marian checkpoint: the tokenizer is of kind "
            f"{tokenizer.kind!r}; Marian's tokenizer is SentencePiece models "
            "and a vocab.json (make_tokenizer's, or an imported checkpoint's)."
        )
    try:
        tokenizer.check_reserved()
    except ValueError as error:
        raise ValueError(f"cannot write a Marian checkpoint: {error}") from None
    pieces = tokenizer.source_pieces()
    proto = tokenizer.export_files()[MODEL_FILE]
    model = translator.transformer
    sizes = (int(model.src_vocab_size) - 1, int(model.tgt_vocab_size) - 1)
    # One pad id for both sides, the last of the smaller vocabulary.
    pad = min(sizes) - 1
    special = {"pad": pad, "start": pad, "end": 0, "unk": 1}
    rows = tuple(_rows(vocabulary_order(size, **special)) for size in sizes)
    names = [_names(pieces, size + 1) for size in sizes]  # by this package's ids
    vocabularies = [
        {names[side][int(row)]: m for m, row in enumerate(rows[side])}
        for side in (0, 1)
    ]
    files = {SOURCE_MODEL: proto, TARGET_MODEL: proto}
    files[VOCABULARY] = _json(vocabularies[0])
    if vocabularies[1] != vocabularies[0]:
        files[TARGET_VOCABULARY] = _json(vocabularies[1])
    return MarianVocabulary(special, sizes, rows, files)


def _names(pieces, size):
    """A Marian piece name for each of this package's ``size`` ids: the
    tokenizer's pieces, ``<pad>`` for the start id (the row Marian decodes
    from), distinct placeholders past the tokenizer's pieces."""
    names = list(pieces[:size])
    names[START_ID] = MARIAN_PIECES["pad"]
    taken = set(names)
    for i in range(len(names), size):
        name = f"<keras_transformer_unused_{i}>"
        while name in taken:
            name = f"<{name}>"
        names.append(name)
        taken.add(name)
    # The pad id is left out: its piece may be reused by the start id.
    if len(set(names[1:])) != size - 1:
        raise ValueError(
            "cannot write a Marian checkpoint: the tokenizer has pieces that "
            "repeat <pad>, </s> or <unk>, which vocab.json could not tell apart."
        )
    return names


def _rows(order):
    """For each Marian id, the row of this package's embedding it gets:
    ``order`` is the Marian id of each of this package's ids (the import's
    ``vocabulary_order``). Where several ids share a Marian id, the start
    id's row wins (the row decoding starts from), else the lowest id's: the
    pad id's row is never taken when another stands for the same id."""
    rows = np.full(int(order.max()) + 1, -1, dtype="int64")
    for ours in range(len(order) - 1, -1, -1):
        rows[order[ours]] = ours
    rows[order[START_ID]] = START_ID
    if (rows < 0).any():
        missing = np.flatnonzero(rows < 0).tolist()
        raise ValueError(f"no row of the model stands for Marian's ids {missing[:8]}")
    return rows


def _imported_vocabulary(tokenizer):
    """An imported checkpoint's vocabulary: its files as they came, its ids
    in the order the import gave them."""
    settings = tokenizer.export_settings()
    special = {name: int(i) for name, i in settings["special"].items()}
    sizes = tuple(int(size) for size in settings["sizes"])
    rows = tuple(_rows(vocabulary_order(size, **special)) for size in sizes)
    return MarianVocabulary(special, sizes, rows, tokenizer.export_files())


# -- the weights -----------------------------------------------------------------------


class _Weights:
    """The model's weights as float32 NumPy arrays by Keras path, taken back
    into Marian's layout (``(out, in)`` matrices, Marian's order of the
    residual stream's coordinates); remembers which were used."""

    def __init__(self, model):
        import keras

        self.weights = {
            variable.path: np.asarray(
                keras.ops.convert_to_numpy(variable.value)
            ).astype("float32")
            for variable in model.weights
        }
        # The import's order gathers Marian's coordinates; its inverse
        # scatters them back.
        self.inverse = np.argsort(residual_order(int(model.config.d_model)))
        self.used = set()

    def take(self, path):
        if path not in self.weights:
            raise ValueError(
                f"cannot write a Marian checkpoint: the model has no weight {path!r}"
            )
        self.used.add(path)
        return self.weights[path]

    def reads(self, path):
        """A Dense layer reading the residual stream: Marian's Linear."""
        kernel = self.take(f"{path}/kernel")[self.inverse, :]
        return kernel.T, self.take(f"{path}/bias")

    def writes(self, path):
        """A Dense layer writing to the residual stream: Marian's Linear."""
        kernel = self.take(f"{path}/kernel")[:, self.inverse]
        return kernel.T, self.take(f"{path}/bias")[self.inverse]

    def norm(self, path):
        inverse = self.inverse
        return self.take(f"{path}/gamma")[inverse], self.take(f"{path}/beta")[inverse]

    def unused(self):
        return sorted(set(self.weights) - self.used)


_ATTENTIONS = {"self_attention": "self_attn", "cross_attention": "encoder_attn"}
_PROJECTIONS = (("query", "q"), ("key", "k"), ("value", "v"))


def _embedding_tensors(read, model, vocabulary):
    """Marian's embeddings and ``final_logits_bias``: rows in Marian's ids,
    columns in Marian's order."""
    source_rows, target_rows = vocabulary.rows
    inverse = read.inverse
    if model.config.share_embeddings:
        source = target = read.take("shared_embedding/embeddings")
        bias_path = "shared_embedding/logits_bias"
    else:
        source = read.take("source_embedding/embeddings")
        target = read.take("target_embedding/embeddings")
        bias_path = "target_embedding/logits_bias"
    bias = (
        read.take(bias_path)
        if model.config.logits_bias
        else np.zeros(len(target), "float32")
    )
    out = {"final_logits_bias": bias[target_rows][None, :]}
    if model.config.share_embeddings:
        out["model.shared.weight"] = source[source_rows][:, inverse]
    else:
        out["model.encoder.embed_tokens.weight"] = source[source_rows][:, inverse]
        out["model.decoder.embed_tokens.weight"] = target[target_rows][:, inverse]
    return out


def _block_tensors(read, side, i):
    """One encoder or decoder layer's tensors, by Marian's names."""
    ours, theirs = f"{side}_block_{i}", f"model.{side}.layers.{i}"
    out = {}

    def linear(name, weights):
        out[f"{name}.weight"], out[f"{name}.bias"] = weights

    def norm(name, path):
        out[f"{name}.weight"], out[f"{name}.bias"] = read.norm(path)

    attentions = ["self_attention"] + (["cross_attention"] if side == "decoder" else [])
    for attention in attentions:
        prefix = f"{theirs}.{_ATTENTIONS[attention]}"
        for keras_name, hf_name in _PROJECTIONS:
            weights = read.reads(f"{ours}/{attention}/{keras_name}")
            linear(f"{prefix}.{hf_name}_proj", weights)
        output = read.writes(f"{ours}/{attention}/attention_output")
        linear(f"{prefix}.out_proj", output)
        norm(f"{prefix}_layer_norm", f"{ours}/{attention}_norm")
    linear(f"{theirs}.fc1", read.reads(f"{ours}/ffn_inner"))
    linear(f"{theirs}.fc2", read.writes(f"{ours}/ffn_outer"))
    norm(f"{theirs}.final_layer_norm", f"{ours}/ffn_norm")
    return out


def marian_tensors(model, vocabulary):
    """Marian's tensors by name (float32, contiguous): every weight of the
    model placed, none left over (the pad row aside, which Marian has no
    place for and no need of)."""
    read = _Weights(model)
    out = _embedding_tensors(read, model, vocabulary)
    for side in ("encoder", "decoder"):
        for i in range(int(model.config.num_layers)):
            out.update(_block_tensors(read, side, i))
    unused = read.unused()
    if unused:
        raise ValueError(
            "cannot write a Marian checkpoint: weights Marian's architecture has "
            f"no place for: {unused[:8]}"
        )
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def _safetensors_bytes(tensors):
    try:
        from safetensors.numpy import save
    except ImportError as error:
        raise ImportError(
            "writing a Marian checkpoint needs the safetensors package: "
            "pip install 'keras-transformer-aiayn[pretrained]'"
        ) from error
    # transformers loads safetensors whose format is "pt" (PyTorch's layout,
    # which these arrays have) without converting them.
    return save(tensors, metadata={"format": "pt"})


# -- the configs -----------------------------------------------------------------------


def marian_config(model, vocabulary):
    """``config.json``: a ``MarianConfig``, with the layer norm's epsilon."""
    config = model.config
    special = vocabulary.special
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": vocabulary.sizes[0],
        "decoder_vocab_size": vocabulary.sizes[1],
        "share_encoder_decoder_embeddings": bool(config.share_embeddings),
        "tie_word_embeddings": True,
        "d_model": int(config.d_model),
        "encoder_layers": int(config.num_layers),
        "decoder_layers": int(config.num_layers),
        "encoder_attention_heads": int(config.num_heads),
        "decoder_attention_heads": int(config.num_heads),
        "encoder_ffn_dim": int(config.d_ff),
        "decoder_ffn_dim": int(config.d_ff),
        "activation_function": MARIAN_ACTIVATIONS[config.activation],
        "max_position_embeddings": int(config.max_length),
        "scale_embedding": bool(config.scale_embeddings),
        "normalize_before": False,
        "dropout": float(config.dropout),
        "attention_dropout": float(config.attention_dropout),
        # No dropout inside the feed-forward network here (§5.4).
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "pad_token_id": special["pad"],
        "decoder_start_token_id": special["start"],
        "eos_token_id": special["end"],
        "forced_eos_token_id": special["end"],
        "bos_token_id": None,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dtype": "float32",
        # Not a MarianConfig field: transformers keeps it and computes with
        # 1e-5; pretrained.marian.read_config reads it back.
        "layer_norm_epsilon": float(config.layer_norm_epsilon),
    }


def generation_config(translator, vocabulary, search):
    """``generation_config.json``: how transformers' ``generate`` searches."""
    special = vocabulary.special
    limit = getattr(translator, "max_output_length", None)
    limit = int(translator.transformer.config.max_length) if limit is None else limit
    return {
        "num_beams": int(search.beam_size),
        "length_penalty": float(search.length_penalty),
        "renormalize_logits": True,
        # The searches here never emit the start id, Marian's <pad>.
        "bad_words_ids": [[special["pad"]]],
        "decoder_start_token_id": special["start"],
        "eos_token_id": special["end"],
        "forced_eos_token_id": special["end"],
        "pad_token_id": special["pad"],
        # transformers counts the start token in max_length.
        "max_length": int(limit) + 1,
    }


def tokenizer_config(model, vocabulary, languages=None):
    """``tokenizer_config.json``: ``MarianTokenizer``'s settings, with the
    translator's language codes where it has them."""
    source, target = languages or (None, None)
    return {
        "tokenizer_class": "MarianTokenizer",
        "model_max_length": int(model.config.max_length),
        "separate_vocabs": TARGET_VOCABULARY in vocabulary.files,
        "source_lang": source,
        "target_lang": target,
        "unk_token": MARIAN_PIECES["unk"],
        "eos_token": MARIAN_PIECES["end"],
        "pad_token": MARIAN_PIECES["pad"],
    }


def _json(data):
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# -- the folder ------------------------------------------------------------------------


def _check_folder(folder, overwrite):
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise FileExistsError(f"{folder} exists and is not a directory.")
    if os.path.isdir(folder) and os.listdir(folder) and not overwrite:
        raise FileExistsError(
            f"{folder} exists and is not empty; give overwrite=True (kt-export: "
            "--overwrite) to replace it, or another folder."
        )


def _write_folder(folder, files, overwrite):
    """``files`` as ``folder``, replaced whole (``atomic.write_folder_atomic``)."""

    def fill(temporary):
        for file_name, data in files.items():
            atomic.write_atomic(
                os.path.join(temporary, file_name), data, "Marian checkpoint"
            )

    needed = sum(len(data) for data in files.values()) + (1 << 20)
    atomic.write_folder_atomic(
        folder,
        fill,
        "Marian checkpoint",
        needed,
        check=lambda: _check_folder(folder, overwrite),
    )
