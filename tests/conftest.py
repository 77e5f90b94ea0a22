"""Shared fixtures. The suite runs once per backend (KERAS_BACKEND)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a fixed seed, and leaves them so."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
