"""No TensorFlow where it is not needed, and none of its lines.

On JAX and PyTorch, importing the package, building a model, ``fit``,
``predict`` and both searches load no TensorFlow (Keras' serializer imports
it just to ask whether it is installed; the layers avoid that path). Each
backend runs in a fresh process, since this one has loaded TensorFlow long
ago.

``kt-translate`` and ``kt-serve`` (until ready, and as they stop) print none
of TensorFlow's, XLA's, CUDA's or absl's start-up lines, on each backend and
on Keras' default one (``KERAS_BACKEND`` unset), whether the user left
``TF_CPP_MIN_LOG_LEVEL`` unset or set it to 0 (everything): their stderr
holds only their own lines. The installed console scripts run, since the
package decides what to import from the command's name.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from tests.installed_commands import Server, command, environment

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import numpy as np

loaded = {}
import keras_transformer as kt
loaded["import"] = "tensorflow" in sys.modules
model = kt.build_model(
    "tiny", src_vocab_size=30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    max_length=16,
)
loaded["build_model"] = "tensorflow" in sys.modules
model.compile(
    optimizer=kt.transformer_optimizer(16, 10), loss=kt.LabelSmoothedCrossEntropy()
)
rng = np.random.default_rng(0)
x = {
    "encoder_inputs": rng.integers(4, 30, (4, 6)).astype("int32"),
    "decoder_inputs": rng.integers(4, 30, (4, 5)).astype("int32"),
}
model.fit(x, rng.integers(4, 30, (4, 5)).astype("int32"), verbose=0)
loaded["fit"] = "tensorflow" in sys.modules
model.predict(x, verbose=0)
loaded["predict"] = "tensorflow" in sys.modules
kt.greedy_search(model, x["encoder_inputs"], 5)
kt.beam_search(model, x["encoder_inputs"], 5, beam_size=2)
loaded["searches"] = "tensorflow" in sys.modules
print(json.dumps(loaded))
"""


# These processes' backends are their own, whatever the run's: TensorFlow's
# run (two workers) takes them, so that PyTorch's run, which records coverage
# on every test, does not end last.
@pytest.mark.once("tensorflow")
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_no_tensorflow_on_jax_and_torch(backend):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == dict.fromkeys(loaded, False), loaded
    assert list(loaded) == ["import", "build_model", "fit", "predict", "searches"]


# -- the commands' stderr --------------------------------------------------------

# The subprocess's backend (this run's: each backend's run of the suite takes
# its own, and Keras' default once) and the user's TF_CPP_MIN_LOG_LEVEL:
# level 0, the one that would let every framework's lines through, and on
# Keras' default backend left unset. The commands set their own level
# whatever the user's (cli/_process.py), so the two levels take one path;
# each case is a process start, seconds of CPU.
SETTINGS = [
    pytest.param("tensorflow", "0", marks=pytest.mark.backends("tensorflow")),
    pytest.param("jax", "0", marks=pytest.mark.backends("jax")),
    pytest.param("torch", "0", marks=pytest.mark.backends("torch")),
    pytest.param(None, None, marks=pytest.mark.once("tensorflow"), id="unset-unset"),
]
# What the commands themselves write to stderr: kt-translate's progress,
# uvicorn's lines about the server.
PROGRESS = re.compile(r"\d+/\d+ sentences, .*")
UVICORN = re.compile(r"INFO: .*")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """An untrained translator with max_length 16: few widths to compile,
    so that a server is soon ready."""
    from keras_transformer import Translator, build_model
    from keras_transformer.data import tokenizer as tk

    keras.utils.set_random_seed(0)
    words = ["seven", "forty-two", "one hundred", "sieben", "zweiundvierzig"]
    tokenizer = tk.make_tokenizer(tk.train_tokenizer(words * 20, 40))
    model = build_model(
        "tiny",
        src_vocab_size=tokenizer.vocabulary_size(),
        num_layers=1,
        d_model=16,
        num_heads=2,
        d_ff=32,
        max_length=16,
    )
    path = tmp_path_factory.mktemp("small") / "translator.keras"
    Translator(tokenizer, model).save(path)
    return str(path)


def foreign_lines(stderr, own):
    return [line for line in stderr.splitlines() if line and not own.fullmatch(line)]


@pytest.mark.slow
@pytest.mark.parametrize("backend, log_level", SETTINGS)
def test_kt_translate_prints_no_framework_lines(small_model, backend, log_level):
    done = subprocess.run(
        [*command("kt-translate"), "--model", small_model, "seven", "sieben"],
        env=environment(backend, log_level),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 2, done.stdout
    assert foreign_lines(done.stderr, PROGRESS) == []
    assert PROGRESS.fullmatch(done.stderr.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("backend, log_level", SETTINGS)
def test_kt_serve_prints_no_framework_lines(small_model, backend, log_level):
    server = Server(
        ["--model", small_model, "--search-batch-size", "1"],
        env=environment(backend, log_level),
    )
    try:
        assert server.url, (server.ready_line, "".join(server.stderr)[-3000:])
        status, body = server.post("/translate", {"texts": ["seven"]})
        assert status == 200 and len(body["translations"]) == 1, body
    finally:
        exit_status = server.stop()
    stderr = "".join(server.stderr)
    assert exit_status == 0, stderr[-3000:]
    assert foreign_lines(stderr, UVICORN) == []
