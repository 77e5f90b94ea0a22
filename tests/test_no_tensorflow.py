"""No JAX or PyTorch process of the commands imports TensorFlow.

TensorFlow is installed here (the suite's TensorFlow run needs it); a user of
JAX or PyTorch has it only where they installed it themselves, and even then
``kt-train``, ``kt-translate``, ``kt-evaluate`` and ``kt-serve`` on those
backends leave it alone, and keras-hub and tensorflow-text, which bring it,
too: importing it takes seconds, memory, and prints its start-up lines. Nor
does a JAX process import PyTorch.

Each command runs as a subprocess whose ``sitecustomize`` writes the modules
it imported when it exits (``tests/installed_commands.py``); ``kt-serve``
stops on SIGTERM by shutting down gracefully, so that its exit handlers run
too. On each backend: ``kt-train`` trains a step of the number task and
writes, averages and tests its translator; ``kt-serve`` answers one request;
and ``kt-translate`` (JAX) or ``kt-evaluate`` (PyTorch) translates. The
translating commands load 0.3.0's translator, whose file names keras-hub's
tokenizer class.
"""

import json
import os
import subprocess

import pytest

from tests.installed_commands import (
    ROOT,
    Server,
    command,
    environment,
    imported,
    sitecustomize,
)

# Subprocesses on JAX and PyTorch whatever the suite's backend: once, in the
# TensorFlow run (two workers).
pytestmark = [pytest.mark.once("tensorflow"), pytest.mark.slow]

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "v0_3_0", "translator.keras")
TENSORFLOW = {"tensorflow", "keras_hub", "tensorflow_text"}
# And on JAX, no PyTorch (which tensorboardX, the writer of kt-train's
# TensorBoard logs, would import). Keras on PyTorch imports JAX itself, where
# it is installed (keras.callbacks' Orbax checkpoint).
OTHER = {"jax": {"torch"}, "torch": set()}
# The cheapest run that trains: one update (the time budget ends the first
# epoch after its first batch) of a one-layer model, a test split of 4.
TRAIN = [
    "--task", "numbers", "--train-size", "40", "--val-size", "4",
    "--test-size", "4", "--uniform-size", "0", "--max-minutes", "0.0001",
    "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
    "--max-length", "64", "--vocab-size", "60", "--batch-tokens", "256",
    "--bucket-lengths", "16,64", "--beam-size", "1",
]  # fmt: skip
SOURCES, REFERENCES = ["seven", "forty-two"], ["sieben", "zweiundvierzig"]
TRANSLATING = {"jax": "kt-translate", "torch": "kt-evaluate"}


def run(name, args, env):
    done = subprocess.run(
        [*command(name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (name, done.stderr[-3000:])
    return done


def check_imports(report, backend, *expected):
    """The process imported Keras on ``backend`` and ``expected``, and
    nothing of TensorFlow's (nor PyTorch on JAX)."""
    packages = {name.split(".")[0] for name in imported(report)}
    assert {backend, "keras", *expected} <= packages
    assert not packages & (TENSORFLOW | OTHER[backend])


@pytest.mark.parametrize("backend", sorted(TRANSLATING))
def test_the_commands_import_no_tensorflow(backend, tmp_path):
    def env(name):
        report = tmp_path / f"{name}.json"
        site = tmp_path / "site"
        return report, sitecustomize(site, environment(backend), report=report)

    report, train_env = env("kt-train")
    out = tmp_path / "run"
    run("kt-train", [*TRAIN, "--out", str(out)], train_env)
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    check_imports(report, backend)

    name = TRANSLATING[backend]
    report, translate_env = env(name)
    if name == "kt-translate":
        done = run(name, ["--model", FIXTURE, *SOURCES], translate_env)
        assert done.stdout.splitlines() == REFERENCES
    else:
        source, reference = tmp_path / "source.txt", tmp_path / "reference.txt"
        source.write_text("\n".join(SOURCES) + "\n")
        reference.write_text("\n".join(REFERENCES) + "\n")
        written = tmp_path / "hypotheses.txt"
        args = ["--source", str(source), "--reference", str(reference)]
        args += ["--out", str(tmp_path / "results.json"), "--hypotheses", str(written)]
        run(name, ["--model", FIXTURE, *args], translate_env)
        assert written.read_text().splitlines() == REFERENCES
    check_imports(report, backend)

    report, serve_env = env("kt-serve")
    # The translator's beam size alone: one search compiled at warm-up.
    server = Server(["--model", FIXTURE, "--beam-sizes", "4"], env=serve_env)
    try:
        assert server.url, (server.ready_line, "".join(server.stderr)[-3000:])
        status, body = server.post("/translate", {"texts": SOURCES})
        assert (status, body["translations"]) == (200, REFERENCES), body
    finally:
        exit_status = server.stop()
    assert exit_status == 0, "".join(server.stderr)[-3000:]
    check_imports(report, backend, "uvicorn")
