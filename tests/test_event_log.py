"""tensorboardX is imported without PyTorch where nothing has imported it,
and nothing changes for the process's other threads while it is."""

import importlib
import importlib.util
import os
import subprocess
import sys
import threading

import pytest

from keras_transformer.trainer import event_log

pytestmark = pytest.mark.once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = "kt_event_log_probe"


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module that imports, on a path of its own."""
    (tmp_path / f"{PROBE}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PROBE
    sys.modules.pop(PROBE, None)


def test_the_import_fails_on_this_thread_only(probe):
    before = list(sys.meta_path)
    elsewhere = []

    def import_it():
        elsewhere.append(importlib.import_module(probe).VALUE)

    with event_log._not_found_here(probe):
        with pytest.raises(ModuleNotFoundError, match=probe):
            importlib.import_module(probe)
        assert probe not in sys.modules  # no None entry for other threads
        thread = threading.Thread(target=import_it)
        thread.start()
        thread.join()
        assert elsewhere == [1]
    assert sys.meta_path == before
    assert importlib.import_module(probe).VALUE == 1


def test_the_finder_goes_even_when_the_import_fails(probe):
    before = list(sys.meta_path)
    with pytest.raises(RuntimeError):
        with event_log._not_found_here(probe):
            raise RuntimeError("the import failed")
    assert sys.meta_path == before


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None
    or importlib.util.find_spec("tensorboardX") is None,
    reason="needs PyTorch and tensorboardX installed",
)
def test_tensorboardx_leaves_pytorch_unimported_and_importable_on_jax():
    code = (
        "import importlib.util, sys\n"
        "from keras_transformer.trainer import event_log\n"
        "assert 'torch' not in sys.modules, 'imported before'\n"
        "finders = list(sys.meta_path)\n"
        "tbx = event_log._tensorboardx()\n"
        "assert tbx.summary.scalar('loss', 1.0).value[0].simple_value == 1.0\n"
        "assert 'torch' not in sys.modules, 'tensorboardX imported PyTorch'\n"
        "assert sys.meta_path == finders\n"
        "import torch\n"
        "assert torch.ones(1).item() == 1.0\n"
    )
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
