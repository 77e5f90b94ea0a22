"""A ``keras.Model`` whose trainer calls check their inputs first and, when
they fail, leave the weights of the last completed step.

``Transformer`` inherits this; the architecture is in ``model.py``. Inputs
are checked by ``_inputs`` (once per path), weights kept by ``_fault_safe``.
"""

import keras

from keras_transformer._guards import checks as _checks
from keras_transformer._guards import fault_safe as _fault_safe
from keras_transformer._guards import inputs as _inputs
from keras_transformer._guards import private_api


class GuardedModel(keras.Model):
    """``keras.Model`` with checked inputs and fault-safe trainer calls."""

    def validate_inputs(self, x, y=None):
        """Raise ``TypeError``/``ValueError`` for malformed token ids or
        targets (what the host can read of them; see ``_inputs.validate``)."""
        _inputs.validate(self, x, y)

    def __call__(self, inputs, *args, **kwargs):
        inputs = _inputs.arrays_from_lists(inputs)
        if _checks.inputs_were_checked() or not _inputs.validate(self, inputs):
            return super().__call__(inputs, *args, **kwargs)
        with _checks.inputs_checked():  # checked whole on the host just now
            return super().__call__(inputs, *args, **kwargs)

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        # Targets are token ids like the inputs, with the same contract: a
        # float or out-of-vocabulary target is an error, never a loss value
        # (JAX would give NaN, PyTorch a finite wrong number).
        y, ids = _inputs.checked_targets(self, y)
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        if ids is None:
            return loss
        return _checks.nan_unless_in_range(loss, ids, 0, self.tgt_vocab_size)

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

    # -- every trainer call checks its data, and keeps the weights on failure --

    def fit(self, x=None, y=None, *args, **kwargs):
        x, y = _inputs.arrays_from_lists(x), _inputs.arrays_from_lists(y, "targets")
        _inputs.validate(self, x, y)
        self._build_optimizer()
        with _fault_safe.guard(self):
            return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        x, y = _inputs.arrays_from_lists(x), _inputs.arrays_from_lists(y, "targets")
        _inputs.validate(self, x, y)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        x = _inputs.arrays_from_lists(x)
        _inputs.validate(self, x)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        x, y = _inputs.arrays_from_lists(x), _inputs.arrays_from_lists(y, "targets")
        _inputs.validate(self, x, y)
        self._build_optimizer()
        with _fault_safe.guard(self):
            return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        x, y = _inputs.arrays_from_lists(x), _inputs.arrays_from_lists(y, "targets")
        _inputs.validate(self, x, y)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().test_on_batch(x, y, *args, **kwargs)

    def predict_on_batch(self, x):
        x = _inputs.arrays_from_lists(x)
        _inputs.validate(self, x)
        with _fault_safe.guard(self), _checks.deferred_value_errors():
            return super().predict_on_batch(x)

    def _build_optimizer(self):
        """Create the optimizer's variables before the first compiled step.

        Keras' TensorFlow trainer builds the optimizer inside the first
        traced step when no distribution strategy is set; tf.function then
        traces that step twice and wraps every new variable's initializer in
        a ``tf.cond`` (four conditional graphs per weight for Adam). Built
        here, the step is traced once, as Keras' JAX and PyTorch trainers do
        by building first."""
        optimizer = getattr(self, "optimizer", None)
        if (
            keras.backend.backend() == "tensorflow"
            and optimizer is not None
            and not optimizer.built
            and self.built
            and private_api.no_tf_distribution(self)
        ):
            optimizer.build(self.trainable_variables)

    # -- JAX trainer hooks (see _fault_safe) -----------------------------------
    # Private to Keras: private_api.TRAINER_HOOKS names them, and the guards
    # stand aside, with a warning, on a Keras that no longer calls one.

    def _purge_model_variables(self, *args, **kwargs):
        if _fault_safe.active(self):
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
        if keras.backend.backend() == "jax" and _fault_safe.active(self):
            step_function = _fault_safe.checked_step(self, step_function)
        return super()._make_function(step_function, *args, **kwargs)

    # -- PyTorch trainer hooks (see _fault_safe.checked_torch_step) -------------

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
            and _fault_safe.active()
            and private_api.should_torch_compile(self)
        ):
            function = _fault_safe.checked_torch_step(self, attribute, function)
            setattr(self, attribute, function)
            return function
        return made
