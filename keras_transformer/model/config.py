"""The architecture's hyper-parameters and the named configurations (Table 3)."""

import dataclasses
import warnings


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
    # §3.3's FFN is max(0, xW1 + b1)W2 + b2; imported checkpoints use GELU or
    # swish (any Keras activation name).
    activation: str = "relu"
    # §3.4's projection is the embedding matrix alone; Marian adds a bias.
    logits_bias: bool = False
    # §3.4: embeddings multiplied by √d_model (some checkpoints do not).
    scale_embeddings: bool = True

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


# Table 3: "base" and "big". "tiny" trains in minutes on two CPU cores;
# "small" suits a small corpus such as Multi30k (29k pairs) within an hour.
CONFIGS = {
    "base": TransformerConfig(),
    "big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    "small": TransformerConfig(
        num_layers=3, d_model=256, num_heads=8, d_ff=1024, dropout=0.1, max_length=256
    ),
    "tiny": TransformerConfig(
        num_layers=2, d_model=128, num_heads=4, d_ff=256, dropout=0.1, max_length=128
    ),
}


def transformer_config(config=None, **overrides):
    """A ``TransformerConfig`` from a name, a config, a dict or ``None`` (base).

    Args:
        config: ``"base"``, ``"big"``, ``"small"``, ``"tiny"``, a
            ``TransformerConfig``, a dict of its fields, or None (``"base"``).
        **overrides: fields that replace the config's.
    """
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


def get_config(config=None, **overrides):
    """Deprecated name of ``transformer_config`` (it read like Keras'
    ``get_config()``, which returns a layer's constructor arguments)."""
    warnings.warn(
        "keras_transformer.get_config is deprecated; use "
        "keras_transformer.transformer_config (same arguments).",
        DeprecationWarning,
        stacklevel=2,
    )
    return transformer_config(config, **overrides)
