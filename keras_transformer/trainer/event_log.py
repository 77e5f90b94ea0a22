"""Training curves for TensorBoard, written without TensorFlow.

``EpochScalars`` writes the scalars of Keras' ``TensorBoard`` callback
(``update_freq="epoch"``) with tensorboardX, which needs neither TensorFlow
nor TensorBoard: ``train/`` and ``validation/`` under the log folder, one
scalar per metric per epoch, tagged ``epoch_<name>`` and stepped by the
epoch's index, the optimizer's learning rate at the end of each epoch
(``epoch_learning_rate``, in ``train/``), and each validation's metrics
stepped by the optimizer's updates (``evaluation_<name>_vs_iterations``, in
``validation/``). Keras' callback also writes the model's config as text;
this one writes scalars only.
"""

import contextlib
import importlib.abc
import itertools
import os
import socket
import sys
import threading
import time

import keras

from keras_transformer.trainer.parallel import log

TRAIN, VALIDATION = "train", "validation"

# Two files opened in one second in one folder would otherwise get the same
# name, and the second would truncate the first.
_opened = itertools.count()
# Two threads' first imports of tensorboardX would each put their finder on
# sys.meta_path, and one could drop the other's (``_not_found_here``).
_first_import = threading.Lock()


def available():
    """Whether tensorboardX imports."""
    try:
        _tensorboardx()
    except ImportError:
        return False
    return True


def _tensorboardx():
    # tensorboardX imports PyTorch wherever it is installed (its package
    # imports its SummaryWriter, which takes torch tensors too): on JAX or
    # TensorFlow that is seconds and memory for nothing, so where nothing
    # has imported PyTorch, tensorboardX is imported as if PyTorch were not
    # installed (a float scalar never asks for it later).
    with _first_import:
        if "torch" in sys.modules or "tensorboardX" in sys.modules:
            import tensorboardX
        else:
            with _not_found_here("torch"):
                import tensorboardX
    import tensorboardX.proto.event_pb2
    import tensorboardX.summary

    return tensorboardX


@contextlib.contextmanager
def _not_found_here(name):
    """Imports of module ``name`` (and its submodules) made by this thread
    in the block fail as if it were not installed.

    ``sys.modules`` is left alone (a ``None`` entry there would fail every
    thread's import of it while the block runs): a finder that answers for
    this thread alone goes first on ``sys.meta_path``, in a new list rather
    than inserted into the one that another thread's import may be walking.
    """
    finder = _NotFoundHere(name, threading.get_ident())
    sys.meta_path = [finder, *sys.meta_path]
    try:
        yield
    finally:
        sys.meta_path = [entry for entry in sys.meta_path if entry is not finder]


class _NotFoundHere(importlib.abc.MetaPathFinder):
    """See ``_not_found_here``."""

    def __init__(self, name, thread):
        self.name, self.thread = name, thread

    def find_spec(self, fullname, path=None, target=None):
        ours = fullname == self.name or fullname.startswith(f"{self.name}.")
        if ours and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None  # the other finders decide


class EpochScalars(keras.callbacks.Callback):
    """Each epoch's logs as TensorBoard scalars in ``log_dir``.

    Keras' logs name validation metrics ``val_<name>``: those go to
    ``validation/`` as ``epoch_<name>``, the others to ``train/``. The step
    is the epoch index that ``fit`` passes, so a run resumed with
    ``initial_epoch`` goes on where it stopped. Each validation's metrics
    also go to ``validation/`` stepped by the optimizer's updates, as Keras'
    callback writes them.

    Each epoch's scalars are on disk when the epoch ends: written in this
    thread (not from the queue of tensorboardX's ``SummaryWriter``, whose
    flush leaves the queue, and whose errors end its thread), then flushed.
    A process killed later loses nothing of them, and the files read to
    their last whole record. The files of one ``fit`` are closed at its end
    (``on_train_end``), and by ``close``; a later ``fit`` writes new files
    beside them, which TensorBoard reads as one run.

    The logs never stop training: a file that cannot be written (a full
    disk) is named in one line, and no more scalars are written.

    Args:
        log_dir: the folder of ``train/`` and ``validation/``.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self.failed = False
        self._files = {}

    def on_test_end(self, logs=None):
        iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
        if iterations is None or not logs:
            return
        step = int(keras.ops.convert_to_numpy(iterations))
        scalars = {f"evaluation_{k}_vs_iterations": v for k, v in logs.items()}
        self._write(VALIDATION, scalars, step)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        validation = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        rate = self._learning_rate()
        if rate is not None:
            train["learning_rate"] = rate
        for folder, scalars in ((TRAIN, train), (VALIDATION, validation)):
            self._write(folder, {f"epoch_{k}": v for k, v in scalars.items()}, epoch)
        for folder, file in list(self._files.items()):
            self._guard(folder, file.flush)

    def on_train_end(self, logs=None):
        self.close()

    def close(self):
        """Close the open files (a later epoch opens new ones)."""
        files, self._files = self._files, {}
        for folder, file in files.items():
            self._guard(folder, file.close)

    def _write(self, folder, scalars, step):
        if not scalars or self.failed:
            return
        tbx = _tensorboardx()

        def write():
            if folder not in self._files:
                self._files[folder] = self._open(folder)
            now = time.time()
            for tag, value in scalars.items():
                summary = tbx.summary.scalar(tag, float(value))
                event = tbx.proto.event_pb2.Event(
                    wall_time=now, step=step, summary=summary
                )
                self._files[folder].write(event.SerializeToString())

        self._guard(folder, write)

    def _open(self, folder):
        tbx = _tensorboardx()
        path = os.path.join(self.log_dir, folder)
        os.makedirs(path, exist_ok=True)
        # Named as tensorboardX and TensorFlow name theirs.
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_opened):06d}"
        )
        file = tbx.RecordWriter(os.path.join(path, name))
        version = tbx.proto.event_pb2.Event(
            wall_time=time.time(), file_version="brain.Event:2"
        )
        file.write(version.SerializeToString())
        return file

    def _guard(self, folder, action):
        try:
            action()
        except OSError as error:
            if not self.failed:
                where = os.path.join(self.log_dir, folder)
                log(f"TensorBoard logs stopped: cannot write to {where}: {error}")
            self.failed = True
            file = self._files.pop(folder, None)
            if file is not None:
                with contextlib.suppress(OSError):
                    file.close()

    def _learning_rate(self):
        # As Keras' callback reads it: the inner optimizer of a loss-scaled
        # one, a schedule at the current step.
        optimizer = getattr(self.model, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            return None
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
