"""No TensorFlow where it is not needed.

On JAX and PyTorch, importing the package, building a model, ``fit``,
``predict`` and both searches load no TensorFlow (Keras' serializer imports
it just to ask whether it is installed; the layers avoid that path). Each
backend runs in a fresh process, since this one has loaded TensorFlow long
ago.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.once
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
