"""Coverage per backend: the tool that finds where TensorFlow and JAX must
record it, and the rule in conftest that applies the result."""

import pathlib
import types

import pytest
from coverage import CoverageData

import conftest
from tests import backend_coverage, redundant_coverage

pytestmark = pytest.mark.once


def write(folder, backend, arcs_by_context):
    data = CoverageData(basename=str(folder / f".coverage.{backend}"))
    for context, arcs in arcs_by_context.items():
        data.set_context(context)
        data.add_arcs({"/src/pkg/backend.py": arcs})
    data.write()


def test_lists_the_arcs_only_other_backends_reach_and_the_files_reaching_them(
    tmp_path, capsys
):
    shared = {(1, 2), (2, -1)}
    write(tmp_path, "torch", {"tests/test_a.py::test_one|run": shared})
    write(
        tmp_path,
        "jax",
        {
            "tests/test_a.py::test_one|run": shared | {(2, 5)},
            "tests/test_b.py::test_two|run": {(2, 5), (5, 6)},
            # Reached while importing: every run records that.
            "": {(7, 8)},
        },
    )
    write(tmp_path, "tensorflow", {"tests/test_c.py::test_three[x]|setup": {(9, 10)}})
    backend_coverage.main(tmp_path)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "3 arcs reached only outside the torch run:"
    assert "backend.py:2->5  (test_a.py, test_b.py)" in out
    assert "backend.py:5->6  (test_b.py)" in out
    assert "backend.py:9->10  (test_c.py)" in out
    assert "7->8" not in out and "1->2" not in out
    assert out.splitlines()[-1] == (
        "test files that reach all of them: test_b.py, test_c.py"
    )


def item(name, test, once=False):
    markers = {"once": pytest.mark.once("tensorflow").mark} if once else {}
    return types.SimpleNamespace(
        path=pathlib.Path("tests") / name,
        originalname=test,
        nodeid=f"tests/{name}::{test}",
        get_closest_marker=markers.get,
    )


@pytest.mark.parametrize(
    "backend, name, test, once, expected",
    [
        ("torch", "test_attention.py", "test_x", False, True),  # the run of `once`
        ("jax", "test_distribute.py", "test_x", False, True),  # a whole file
        ("jax", "test_attention.py", "test_x", False, False),
        (
            "tensorflow",
            "test_model.py",
            "test_compiled_training_under_mixed_bfloat16",
            False,
            True,  # one test of a file
        ),
        (
            "tensorflow",
            "test_model.py",
            "test_other",
            False,
            False,
        ),
        # A `once` test collected elsewhere than torch: its only run records.
        ("tensorflow", "test_install.py", "test_x", True, True),
    ],
)
def test_which_tests_record_coverage(monkeypatch, backend, name, test, once, expected):
    monkeypatch.setattr(conftest, "BACKEND", backend)
    suite = ["tensorflow", "jax", "torch"]
    assert conftest._records_coverage(item(name, test, once), suite) is expected
    # Without run_all.sh's backend list (plain pytest) every test records.
    assert conftest._records_coverage(item(name, test, once), []) is True


def test_the_untraced_tests_record_nowhere(monkeypatch):
    """A test listed in tests/untraced.txt records in no run, even the one
    that records every other test, and even with plain pytest."""
    listed = sorted(conftest.UNTRACED)[0]
    repo = pathlib.Path(__file__).resolve().parents[1]
    assert listed.count("::") == 1 and (repo / listed.split("::")[0]).is_file()
    name, test = listed.split("::")
    untraced = types.SimpleNamespace(
        path=pathlib.Path(name), originalname=test, nodeid=listed,
        get_closest_marker={}.get,
    )  # fmt: skip
    for backend in ("torch", "jax", "tensorflow"):
        monkeypatch.setattr(conftest, "BACKEND", backend)
        assert (
            conftest._records_coverage(untraced, ["tensorflow", "jax", "torch"])
            is False
        )
        assert conftest._records_coverage(untraced, []) is False


def test_the_costliest_tests_whose_arcs_others_reach_go_untraced(tmp_path):
    """Costliest first: a test goes when every arc it reaches is reached by
    a test still traced; the ones left then keep what they alone reach."""
    write(
        tmp_path,
        "torch",
        {
            "tests/test_a.py::test_big|setup": {(1, 2)},
            "tests/test_a.py::test_big|run": {(2, 3)},
            "tests/test_b.py::test_mid|run": {(2, 3)},
            "tests/test_c.py::test_small|run": {(1, 2), (4, 5)},
            "": {(7, 8)},
        },
    )
    arcs = redundant_coverage.arcs_by_test(tmp_path / ".coverage.torch")
    assert arcs["tests/test_a.py::test_big"] == {
        ("/src/pkg/backend.py", 1, 2), ("/src/pkg/backend.py", 2, 3),
    }  # fmt: skip
    cost = {
        "tests/test_a.py::test_big": 30.0,
        "tests/test_b.py::test_mid": 20.0,
        "tests/test_c.py::test_small": 2.0,
    }
    assert redundant_coverage.untraceable(arcs, cost) == ["tests/test_a.py::test_big"]
    # test_mid then alone reaches 2->3, test_small alone 1->2: both stay.
    cost["tests/test_b.py::test_mid"] = 40.0
    assert redundant_coverage.untraceable(arcs, cost) == ["tests/test_b.py::test_mid"]
