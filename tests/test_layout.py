"""The code's shape: scripts that only import the package, short functions,
no layer found by its name, backend branches in one module."""

import ast
import pathlib
import runpy
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = sorted((ROOT / "keras_transformer").rglob("*.py"))
SCRIPTS = sorted((ROOT / "training").glob("*.py"))

pytestmark = pytest.mark.once


def imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_the_package_commands(path):
    """``training/<name>.py`` runs ``keras_transformer.commands.<name>``, the
    code that ``pip install`` installs as ``kt-<name>``."""
    if path.name == "__init__.py":
        return
    assert list(imported_modules(path)) == [f"keras_transformer.commands.{path.stem}"]


def test_no_function_over_80_lines():
    long = []
    for path in PACKAGE + SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long


def test_no_layer_is_looked_up_by_name():
    for path in PACKAGE:
        text = path.read_text()
        assert "get_layer(" not in text, path
        assert "layer.name ==" not in text, path


def test_backend_imports_in_one_module():
    """TensorFlow, JAX and PyTorch are imported by backend.py, and by the two
    modules about per-backend trainer behaviour (fault safety, data
    parallelism) and the one about several JAX processes (``cluster.py``);
    ``kt-benchmark`` compares with native PyTorch and reads each
    framework's device memory, ``kt-step-speed`` compiles its floors the
    way each backend compiles a step, ``kt-train`` checks that
    TensorBoard's TensorFlow is there before it writes logs, and the
    commands start TensorFlow with its C++ logs silenced
    (``commands/__init__.py``)."""
    allowed = {
        "backend.py",
        "_fault_safe.py",
        "distribute.py",
        "cluster.py",
        "commands/__init__.py",
        "commands/benchmark.py",
        "commands/matmul_floor.py",
        "commands/step_speed.py",
        "commands/train.py",
    }
    for path in PACKAGE:
        frameworks = {m.split(".")[0] for m in imported_modules(path)} & {
            "tensorflow",
            "jax",
            "torch",
        }
        where = path.relative_to(ROOT / "keras_transformer").as_posix()
        assert not frameworks or where in allowed, (path, frameworks)


@pytest.mark.parametrize(
    "path", [p for p in SCRIPTS if p.name != "__init__.py"], ids=lambda p: p.stem
)
def test_python_m_training_runs_the_command(path, monkeypatch, capsys):
    name = "kt-" + path.stem.replace("_", "-")
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(f"training.{path.stem}", run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")
