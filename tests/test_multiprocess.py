"""Multi-process data parallel: ``kt-launch`` starts 2 processes × 2
virtual CPU devices of ``kt-train --data-parallel`` on JAX, joined on
127.0.0.1 at a free port.

References: the same command as one process over 4 virtual devices (the
same global batches, so the same gradients and losses), and the files a
single-process run writes. Each run is bounded in time and every exit
status is checked.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from keras_transformer.cli import launch
from tests.installed_commands import (
    command,
    environment,
    heavy,
    imported,
    sitecustomize,
)

REPO = Path(__file__).resolve().parents[1]
RUN = [
    "--task", "numbers", "--train-size", "96", "--val-size", "8",
    "--test-size", "4", "--uniform-size", "4", "--num-layers", "1",
    "--d-model", "16", "--num-heads", "2", "--d-ff", "32", "--max-length", "32",
    "--vocab-size", "60", "--batch-tokens", "256", "--bucket-lengths", "32",
    "--beam-size", "1", "--checkpoint-steps", "1", "--keep-checkpoints", "0",
    "--verbose", "2",
]  # fmt: skip
TIMEOUT = 420  # seconds for one run, compilation in every process included

# Subprocesses on JAX whatever the suite's backend: once, in the TensorFlow
# run (whose two workers share the slow tests).
pytestmark = [pytest.mark.once("tensorflow"), pytest.mark.slow]


# JAX's compilation cache, shared by this module's processes: every launch
# compiles the same programs, so only the first of them pays XLA. Eviction
# on: a size limit makes JAX lock the folder, so that no process reads an
# entry another is still writing.
COMPILATION_CACHE = {}


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    COMPILATION_CACHE["JAX_COMPILATION_CACHE_DIR"] = str(
        tmp_path_factory.mktemp("jax-compilation-cache")
    )
    COMPILATION_CACHE["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(2**30)
    COMPILATION_CACHE["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    COMPILATION_CACHE["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    yield
    COMPILATION_CACHE.clear()


def env(devices=None):
    out = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_DISTRIB")}
    out["KERAS_BACKEND"] = "jax"
    out["PYTHONPATH"] = str(REPO)
    out.update(COMPILATION_CACHE)
    if devices:
        # The device count replaced, the suite's other XLA flags (its cheap
        # code generation) kept: most of a tiny run's CPU is XLA compiling.
        flags = [
            flag for flag in out.get("XLA_FLAGS", "").split()
            if not flag.startswith("--xla_force_host_platform_device_count")
        ]  # fmt: skip
        flags.append(f"--xla_force_host_platform_device_count={devices}")
        out["XLA_FLAGS"] = " ".join(flags)
    return out


def launched(out, *extra):
    return [
        sys.executable, "-m", "keras_transformer.cli.launch", "--processes", "2",
        "--devices-per-process", "2", "--", *RUN, *extra, "--out", str(out),
    ]  # fmt: skip


def run(command, cwd, devices=None):
    done = subprocess.run(
        command, cwd=cwd, env=env(devices), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done


def optimizer_arrays(checkpoint):
    """Adam's variables in a checkpoint, by index: 0 is the step count, then
    each weight's first and second moment in turn."""
    with h5py.File(checkpoint / "model.weights.h5") as file:
        group = file["optimizer/vars"]
        return [np.asarray(group[str(i)]) for i in range(len(group))]


def files(folder):
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
        if "logs" not in p.parts  # TensorBoard's file names hold the pid
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process over 4 devices, then 2 processes × 2 devices (the
    second process in a folder of its own, to see that it writes nothing)."""
    root = tmp_path_factory.mktemp("multiprocess")
    single = root / "single"
    one = run(
        [sys.executable, "-m", "keras_transformer.cli.train", *RUN, "--epochs", "1",
         "--data-parallel", "--out", str(single)],
        cwd=REPO, devices=4,
    )  # fmt: skip
    two = run(launched(root / "two", "--epochs", "1"), cwd=REPO)
    return single, root / "two", one, two


def test_two_processes_take_the_steps_of_one(runs):
    single, two, _, log = runs
    assert "JAX DataParallel over 4 cpu devices in 2 processes" in log.stdout
    # The first step's gradient: Adam's first moment after one step is
    # (1 - β1) · g, its second (1 - β2) · g², per weight.
    first = sorted(p.name for p in (single / "checkpoints").iterdir())[0]
    ours = optimizer_arrays(two / "checkpoints" / first)
    theirs = optimizer_arrays(single / "checkpoints" / first)
    assert int(ours[0]) == int(theirs[0]) == 1
    assert len(ours) == len(theirs) > 3
    for kind in (1, 2):  # moments, then second moments
        pairs = list(zip(ours[kind::2], theirs[kind::2], strict=True))
        largest = max(np.abs(b).max() for _, b in pairs)
        assert largest > 0
        for a, b in pairs:
            # The floor: entries that are float32 noise around 0 (the key
            # biases' gradient), which no two summation orders share.
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * largest)
    # The whole epoch's losses (training and validation) as one process.
    last = sorted(p.name for p in (single / "checkpoints").iterdir())[-1]
    logs = [
        json.loads((run / "checkpoints" / last / "state.json").read_text())["logs"]
        for run in (two, single)
    ]
    for key in ("loss", "val_loss"):
        assert logs[0][key] == pytest.approx(logs[1][key], rel=1e-4), key


def test_process_0_alone_writes_and_reports(runs):
    single, two, one, log = runs
    assert files(two) == files(single)
    settings = json.loads((two / "run.json").read_text())["settings"]
    assert settings["data_parallel"] is True
    assert json.loads((two / "run.json").read_text())["status"] == "finished"
    # One log: process 0's lines once, not twice.
    assert log.stdout.count("saved ") == one.stdout.count("saved ") == 1
    assert log.stdout.count("data parallel:") == 1


@pytest.mark.parametrize("bad", [["--processes", "0"], ["--devices-per-process", "0"]])
def test_kt_launch_refuses_bad_counts(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch.parse_args([*bad, "--", "--task", "numbers"])
    assert exit_info.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_kt_launch_refuses_other_backends(monkeypatch, capsys):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(SystemExit):
        launch.parse_args(["--", "--task", "numbers"])
    assert "JAX only" in capsys.readouterr().err


def test_kt_launch_imports_no_framework(tmp_path):
    """The launcher waits beside its kt-train processes for the whole run:
    it imports neither Keras nor a framework (its children do)."""
    report = tmp_path / "modules.json"
    env = sitecustomize(tmp_path / "site", environment("jax"), report=report)
    done = subprocess.run(
        [*command("kt-launch"), "--processes", "1", "--", "--help"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: kt-train" in done.stdout  # the child ran, and exited first
    # The launcher exits last, so the report is its own.
    modules = imported(report)
    assert "keras_transformer.cli.launch" in modules
    assert "keras_transformer.cli.train" not in modules
    assert heavy(modules) == []


def test_kt_launch_stops_the_others_when_one_fails(tmp_path):
    # The coordinator's port is taken: process 0 cannot start it and dies
    # (JAX 0.10.2 raises, or crashes with SIGSEGV); process 1 would wait for
    # the coordinator for minutes, so the launcher must stop it.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "keras_transformer.cli.launch", "--processes", "2",
             "--port", str(port), "--", "--task", "numbers", "--out",
             str(tmp_path / "x")],
            cwd=REPO, env=env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode != 0
    assert "process 0 " in done.stderr and "stopping the others" in done.stderr
    assert time.monotonic() - start < 100  # not the coordinator's 5-minute wait
    assert not (tmp_path / "x").exists()


def _children(pid):
    """{process index: pid} of the launcher's kt-train processes."""
    listed = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout.split()
    found = {}
    for child in map(int, listed):
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        for item in environ:
            if item.startswith(b"KERAS_DISTRIBUTION_PROCESS_ID="):
                found[int(item.split(b"=")[1])] = child
    return found


def _states(out):
    return [
        json.loads((path / "state.json").read_text())
        for path in sorted((out / "checkpoints").iterdir())
        if path.name.startswith("step-")
    ]


def test_sigterm_to_one_process_then_kill_then_resume(tmp_path):
    """SIGTERM reaches process 1 alone: both stop after the same batch and
    process 0 writes that step. The rerun resumes; killed with SIGKILL
    (launcher and both processes) once it has written a new checkpoint, the
    third run resumes from that and trains exactly the rest."""
    out = tmp_path / "run"
    command = launched(out, "--epochs", "2", "--progress-seconds", "0")
    started = subprocess.Popen(
        command, cwd=REPO, env=env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with started:
        try:
            for line in started.stdout:  # process 0's "step 3/12, ..."
                if line.startswith("step ") and line.split()[1].startswith("3/"):
                    os.kill(_children(started.pid)[1], signal.SIGTERM)
                    break
            _, err = started.communicate(timeout=TIMEOUT)
        finally:
            started.kill()
    assert started.returncode == 128 + signal.SIGTERM, err[-2000:]
    epoch_length = int(line.split("/")[1].split(",")[0])
    stop = _states(out)[-1]
    assert stop["epoch"] == 0 and 3 <= stop["batch"] < epoch_length
    assert "SIGTERM" in json.loads((out / "run.json").read_text())["stopped"]

    started = subprocess.Popen(
        command, cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while _states(out)[-1]["iterations"] <= stop["iterations"]:
            assert started.poll() is None, "the launch ended before a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
    finally:
        os.killpg(started.pid, signal.SIGKILL)  # the launcher and both processes
        started.wait()
    assert started.returncode == -signal.SIGKILL
    assert (out / "run.json").exists() and not (out / "results.json").exists()
    again = run(command, cwd=REPO)
    assert "resuming from" in again.stdout
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    last = _states(out)[-1]
    assert (last["epoch"], last["batch"]) == (2, 0)
    assert last["iterations"] == 2 * epoch_length
