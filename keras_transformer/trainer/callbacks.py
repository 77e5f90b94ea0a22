"""Callbacks for long training runs: a time budget, resumable checkpoints
that never hold a diverged model, a clean stop on a scheduler's signal, and
progress lines for logs."""

import contextlib
import math
import os
import signal
import sys
import threading
import time

import keras

from keras_transformer import progress
from keras_transformer.trainer import checkpoints


class TimeBudget(keras.callbacks.Callback):
    """Stop training cleanly once a time budget is spent.

    The clock runs from ``on_train_begin`` and adds to ``elapsed`` (seconds
    already trained, e.g. before an interruption), so a resumed run gets only
    what is left of the budget. When the budget is spent the callback sets
    ``model.stop_training`` at the end of a batch; Keras then ends the epoch
    as usual (validation and ``on_epoch_end`` still run).

    Args:
        max_seconds: float > 0, or None for no limit (the clock still runs).
        elapsed: float, seconds already spent.
        agree: optional callable, ``agree(spent) -> bool``: turns this
            process's verdict into the one all processes act on (several
            processes training one model must stop at the same batch;
            ``keras_transformer.distribute.cluster.broadcast_flag`` gives process 0's).
    """

    def __init__(self, max_seconds=None, elapsed=0.0, agree=None):
        super().__init__()
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0. Received: {max_seconds!r}")
        self.max_seconds = max_seconds
        self.agree = agree
        self._before = float(elapsed)
        self._start = None

    @property
    def elapsed(self):
        """Seconds trained, this run included."""
        if self._start is None:
            return self._before
        return self._before + time.monotonic() - self._start

    @property
    def exhausted(self):
        """Whether the budget is spent: this process's clock, or, with
        ``agree``, the verdict all processes share (a collective: every
        process must ask at the same point)."""
        spent = self.max_seconds is not None and self.elapsed >= self.max_seconds
        if self.agree is not None and self.max_seconds is not None:
            spent = self.agree(spent)
        return spent

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()

    def on_train_end(self, logs=None):
        self._before = self.elapsed
        self._start = None

    def on_train_batch_end(self, batch, logs=None):
        if self.exhausted:
            self.model.stop_training = True


class Checkpointer(keras.callbacks.Callback):
    """Save resumable checkpoints every ``every_steps`` steps and per epoch,
    never one of a diverged model.

    A checkpoint records where in the data it was taken: ``epoch`` (0-based)
    and ``batch`` (batches of that epoch already trained), so a resumed run
    can skip exactly those. It is written at every ``every_steps`` optimizer
    steps and at the end of every ``fit`` epoch, whether the epoch was
    complete or stopped early (then ``batch`` says how far it got).

    A loss that is not finite, or weights that are not (checked before each
    save), mean the run diverged: nothing more is saved, ``diverged`` says
    where, and training stops at the end of that batch. The checkpoints
    written before are all finite.

    Args:
        directory: where checkpoints go (see ``keras_transformer.trainer.checkpoints``).
        epoch_length: batches in a full epoch.
        every_steps: int >= 1 or None (only at epoch ends).
        keep: int or None, how many checkpoints to keep.
        budget: optional ``TimeBudget`` whose ``elapsed`` is recorded.
        extra_state: optional dict merged into every ``state.json``.
        write: False to keep the state of each checkpoint without writing
            it (the processes other than 0 of a multi-process run).

    Attributes:
        first_batch: batches of the current epoch trained before this ``fit``
            (set it before a ``fit`` that resumes mid-epoch).
        last_path: the newest checkpoint written.
        last_state: the ``state.json`` of the newest checkpoint (written or
            not).
        diverged: None, or a dict saying where training diverged
            (``iterations``, ``epoch``, ``batch``, ``reason``).
    """

    def __init__(
        self,
        directory,
        epoch_length,
        every_steps=None,
        keep=None,
        budget=None,
        extra_state=None,
        write=True,
    ):
        super().__init__()
        self.write = bool(write)
        self.last_state = None
        self.directory = directory
        self.epoch_length = int(epoch_length)
        self.every_steps = every_steps
        self.keep = keep
        self.budget = budget
        self.extra_state = dict(extra_state or {})
        self.first_batch = 0
        self.last_path = None
        self.diverged = None
        self._epoch = 0
        self._done = 0
        self._updates = None

    def on_train_begin(self, logs=None):
        self._updates = self._iterations()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._done = self.first_batch

    def on_train_batch_end(self, batch, logs=None):
        self._done = self.first_batch + batch + 1
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self._diverge(f"the loss was {float(loss)}")
            return
        # With gradient accumulation a batch need not end in an update: save
        # only after one, or the same step would be saved N times.
        updates, before = self._iterations(), self._updates
        self._updates = updates
        if self.every_steps and updates != before and updates % self.every_steps == 0:
            self._save(self._epoch, self._done)

    def on_epoch_end(self, epoch, logs=None):
        self._save(epoch, self._done, logs)
        self.first_batch = 0

    def _diverge(self, reason):
        if self.diverged is None:
            self.diverged = {
                "iterations": self._iterations(),
                "epoch": int(self._epoch),
                "batch": int(self._done),
                "reason": reason,
            }
        self.model.stop_training = True

    def _iterations(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _save(self, epoch, batch, logs=None):
        if self.diverged is not None:
            return
        if not checkpoints.weights_are_finite(self.model):
            self._diverge("the weights were no longer finite")
            return
        if batch >= self.epoch_length:  # a finished epoch resumes at the next
            epoch, batch = epoch + 1, 0
        state = dict(self.extra_state)
        state.update(
            epoch=int(epoch),
            batch=int(batch),
            iterations=self._iterations(),
            elapsed_seconds=round(self.budget.elapsed, 3) if self.budget else None,
        )
        if logs:
            state["logs"] = {k: float(v) for k, v in logs.items()}
        self.last_state = state
        if self.write:
            self.last_path = checkpoints.save_checkpoint(
                self.model, self.directory, state, keep=self.keep
            )


# SIGUSR1 where there is one (not on Windows).
_REQUESTS = tuple(filter(None, [getattr(signal, "SIGUSR1", None)]))


class StopOnSignal(keras.callbacks.Callback):
    """Stop training at the end of the batch in which a signal arrives.

    Schedulers and spot machines send SIGTERM (a user's Ctrl-C, SIGINT) and
    wait a while before killing. While ``handling()`` is active the first
    such signal is noted (and said on ``stream``); at the end of the batch
    training stops as at the end of an epoch (a ``Checkpointer`` then
    writes its checkpoint). A second signal ends the process at once, with
    the exit status ``128 + signal``. A ``requests`` signal (SIGUSR1, which
    ``kt-launch`` passes on) asks for the same stop but never counts as the
    second: a process hit by both a launcher's request and the signal
    itself still writes its checkpoint.

    Args:
        signals: the signals to handle.
        requests: signals that only ask for the stop.
        agree: optional callable, ``agree(signal_number_or_0) -> int``: what
            every process acts on (several processes training one model stop
            at the same batch; ``keras_transformer.distribute.cluster.largest``).
        stream: where the notice goes (default ``sys.stderr``).

    Attributes:
        signal: the number of the signal that stopped training (one that
            reached another process, with ``agree``), or None.
    """

    def __init__(
        self,
        signals=(signal.SIGTERM, signal.SIGINT),
        requests=_REQUESTS,
        agree=None,
        stream=None,
    ):
        super().__init__()
        self.signals = tuple(signals)
        self.requests = tuple(requests)
        self.agree = agree
        self.stream = stream
        self.signal = None
        self._received = 0

    @contextlib.contextmanager
    def handling(self):
        """The handlers installed while the block runs (main thread only:
        elsewhere Python delivers no signals, and nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        numbers = self.signals + self.requests
        previous = {number: signal.signal(number, self._handle) for number in numbers}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _handle(self, number, frame):
        name = signal.Signals(number).name
        stream = sys.stderr if self.stream is None else self.stream
        if number in self.requests:
            if not self._received:
                self._received = number
                stream.write(f"\n{name}: stopping at the end of this batch\n")
                stream.flush()
            return
        if self._received in self.signals:
            stream.write(f"\n{name}, a second signal: stopping now, no checkpoint\n")
            stream.flush()
            os._exit(128 + number)
        self._received = number
        stream.write(
            f"\n{name}: stopping at the end of this batch to write a checkpoint "
            f"({name} again stops at once)\n"
        )
        stream.flush()

    def on_train_batch_end(self, batch, logs=None):
        received = self._received
        if self.agree is not None:
            received = self.agree(received)
        if received:
            self.signal = received
            self.model.stop_training = True


class ProgressLog(keras.callbacks.Callback):
    """A line every ``every`` seconds within an epoch, for logs.

    Keras' progress bar prints one line per epoch when its output is not a
    terminal, and an epoch can last many minutes; this prints the step, the
    loss, target tokens per second, the learning rate and what is left of the
    time budget in between.

    Args:
        every: float, seconds between lines.
        budget: optional ``TimeBudget`` whose remaining time is shown.
        tokens: optional callable, ``tokens(batch)`` the target tokens of
            batch ``batch`` of the running ``fit`` (for tokens per second).
        stream: where the lines go (default ``sys.stdout``, with Keras' own).
        clock: callable returning seconds (for tests).
    """

    def __init__(self, every=30.0, budget=None, tokens=None, stream=None, clock=None):
        super().__init__()
        self.every = every
        self.budget = budget
        self.tokens = tokens
        self.stream = stream
        self.clock = time.monotonic if clock is None else clock

    def on_train_begin(self, logs=None):
        self._start = self._last = self.clock()
        self._seen_tokens = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.tokens is not None:
            self._seen_tokens += self.tokens(batch)
        now = self.clock()
        if now - self._last < self.every:
            return
        self._last = now
        steps = self.params.get("steps")
        parts = [f"step {batch + 1}" + (f"/{steps}" if steps else "")]
        if logs and "loss" in logs:
            parts.append(f"loss {float(logs['loss']):.4f}")
        if self.tokens is not None and now > self._start:
            rate = self._seen_tokens / (now - self._start)
            parts.append(f"{rate:,.0f} target tokens/s")
        rate = self.model.optimizer.learning_rate
        parts.append(f"learning rate {float(keras.ops.convert_to_numpy(rate)):.3g}")
        if self.budget is not None and self.budget.max_seconds is not None:
            left = max(self.budget.max_seconds - self.budget.elapsed, 0.0)
            parts.append(f"{progress.duration(left)} of the time budget left")
        stream = sys.stdout if self.stream is None else self.stream
        stream.write(", ".join(parts) + "\n")
        stream.flush()
