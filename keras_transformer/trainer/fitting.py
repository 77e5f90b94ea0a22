"""The model of a run, and its training with ``model.fit``.

The paper's recipe: Adam (β1 0.9, β2 0.98, ε 1e-9) with warm-up and inverse
square-root decay (§5.3), label smoothing (§5.4), one joint vocabulary and
shared embeddings (§3.4), and the final model the mean of the last
checkpoints (§6.1).
"""

import contextlib
import dataclasses
import signal
import sys

import keras

import keras_transformer as kt
from keras_transformer.distribute import cluster
from keras_transformer.trainer import checkpoints, event_log
from keras_transformer.trainer.callbacks import (
    Checkpointer,
    ProgressLog,
    StopOnSignal,
    TimeBudget,
)
from keras_transformer.trainer.errors import UsageError
from keras_transformer.trainer.parallel import log
from keras_transformer.trainer.run_folder import CHECKPOINTS_DIR, LOGS_DIR


def compiled_model(config, model_config, vocab_size, pretrained=None):
    """The Transformer of ``model_config`` over one joint vocabulary, or a
    copy of ``pretrained`` (a Transformer: its architecture and weights),
    compiled with the paper's optimizer and the label-smoothed loss."""
    if pretrained is None:
        model = kt.build_model(
            model_config, src_vocab_size=vocab_size, share_embeddings=True
        )
    else:
        model = type(pretrained).from_config(pretrained.get_config())
        model.set_weights(pretrained.get_weights())
    model.compile(
        optimizer=kt.transformer_optimizer(
            model_config.d_model,
            config.warmup_steps,
            config.lr_scale,
            config.accumulate or 1,
        ),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=config.label_smoothing),
        metrics=[kt.MaskedAccuracy()],
    )
    return model


def single_process_copy(config, model_config, model):
    """``model`` (its weights, its step) on this process alone: the trained
    one's variables span every process's devices, and setting them (as
    averaging does) would wait for the other processes, which have ended."""
    copy = compiled_model(config, model_config, model.src_vocab_size, model)
    copy.optimizer.build(copy.trainable_variables)
    copy.set_weights(model.get_weights())
    copy.optimizer.iterations.assign(steps(model))
    return copy


def describe(config, model_config, model):
    """One line: the model, the backend and the precision."""
    fields = ("num_layers", "d_model", "num_heads", "d_ff", "dropout")
    values = dataclasses.asdict(model_config)
    shape = ", ".join(f"{f}={values[f]}" for f in fields)
    return (
        f"model: {config.init_from or config.config} ({shape}), "
        f"{model.count_params():,} parameters; "
        f"backend {keras.backend.backend()}, {keras.config.dtype_policy().name}"
    )


def resume_state(model, folder):
    """Load the newest checkpoint that loads; its state, or None if there is
    none. A damaged checkpoint is skipped (and left as it is)."""
    latest, state = checkpoints.load_latest(
        model, folder.checkpoints, _skipping, finite=True
    )
    if latest is not None:
        log(
            f"resuming from {latest}: epoch {state['epoch'] + 1}, "
            f"batch {state['batch']}, step {state['iterations']}, "
            f"{state['elapsed_seconds']:.0f} s trained"
        )
        return state
    if checkpoints.list_checkpoints(folder.checkpoints):
        # Starting over would soon delete them; that is for the user to say.
        raise UsageError(
            f"no checkpoint in {folder.checkpoints} loads (why is above); pass "
            "`overwrite` to train again from scratch."
        )
    return None


@dataclasses.dataclass
class Outcome:
    """How ``fit`` ended: the seconds trained in all, and, if training
    stopped early, where it diverged or the signal that stopped it."""

    seconds: float
    diverged: dict | None = None
    signal: int | None = None
    checkpoint: str | None = None  # the newest checkpoint written


def fit(config, folder, model, dataset, val_dataset, state):
    """Train until ``epochs`` or ``max_minutes``, from ``state`` (a
    checkpoint's, or None), or until the run diverges or a signal asks it to
    stop (a checkpoint written first); returns an ``Outcome``."""
    state = state or {"epoch": 0, "batch": 0, "elapsed_seconds": 0.0}
    chief, several = cluster.is_chief(), cluster.process_count() > 1
    budget = TimeBudget(
        None if config.max_minutes is None else 60 * config.max_minutes,
        elapsed=state["elapsed_seconds"] or 0.0,
        agree=cluster.broadcast_flag if several else None,  # process 0's clock
    )
    checkpointer = Checkpointer(
        folder.checkpoints,
        epoch_length=len(dataset),
        every_steps=config.checkpoint_steps,
        keep=config.checkpoints_kept(),
        budget=budget,
        write=chief,
    )
    # Every process stops at the batch in which any of them got a signal.
    stop = StopOnSignal(agree=cluster.largest if several else None)
    callbacks = [budget, keras.callbacks.TerminateOnNaN(), stop, checkpointer]
    verbose = config.verbose
    verbose = (1 if sys.stdout.isatty() else 2) if verbose == "auto" else int(verbose)
    # Not on a terminal Keras prints one line per epoch: lines in between.
    lines = ProgressLog(every=config.progress_seconds, budget=budget)
    tensorboard = None
    if not chief:
        verbose = 0
    else:
        callbacks.append(_Progress(config.epochs))
        if verbose == 2:
            callbacks.append(lines)
        tensorboard = _tensorboard(folder.file(LOGS_DIR))
        if tensorboard is not None:
            callbacks.append(tensorboard)
        folder.will_create(CHECKPOINTS_DIR, *([LOGS_DIR] if tensorboard else []))
    # One fit() per epoch, each on that epoch's fixed order of batches: a
    # resumed epoch then serves exactly the batches not trained yet.
    epoch, skip = state["epoch"], state["batch"]
    with stop.handling(), _closing(tensorboard):
        while epoch < config.epochs and not budget.exhausted:
            checkpointer.first_batch = skip
            view = dataset.epoch_view(epoch, skip=skip)
            lines.tokens = view.target_tokens
            model.fit(
                view,
                validation_data=val_dataset,
                initial_epoch=epoch,
                epochs=epoch + 1,
                callbacks=callbacks,
                verbose=verbose,
                shuffle=False,
            )
            if checkpointer.diverged or stop.signal:
                break
            last = checkpointer.last_state
            epoch, skip = last["epoch"], last["batch"]
    outcome = Outcome(
        budget.elapsed, checkpointer.diverged, stop.signal, checkpointer.last_path
    )
    if outcome.diverged:
        reason = f"diverged: {outcome.diverged['reason']}"
    elif outcome.signal:
        reason = signal.Signals(outcome.signal).name
    else:
        reason = "time budget" if budget.exhausted else f"{config.epochs} epochs"
    log(f"trained {budget.elapsed:.0f} s ({reason}), {steps(model)} steps")
    return outcome


def average(config, model, folder):
    """The mean of the last ``average_last`` checkpoints' weights (§6.1),
    up to this step: later ones (that did not load when resuming) are not of
    this training. Checkpoints that do not load, or hold weights that are not
    finite, are left out (and named). Returns the checkpoints averaged."""
    paths = checkpoints.list_checkpoints(folder.checkpoints, up_to=steps(model))
    paths = paths[-config.average_last :]
    skipped = []

    def skip_one(error):
        skipped.append(error)
        _skipping(error)

    try:
        checkpoints.average_checkpoints(model, paths, on_skip=skip_one)
    except checkpoints.CheckpointError as error:
        raise UsageError(str(error)) from None
    used = f"{len(paths) - len(skipped)} of " if skipped else ""
    log(f"averaged {used}the last {len(paths)} checkpoints")
    left_out = {error.path for error in skipped}
    return [path for path in paths if path not in left_out]


def steps(model):
    """The optimizer's update count."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _skipping(error):
    log(f"skipping checkpoint {error.path}: {error.reason}")


def _tensorboard(log_dir):
    if not event_log.available():
        log(
            "tensorboardX is not installed: no TensorBoard logs "
            '(pip install "keras-transformer-aiayn[text]")'
        )
        return None
    return event_log.EpochScalars(log_dir)


@contextlib.contextmanager
def _closing(tensorboard):
    # fit() closes the files at its end; a fit that raises leaves them open.
    try:
        yield
    finally:
        if tensorboard is not None:
            tensorboard.close()


class _Progress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, numbering epochs out of the run's total.

    Each ``fit`` here trains one epoch, so Keras' own logger would print
    "Epoch 3/3" for the third epoch of twenty.
    """

    def __init__(self, total_epochs):
        super().__init__()
        self.total_epochs = total_epochs

    def set_params(self, params):
        super().set_params(params)
        self.epochs = self.total_epochs

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:  # the time budget ended the epoch early
            self.target = self.seen
        super().on_epoch_end(epoch, logs)
