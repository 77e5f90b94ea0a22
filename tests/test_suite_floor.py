"""The suite's CPU reports read back, and the floor computed from them
(tests/cpu_report.py writes the reports, tests/suite_floor.py reads them)."""

import pytest

from tests import cpu_report, redundant_coverage, suite_floor

pytestmark = pytest.mark.once


def report(prefix, monkeypatch, backend, tests, worker=None):
    """A report as the plugin writes it at the end of a backend's run
    (tests/run_all.sh gives each backend's run ``prefix.BACKEND``)."""
    monkeypatch.setenv("KERAS_BACKEND", backend)
    if worker:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    else:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    recorder = cpu_report._Recorder(f"{prefix}.{backend}")
    recorder.tests = [(cpu, 2 * cpu, nodeid) for nodeid, cpu in tests.items()]
    recorder.pytest_sessionfinish(None)


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    prefix = tmp_path / "r"
    # TensorFlow's run in two pytest-xdist workers; its controller's report
    # lists no tests.
    report(prefix, monkeypatch, "tensorflow", {"tests/test_blocks.py::t[a b]": 3.0,
           "tests/test_serve.py::s": 10.0}, worker="gw0")  # fmt: skip
    report(prefix, monkeypatch, "tensorflow", {"tests/test_x.py::two": 4.0}, "gw1")
    report(prefix, monkeypatch, "tensorflow", {})
    report(prefix, monkeypatch, "jax", {"tests/test_blocks.py::t[a b]": 2.0,
           "tests/test_serve.py::s": 6.0, "tests/test_x.py::two": 5.0})  # fmt: skip
    report(prefix, monkeypatch, "torch", {"tests/test_blocks.py::t[a b]": 1.0,
           "tests/test_serve.py::s": 8.0, "tests/test_once.py::o": 7.0})  # fmt: skip
    (tmp_path / "r.torch.partial").write_text("99.00 99.00  tests/test_z.py::z\n")
    return prefix


def test_the_reports_read_back_per_test_and_backend(prefix):
    assert cpu_report.read(prefix) == {
        "tests/test_blocks.py::t[a b]": {"tensorflow": 3.0, "jax": 2.0, "torch": 1.0},
        "tests/test_serve.py::s": {"tensorflow": 10.0, "jax": 6.0, "torch": 8.0},
        "tests/test_x.py::two": {"tensorflow": 4.0, "jax": 5.0},
        "tests/test_once.py::o": {"torch": 7.0},
    }
    assert redundant_coverage.cpu_by_test(prefix)["tests/test_serve.py::s"] == 24.0


def test_reach_and_floor(prefix, capsys):
    cost = cpu_report.read(prefix)
    assert suite_floor.by_reach(cost) == {"every": 30.0, "some": 9.0, "one": 7.0}
    # The layer test on all three (6), the server test where it cost least
    # (6), the two-backend test likewise (4), the one-backend test (7).
    assert suite_floor.floor(cost) == 23.0
    suite_floor.main(str(prefix))
    out = capsys.readouterr().out
    assert "4 tests, 46 s of CPU in tests (jax 13, tensorflow 17, torch 16)" in out
    assert "floor: 23 s (the layers on every backend" in out
    # The server's file kept on every backend too: 24 s for it instead of 6;
    # alone, the layer test goes to its cheapest backend (1 s).
    assert suite_floor.floor(cost, ("tests/test_serve.py",)) == 36.0
    kept = (*suite_floor.LAYER_FILES, "tests/test_serve.py")
    assert suite_floor.floor(cost, kept) == 41.0
    suite_floor.main(str(prefix), "tests/test_serve.py")
    assert "floor: 41 s (tests/test_serve.py, the layers on" in capsys.readouterr().out


def test_a_file_that_is_no_report_is_named(tmp_path):
    (tmp_path / "r.torch").write_text("cpu wall test\n")
    with pytest.raises(ValueError, match=r"r\.torch:1: not a CPU report"):
        cpu_report.read(tmp_path / "r")
    with pytest.raises(SystemExit, match="no CPU reports at"):
        suite_floor.main(str(tmp_path / "nothing"))
