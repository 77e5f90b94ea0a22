"""A trained ``Translator`` as a CTranslate2 model directory.

``export_ctranslate2(translator, "model_ct2")`` writes it;
``load_ctranslate2("model_ct2").translate(["..."])`` translates with the
calls and options of ``Translator`` (``ctranslate2_translator``).

The converter fills CTranslate2's ``TransformerSpec`` from the Keras weights
with NumPy alone (no PyTorch, no converter of another framework):

- each encoder and decoder layer's attention (the query, key and value
  projections fused as CTranslate2 expects: one ``(3·d, d)`` matrix for
  self-attention, query and ``(2·d, d)`` key-value for cross-attention; Keras
  kernels are ``(in, out)``, CTranslate2's ``(out, in)``), feed-forward
  network (ReLU, GELU or swish) and layer norms, with the model's
  ``layer_norm_epsilon``;
  post-LN (the paper's) or pre-LN with its two final norms (``norm_first``);
- the embeddings, scaled by √d_model; one matrix for source, target and
  output projection where ``share_embeddings`` ties them (CTranslate2 stores
  it once and aliases the other two), three otherwise, the output projection
  being the target embedding, with the model's logits bias if it has one;
- the position table, given explicitly: row ``t`` is
  ``sinusoidal_table(t)`` of this package (sine and cosine interleaved,
  from position 0), computed once by the current Keras backend. CTranslate2's
  built-in table puts all the sines before all the cosines and starts at
  position 1, so it would be a different model. The table has the model's
  ``max_length`` rows: sources are cut to it, as ``Translator`` cuts them,
  and no output is longer;
- the vocabularies: the tokenizer's pieces **in the model's id order**
  (``source_pieces()`` and ``target_pieces()`` of the tokenizer contract,
  ``data.contract``; never a SentencePiece file's order, which an imported
  Marian checkpoint does not share), made distinct and padded with unused
  placeholder names where the model has more ids than the tokenizer; the
  engine hands CTranslate2 these names and maps them back to ids, so a name
  is only a label. ``<unk>``, ``<s>`` (begin and decoder start) and
  ``</s>`` are the names of the reserved ids 3, 1 and 2.

Beside CTranslate2's files go the tokenizer's own (``export_files()``:
``tokenizer.model`` for the package's SentencePiece model; ``source.spm``,
``target.spm``, ``vocab.json`` for an imported Marian checkpoint's) and
``keras_transformer.json`` (package version, model config, the tokenizer's
kind and settings, special ids, output-length rule, the translator's default
search, length-penalty mapping); the folder is written under a temporary
sibling name and renamed into place when complete.
``quantization`` is CTranslate2's weight type (``None`` keeps float32); the
weights are read in float32 whatever the model's dtype policy.

What it cannot express raises ``ValueError`` naming the reason, before
anything is written: a default search with transformers' length penalty
(CTranslate2's engine here ranks by GNMT's; give a search with
``length_penalty_form="gnmt"``), a
``max_length=None`` model (CTranslate2 needs a finite position table),
an activation other than ReLU, GELU and swish, a layer norm without centre
or scale, a Keras layer quantised in place (``model.quantize``: export the
float model and give ``quantization=``). Every model that ``build_model``
makes (post-LN or pre-LN, shared or separate embeddings, any ``num_layers``,
``num_heads``, ``d_ff``) is expressible.
"""

import dataclasses
import math
import os

import numpy as np

from keras_transformer import atomic
from keras_transformer.search.options import LENGTH_PENALTY, SearchOptions

# The format is the engine's to read: written here as it reads it. The
# engine's names are this module's API too (load what you exported).
from keras_transformer.translate.ctranslate2_translator import (
    DEFAULT_BATCH_SIZES,
    FORMAT,
    FORMAT_VERSION,
    METADATA_FILE,
    PATIENCE,
    SEARCH_LENGTH_PENALTY,
    CTranslate2Translator,
    import_ctranslate2,
    load_ctranslate2,
    vocabulary_names,
)

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "CTranslate2Translator",
    "export_ctranslate2",
    "load_ctranslate2",
]

_LENGTH_PENALTY_MAPPING = (
    "alpha is GNMT's: score = log P(Y|X) / ((5 + |Y|) / 6) ** alpha, |Y| "
    "counting the end token. CTranslate2 searches with length_penalty="
    f"{SEARCH_LENGTH_PENALTY} and patience (default {PATIENCE}), returns all "
    "round(beam_size * patience) finished hypotheses with the end token, and "
    "they are re-ranked by that score."
)


def _accepted_quantizations():
    from ctranslate2.specs import model_spec

    return tuple(model_spec.ACCEPTED_MODEL_TYPES)


def check_quantization(quantization):
    """``quantization`` if CTranslate2 can save weights so (None: float32),
    else ``ValueError`` naming the accepted ones."""
    import_ctranslate2()
    accepted = _accepted_quantizations()
    if quantization is None:
        return None
    if not isinstance(quantization, str) or quantization not in accepted:
        raise ValueError(
            f"quantization must be None (float32) or one of {list(accepted)}. "
            f"Received: quantization={quantization!r}"
        )
    return quantization


# -- the export ---------------------------------------------------------------------


def export_ctranslate2(
    translator, out_dir, quantization=None, overwrite=False, search=None
):
    """Write ``translator`` as a CTranslate2 model directory.

    Args:
        translator: a ``Translator``, or the path of a ``.keras`` file
            holding one.
        out_dir: the directory to write. It must not exist, or be empty,
            unless ``overwrite``.
        quantization: CTranslate2's weight type: None (float32), or one of
            ``ctranslate2.specs``' accepted types ("int8", "int8_float32",
            "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
            "float32").
        overwrite: replace an existing non-empty ``out_dir`` (it is
            replaced only once the new one is complete).
        search: the ``SearchOptions`` a call on the export starts from
            (default: the translator's ``default_search``); it must use
            GNMT's length penalty.

    Returns:
        str, the absolute path of ``out_dir``.

    Raises:
        ImportError: ctranslate2 is not installed.
        ValueError: a bad ``quantization``; a model the converter cannot
            express; a file that holds no ``Translator``.
        FileExistsError: ``out_dir`` exists and is not empty, and
            ``overwrite`` is False (it is left as it was).
        atomic.DiskFullError: no room for the model; nothing is left.
    """
    ctranslate2 = import_ctranslate2()
    quantization = check_quantization(quantization)
    out_dir = os.path.abspath(os.fspath(out_dir))
    _check_out_dir(out_dir, overwrite)
    translator = _load_translator(translator)
    search = _default_search(translator, search)
    spec, metadata = _convert(translator)
    metadata["default_search"] = dataclasses.asdict(search)
    metadata["quantization"] = quantization or "float32"
    metadata["ctranslate2_version"] = ctranslate2.__version__
    files = translator.tokenizer.export_files()
    metadata["tokenizer"]["files"] = sorted(files)
    taken = set(files) & {"model.bin", "config.json", METADATA_FILE}
    taken |= {name for name in files if name.endswith("_vocabulary.json")}
    if taken:
        raise ValueError(
            f"The tokenizer's files {sorted(taken)} would overwrite CTranslate2's."
        )

    needed = sum(v.nbytes for v in _arrays(spec)) + (1 << 20)
    needed += sum(len(data) for data in files.values())

    def fill(temporary):
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(temporary)
        for name, data in files.items():
            atomic.write_atomic(os.path.join(temporary, name), data)
        atomic.write_json_atomic(os.path.join(temporary, METADATA_FILE), metadata)

    atomic.write_folder_atomic(
        out_dir,
        fill,
        "CTranslate2 model",
        needed,
        check=lambda: _check_out_dir(out_dir, overwrite),
    )
    return out_dir


def _default_search(translator, search):
    """The search the export keeps as its default, or ``ValueError`` for one
    its engine cannot run."""
    search = SearchOptions.of(translator.default_search if search is None else search)
    # transformers' greedy search is the engine's too (the end forced at the
    # limit), but a default is every call's start, with any beam size: a
    # beam of transformers' form is none of CTranslate2's.
    if search.length_penalty_form != "gnmt":
        raise ValueError(
            "The CTranslate2 export ranks hypotheses by GNMT's length penalty; "
            f"this translator's default search uses {search.length_penalty_form}"
            "'s (an imported checkpoint's generation config), which it cannot "
            'keep: give a search with length_penalty_form="gnmt" '
            "(kt-export --length-penalty-form gnmt)."
        )
    # What a batch holds is the engine's choice (DEFAULT_BATCH_SIZES).
    return SearchOptions.of(search, verbose=0, batch_size=None, fixed_batch=False)


def _check_out_dir(out_dir, overwrite):
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a directory.")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise FileExistsError(
            f"{out_dir} exists and is not empty; give overwrite=True to replace "
            "it (or another directory)."
        )


def _load_translator(translator):
    from keras_transformer.translate.keras_translator import Translator

    if isinstance(translator, (str, os.PathLike)):
        from keras_transformer.saving import load_model

        path = os.fspath(translator)
        model = load_model(path)
        if not isinstance(model, Translator):
            raise ValueError(
                f"{path} holds a {type(model).__name__}, not a keras_transformer "
                "Translator (a tokenizer and a Transformer): build one with "
                "Translator(tokenizer, transformer) and save it, or export that."
            )
        translator = model
    if not isinstance(translator, Translator):
        raise TypeError(
            "translator must be a keras_transformer Translator or the path of a "
            f".keras file holding one. Received: {type(translator).__name__}"
        )
    translator.check_tokenizer()
    return translator


def _numpy(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable)).astype(np.float32)


def _dense(layer, where):
    """``(weight, bias)`` of a Keras ``Dense`` as CTranslate2 takes them:
    weight ``(out, in)``."""
    if getattr(layer, "quantization_mode", None):
        raise ValueError(
            f"{where} is quantized in Keras ({layer.quantization_mode}); export "
            "the float model and give export_ctranslate2 a quantization= instead."
        )
    kernel = _numpy(layer.kernel)
    bias = _numpy(layer.bias) if layer.use_bias else None
    return np.ascontiguousarray(kernel.T), bias


def _set_linear(spec, weights):
    weight, bias = weights
    spec.weight = weight
    if bias is not None:
        spec.bias = bias


def _fused(*parts):
    weights = np.concatenate([w for w, _ in parts], axis=0)
    biases = [b for _, b in parts]
    if all(b is None for b in biases):
        return weights, None
    rows = [
        b if b is not None else np.zeros(w.shape[0], np.float32)
        for (w, _), b in zip(parts, biases, strict=True)
    ]
    return weights, np.concatenate(rows)


def _set_norm(spec, layer, epsilon, where):
    import keras

    if not isinstance(layer, keras.layers.LayerNormalization):
        raise ValueError(f"{where} is a {type(layer).__name__}, not a LayerNorm.")
    if getattr(layer, "rms_scaling", False) or not (layer.center and layer.scale):
        raise ValueError(
            f"{where} is not a LayerNorm with scale and centre (gamma and beta): "
            "CTranslate2's Transformer cannot express it."
        )
    axis = layer.axis if isinstance(layer.axis, int) else tuple(layer.axis)
    if axis not in (-1, 2, (-1,), (2,)):
        raise ValueError(f"{where} normalises axis {layer.axis}, not the last one.")
    if not math.isclose(float(layer.epsilon), float(epsilon), rel_tol=1e-6):
        raise ValueError(
            f"{where} has epsilon {layer.epsilon}, not the model's {epsilon}: "
            "CTranslate2 takes one epsilon for the whole model."
        )
    spec.gamma = _numpy(layer.gamma)
    spec.beta = _numpy(layer.beta)


# Keras' names of the feed-forward activations CTranslate2 computes: GELU
# exact (erf) as Keras' default, swish as SiLU (x * sigmoid(x)).
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}


def _activation_name(block, where):
    """Keras' name of a block's feed-forward activation, if CTranslate2 has it."""
    import keras

    activation = keras.activations.serialize(block.activation)
    name = activation if isinstance(activation, str) else activation.get("config")
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"{where} uses the activation {activation!r}; the export supports "
            f"{sorted(_ACTIVATIONS)} (the paper's is ReLU)."
        )
    return name


def _check_block(block, where, activation):
    name = _activation_name(block, where)
    if name != activation:
        raise ValueError(
            f"{where} uses the activation {name!r}, the first block {activation!r}: "
            "CTranslate2 takes one activation for the whole model."
        )


def _set_attention(spec, layer, self_attention, where):
    query = _dense(layer.query_dense, f"{where} query")
    key = _dense(layer.key_dense, f"{where} key")
    value = _dense(layer.value_dense, f"{where} value")
    output = _dense(layer.output_dense, f"{where} output")
    if self_attention:
        _set_linear(spec.linear[0], _fused(query, key, value))
        _set_linear(spec.linear[1], output)
    else:
        _set_linear(spec.linear[0], query)
        _set_linear(spec.linear[1], _fused(key, value))
        _set_linear(spec.linear[2], output)


def _set_feed_forward(spec, block, epsilon, where):
    _set_linear(spec.linear_0, _dense(block.ffn_inner, f"{where} ffn_inner"))
    _set_linear(spec.linear_1, _dense(block.ffn_outer, f"{where} ffn_outer"))
    _set_norm(spec.layer_norm, block.ffn_norm, epsilon, f"{where} ffn_norm")


def _position_table(layer, rows, d_model):
    import keras

    from keras_transformer.layers.position import sinusoidal_table

    table = sinusoidal_table(np.arange(rows, dtype="int32"), d_model, layer.base)
    return np.asarray(keras.ops.convert_to_numpy(table), np.float32)


def _check_convertible(model, config):
    """``ValueError`` if the model's shape is one CTranslate2 cannot express."""
    if config.max_length is None:
        raise ValueError(
            "The model has max_length=None; CTranslate2 needs a position table "
            "of fixed size. Rebuild the Transformer with a max_length (its "
            "weights do not depend on it) and export that."
        )
    if not (
        getattr(model.source_embedding, "scale", True)
        == getattr(model.target_embedding, "scale", True)
    ):
        raise ValueError(
            "The source and target embeddings differ in scaling; CTranslate2 "
            "scales both or neither."
        )
    blocks = {len(model.encoder_blocks), len(model.decoder_blocks)}
    if blocks != {int(config.num_layers)}:
        raise ValueError("The model's number of blocks differs from num_layers.")


def _set_embeddings(encoder, decoder, model):
    """Fill the embeddings, output projection and position tables."""
    rows, d_model = int(model.config.max_length), int(model.config.d_model)
    source = _numpy(model.source_embedding.embeddings)
    target = (
        source
        if model.target_embedding is model.source_embedding
        else _numpy(model.target_embedding.embeddings)
    )
    encoder.embeddings[0].weight = source
    decoder.embeddings.weight = target
    decoder.projection.weight = target
    if getattr(model.target_embedding, "bias", None) is not None:
        decoder.projection.bias = _numpy(model.target_embedding.bias)
    scale = bool(getattr(model.source_embedding, "scale", True))
    encoder.scale_embeddings = decoder.scale_embeddings = scale
    pairs = ((encoder, model.encoder_position), (decoder, model.decoder_position))
    for side, layer in pairs:
        side.position_encodings.encodings = _position_table(layer, rows, d_model)


def _set_blocks(encoder, decoder, model, epsilon, pre_norm, activation):
    """Fill every encoder and decoder layer, then the pre-LN final norms."""
    for name, blocks, layers in (
        ("encoder", model.encoder_blocks, encoder.layer),
        ("decoder", model.decoder_blocks, decoder.layer),
    ):
        for i, (block, layer) in enumerate(zip(blocks, layers, strict=True)):
            where = f"{name} block {i}"
            _check_block(block, where, activation)
            _set_attention(layer.self_attention, block.self_attention, True, where)
            _set_norm(
                layer.self_attention.layer_norm,
                block.self_attention_norm,
                epsilon,
                f"{where} self_attention_norm",
            )
            if name == "decoder":
                _set_attention(layer.attention, block.cross_attention, False, where)
                _set_norm(
                    layer.attention.layer_norm,
                    block.cross_attention_norm,
                    epsilon,
                    f"{where} cross_attention_norm",
                )
            _set_feed_forward(layer.ffn, block, epsilon, where)
    if pre_norm:
        _set_norm(encoder.layer_norm, model.encoder_norm, epsilon, "encoder_norm")
        _set_norm(decoder.layer_norm, model.decoder_norm, epsilon, "decoder_norm")


def _set_vocabulary(spec, translator, epsilon):
    """Set the vocabularies and tokens from the tokenizer's pieces in the
    model's id order; ``(special, special_pieces)``."""
    model = translator.transformer
    tokenizer = translator.tokenizer
    source, target = tokenizer.source_pieces(), tokenizer.target_pieces()
    for side, pieces, size in (
        ("source", source, model.src_vocab_size),
        ("target", target, model.tgt_vocab_size),
    ):
        if len(pieces) > size:
            raise ValueError(
                f"The tokenizer has {len(pieces)} {side} ids, the model "
                f"{size}: the export cannot name the ids the model lacks."
            )
    source = vocabulary_names(source, model.src_vocab_size)
    target = vocabulary_names(target, model.tgt_vocab_size)
    special = tokenizer.special_ids()
    special_pieces = {name: target[i] for name, i in special.items()}
    if any(source[i] != target[i] for i in special.values()):
        raise ValueError(
            "The tokenizer names its reserved ids differently on the source and "
            "target sides; CTranslate2 takes one name for each."
        )
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    spec.config.unk_token = special_pieces["unk"]
    spec.config.eos_token = special_pieces["end"]
    spec.config.bos_token = spec.config.decoder_start_token = special_pieces["start"]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False  # the sources come with their </s>
    spec.config.layer_norm_epsilon = epsilon
    return special, special_pieces


def _metadata(translator, special, special_pieces):
    """The ``keras_transformer.json`` content (without quantization,
    version and search)."""
    import keras_transformer

    model = translator.transformer
    tokenizer = translator.tokenizer
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "keras_transformer_version": keras_transformer.__version__,
        "model": {
            "src_vocab_size": int(model.src_vocab_size),
            "tgt_vocab_size": int(model.tgt_vocab_size),
            **dataclasses.asdict(model.config),
            "dtype_policy": _policy_name(model.get_config().get("dtype")),
        },
        "max_length": int(model.config.max_length),
        "max_output_length": translator.max_output_length,
        "extra_output_length": int(translator.extra_output_length),
        "languages": list(translator.languages) if translator.languages else None,
        "tokenizer": {
            "kind": tokenizer.kind,
            "settings": tokenizer.export_settings(),
            "source_pieces": len(tokenizer.source_pieces()),
            "target_pieces": len(tokenizer.target_pieces()),
        },
        "special_ids": special,
        "special_pieces": special_pieces,
        "sources_end_with": special_pieces["end"],
        "length_penalty": {
            "alpha": "GNMT: ((5 + |Y|) / 6) ** alpha, |Y| with the end token",
            "default_alpha": LENGTH_PENALTY,
            "mapping": _LENGTH_PENALTY_MAPPING,
            "patience": PATIENCE,
        },
    }


def _convert(translator):
    """``(TransformerSpec, metadata)`` for a Translator."""
    from ctranslate2.specs import common_spec, transformer_spec

    model = translator.transformer
    config = model.config
    _check_convertible(model, config)
    epsilon = float(config.layer_norm_epsilon)
    pre_norm = bool(config.norm_first)
    shape = (int(config.num_layers), int(config.num_heads))
    activation = _activation_name(model.encoder_blocks[0], "encoder block 0")
    options = {
        "pre_norm": pre_norm,
        "activation": getattr(common_spec.Activation, _ACTIVATIONS[activation]),
    }
    encoder = transformer_spec.TransformerEncoderSpec(*shape, **options)
    decoder = transformer_spec.TransformerDecoderSpec(*shape, **options)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    _set_embeddings(encoder, decoder, model)
    _set_blocks(encoder, decoder, model, epsilon, pre_norm, activation)
    vocabulary = _set_vocabulary(spec, translator, epsilon)
    return spec, _metadata(translator, *vocabulary)


def _policy_name(policy):
    if isinstance(policy, dict):
        return policy.get("config", {}).get("name")
    return policy if isinstance(policy, str) else None


def _arrays(spec):
    arrays = []

    def visit(layer):
        for value in vars(layer).values():
            if isinstance(value, np.ndarray):
                arrays.append(value)
            elif isinstance(value, list):
                for item in value:
                    if hasattr(item, "__dict__"):
                        visit(item)
            elif hasattr(value, "__dict__") and not isinstance(value, type):
                visit(value)

    visit(spec)
    return arrays
