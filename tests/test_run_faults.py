"""What real training runs meet, injected for real through kt-train: a second
run on the same folder, a divergent learning rate, a full disk, SIGTERM in
the middle of an epoch. After each: the files that matter, the message, the
exit status, and a rerun.

JAX's and TensorFlow's runs take these (their trainers have paths of their
own: JAX's detached state, TensorFlow's graphs); the backend-free parts run
once.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_transformer.cli import train
from keras_transformer.model.transformer import Transformer
from keras_transformer.trainer import checkpoints
from keras_transformer.trainer.lock import FolderInUse, FolderLock, lock_path
from keras_transformer.translate.evaluation import load_translator

REPO = Path(__file__).resolve().parents[1]
BACKEND = keras.backend.backend()

# A model small enough that a run takes seconds, on 300 pairs: 19 batches
# an epoch, one bucket (one shape to compile).
SMALL = [
    "--task", "numbers", "--train-size", "300", "--val-size", "8",
    "--test-size", "8", "--uniform-size", "0", "--num-layers", "1",
    "--d-model", "32", "--num-heads", "2", "--d-ff", "64", "--max-length", "32",
    "--vocab-size", "80", "--batch-tokens", "512", "--bucket-lengths", "32",
    "--beam-size", "1", "--verbose", "0",
]  # fmt: skip
RUN_BACKENDS = pytest.mark.backends("jax", "tensorflow")


def command(out, *extra):
    return [*SMALL, *extra, "--out", str(out)]


def stopped(capsys, argv, status):
    """Run kt-train, which must exit with ``status``; its one error line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        train.main(argv)
    assert raised.value.code == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("kt-train: ")]
    assert len(lines) == 1, err
    return lines[0]


def states(out):
    return [
        checkpoints.read_state(path)
        for path in checkpoints.list_checkpoints(out / "checkpoints")
    ]


def temporaries(out):
    """Temporary files and folders anywhere in the run folder."""
    return [
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.name.startswith(".tmp-") or checkpoints.temporary_target(p.name)
    ]


def all_finite(path):
    model = load_translator(path).transformer
    return checkpoints.weights_are_finite(model)


def subprocess_env():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    return env


# -- one writer per folder --------------------------------------------------------


@RUN_BACKENDS
@pytest.mark.slow
def test_a_second_run_on_the_folder_is_refused_and_the_first_loses_nothing(
    tmp_path, capsys
):
    out = tmp_path / "run"
    argv = command(out, "--epochs", "1", "--checkpoint-steps", "5")
    first = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.cli.train", *argv],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with first:
        deadline = time.monotonic() + 120
        while not (out / "run.json").exists():  # it holds the folder by then
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run never started"
            time.sleep(0.05)
        line = stopped(capsys, argv, 2)
        assert f"--out {out} is in use by another run" in line
        assert f"process {first.pid} on host " in line
        assert first.wait(timeout=300) == 0, first.stderr.read()
    # The first run's checkpoints are whole, nothing temporary is left, and
    # its translator loads.
    paths = checkpoints.list_checkpoints(out / "checkpoints")
    assert paths and all(
        sorted(os.listdir(p)) == [checkpoints.WEIGHTS_FILE, checkpoints.STATE_FILE]
        for p in paths
    )
    assert not temporaries(out)
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    assert all_finite(out / "translator.keras")
    # The lock went with its run: the folder now answers as a finished run.
    assert not os.path.exists(lock_path(out))
    assert "finished run" in stopped(capsys, argv, 2)


LOCKER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("lock", sys.argv[1])
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
lock.FolderLock(sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.once
def test_a_lock_left_by_a_killed_run_blocks_nothing(tmp_path):
    from keras_transformer.trainer import lock

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, lock.__file__, str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    with holder:
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(FolderInUse) as raised:
                FolderLock(out).acquire()
            assert raised.value.holder["pid"] == holder.pid
            assert f"process {holder.pid} on host" in str(raised.value)
        finally:
            holder.kill()  # as kill -9: no chance to release anything
    assert os.path.exists(lock_path(out))  # left behind, and harmless
    with FolderLock(out) as taken:
        assert taken.held
        with pytest.raises(FolderInUse):  # and exclusive again
            FolderLock(out).acquire()
    assert not os.path.exists(lock_path(out))


# -- divergence -------------------------------------------------------------------


@RUN_BACKENDS
def test_a_divergent_learning_rate_saves_nothing_non_finite(tmp_path, capsys):
    # The paper's rate times 1e12: the loss is NaN from the second step.
    divergent = ["--lr-scale", "1e12", "--warmup-steps", "1", "--epochs", "2"]
    out = tmp_path / "run"
    line = stopped(capsys, command(out, *divergent, "--checkpoint-steps", "1"), 1)
    assert "training diverged at step 2" in line and "the loss was nan" in line
    assert f"{out / 'translator.keras'} holds the last finite checkpoint" in line
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "diverged" and "the loss was nan" in run["stopped"]
    # Only the step before it was saved, and the translator is made of it.
    assert [s["iterations"] for s in states(out)] == [1]
    assert all_finite(out / "translator.keras")
    assert not (out / "results.json").exists()
    assert "holds a run that diverged" in stopped(
        capsys, command(out, *divergent, "--checkpoint-steps", "1"), 2
    )
    # Without a checkpoint before it: no translator at all.
    out = tmp_path / "none"
    line = stopped(capsys, command(out, *divergent, "--checkpoint-steps", "100"), 1)
    assert "no finite checkpoint: no" in line
    assert not (out / "translator.keras").exists() and not states(out)


# -- a full disk ------------------------------------------------------------------


def enospc_on(monkeypatch, cls, method, calls):
    """``cls.method`` writes half a file, then fails with ENOSPC, on the
    calls whose numbers (from 1) are in ``calls``."""
    real = getattr(cls, method)
    count = []

    def writer(self, path, *args, **kwargs):
        count.append(path)
        if len(count) not in calls:
            return real(self, path, *args, **kwargs)
        Path(path).write_bytes(b"\x89HDF\r\n" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(cls, method, writer)


@RUN_BACKENDS
@pytest.mark.slow
def test_a_full_disk_is_an_error_and_the_rerun_resumes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    argv = command(
        out, "--train-size", "150", "--epochs", "2", "--checkpoint-steps", "4"
    )
    # The second checkpoint finds the disk full.
    enospc_on(monkeypatch, Transformer, "save_weights", calls={2})
    line = stopped(capsys, argv, 1)
    assert "no space left to write the checkpoint" in line and "free" in line
    first = checkpoints.list_checkpoints(out / "checkpoints")
    assert len(first) == 1 and f"the checkpoint {first[0]} is intact" in line
    assert not temporaries(out) and not (out / "translator.keras").exists()
    # The rerun resumes there; at the end the translator finds the disk full.
    monkeypatch.undo()
    enospc_on(monkeypatch, keras.Model, "save", calls={1})
    line = stopped(capsys, argv, 1)
    assert f"no space left to write the translator {out / 'translator.keras'}" in line
    assert not temporaries(out) and not (out / "translator.keras").exists()
    trained = states(out)[-1]
    assert (trained["epoch"], trained["batch"]) == (2, 0)
    # With room again: nothing is trained twice, the translator is saved.
    monkeypatch.undo()
    capsys.readouterr()
    results = train.main(argv)
    assert "resuming from" in capsys.readouterr().out
    assert results["sentences"] == 8 and states(out)[-1] == trained
    assert json.loads((out / "run.json").read_text())["status"] == "finished"


@pytest.mark.once
@pytest.mark.slow
def test_a_small_disk_for_real(tmp_path, capsys):
    """A tmpfs too small for the first checkpoint: the room is checked before
    HDF5 writes (it can crash the process on a full disk), the rerun on a
    larger one resumes. Needs the right to mount (root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        out = disk / "run"
        argv = command(out, "--epochs", "1", "--checkpoint-steps", "5")
        line = stopped(capsys, argv, 1)
        assert f"no space left to write the checkpoint {out / 'checkpoints'}" in line
        assert "no checkpoint yet" in line and not temporaries(out)
        remount = ["mount", "-o", "remount,size=8m", str(disk)]
        subprocess.run(remount, check=True)
        assert train.main(argv)["sentences"] == 8
    finally:  # lazily: TensorBoard's writer may still hold a file there
        subprocess.run(["umount", "-l", str(disk)], check=True)


# -- preemption -------------------------------------------------------------------


@RUN_BACKENDS
@pytest.mark.slow
def test_sigterm_mid_epoch_loses_at_most_the_batch_in_flight(
    tmp_path, capsys, monkeypatch
):
    """A real SIGTERM to this process while kt-train's ``main`` trains in it,
    sent as batch 5 ends: batch 6 is the one in flight."""
    from keras_transformer.trainer.callbacks import Checkpointer

    out = tmp_path / "run"
    argv = command(out, "--epochs", "2", "--checkpoint-steps", "100000")
    real = Checkpointer.on_train_batch_end

    def signal_after_batch_5(self, batch, logs=None):
        real(self, batch, logs)
        if self.epoch_length and self._done == 5 and self._epoch == 0:
            # Refuse to kill the test run if nobody handles the signal.
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Checkpointer, "on_train_batch_end", signal_after_batch_5)
    line = stopped(capsys, argv, 128 + signal.SIGTERM)
    assert "kt-train: stopped by SIGTERM; the checkpoint" in line
    (state,) = states(out)  # the one the signal wrote
    assert (state["epoch"], state["batch"], state["iterations"]) == (0, 6, 6)
    assert "SIGTERM" in json.loads((out / "run.json").read_text())["stopped"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    # The rerun trains exactly the rest: no batch twice, none left out.
    monkeypatch.undo()
    capsys.readouterr()
    train.main(argv)
    assert f"resuming from {out / 'checkpoints'}" in capsys.readouterr().out
    last = states(out)[-1]
    assert (last["epoch"], last["batch"]) == (2, 0)
    assert last["iterations"] == 2 * 19  # 19 batches an epoch
    assert "stopped" not in json.loads((out / "run.json").read_text())


@pytest.mark.once
def test_a_second_signal_stops_at_once(monkeypatch):
    from keras_transformer.trainer.callbacks import StopOnSignal

    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)

    class Stream:
        text = ""

        def write(self, text):
            Stream.text += text

        def flush(self):
            pass

    stop = StopOnSignal(stream=Stream())
    with stop.handling():
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        stop._handle(signal.SIGUSR1, None)  # a launcher's request
        stop._handle(signal.SIGUSR1, None)  # and again: still a request
        assert exits == [] and stop._received == signal.SIGUSR1
        stop._handle(signal.SIGTERM, None)  # the signal itself, first time
        assert exits == []
        stop._handle(signal.SIGTERM, None)  # the second: now
        assert exits == [128 + signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not stop._handle
    assert "a second signal: stopping now" in Stream.text
    np.testing.assert_equal(stop._received, signal.SIGTERM)
