"""The learning-rate schedule and optimizer of the paper (§5.3)."""

import math
import numbers

import keras
from keras import ops


def _check_positive(name, value):
    """Return ``value`` as a Python int or float; raise unless finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a positive number. Received: {name}={value!r} "
            f"of type {type(value).__name__}"
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{name} must be a positive number. Received: {name}={value!r}"
        )
    # Plain Python numbers keep get_config JSON-serializable (e.g. for np.int64).
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _check_accumulate(value):
    """``value`` as a Python int >= 1; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            "accumulate must be an integer >= 1. Received: "
            f"accumulate={value!r} of type {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(f"accumulate must be an integer >= 1. Received: {value}")
    return int(value)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up, then decay with the inverse square root of the step (§5.3).

    ``lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)``

    The rate rises linearly for ``warmup_steps`` steps, peaks at
    ``step = warmup_steps`` with ``scale · (d_model · warmup_steps)^-0.5``, and
    decays as ``step^-0.5`` afterwards.

    ``step`` counts from 1: the schedule is called with the optimizer's
    iteration counter, which is 0 before the first update, and uses
    ``step = iteration + 1``. The first update thus gets the paper's
    ``step_num = 1`` rather than a rate of 0 (and never evaluates ``0^-0.5``).

    With ``accumulate = N`` the step counts updates of an optimizer with
    ``gradient_accumulation_steps=N``: Keras calls a schedule with the
    number of batches seen, not of updates (``optimizer.iterations`` is the
    latter), so ``step = floor(batches / N) + 1`` and the warm-up lasts
    ``warmup_steps`` updates, as in the paper, not ``warmup_steps`` batches.

    Args:
        d_model: model width; the paper's rate scales with ``d_model^-0.5``.
        warmup_steps: number of warm-up steps (paper: 4000).
        scale: constant factor on the whole rate (paper: 1.0).
        accumulate: int >= 1, batches per update (1: no accumulation).
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, accumulate=1):
        super().__init__()
        self.d_model = _check_positive("d_model", d_model)
        self.warmup_steps = _check_positive("warmup_steps", warmup_steps)
        self.scale = _check_positive("scale", scale)
        self.accumulate = _check_accumulate(accumulate)

    def __call__(self, step):
        """Return the learning rate for optimizer iteration ``step`` (from 0).

        Args:
            step: the optimizer's iteration counter (scalar or array, int or
                float); 0 before the first update.

        Returns:
            The learning rate as a float32 tensor of ``step``'s shape.
        """
        # The optimizer counts iterations from 0; the paper's step_num from 1.
        step = ops.cast(step, "float32")
        if self.accumulate > 1:  # batches seen -> updates made
            step = ops.floor(step / float(self.accumulate))
        step = step + 1.0
        # Python floats: the constant factors are computed in float64.
        factor = self.scale * float(self.d_model) ** -0.5
        warmup = float(self.warmup_steps) ** -1.5
        # §5.3: lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5).
        return factor * ops.minimum(ops.rsqrt(step), step * warmup)

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "accumulate": self.accumulate,
        }


def transformer_optimizer(d_model, warmup_steps=4000, scale=1.0, accumulate=1):
    """Adam with the paper's hyper-parameters and learning-rate schedule (§5.3).

    Args:
        d_model: model width, for the ``d_model^-0.5`` factor of the schedule.
        warmup_steps: warm-up steps of the schedule (paper: 4000).
        scale: constant factor on the learning rate (paper: 1.0).
        accumulate: int >= 1: one update per ``accumulate`` batches, with
            their mean gradient (Keras' ``gradient_accumulation_steps``), so
            that a small device trains with the paper's batches of about
            25,000 target tokens (§5.1).

    Returns:
        ``keras.optimizers.Adam`` with β1 = 0.9, β2 = 0.98, ε = 1e-9 and a
        ``TransformerSchedule`` as its learning rate.
    """
    schedule = TransformerSchedule(
        d_model, warmup_steps=warmup_steps, scale=scale, accumulate=accumulate
    )
    # §5.3: "β1 = 0.9, β2 = 0.98 and ε = 10^-9".
    return keras.optimizers.Adam(
        learning_rate=schedule,
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        gradient_accumulation_steps=schedule.accumulate
        if schedule.accumulate > 1
        else None,
    )
