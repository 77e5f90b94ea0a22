"""A Marian (OPUS-MT) checkpoint as this package's ``Transformer``.

Marian's models (Hugging Face's ``MarianMTModel``) are the paper's post-LN
encoder-decoder with sinusoidal positions and embeddings tied to the output
projection. What differs is expressed without a new layer:

- **Config fields** (``TransformerConfig``): the feed-forward ``activation``
  (mostly swish, GELU or ReLU), a ``logits_bias`` (``final_logits_bias``),
  ``layer_norm_epsilon`` 1e-5 (PyTorch's default; or the config's own
  ``layer_norm_epsilon``, which ``export.marian`` writes and transformers
  ignores), ``scale_embeddings`` (the checkpoint's ``scale_embedding``),
  separate source and target vocabularies (``share_embeddings=False``).
- **The sinusoid's layout, by a permutation of the model dimension.** Marian
  puts the sines of all frequencies first, then the cosines; §3.5 interleaves
  them. Nothing else in the model depends on the order of the residual
  stream's coordinates: a layer norm averages over all of them, and
  attention and the feed-forward network read the stream only through
  matrices. So the weights are permuted once, at import: every row of a
  matrix that reads the stream, every column of one that writes it, the
  embeddings' columns and the layer norms' vectors. The permuted model with
  the paper's sinusoid computes Marian's function exactly (one gather per
  weight), where a layout option would have put a second sinusoid into every
  model's code for the sake of importing.
- **The special ids, by an order of the vocabulary.** Marian's ``</s>`` is 0,
  ``<unk>`` 1 and ``<pad>`` the last id, and decoding starts from ``<pad>``;
  this package's are fixed (``special_tokens``: 0 pad, 1 start, 2 end,
  3 unk), and the padding masks hide id 0. The embedding rows (and the
  logits bias) are reordered to put Marian's pad, start, end and unk rows at
  0-3 and the other tokens after them in Marian's order. The start id gets a
  copy of the row Marian starts from, so the vocabulary grows by one row when
  that row is the pad's: it is embedded as Marian embeds it, and never hidden
  as padding. Marian's generation never emits ``<pad>``; the searches here
  never emit pad or start, which are that same row.

``id_map`` gives, for each of the model's ids, the Marian id it stands for:
``logits[..., i]`` here equals Marian's ``logits[..., id_map[i]]``.
"""

import dataclasses
import json
import os

import numpy as np

from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID

# Hugging Face's activation names and Keras' for the same function
# (``swish`` is SiLU, ``x * sigmoid(x)``; ``gelu`` the exact, erf form).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# Marian's layer norms are PyTorch's ``nn.LayerNorm`` with its default.
LAYER_NORM_EPSILON = 1e-5
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)


@dataclasses.dataclass(frozen=True)
class MarianCheckpoint:
    """A Marian checkpoint read into this package's terms.

    Attributes:
        arguments: the ``Transformer`` constructor's arguments.
        source_ids, target_ids: int arrays; entry ``i`` is the Marian id
            that this package's id ``i`` stands for (one array when the
            vocabulary is shared).
        weights: the model's weights by Keras path, permuted and reordered.
        config: the checkpoint's ``config.json``.
        special: Marian's ``{"pad", "start", "end", "unk"}`` ids.
        sizes: Marian's source and target vocabulary sizes.
    """

    arguments: dict
    source_ids: np.ndarray
    target_ids: np.ndarray
    weights: dict
    config: dict
    special: dict
    sizes: tuple


def read_config(folder):
    """The checkpoint's ``config.json``, refused with a reason where this
    package cannot express it."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: no config.json; not a Marian checkpoint folder"
        )
    with open(path, encoding="utf-8") as file:
        config = json.load(file)
    if config.get("model_type") != "marian":
        raise ValueError(
            f"{path}: model_type {config.get('model_type')!r}; only 'marian' "
            "checkpoints (MarianMTModel) can be imported."
        )
    problems = []
    for ours, theirs in (
        ("encoder_layers", "decoder_layers"),
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(ours) != config.get(theirs):
            problems.append(
                f"{ours}={config.get(ours)} but {theirs}={config.get(theirs)}"
            )
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        problems.append(
            f"activation_function={activation!r} (supported: {sorted(ACTIVATIONS)})"
        )
    for flag in ("normalize_before", "normalize_embedding", "add_final_layer_norm"):
        if config.get(flag):
            problems.append(f"{flag}=true (the paper's post-LN has no such norm)")
    epsilon = config.get("layer_norm_epsilon", LAYER_NORM_EPSILON)
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, (int, float))
        or not (0 < epsilon < 1)
    ):
        problems.append(f"layer_norm_epsilon={epsilon!r} (a number in (0, 1))")
    if not config.get("tie_word_embeddings", True):
        problems.append("tie_word_embeddings=false (the output projection here is "
                        "the target embedding)")  # fmt: skip
    if problems:
        raise ValueError(f"{path}: cannot import: " + "; ".join(problems))
    return config


def transformer_arguments(config, source_size, target_size):
    """The ``Transformer`` arguments of a Marian config, for vocabularies of
    ``source_size`` and ``target_size`` ids (after ``vocabulary_order``)."""
    shared = bool(config.get("share_encoder_decoder_embeddings", True))
    return {
        "src_vocab_size": int(source_size),
        "tgt_vocab_size": int(target_size),
        "num_layers": int(config["encoder_layers"]),
        "d_model": int(config["d_model"]),
        "num_heads": int(config["encoder_attention_heads"]),
        "d_ff": int(config["encoder_ffn_dim"]),
        "dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "share_embeddings": shared,
        "norm_first": False,
        "max_length": int(config["max_position_embeddings"]),
        # Not a MarianConfig field: export.marian writes the model's, which
        # transformers ignores (computing with 1e-5).
        "layer_norm_epsilon": float(
            config.get("layer_norm_epsilon", LAYER_NORM_EPSILON)
        ),
        "activation": ACTIVATIONS[config.get("activation_function", "gelu")],
        "logits_bias": True,
        "scale_embeddings": bool(config.get("scale_embedding", False)),
    }


def vocabulary_order(size, pad, start, end, unk):
    """The Marian id of each of this package's ids, for a vocabulary of
    ``size`` Marian ids: ``[pad, start, end, unk]``, then every other id in
    Marian's order (``start`` again there unless it is ``pad``, ``end`` or
    ``unk``)."""
    special = {"pad": pad, "start": start, "end": end, "unk": unk}
    for name, value in special.items():
        if not 0 <= int(value) < size:
            raise ValueError(
                f"the {name} id {value} is outside the vocabulary of {size} ids"
            )
    if len({pad, end, unk}) < 3:
        raise ValueError(
            f"pad ({pad}), end ({end}) and unk ({unk}) must be three different ids"
        )
    fixed = [None] * 4
    fixed[PAD_ID], fixed[START_ID], fixed[END_ID], fixed[UNK_ID] = pad, start, end, unk
    others = [i for i in range(size) if i not in (pad, end, unk)]
    return np.asarray(fixed + others, dtype="int64")


def residual_order(d_model):
    """Marian's coordinate of each of this package's model coordinates:
    §3.5's column ``2i`` is the sine of frequency ``i`` (Marian's column
    ``i``), column ``2i + 1`` its cosine (Marian's ``d_model/2 + i``)."""
    if d_model % 2:
        raise ValueError(f"d_model must be even for the sinusoid. Received: {d_model}")
    half = d_model // 2
    order = np.empty(d_model, dtype="int64")
    order[0::2] = np.arange(half)
    order[1::2] = half + np.arange(half)
    return order


def read_weights(folder):
    """The checkpoint's tensors as float32 NumPy arrays, by name (without a
    leading ``model.``): safetensors (one file or shards), else a PyTorch
    ``.bin`` (which needs PyTorch)."""
    found = [
        name for name in WEIGHT_FILES if os.path.isfile(os.path.join(folder, name))
    ]
    if not found:
        raise FileNotFoundError(
            f"{folder}: none of {', '.join(WEIGHT_FILES)}; not a checkpoint folder"
        )
    name = found[0]
    path = os.path.join(folder, name)
    if name == "pytorch_model.bin":
        tensors = _read_torch(path)
    else:
        files = [path]
        if name.endswith(".index.json"):
            with open(path, encoding="utf-8") as file:
                shards = sorted(set(json.load(file)["weight_map"].values()))
            files = [os.path.join(folder, shard) for shard in shards]
        tensors = {}
        for file in files:
            tensors.update(_read_safetensors(file))
    return {
        key.removeprefix("model."): np.asarray(value, dtype="float32")
        for key, value in tensors.items()
    }


def _read_safetensors(path):
    try:
        from safetensors.numpy import load_file
    except ImportError as error:
        raise ImportError(
            f"reading {path} needs the safetensors package: "
            "pip install 'keras-transformer-aiayn[pretrained]'"
        ) from error
    return load_file(path)


def _read_torch(path):
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"{path} is a PyTorch checkpoint, which needs PyTorch to read: "
            "pip install 'keras-transformer-aiayn[torch]' (or a checkpoint "
            "with model.safetensors)"
        ) from error
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {key: value.float().numpy() for key, value in state.items()}


def read_checkpoint(folder, unk_id=1):
    """A ``MarianCheckpoint`` from a checkpoint folder.

    Args:
        folder: a folder with ``config.json`` and the weights.
        unk_id: Marian's id of ``<unk>`` (``vocab.json``'s; 1 in OPUS-MT).
    """
    config = read_config(folder)
    tensors = read_weights(folder)
    pad = int(config["pad_token_id"])
    start = int(config.get("decoder_start_token_id", pad))
    end = _single(config.get("eos_token_id", 0), "eos_token_id")
    size = int(config["vocab_size"])
    target_size = int(config.get("decoder_vocab_size") or size)
    shared = bool(config.get("share_encoder_decoder_embeddings", True))
    if shared and target_size != size:
        raise ValueError(
            f"{folder}: shared embeddings but vocab_size={size}, "
            f"decoder_vocab_size={target_size}"
        )
    special = {"pad": pad, "start": start, "end": end, "unk": int(unk_id)}
    source_ids = vocabulary_order(size, **special)
    target_ids = vocabulary_order(target_size, **special)
    arguments = transformer_arguments(config, len(source_ids), len(target_ids))
    weights = _our_weights(tensors, arguments, source_ids, target_ids, folder)
    return MarianCheckpoint(
        arguments, source_ids, target_ids, weights, config, special, (size, target_size)
    )


def _single(value, name):
    if isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"{name} lists several ids ({value}); one is needed")
        value = value[0]
    return int(value)


class _Tensors:
    """Marian's tensors, read into Keras' layout: ``(in, out)`` kernels with
    the residual stream's coordinates in §3.5's order; remembers which were
    used."""

    def __init__(self, tensors, d_model, folder):
        self.tensors, self.folder = tensors, folder
        self.order = residual_order(d_model)
        self.used = set()

    def take(self, name):
        if name not in self.tensors:
            raise ValueError(f"{self.folder}: the checkpoint has no tensor {name!r}")
        self.used.add(name)
        return self.tensors[name]

    def first(self, *names):
        """The first of ``names`` the checkpoint has (tied copies are saved
        once, under one of them)."""
        found = [name for name in names if name in self.tensors]
        return self.take(found[0] if found else names[0])

    def reads(self, name):
        """A Linear reading the residual stream: its rows permuted."""
        return self.take(f"{name}.weight").T[self.order, :], self.take(f"{name}.bias")

    def writes(self, name):
        """A Linear writing to the residual stream: its columns permuted."""
        weight, bias = self.take(f"{name}.weight"), self.take(f"{name}.bias")
        return weight.T[:, self.order], bias[self.order]

    def norm(self, name):
        order = self.order
        return self.take(f"{name}.weight")[order], self.take(f"{name}.bias")[order]

    def unused(self):
        skipped = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
        return sorted(
            name for name in set(self.tensors) - self.used
            if not name.endswith("embed_positions.weight")  # the fixed sinusoid
            and name not in skipped
        )  # fmt: skip


_ATTENTIONS = {"self_attention": "self_attn", "cross_attention": "encoder_attn"}
_PROJECTIONS = (("query", "q"), ("key", "k"), ("value", "v"))


def _embedding_weights(read, shared, source_ids, target_ids):
    """The embeddings (rows reordered, columns permuted) and the logits bias."""
    order = read.order
    source = read.first("encoder.embed_tokens.weight", "shared.weight")
    target = read.first("decoder.embed_tokens.weight", "shared.weight")
    bias = read.take("final_logits_bias")[0]
    if "lm_head.weight" in read.tensors:  # saved tied: the same matrix
        if not np.array_equal(read.take("lm_head.weight"), target):
            raise ValueError(
                f"{read.folder}: lm_head.weight differs from the decoder "
                "embedding; an untied output projection cannot be imported"
            )
    if shared:
        return {
            "shared_embedding/embeddings": source[source_ids][:, order],
            "shared_embedding/logits_bias": bias[source_ids],
        }
    return {
        "source_embedding/embeddings": source[source_ids][:, order],
        "target_embedding/embeddings": target[target_ids][:, order],
        "target_embedding/logits_bias": bias[target_ids],
    }


def _block_weights(read, side, i):
    """One encoder or decoder layer's weights, by Keras path."""
    theirs, ours = f"{side}.layers.{i}", f"{side}_block_{i}"
    out = {}
    attentions = ["self_attention"] + (["cross_attention"] if side == "decoder" else [])
    for attention in attentions:
        prefix = f"{theirs}.{_ATTENTIONS[attention]}"
        for keras_name, hf_name in _PROJECTIONS:
            kernel, bias = read.reads(f"{prefix}.{hf_name}_proj")
            out[f"{ours}/{attention}/{keras_name}/kernel"] = kernel
            out[f"{ours}/{attention}/{keras_name}/bias"] = bias
        kernel, bias = read.writes(f"{prefix}.out_proj")
        out[f"{ours}/{attention}/attention_output/kernel"] = kernel
        out[f"{ours}/{attention}/attention_output/bias"] = bias
        gamma, beta = read.norm(f"{prefix}_layer_norm")
        out[f"{ours}/{attention}_norm/gamma"] = gamma
        out[f"{ours}/{attention}_norm/beta"] = beta
    kernel, bias = read.reads(f"{theirs}.fc1")
    out[f"{ours}/ffn_inner/kernel"], out[f"{ours}/ffn_inner/bias"] = kernel, bias
    kernel, bias = read.writes(f"{theirs}.fc2")
    out[f"{ours}/ffn_outer/kernel"], out[f"{ours}/ffn_outer/bias"] = kernel, bias
    gamma, beta = read.norm(f"{theirs}.final_layer_norm")
    out[f"{ours}/ffn_norm/gamma"], out[f"{ours}/ffn_norm/beta"] = gamma, beta
    return out


def _our_weights(tensors, arguments, source_ids, target_ids, folder):
    """Keras path -> array: Marian's tensors transposed to Keras' ``(in,
    out)`` kernels, their residual coordinates permuted, vocabularies
    reordered; every tensor of the checkpoint used (but the sinusoid's)."""
    read = _Tensors(tensors, arguments["d_model"], folder)
    out = _embedding_weights(
        read, arguments["share_embeddings"], source_ids, target_ids
    )
    for side in ("encoder", "decoder"):
        for i in range(arguments["num_layers"]):
            out.update(_block_weights(read, side, i))
    unused = read.unused()
    if unused:
        raise ValueError(
            f"{folder}: tensors this architecture has no place for: {unused[:8]}"
        )
    return {path: np.ascontiguousarray(value) for path, value in out.items()}


def marian_transformer(folder, unk_id=1, dtype=None):
    """``(Transformer, MarianCheckpoint)``: the checkpoint in ``folder`` as
    this package's model, with its weights."""
    from keras_transformer.model.transformer import Transformer

    checkpoint = read_checkpoint(folder, unk_id=unk_id)
    model = Transformer(**checkpoint.arguments, dtype=dtype, name="transformer")
    variables = {variable.path: variable for variable in model.weights}
    missing = sorted(set(variables) - set(checkpoint.weights))
    if missing:
        raise ValueError(f"{folder}: no weights for {missing[:8]}")
    for path, value in checkpoint.weights.items():
        variable = variables[path]
        if tuple(variable.shape) != value.shape:
            raise ValueError(
                f"{folder}: {path} has shape {value.shape}, the model {variable.shape}"
            )
        variable.assign(value)
    return model, checkpoint
