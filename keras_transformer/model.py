"""The encoder-decoder Transformer as a Keras functional model (paper §3, Figure 1)."""

import dataclasses

import keras

from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.position import SinusoidalEncoding


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the architecture (names from the paper, Table 3)."""

    num_layers: int = 6  # N
    d_model: int = 512
    num_heads: int = 8  # h
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop
    attention_dropout: float = 0.0
    share_embeddings: bool = True
    norm_first: bool = False
    max_length: int | None = 512
    layer_norm_epsilon: float = 1e-6

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


# Table 3: "base" and "big". "tiny" trains in minutes on two CPU cores.
CONFIGS = {
    "base": TransformerConfig(),
    "big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    "tiny": TransformerConfig(
        num_layers=2, d_model=128, num_heads=4, d_ff=256, dropout=0.1, max_length=128
    ),
}


def get_config(config=None, **overrides):
    """Resolve a named config, a ``TransformerConfig``, a dict or ``None`` (base)."""
    if config is None:
        config = CONFIGS["base"]
    elif isinstance(config, str):
        if config not in CONFIGS:
            raise ValueError(
                f"Unknown config name. Expected one of {sorted(CONFIGS)}. "
                f"Received: config={config!r}"
            )
        config = CONFIGS[config]
    elif isinstance(config, dict):
        config = TransformerConfig(**config)
    elif not isinstance(config, TransformerConfig):
        raise TypeError(
            "config must be a name, a dict or a TransformerConfig. "
            f"Received: config={config!r}"
        )
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"Unknown build_model arguments: {unknown}")
    return config.replace(**overrides)


def build_model(
    config=None,
    *,
    src_vocab_size,
    tgt_vocab_size=None,
    name="transformer",
    dtype=None,
    **overrides,
):
    """Build the encoder-decoder Transformer as a functional ``keras.Model``.

    Args:
        config: ``"base"``, ``"big"``, ``"tiny"``, a ``TransformerConfig``, a
            dict, or None (``"base"``).
        src_vocab_size: int, source vocabulary size (ids ``0..V-1``, 0 = pad).
        tgt_vocab_size: int, target vocabulary size; defaults to
            ``src_vocab_size``.
        name: model name.
        dtype: optional dtype policy for every layer (e.g.
            ``"mixed_float16"``); defaults to the global policy.
        **overrides: any ``TransformerConfig`` field (``num_layers``,
            ``d_model``, ``num_heads``, ``d_ff``, ``dropout``,
            ``attention_dropout``, ``share_embeddings``, ``norm_first``,
            ``max_length``, ``layer_norm_epsilon``), overriding the config.

    With ``share_embeddings=True`` one matrix serves as source embedding,
    target embedding and pre-softmax projection (§3.4), which needs one joint
    vocabulary. Otherwise the source has its own embedding and the target
    embedding doubles as the projection. The projection has no bias.

    Returns:
        A model with inputs ``{"encoder_inputs": (B, S) int,
        "decoder_inputs": (B, T) int}`` and output logits
        ``(B, T, tgt_vocab_size)`` in float32, carrying the decoder padding
        mask (so Keras losses and metrics skip padded positions).
    """
    cfg = get_config(config, **overrides)
    tgt_vocab_size = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
    if cfg.share_embeddings and tgt_vocab_size != src_vocab_size:
        raise ValueError(
            "share_embeddings=True needs one joint vocabulary. Received: "
            f"src_vocab_size={src_vocab_size}, tgt_vocab_size={tgt_vocab_size}"
        )

    def common(layer_name):
        return {"dtype": dtype, "name": layer_name}

    block_args = dict(
        d_model=cfg.d_model,
        num_heads=cfg.num_heads,
        d_ff=cfg.d_ff,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        norm_first=cfg.norm_first,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
    )

    encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")

    if cfg.share_embeddings:
        src_embedding = tgt_embedding = TokenEmbedding(
            src_vocab_size, cfg.d_model, **common("shared_embedding")
        )
    else:
        src_embedding = TokenEmbedding(
            src_vocab_size, cfg.d_model, **common("source_embedding")
        )
        tgt_embedding = TokenEmbedding(
            tgt_vocab_size, cfg.d_model, **common("target_embedding")
        )

    def embed(embedding, ids, prefix):
        # §3.4-3.5, §5.4: scaled embedding + positional encoding, then dropout.
        x = embedding(ids)
        x = SinusoidalEncoding(cfg.max_length, **common(f"{prefix}_position"))(x)
        return keras.layers.Dropout(cfg.dropout, **common(f"{prefix}_dropout"))(x)

    # Encoder: N identical layers (§3.1). The padding mask of encoder_inputs
    # travels with the tensors as a Keras mask.
    x = embed(src_embedding, encoder_inputs, "encoder")
    for i in range(cfg.num_layers):
        x = EncoderBlock(**block_args, **common(f"encoder_block_{i}"))(x)
    if cfg.norm_first:
        x = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_epsilon, **common("encoder_norm")
        )(x)
    encoder_outputs = x

    # Decoder: N identical layers; each cross-attends to the encoder output
    # under the encoder's padding mask.
    y = embed(tgt_embedding, decoder_inputs, "decoder")
    for i in range(cfg.num_layers):
        y = DecoderBlock(**block_args, **common(f"decoder_block_{i}"))(y, encoder_outputs)
    if cfg.norm_first:
        y = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_epsilon, **common("decoder_norm")
        )(y)

    # Pre-softmax projection with the (shared) target embedding, float32 out.
    logits = tgt_embedding(y, reverse=True)

    return keras.Model(
        inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
        outputs=logits,
        name=name,
    )
