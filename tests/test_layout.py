"""The code's shape: scripts that only import the package, short functions,
no layer found by its name, backend branches in one module."""

import ast
import pathlib

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
def test_scripts_import_the_package_not_each_other(path):
    assert not [m for m in imported_modules(path) if m.split(".")[0] == "training"]


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
    parallelism)."""
    allowed = {"backend.py", "_fault_safe.py", "distribute.py"}
    for path in PACKAGE:
        frameworks = {m.split(".")[0] for m in imported_modules(path)} & {
            "tensorflow",
            "jax",
            "torch",
        }
        assert not frameworks or path.name in allowed, (path, frameworks)
