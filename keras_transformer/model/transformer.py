"""The encoder-decoder Transformer as a Keras functional model (paper §3, Figure 1).

The configuration (``configs.TransformerConfig``), the parts (embeddings,
positional encodings, N encoder and N decoder blocks, the final norms of
pre-LN), and the two halves, each written once: the training graph,
``encode``/``decode`` and the cached ``decode_step`` all run them. Input
checks and the trainer's guards are inherited (``_guarded_model``).
"""

import dataclasses

import keras
from keras import ops

from keras_transformer._guards.guarded_model import GuardedModel
from keras_transformer.layers import masks
from keras_transformer.layers.attention import call_sublayer
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.position import SinusoidalEncoding
from keras_transformer.model.config import TransformerConfig, transformer_config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(GuardedModel):
    """The encoder-decoder Transformer (§3, Figure 1) as a functional model.

    The model creates its parts (embeddings, positional encodings, the
    ``encoder_blocks`` and ``decoder_blocks``, the final norms of pre-LN) and
    wires the functional graph from the same two methods that ``encode`` and
    ``decode`` run, so that the training graph, the two halves and the cached
    decoding step (``decode_step``) are one definition. ``build_model`` is the
    usual way to make one, from a named configuration.

    Args:
        src_vocab_size: int, source vocabulary size (ids ``0..V-1``, 0 = pad).
        tgt_vocab_size: int, target vocabulary size; defaults to
            ``src_vocab_size``.
        num_layers, d_model, num_heads, d_ff, dropout, attention_dropout,
        share_embeddings, norm_first, max_length, layer_norm_epsilon,
        activation, logits_bias, scale_embeddings: as in ``TransformerConfig``.
        dtype: optional dtype policy for every layer (e.g.
            ``"mixed_bfloat16"``); defaults to the global policy.
        **kwargs: ``keras.Model`` arguments (``name``, ``trainable``).

    Inputs ``{"encoder_inputs": (B, S) int, "decoder_inputs": (B, T) int}``;
    output: logits ``(B, T, tgt_vocab_size)`` in float32, carrying the decoder
    padding mask (so Keras losses and metrics skip padded positions).

    The hyper-parameters are ``model.config``, a ``TransformerConfig`` (each
    field also reads as an attribute: ``model.d_model``); ``get_config``
    gives them with the vocabulary sizes, the constructor's arguments.

    Token ids are checked before any work starts, with the same clear error on
    every backend: integers inside the vocabulary, no longer than
    ``max_length``, and the two inputs (and the targets) with the same number
    of rows (``_inputs`` says where each path checks them).
    """

    def __init__(
        self,
        src_vocab_size,
        tgt_vocab_size=None,
        num_layers=6,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        dropout=0.1,
        attention_dropout=0.0,
        share_embeddings=True,
        norm_first=False,
        max_length=512,
        layer_norm_epsilon=1e-6,
        activation="relu",
        logits_bias=False,
        scale_embeddings=True,
        dtype=None,
        **kwargs,
    ):
        tgt_vocab_size = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
        if share_embeddings and tgt_vocab_size != src_vocab_size:
            raise ValueError(
                "share_embeddings=True needs one joint vocabulary. Received: "
                f"src_vocab_size={src_vocab_size}, tgt_vocab_size={tgt_vocab_size}"
            )
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(
                f"num_layers must be a positive integer. Received: {num_layers}"
            )
        _check_activation(activation)
        config = TransformerConfig(
            num_layers=num_layers,
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            share_embeddings=bool(share_embeddings),
            norm_first=bool(norm_first),
            max_length=max_length,
            layer_norm_epsilon=layer_norm_epsilon,
            activation=activation,
            logits_bias=bool(logits_bias),
            scale_embeddings=bool(scale_embeddings),
        )
        parts = _Parts(config, src_vocab_size, tgt_vocab_size, dtype)
        encoder_inputs = keras.Input(
            shape=(None,), dtype="int32", name="encoder_inputs"
        )
        decoder_inputs = keras.Input(
            shape=(None,), dtype="int32", name="decoder_inputs"
        )
        encoder_outputs, encoder_mask, _ = parts.encoder(encoder_inputs)
        logits, _ = parts.decoder(decoder_inputs, encoder_outputs, encoder_mask)
        super().__init__(
            inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
            outputs=logits,
            **kwargs,
        )
        # The parts become attributes once the model is initialised (PyTorch
        # modules cannot take sub-modules before): the functional graph
        # already tracks them, so they are saved once, under their names.
        self._parts = parts
        for name in _Parts.PUBLIC:
            setattr(self, name, getattr(parts, name))
        self.config = config
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.target_embedding.dtype_policy),
            "src_vocab_size": self.src_vocab_size,
            "tgt_vocab_size": self.tgt_vocab_size,
            **dataclasses.asdict(self.config),
        }

    @classmethod
    def from_config(cls, config):
        if "layers" in config and "input_layers" in config:
            config = _arguments_from_functional_config(config)
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    # -- the two halves, for decoding and inspection -------------------------

    def encode(self, encoder_inputs, return_attention_scores=False):
        """The encoder half, in inference mode: encode a source once.

        Args:
            encoder_inputs: ``(B, S)`` int source ids, ``PAD_ID`` = padding.
            return_attention_scores: also return each encoder layer's
                self-attention weights.

        Returns:
            ``(encoder_outputs, encoder_mask)``: ``(B, S, d_model)`` and the
            ``(B, S)`` boolean padding mask; with ``return_attention_scores``,
            a third item, a list of ``(B, num_heads, S, S)`` per layer.
        """
        x, mask, scores = self._parts.encoder(
            encoder_inputs,
            training=False,
            return_attention_scores=return_attention_scores,
        )
        return (x, mask, scores) if return_attention_scores else (x, mask)

    def decode(
        self,
        decoder_inputs,
        encoder_outputs,
        encoder_mask,
        return_attention_scores=False,
    ):
        """The decoder half, in inference mode.

        Args:
            decoder_inputs: ``(B, T)`` int target ids, the start id first.
            encoder_outputs, encoder_mask: from ``encode``.
            return_attention_scores: also return each decoder layer's
                self-attention and cross-attention weights.

        Returns:
            Logits ``(B, T, tgt_vocab_size)``, float32; with
            ``return_attention_scores``, also two lists per layer:
            self-attention ``(B, num_heads, T, T)`` and cross-attention
            ``(B, num_heads, T, S)`` weights.
        """
        logits, scores = self._parts.decoder(
            decoder_inputs,
            encoder_outputs,
            encoder_mask,
            training=False,
            return_attention_scores=return_attention_scores,
        )
        if return_attention_scores:
            return logits, [s for s, _ in scores], [c for _, c in scores]
        return logits

    def initial_cache(self, encoder_outputs, max_length):
        """The decoding cache of ``decode_step`` for a batch of encoded sources.

        Args:
            encoder_outputs: ``(B, S, d_model)``, from ``encode``.
            max_length: int, the most positions the decoder will reach.

        Returns:
            ``(self_attention_cache, cross_attention_cache)``: per decoder
            layer, ``(keys, values)``; the self-attention ones
            ``(B, num_heads, max_length, d_k)`` zeros, the cross-attention
            ones those of the encoder output, ``(B, num_heads, S, d_k)``.
            Only the first changes from step to step.
        """
        rows = ops.shape(encoder_outputs)[0]
        self_cache, cross_cache = [], []
        for block in self.decoder_blocks:
            attention = block.self_attention
            shape = (rows, attention.num_heads, max_length, attention.d_k)
            zeros = ops.zeros(shape, block.compute_dtype)
            self_cache.append((zeros, zeros))
            cross_cache.append(block.compute_cross_attention_cache(encoder_outputs))
        return tuple(self_cache), tuple(cross_cache)

    def grow_cache(self, self_cache, max_length):
        """``self_cache`` made ``max_length`` positions wide, entries kept."""

        def grow(entry):  # (B, num_heads, T, d_k): zeros after position T
            return ops.pad(
                entry, [[0, 0], [0, 0], [0, max_length - entry.shape[2]], [0, 0]]
            )

        return keras.tree.map_structure(grow, self_cache)

    def decode_step(self, token_ids, index, self_cache, cross_cache, encoder_mask):
        """One step of incremental decoding, in inference mode (§3.2.3).

        The tokens at position ``index`` attend to themselves and to the cached
        keys and values of the earlier positions: no position sees a later
        one, so the earlier ones never need computing again. Gives the logits
        that ``decode`` gives at position ``index`` of the whole prefix.

        Args:
            token_ids: ``(B,)`` int, the token of each row at ``index``;
                not range-checked (a search feeds its own argmax), so they
                must be in ``[0, tgt_vocab_size)``.
            index: scalar int, the position (0 for the start id).
            self_cache, cross_cache: from ``initial_cache``, the first as the
                previous step returned it.
            encoder_mask: ``(B, S)``, from ``encode``.

        Returns:
            ``(logits, self_cache)``: ``(B, tgt_vocab_size)`` float32, and the
            cache with this position's keys and values written in.
        """
        logits, self_cache = self._parts.decoder(
            ops.expand_dims(token_ids, 1),
            None,
            encoder_mask,
            training=False,
            cache=(self_cache, cross_cache),
            index=index,
        )
        return logits[:, 0], self_cache


# The config's fields read as the model's own attributes (``model.d_model``).
for _field in dataclasses.fields(TransformerConfig):
    setattr(
        Transformer,
        _field.name,
        property(lambda self, name=_field.name: getattr(self.config, name)),
    )
del _field


class _Parts:
    """The layers of a ``Transformer`` and its two halves, each written once.

    ``encoder`` and ``decoder`` wire the functional graph (on symbolic inputs,
    ``training=None``), run ``Transformer.encode``/``decode`` (inference), and,
    for the decoder, the cached step of ``Transformer.decode_step``.
    """

    # The parts a Transformer has as attributes.
    PUBLIC = (
        "source_embedding",
        "target_embedding",
        "encoder_position",
        "decoder_position",
        "encoder_blocks",
        "decoder_blocks",
        "encoder_norm",
        "decoder_norm",
    )

    def __init__(self, config, src_vocab_size, tgt_vocab_size, dtype):
        d_model = config.d_model
        # The target embedding is also the pre-softmax projection (§3.4).
        bias, scale = config.logits_bias, config.scale_embeddings
        if config.share_embeddings:
            self.source_embedding = self.target_embedding = TokenEmbedding(
                src_vocab_size,
                d_model,
                scale=scale,
                logits_bias=bias,
                dtype=dtype,
                name="shared_embedding",
            )
        else:
            self.source_embedding = TokenEmbedding(
                src_vocab_size,
                d_model,
                scale=scale,
                dtype=dtype,
                name="source_embedding",
            )
            self.target_embedding = TokenEmbedding(
                tgt_vocab_size,
                d_model,
                scale=scale,
                logits_bias=bias,
                dtype=dtype,
                name="target_embedding",
            )
        for side in ("encoder", "decoder"):
            # §3.5: positional encodings added to the embeddings; §5.4:
            # dropout on their sum.
            setattr(
                self,
                f"{side}_position",
                SinusoidalEncoding(
                    config.max_length, dtype=dtype, name=f"{side}_position"
                ),
            )
            setattr(
                self,
                f"{side}_dropout",
                Dropout(config.dropout, dtype=dtype, name=f"{side}_dropout"),
            )
            # Pre-LN ends each stack with a LayerNorm; post-LN has none.
            norm = None
            if config.norm_first:
                norm = keras.layers.LayerNormalization(
                    epsilon=config.layer_norm_epsilon, dtype=dtype, name=f"{side}_norm"
                )
            setattr(self, f"{side}_norm", norm)
        # §3.1: N identical layers in each stack.
        block = dict(
            d_model=d_model,
            num_heads=config.num_heads,
            d_ff=config.d_ff,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            norm_first=config.norm_first,
            layer_norm_epsilon=config.layer_norm_epsilon,
            activation=config.activation,
            dtype=dtype,
        )
        self.encoder_blocks = [
            EncoderBlock(**block, name=f"encoder_block_{i}")
            for i in range(config.num_layers)
        ]
        self.decoder_blocks = [
            DecoderBlock(**block, name=f"decoder_block_{i}")
            for i in range(config.num_layers)
        ]

    def encoder(self, encoder_inputs, training=None, return_attention_scores=False):
        """``(encoder_outputs, encoder_mask, scores)`` of source ids."""
        mask = masks.padding_mask(encoder_inputs)
        x = self.encoder_position(self.source_embedding(encoder_inputs))
        x = self.encoder_dropout(x, training=training)
        scores = []
        for block in self.encoder_blocks:
            x = block(
                x,
                mask=mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                x, weights = x
                scores.append(weights)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, mask, scores

    def decoder(
        self,
        decoder_inputs,
        encoder_outputs,
        encoder_mask,
        training=None,
        return_attention_scores=False,
        cache=None,
        index=None,
    ):
        """``(logits, scores)`` of target ids; with a ``cache`` (decoding
        step: ``decoder_inputs`` are the tokens at position ``index``),
        ``(logits, self_attention_cache)``."""
        if cache is None:
            mask = masks.padding_mask(decoder_inputs)
            y = self.decoder_position(self.target_embedding(decoder_inputs))
            y = self.decoder_dropout(y, training=training)
            call = _through_call
            steps = [{}] * len(self.decoder_blocks)
        else:
            # The search's own tokens: in range by construction, so the
            # embedding's range check (a host round trip a step) is skipped.
            mask = None
            y = self.target_embedding.lookup(decoder_inputs)
            y = call_sublayer(
                self.decoder_position, y, start_index=index, check_length=False
            )
            call = call_sublayer
            steps = [
                dict(
                    self_attention_cache=self_cache,
                    self_attention_cache_update_index=index,
                    cross_attention_cache=cross_cache,
                )
                for self_cache, cross_cache in zip(*cache, strict=True)
            ]
        scores, new_cache = [], []
        for block, step in zip(self.decoder_blocks, steps, strict=True):
            y = call(
                block,
                y,
                encoder_outputs,
                decoder_sequence_mask=mask,
                encoder_sequence_mask=encoder_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                **step,
            )
            if return_attention_scores:
                y, weights = y
                scores.append(weights)
            if cache is not None:
                y, self_cache = y
                new_cache.append(self_cache)
        if self.decoder_norm is not None:
            y = call(self.decoder_norm, y)
        # Pre-softmax projection with the (shared) target embedding (§3.4),
        # float32 out.
        logits = call(self.target_embedding, y, reverse=True)
        return logits, (scores if cache is None else tuple(new_cache))


def _check_activation(activation):
    """The feed-forward activation must be a Keras activation's name (a name
    is what ``get_config`` can save)."""
    problem = not isinstance(activation, str)
    if not problem:
        try:
            keras.activations.get(activation)
        except ValueError:
            problem = True
    if problem:
        raise ValueError(
            "activation must be the name of a Keras activation, such as "
            f"'relu' (the paper's), 'gelu' or 'swish'. Received: {activation!r}"
        )


def _through_call(layer, *args, **kwargs):
    """``layer(...)``: through ``Layer.__call__``, so that the functional graph
    records the call."""
    return layer(*args, **kwargs)


def _arguments_from_functional_config(config):
    """The ``Transformer`` arguments of a model saved by keras_transformer
    0.1.0, whose config was the functional graph of ``build_model``."""
    layers = {layer["config"]["name"]: layer for layer in config["layers"]}
    shared = "shared_embedding" in layers
    source = layers["shared_embedding" if shared else "source_embedding"]["config"]
    target = layers["shared_embedding" if shared else "target_embedding"]["config"]
    blocks = [name for name in layers if name.startswith("encoder_block_")]
    block = layers["encoder_block_0"]["config"]
    return {
        "name": config.get("name", "transformer"),
        "trainable": config.get("trainable", True),
        "dtype": source.get("dtype"),
        "src_vocab_size": source["vocab_size"],
        "tgt_vocab_size": target["vocab_size"],
        "num_layers": len(blocks),
        "d_model": block["d_model"],
        "num_heads": block["num_heads"],
        "d_ff": block["d_ff"],
        "dropout": block["dropout"],
        "attention_dropout": block["attention_dropout"],
        "share_embeddings": shared,
        "norm_first": block["norm_first"],
        "max_length": layers["encoder_position"]["config"]["max_length"],
        "layer_norm_epsilon": block["layer_norm_epsilon"],
    }


def build_model(
    config=None,
    *,
    src_vocab_size,
    tgt_vocab_size=None,
    name="transformer",
    dtype=None,
    **overrides,
):
    """Build the encoder-decoder Transformer from a named configuration.

    Args:
        config: ``"base"``, ``"big"``, ``"small"``, ``"tiny"``, a
            ``TransformerConfig``, a dict, or None (``"base"``).
        src_vocab_size: int, source vocabulary size (ids ``0..V-1``, 0 = pad).
        tgt_vocab_size: int, target vocabulary size; defaults to
            ``src_vocab_size``.
        name: model name.
        dtype: optional dtype policy for every layer (e.g.
            ``"mixed_float16"``); defaults to the global policy.
        **overrides: any ``TransformerConfig`` field (``num_layers``,
            ``d_model``, ``num_heads``, ``d_ff``, ``dropout``,
            ``attention_dropout``, ``share_embeddings``, ``norm_first``,
            ``max_length``, ``layer_norm_epsilon``, ``activation``,
            ``logits_bias``, ``scale_embeddings``), overriding the config.

    With ``share_embeddings=True`` one matrix serves as source embedding,
    target embedding and pre-softmax projection (§3.4), which needs one joint
    vocabulary. Otherwise the source has its own embedding and the target
    embedding doubles as the projection. The projection has no bias unless
    ``logits_bias=True`` (Marian's checkpoints have one).

    Returns:
        A ``Transformer``.
    """
    cfg = transformer_config(config, **overrides)
    return Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        name=name,
        dtype=dtype,
        **dataclasses.asdict(cfg),
    )
