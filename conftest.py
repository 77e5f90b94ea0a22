"""Shared fixtures and the suite's four markers.

The suite runs once per backend (KERAS_BACKEND). Four markers shape a run:

* ``once``: the test's outcome cannot depend on the backend (corpus reading,
  the number task, argument checking, notebooks' files), or it is a
  whole-program test that one backend covers for all (``kill -9`` and
  resume). When ``tests/run_all.sh`` runs the suite it sets
  ``KT_SUITE_BACKENDS`` to the backends of that run, and such a test is
  collected in one backend's run only: the backend named in the marker
  (``@pytest.mark.once("jax")``) if it is in the run, else ``torch`` (the
  lightest run), else the first backend of the run. Plain ``pytest``, without
  ``KT_SUITE_BACKENDS``, runs every test.
* ``slow``: left out of the quick loop (``tests/run_all.sh --quick``, which is
  ``-m "not slow"``).
* ``backends(backend, ...)``: collected in those backends' runs only (the
  fault tests of whole training runs: JAX's and TensorFlow's trainers are
  the ones with their own paths).
* ``early(backend, ...)``: a long test that the named backends' runs start
  with. The backends run side by side on two cores; a minutes-long test last
  in a run would run alone on one core while the other idles.

Coverage (``tests/run_all.sh`` without ``--quick``): the run that collects the
``once`` tests by default records coverage for every test, and every run
records it for the ``once`` tests it collects; the other backends' runs
record it otherwise only for the test files (and single tests) in
``PER_BACKEND_COVERAGE``, which reach lines that only some backends run
(``tests/backend_coverage.py`` lists those lines and the tests reaching
them); and no run records it for the costly tests in ``tests/untraced.txt``,
whose lines other tests reach (``tests/redundant_coverage.py``). Tracing
slows a test markedly; every test still runs on every backend, only what
coverage records differs.
"""

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# trio (Selenium's) registers a Hypothesis plugin whose set-up warns, and
# warnings are errors here; the suite uses no Hypothesis plugins.
os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["tests.cpu_report"]

BACKEND = keras.backend.backend()
ONCE_DEFAULT = "torch"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "once(backend=None): run in one backend's run of tests/run_all.sh only",
    )
    config.addinivalue_line(
        "markers", "early(*backends): run first in these backends' runs"
    )
    config.addinivalue_line(
        "markers", "backends(*backends): run in these backends' runs only"
    )


def _suite_backends():
    return os.environ.get("KT_SUITE_BACKENDS", "").replace(",", " ").split()


def once_home(marker, suite):
    """The backend whose run collects a test marked ``once``."""
    for backend in (*marker.args, ONCE_DEFAULT):
        if backend in suite:
            return backend
    return suite[0]


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not _starts_early(item))  # stable: order kept
    elsewhere = [item for item in items if not _runs_here(item)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if _runs_here(item)]
    suite = _suite_backends()
    if not suite:
        return
    keep, elsewhere = [], []
    for item in items:
        marker = item.get_closest_marker("once")
        if marker is None or once_home(marker, suite) == BACKEND:
            keep.append(item)
        else:
            elsewhere.append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = keep


def _runs_here(item):
    marker = item.get_closest_marker("backends")
    return marker is None or BACKEND in marker.args


def _starts_early(item):
    marker = item.get_closest_marker("early")
    return marker is not None and BACKEND in marker.args


# Where the TensorFlow and JAX runs record coverage: the test files (or
# `file::test`) whose tests reach lines and branches that the PyTorch run does
# not (backend.py's, distribute.py's and _fault_safe.py's branches for those
# backends, the TensorFlow graph checks in _inputs.py; and test_run_faults.py,
# which the PyTorch run leaves out, for the trainer's fault paths). Chosen from
# the list that tests/backend_coverage.py prints for a run with test contexts,
# preferring the files that take least time and single tests where a file is
# slow, so that together they reach every such arc; the tool's own greedy
# choice ignores time.
PER_BACKEND_COVERAGE = {
    "tensorflow": (
        "test_batching.py",
        "test_training_speed.py",
        "test_embedding.py",
        "test_train.py",
        "test_translator_faults.py",
        "test_faults_model.py::test_bad_streamed_targets_never_give_a_loss",
        "test_faults_model.py::test_loss_that_fails_while_tracing_keeps_weights",
        "test_run_faults.py",
        "test_model.py::test_compiled_training_under_mixed_bfloat16",
    ),
    "jax": (
        "test_training_speed.py",
        "test_compat.py",
        "test_distribute.py",
        "test_embedding.py",
        "test_faults_model.py",
        "test_losses.py",
        "test_seeds.py",
        "test_train.py",
    ),
}


# Tests that run without coverage in every run (tests/untraced.txt, one node
# id a line): costly ones whose every line and branch other traced tests
# reach, as tests/redundant_coverage.py chose them from a run with test
# contexts. The tracer roughly doubles the CPU time of the Python it
# watches; leaving these out can only lower the coverage reported.
with open(
    os.path.join(os.path.dirname(__file__), "tests", "untraced.txt"), encoding="utf-8"
) as _listed:
    UNTRACED = frozenset(line.split("#", 1)[0].strip() for line in _listed) - {""}


def _records_coverage(item, suite):
    """Whether this backend's run records coverage while ``item`` runs."""
    if item.nodeid in UNTRACED:
        return False
    if not suite or BACKEND == once_home(pytest.mark.once.mark, suite):
        return True
    if item.get_closest_marker("once") is not None:
        return True  # this is its only run
    chosen = PER_BACKEND_COVERAGE.get(BACKEND, ())
    name = item.path.name
    return name in chosen or f"{name}::{item.originalname}" in chosen


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    plugin = item.config.pluginmanager.getplugin("_cov")
    controller = getattr(plugin, "cov_controller", None)
    pause = (
        getattr(controller, "started", False)
        # pytest-cov pauses tests marked no_cover itself (their call phase).
        and item.get_closest_marker("no_cover") is None
        and not _records_coverage(item, _suite_backends())
    )
    if pause:
        controller.pause()
    try:
        yield
    finally:
        if pause:
            controller.resume()


def pytest_report_header(config):
    suite = _suite_backends()
    where = (
        f"; tests marked `once` run in one of: {' '.join(suite)}"
        if suite
        else "; all tests (KT_SUITE_BACKENDS unset)"
    )
    return f"keras {keras.__version__}, backend {BACKEND}{where}"


# Test files run with TensorFlow's graph optimizer (Grappler) as users have
# it when tests/run_all.sh turns it off for the rest (KT_TF_GRAPPLER=0): the
# end-to-end runs of the training command, and the fault tests, which check
# that a failed step leaves the weights as they were: what Grappler may
# reorder in a step's graph is what they are there to catch.
GRAPPLER_ON = (
    "test_faults_model.py",
    "test_fuzz.py",
    "test_train.py",
    "test_train_faults.py",
    "test_translator_faults.py",
)


@pytest.fixture(autouse=True, scope="module")
def _graph_optimizer(request):
    """``KT_TF_GRAPPLER=0``: TensorFlow's functions run without Grappler.

    The suite's graphs are tiny and each runs a few times, so rewriting them
    costs more than it saves; XLA's cheapest code generation for JAX
    (``XLA_FLAGS`` in tests/run_all.sh) is the same trade. The values, shapes
    and files the other tests check do not depend on it.
    """
    off = (
        BACKEND == "tensorflow"
        and os.environ.get("KT_TF_GRAPPLER") == "0"
        and request.path.name not in GRAPPLER_ON
    )
    if off:
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    yield
    if off:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a fixed seed, and leaves them so.

    ``clear_session(free_memory=False)``: the default also runs a full garbage
    collection, which after every test would dominate the suite's time on
    TensorFlow and JAX; ``_collect_garbage`` does it once per module.
    """
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage():
    yield
    gc.collect()
    # What survives a full collection here (modules, Keras' and the
    # backends' globals, traced graphs kept by live models) is kept out of
    # later collections: each full collection of a long run otherwise walks
    # all of it again.
    gc.freeze()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
