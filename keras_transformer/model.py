"""The encoder-decoder Transformer as a Keras functional model (paper §3, Figure 1)."""

import dataclasses
import numbers

import keras
import numpy as np
from keras import ops

from keras_transformer import _checks, _fault_safe, backend
from keras_transformer.layers import masks
from keras_transformer.layers.attention import call_sublayer
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.dropout import Dropout
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


INPUT_NAMES = ("encoder_inputs", "decoder_inputs")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
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
        share_embeddings, norm_first, max_length, layer_norm_epsilon: as in
            ``TransformerConfig``.
        dtype: optional dtype policy for every layer (e.g.
            ``"mixed_bfloat16"``); defaults to the global policy.
        **kwargs: ``keras.Model`` arguments (``name``, ``trainable``).

    Inputs ``{"encoder_inputs": (B, S) int, "decoder_inputs": (B, T) int}``;
    output: logits ``(B, T, tgt_vocab_size)`` in float32, carrying the decoder
    padding mask (so Keras losses and metrics skip padded positions).

    Token ids are checked before any work starts, with the same clear error on
    every backend: integers inside the vocabulary, no longer than
    ``max_length``, and the two inputs (and the targets) with the same number
    of rows. Checks run on the eager call and on NumPy data given to ``fit``,
    ``evaluate`` and ``predict``; inside compiled steps fed by datasets the
    layers' own checks apply.
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
        parts = _Parts(
            src_vocab_size,
            tgt_vocab_size,
            num_layers,
            dict(
                d_model=d_model,
                num_heads=num_heads,
                d_ff=d_ff,
                dropout=dropout,
                attention_dropout=attention_dropout,
                norm_first=norm_first,
                layer_norm_epsilon=layer_norm_epsilon,
            ),
            share_embeddings,
            max_length,
            dtype,
        )
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
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.share_embeddings = bool(share_embeddings)
        self.norm_first = bool(norm_first)
        self.max_length = max_length
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.target_embedding.dtype_policy),
            "src_vocab_size": self.src_vocab_size,
            "tgt_vocab_size": self.tgt_vocab_size,
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "d_ff": self.d_ff,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "share_embeddings": self.share_embeddings,
            "norm_first": self.norm_first,
            "max_length": self.max_length,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }

    @classmethod
    def from_config(cls, config):
        if "layers" in config and "input_layers" in config:
            config = _arguments_from_functional_config(config)
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    def _limits(self):
        """{input name: (vocab_size, max_length)}."""
        return {
            "encoder_inputs": (self.src_vocab_size, self.max_length),
            "decoder_inputs": (self.tgt_vocab_size, self.max_length),
        }

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

    def _target_vocab_size(self):
        return self._limits()["decoder_inputs"][0]

    def _target_pad_ids(self):
        """Target ids that the compiled loss skips: allowed outside the vocabulary."""
        loss = getattr(self, "loss", None)
        losses = loss if isinstance(loss, (list, tuple)) else [loss]
        pads = set()
        for loss in losses:
            for attribute in ("pad_id", "ignore_class"):
                value = getattr(loss, attribute, None)
                if isinstance(value, int) and not isinstance(value, bool):
                    pads.add(value)
        return sorted(pads)

    def validate_inputs(self, x, y=None):
        """Raise ``TypeError``/``ValueError`` for malformed token ids or targets.

        Checks what is known on the host: NumPy arrays, lists and concrete
        tensors. Symbolic and traced values are left to the layers' own
        checks (and to ``compute_loss`` for the targets).
        """
        _check_container(x)
        if not isinstance(x, dict):
            return  # a dataset, generator or PyDataset: checked per batch
        arrays = _host_arrays(x, y)
        if arrays is None:
            return
        _check_shapes(arrays)
        limits = dict(self._limits())
        limits["targets"] = (self._target_vocab_size(), None)
        for name, (vocab_size, max_length) in limits.items():
            if name not in arrays:
                continue
            ids = arrays[name]
            if name == "targets" and "decoder_inputs" in arrays:
                _check_same_shape(arrays["decoder_inputs"], ids)
            if max_length is not None and ids.shape[1] > max_length:
                raise ValueError(
                    f"{name} is longer than the model's max_length={max_length}. "
                    f"Received: {name}.shape={tuple(ids.shape)}"
                )
            # Ranges of backend tensors are checked by the embedding layers
            # (and compute_loss), without a copy to the host here.
            if not isinstance(ids, np.ndarray):
                continue
            if name == "targets":
                pads = self._target_pad_ids()
                if pads:
                    ids = np.where(np.isin(ids, pads), 0, ids)
                _check_ids(ids, name, vocab_size, pads)
            else:
                _check_ids(ids, name, vocab_size, [])

    def _check_batch(self, data):
        """Check one batch on the host before it enters a compiled step."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if isinstance(x, dict):
            x = {name: _fault_safe.to_numpy(value) for name, value in x.items()}
            x = {name: value for name, value in x.items() if value is not None}
            if any(name not in x for name in INPUT_NAMES):
                return  # not all on this host: the layers check in the step
        self.validate_inputs(x, _fault_safe.to_numpy(y))

    def _checked_targets(self, y):
        """``(y, ids)``: the targets with their range check attached, and the
        ids with the loss's pad ids mapped into the vocabulary (for NaN
        poisoning under XLA); ``(y, None)`` if ``y`` is not one tensor."""
        if y is None or isinstance(y, (dict, list, tuple)):
            return y, None
        vocab_size = self._target_vocab_size()
        ids = y
        if "float" in keras.backend.standardize_dtype(y.dtype):
            # Keras itself may hand integer labels over as floats (it does
            # under tf.distribute); host data was already held to an integer
            # dtype (validate_inputs). What must not pass is a fractional id.
            whole = ops.cast(ops.equal(y, ops.floor(y)), "int32")
            y = _checks.check_range(
                whole,
                1,
                2,
                "targets must hold integer token ids; some have a fractional "
                "part (or are NaN).",
                output=y,
            )
            ids = ops.cast(ops.where(ops.equal(whole, 1), y, -1), "int32")
        else:
            _checks.check_integer(y, "targets")
        for pad in self._target_pad_ids():
            ids = ops.where(ops.equal(ids, pad), 0, ids)
        y = _checks.check_range(
            ids,
            0,
            vocab_size,
            f"Target ids must be in [0, {vocab_size}) (the target vocabulary) "
            "or the loss's pad id. Received ids from {lo} to {hi}.",
            output=y,
        )
        return y, ids

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        # Targets are token ids like the inputs, with the same contract: a
        # float or out-of-vocabulary target is an error, never a loss value
        # (JAX would give NaN, PyTorch a finite wrong number).
        y, ids = self._checked_targets(y)
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        if ids is None:
            return loss
        return _checks.nan_unless_in_range(loss, ids, 0, self._target_vocab_size())

    def _batch_checks(self, data):
        """In-graph checks of one batch (TensorFlow): tensors that fail to
        compute when the batch is bad (see ``_fault_safe.checked_tf_step``)."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        checks = []
        if isinstance(x, dict):
            for name, (vocab_size, _) in self._limits().items():
                ids = x.get(name)
                if ids is None or not hasattr(ids, "dtype"):
                    continue
                _checks.check_integer(ids, name)
                checks.append(_checks.check_not_empty(ids, name))
                checks.append(
                    _checks.check_range(
                        ids,
                        0,
                        vocab_size,
                        f"Token ids must be in [0, {vocab_size}) for {name} "
                        f"(vocab_size={vocab_size}). Received ids from {{lo}} "
                        "to {hi}.",
                    )
                )
        checked_y, ids = self._checked_targets(y)
        if ids is not None:
            checks.append(checked_y)
        return checks

    if keras.backend.backend() == "tensorflow":
        # TensorFlow only (Keras picks the trainer for the backend at import):
        # on PyTorch, torch.compile would trace one more frame of Python for
        # every frame between its entry and the graph break at
        # `loss.backward()`, and cannot break a graph inside a `with` at all.

        def train_step(self, *args, **kwargs):
            with _fault_safe.checked_tf_step(self, args[-1]):
                return super().train_step(*args, **kwargs)

        def test_step(self, *args, **kwargs):
            with _fault_safe.checked_tf_step(self, args[-1]):
                return super().test_step(*args, **kwargs)

    # -- every trainer call leaves the weights intact when it fails ----------

    def __call__(self, inputs, *args, **kwargs):
        inputs = _arrays_from_lists(inputs)
        if not _checks.batch_checked_on_host():
            self.validate_inputs(inputs)
        return super().__call__(inputs, *args, **kwargs)

    def fit(self, x=None, y=None, *args, **kwargs):
        x, y = _arrays_from_lists(x), _arrays_from_lists(y, "targets")
        self.validate_inputs(x, y)
        self._build_optimizer()
        with _fault_safe.guard(self):
            return super().fit(x, y, *args, **kwargs)

    def _build_optimizer(self):
        """Create the optimizer's variables before the first compiled step.

        Keras' TensorFlow trainer (3.15) builds the optimizer inside the first
        traced step when no distribution strategy is set; tf.function then
        traces that step twice and wraps every new variable's initializer in
        a ``tf.cond`` (four conditional graphs per weight for Adam: 193 traced
        graphs for a tiny model's first ``fit``, 16 without; docs/results.md).
        Built here, the step is traced once, as Keras' JAX and PyTorch
        trainers do by building first."""
        optimizer = getattr(self, "optimizer", None)
        if (
            keras.backend.backend() == "tensorflow"
            and optimizer is not None
            and not optimizer.built
            and self.built
            and getattr(self, "_distribute_strategy", None) is None
        ):
            optimizer.build(self.trainable_variables)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        x, y = _arrays_from_lists(x), _arrays_from_lists(y, "targets")
        self.validate_inputs(x, y)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        x = _arrays_from_lists(x)
        self.validate_inputs(x)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        x, y = _arrays_from_lists(x), _arrays_from_lists(y, "targets")
        self.validate_inputs(x, y)
        self._build_optimizer()
        with _fault_safe.guard(self):
            return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        x, y = _arrays_from_lists(x), _arrays_from_lists(y, "targets")
        self.validate_inputs(x, y)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().test_on_batch(x, y, *args, **kwargs)

    def predict_on_batch(self, x):
        x = _arrays_from_lists(x)
        self.validate_inputs(x)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().predict_on_batch(x)

    # JAX trainer hooks (Keras 3.15): see _fault_safe.

    def _purge_model_variables(self, *args, **kwargs):
        names = (
            "trainable_variables",
            "non_trainable_variables",
            "optimizer_variables",
            "metrics_variables",
        )
        flags = dict(zip(names, args, strict=False), **kwargs)
        groups = {
            "trainable_variables": lambda: self.trainable_variables,
            "non_trainable_variables": lambda: self.non_trainable_variables,
            "optimizer_variables": lambda: self.optimizer.variables,
            "metrics_variables": lambda: self.metrics_variables,
        }
        _fault_safe.remember_current(
            self, [groups[name]() for name in names if flags.get(name)]
        )
        return super()._purge_model_variables(*args, **kwargs)

    def _make_function(self, step_function, *args, **kwargs):
        if keras.backend.backend() == "jax":
            step_function = _fault_safe.checked_step(self, step_function)
        return super()._make_function(step_function, *args, **kwargs)

    # PyTorch trainer hooks (Keras 3.15): see _fault_safe.checked_torch_step.

    def make_train_function(self, force=False):
        return self._checked_torch_function("train_function", force)

    def make_test_function(self, force=False):
        return self._checked_torch_function("test_function", force)

    def make_predict_function(self, force=False):
        return self._checked_torch_function("predict_function", force)

    def _checked_torch_function(self, attribute, force):
        before = getattr(self, attribute)
        made = getattr(super(), f"make_{attribute}")(force)
        function = getattr(self, attribute)
        if (
            keras.backend.backend() == "torch"
            and function is not None
            and function is not before
            and self._should_torch_compile()
        ):
            function = _fault_safe.checked_torch_step(self, attribute, function)
            setattr(self, attribute, function)
            return function
        return made


def _check_container(x):
    """Refuse what cannot be the input dict, and a dict short of a key."""
    if isinstance(x, (list, tuple)):
        received = f"a {type(x).__name__} of {len(x)} items"
    elif x is None or isinstance(x, (str, bytes, numbers.Number)):
        received = repr(x)[:40]
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
        received = f"one array of shape {tuple(x.shape)}"
    else:
        received = None  # a dict, or a dataset / generator / PyDataset
    if received is not None:
        raise ValueError(
            f"The model takes a dict with keys {list(INPUT_NAMES)}. "
            f"Received: {received}. Pass "
            "{'encoder_inputs': source_ids, 'decoder_inputs': target_ids}."
        )
    if isinstance(x, dict):
        missing = [name for name in INPUT_NAMES if name not in x]
        if missing:
            raise ValueError(
                f"Missing model inputs {missing}. Expected a dict with keys "
                f"{list(INPUT_NAMES)}. Received keys: {sorted(x)}"
            )


def _host_arrays(x, y):
    """{name: array} of the inputs (and targets) known on the host; None if
    an input is symbolic or traced (then the layers check it)."""
    arrays = {}
    for name in INPUT_NAMES:
        value = x[name]
        if isinstance(value, (list, tuple)):
            value = _as_array(value, name)
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            continue
        if isinstance(value, keras.KerasTensor) or backend.is_traced(value):
            return None
        arrays[name] = value
    if isinstance(y, (list, tuple)):
        y = _as_array(y, "targets")
    if y is not None and hasattr(y, "shape") and hasattr(y, "dtype"):
        if not (isinstance(y, keras.KerasTensor) or backend.is_traced(y)):
            arrays["targets"] = y
    return arrays


def _check_shapes(arrays):
    """Integer ids of shape (batch, length), the same rows, none empty."""
    for name, value in arrays.items():
        _checks.check_integer(value, name)
        if len(value.shape) != 2:
            raise ValueError(
                f"{name} must have shape (batch, length). "
                f"Received: {name}.shape={tuple(value.shape)}"
            )
    rows = {name: int(value.shape[0]) for name, value in arrays.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(
            "All inputs (and targets) must have the same number of rows "
            f"(batch size). Received: {rows}"
        )
    if 0 in rows.values():
        raise ValueError(
            f"The batch has no rows: there is nothing to run. Received: {rows}"
        )
    for name, value in arrays.items():
        if int(value.shape[1]) == 0:
            raise ValueError(
                f"{name} must hold at least one token per sequence. "
                f"Received: {name}.shape={tuple(value.shape)}"
            )


def _as_array(value, name):
    try:
        return np.asarray(value)
    except ValueError as error:
        raise ValueError(
            f"{name} is a ragged list: pad every sequence to one length with "
            "0 (the padding id), or use a NumPy array. "
            f"({error})"
        ) from None


def _arrays_from_lists(x, name=None):
    """Python lists of ids as arrays: Keras would read a list as many inputs."""
    if isinstance(x, dict):
        return {
            key: _as_array(value, key) if isinstance(value, (list, tuple)) else value
            for key, value in x.items()
        }
    if name is not None and isinstance(x, (list, tuple)):
        return _as_array(x, name)
    return x


def _check_same_shape(decoder_inputs, targets):
    if tuple(decoder_inputs.shape) != tuple(targets.shape):
        raise ValueError(
            "targets must have the shape of decoder_inputs (one target id per "
            f"decoder position). Received: decoder_inputs.shape="
            f"{tuple(decoder_inputs.shape)}, targets.shape={tuple(targets.shape)}"
        )


def _check_ids(ids, name, vocab_size, pads):
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        allowed = f"[0, {vocab_size}) (vocab_size={vocab_size})"
        if pads:
            allowed += f" or the loss's pad id {pads}"
        raise ValueError(
            f"Token ids in {name} must be in {allowed}. Received ids from "
            f"{ids.min()} to {ids.max()}."
        )


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

    def __init__(
        self,
        src_vocab_size,
        tgt_vocab_size,
        num_layers,
        block_args,
        share,
        max_length,
        dtype,
    ):
        d_model, epsilon = block_args["d_model"], block_args["layer_norm_epsilon"]
        if share:
            self.source_embedding = self.target_embedding = TokenEmbedding(
                src_vocab_size, d_model, dtype=dtype, name="shared_embedding"
            )
        else:
            self.source_embedding = TokenEmbedding(
                src_vocab_size, d_model, dtype=dtype, name="source_embedding"
            )
            self.target_embedding = TokenEmbedding(
                tgt_vocab_size, d_model, dtype=dtype, name="target_embedding"
            )
        rate = block_args["dropout"]
        for side in ("encoder", "decoder"):
            # §3.5: positional encodings added to the embeddings; §5.4:
            # dropout on their sum.
            setattr(
                self,
                f"{side}_position",
                SinusoidalEncoding(max_length, dtype=dtype, name=f"{side}_position"),
            )
            setattr(
                self,
                f"{side}_dropout",
                Dropout(rate, dtype=dtype, name=f"{side}_dropout"),
            )
            # Pre-LN ends each stack with a LayerNorm; post-LN has none.
            norm = None
            if block_args["norm_first"]:
                norm = keras.layers.LayerNormalization(
                    epsilon=epsilon, dtype=dtype, name=f"{side}_norm"
                )
            setattr(self, f"{side}_norm", norm)
        # §3.1: N identical layers in each stack.
        self.encoder_blocks = [
            EncoderBlock(**block_args, dtype=dtype, name=f"encoder_block_{i}")
            for i in range(num_layers)
        ]
        self.decoder_blocks = [
            DecoderBlock(**block_args, dtype=dtype, name=f"decoder_block_{i}")
            for i in range(num_layers)
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
            ``max_length``, ``layer_norm_epsilon``), overriding the config.

    With ``share_embeddings=True`` one matrix serves as source embedding,
    target embedding and pre-softmax projection (§3.4), which needs one joint
    vocabulary. Otherwise the source has its own embedding and the target
    embedding doubles as the projection. The projection has no bias.

    Returns:
        A ``Transformer``.
    """
    cfg = get_config(config, **overrides)
    return Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        name=name,
        dtype=dtype,
        **dataclasses.asdict(cfg),
    )
