"""benchmarks/text_edges.py: the sizes it adds up and the packages it finds
among module names, checked on a folder and names made here; and one
start-up measured end to end on the number translator of 0.3.0."""

import pathlib
import sys

import pytest

from benchmarks import text_edges

FIXTURE = pathlib.Path(__file__).parents[2] / "tests/fixtures/v0_3_0/translator.keras"


@pytest.mark.once
def test_the_venv_report_adds_up_the_files(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "big").mkdir(parents=True)
    (site / "big" / "a.so").write_bytes(b"x" * 3000)
    (site / "small").mkdir()
    (site / "small" / "b.py").write_bytes(b"y" * 10)
    (site / "small-1.0.dist-info").mkdir()
    (site / "small-1.0.dist-info" / "RECORD").write_bytes(b"z" * 7)
    (tmp_path / "pyvenv.cfg").write_bytes(b"w" * 5)
    report = text_edges.venv_report(tmp_path)
    assert report["bytes"] == 3000 + 10 + 7 + 5
    assert report["largest"] == {"big": 3000, "small": 10}


@pytest.mark.once
def test_the_watched_packages_are_found_among_module_names():
    modules = ["keras", "tensorflow.python", "keras_hub.src", "jax", "tensorflow"]
    assert text_edges.imported(modules) == ["keras_hub", "tensorflow"]
    assert text_edges.imported(["jax", "tensorflowish"]) == []


@pytest.mark.once("jax")
def test_one_start_up_is_measured_and_translates():
    (result,) = text_edges.main(
        ["--model", str(FIXTURE), "--backends", "jax", "--repeats", "0",
         "--python", sys.executable]
    )  # fmt: skip
    assert result["backend"] == "jax" and result["translation"] == "sieben"
    assert result["imported"] == []  # the JAX process imports no TensorFlow
    assert result["cpu_s"] > 0 and result["wall_s"] > 0
