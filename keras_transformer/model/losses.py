"""Label-smoothed cross-entropy (§5.4) and token accuracy that skip padding."""

import numbers

import keras
from keras import ops

from keras_transformer import backend


def _global_mean(total, count):
    """``total / count`` over the global batch, also under tf.distribute.

    Under ``tf.distribute`` each replica sees a slice of the batch and the
    replicas' gradients are summed. Dividing each replica's ``total`` by the
    token count of the *whole* batch (summed across replicas) makes that sum
    the gradient of the global per-token mean. (Keras' own mean losses
    instead divide each replica's mean by the replica count, which equals the
    global mean only when every replica holds as many real tokens.) For the
    reported loss Keras multiplies each replica's value by N and averages
    over the replicas, which gives the global mean again when the replicas
    hold as many rows each. Other backends compute on the global batch.
    """
    return ops.divide_no_nan(total, backend.sum_over_replicas(count))


def _check_pad_id(pad_id):
    if pad_id is not None and (
        isinstance(pad_id, bool) or not isinstance(pad_id, numbers.Integral)
    ):
        raise TypeError(f"pad_id must be an int or None. Received: pad_id={pad_id!r}")
    return None if pad_id is None else int(pad_id)


def _real_tokens(y_true, pad_id):
    """Boolean (B, T): targets that are not padding.

    Only the targets decide. The Keras mask that ``build_model`` attaches to
    its logits comes from the decoder *inputs* and keeps one more position per
    padded row (input </s>, target padding), so it is not used.
    """
    if pad_id is None:
        return ops.ones(ops.shape(y_true), dtype="bool")
    return ops.not_equal(y_true, pad_id)


def _token_weights(real, sample_weight):
    """float32 (B, T): 1 for real tokens, 0 elsewhere, times any sample weight.

    ``sample_weight`` may be None, per sequence (B,) or per token (B, T).
    """
    weights = ops.cast(real, "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.convert_to_tensor(sample_weight, dtype="float32")
    if len(sample_weight.shape) == len(weights.shape) - 1:
        sample_weight = ops.expand_dims(sample_weight, -1)
    return weights * sample_weight


def smoothed_cross_entropy(logits, labels, label_smoothing):
    """Per-token ``-Σ_v q_v log softmax(logits)_v`` with
    ``q = (1 - ε)·onehot(labels) + ε/V``, float32 logits (..., V).

    With ``lse = log Σ exp(logits)`` this is
    ``lse - (1 - ε)·logits[label] - ε·mean(logits)``, and its gradient with
    respect to the logits is ``softmax(logits) - q``. On JAX and TensorFlow
    that gradient is written out (``_fused``): automatic differentiation of
    ``log_softmax`` and the gather builds it in several passes over the
    (B, T, V) logits, the largest array of a step (docs/results.md, "Step
    speed"). PyTorch runs eagerly, one kernel per operation, and its own
    fused ``log_softmax`` and its gradient are fewer passes than the
    expression written out, so it keeps automatic differentiation
    (``_from_log_probs``).
    """
    if backend.name() == "torch":
        log_probs = ops.log_softmax(logits, axis=-1)
        return _from_log_probs(log_probs, labels, label_smoothing)
    return _fused(logits, labels, label_smoothing)


def _from_log_probs(log_probs, labels, eps):
    picked = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)
    nll = -ops.squeeze(picked, -1)
    if not eps:
        return nll
    # §5.4 label smoothing, ε_ls spread evenly over all V classes:
    # -Σ q log p = (1 - ε)·nll + (ε / V)·Σ_v (-log p_v).
    return (1.0 - eps) * nll - eps * ops.mean(log_probs, axis=-1)


def _fused(logits, labels, eps):
    @ops.custom_gradient
    def loss(logits):
        top = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))
        exp = ops.exp(logits - top)
        total = ops.sum(exp, axis=-1, keepdims=True)
        lse = ops.squeeze(top + ops.log(total), -1)
        picked = ops.take_along_axis(logits, ops.expand_dims(labels, -1), axis=-1)
        value = lse - (1.0 - eps) * ops.squeeze(picked, -1)
        if eps:
            value = value - eps * ops.mean(logits, axis=-1)

        def grad(upstream):
            vocab_size = ops.shape(logits)[-1]
            # q without a one-hot array: a comparison that XLA fuses.
            hit = ops.equal(
                ops.arange(vocab_size, dtype="int32"), ops.expand_dims(labels, -1)
            )
            q = ops.where(hit, 1.0 - eps + eps / vocab_size, eps / vocab_size)
            return ops.expand_dims(upstream, -1) * (exp / total - q)

        return value, grad

    return loss(logits)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, averaged over real tokens.

    The variant implemented spreads ε uniformly over the **whole** vocabulary
    of size ``V``, the true class included (as in
    ``keras.losses.CategoricalCrossentropy(label_smoothing=ε)``):

        q = (1 - ε) · onehot(y) + ε / V
        loss(token) = -Σ_v q_v · log softmax(logits)_v

    so the true class gets ``1 - ε + ε/V`` and every other class ``ε/V``. (Some
    implementations give ε/(V-1) to the other classes only, or leave the padding
    class out; those differ by O(ε/V).) The paper uses ε_ls = 0.1 (§5.4).

    Padding is skipped: tokens whose target is ``pad_id`` have no loss. With the
    default reduction the result is the mean over the remaining (real)
    tokens: ``Σ w · loss / #real``, where ``w`` is the sample weight (1 if
    none). A batch without real tokens gives 0 (not NaN) and zero gradients.

    Args:
        label_smoothing: ε in ``[0, 1)``; 0 gives the plain (sparse)
            cross-entropy.
        pad_id: target id to ignore; ``None`` ignores no id.
        from_logits: whether predictions are logits (default) or
            probabilities.
        reduction: as for ``keras.losses.Loss``; ``"sum_over_batch_size"``
            (and ``"mean"``) divide by the number of real tokens,
            ``"mean_with_sample_weight"`` by their summed weights, ``"sum"``
            does not divide, ``None``/``"none"`` return per-token losses
            (B, T) with 0 at padding.
        name: name of the loss.
        dtype: accepted for ``keras.losses.Loss`` compatibility; the loss is
            always computed in float32.

    Call args:
        y_true: integer target ids, shape (B, T).
        y_pred: logits (or probabilities), shape (B, T, V).
        sample_weight: optional weights, shape (B,) or (B, T).

    Returns:
        A float32 scalar (or (B, T) with ``reduction=None``).
    """

    def __init__(
        self,
        label_smoothing=0.1,
        pad_id=0,
        from_logits=True,
        reduction="sum_over_batch_size",
        name="label_smoothed_cross_entropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if isinstance(label_smoothing, bool) or not isinstance(
            label_smoothing, numbers.Real
        ):
            raise TypeError(
                "label_smoothing must be a number in [0, 1). "
                f"Received: label_smoothing={label_smoothing!r}"
            )
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                "label_smoothing must be in [0, 1). "
                f"Received: label_smoothing={label_smoothing!r}"
            )
        self.label_smoothing = float(label_smoothing)
        self.pad_id = _check_pad_id(pad_id)
        self.from_logits = bool(from_logits)

    def call(self, y_true, y_pred):
        """Per-token smoothed cross-entropy (B, T), padding not yet removed.

        Args:
            y_true: integer ids (B, T).
            y_pred: logits or probabilities (B, T, V).

        Returns:
            float32 tensor (B, T).
        """
        y_true = ops.cast(y_true, "int32")
        if self.pad_id is not None:
            # The pad id need not be a valid index (e.g. -100); its loss is
            # dropped later, so any in-range id will do for the gather.
            y_true = ops.where(ops.equal(y_true, self.pad_id), 0, y_true)
        # float32 even under mixed precision: log-softmax of float16 logits
        # loses the small probabilities that the ε/V term sums over.
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            return smoothed_cross_entropy(y_pred, y_true, self.label_smoothing)
        probs = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
        log_probs = ops.log(ops.clip(probs, keras.config.epsilon(), 1.0))
        return _from_log_probs(log_probs, y_true, self.label_smoothing)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Replaces Loss.__call__, which would average over the Keras mask of
        # y_pred alone: that mask comes from the decoder inputs, so it keeps
        # the </s>-input/padding-target position and the mean would be taken
        # over too many tokens.
        with keras.name_scope(self.name):
            real = _real_tokens(y_true, self.pad_id)
            weights = _token_weights(real, sample_weight)
            losses = self.call(y_true, y_pred) * weights
            if self.reduction in (None, "none"):
                return losses
            total = ops.sum(losses)
            if self.reduction == "sum":
                return total
            if self.reduction == "mean_with_sample_weight":
                count = ops.sum(weights)
            else:  # "sum_over_batch_size", "mean": per real token
                count = ops.sum(ops.cast(real, "float32"))
            # No real tokens: 0 / 0 gives 0, not NaN (and zero gradients).
            # Over the global batch also under tf.distribute (_global_mean).
            return _global_mean(total, count)

    def get_config(self):
        config = super().get_config()
        config.update(
            label_smoothing=self.label_smoothing,
            pad_id=self.pad_id,
            from_logits=self.from_logits,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Token accuracy over non-padding targets, accumulated over batches.

    ``correct / total`` where a token counts if its target is not ``pad_id``,
    and is correct if
    ``argmax(y_pred) == y_true``. Sample weights, if given, weight the tokens.

    Keras' built-in ``"accuracy"`` does not skip the padding positions of our
    model's targets: it goes by the Keras mask of the logits, which comes
    from the decoder *inputs* and so keeps the position where the input is
    </s> and the target is padding. A trained model predicts padding
    there, which counts as a correct token and inflates the accuracy. This
    metric goes by the targets.

    Args:
        pad_id: target id to ignore; ``None`` ignores no id.
        name: name of the metric.
        dtype: dtype of the state variables (default float32).

    Returns (``result()``):
        The fraction of correct real tokens, 0 before any real token.
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.pad_id = _check_pad_id(pad_id)
        self.correct = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="correct"
        )
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Add one batch: ids (B, T), logits (B, T, V), optional weights."""
        real = _real_tokens(y_true, self.pad_id)
        y_true = ops.cast(y_true, "int32")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weight = ops.cast(_token_weights(real, sample_weight), self.dtype)
        hits = ops.cast(ops.equal(predicted, y_true), self.dtype)
        self.correct.assign_add(ops.sum(hits * weight))
        self.total.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.correct, self.total)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {"pad_id": self.pad_id, "name": self.name, "dtype": self.dtype}
