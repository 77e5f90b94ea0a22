"""The code's shape: what ships and what stays in the repository, scripts
written with the public API, no layer found by its name, backend branches
in few modules, settings made where they belong, imports that go down.
(Functions are cut by responsibility, which no line count measures.)"""

import ast
import importlib
import pathlib
import re
import runpy
import sys

import pytest

import keras_transformer as kt
from tests.test_moved import MOVED

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = sorted((ROOT / "keras_transformer").rglob("*.py"))
SCRIPTS = sorted(p for p in (ROOT / "training").glob("*.py") if p.stem != "__init__")
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))
COMMANDS = ("train", "evaluate", "translate", "attention", "launch", "export", "serve")

pytestmark = pytest.mark.once

# What a script in training/ may import of this package: its public API.
PUBLIC = {
    "keras_transformer",
    "keras_transformer.data",
    "keras_transformer.trainer.callbacks",
    "keras_transformer.translate.evaluation",
}


def imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_there_are_training_scripts():
    assert {p.stem for p in SCRIPTS} >= {"numbers", "parallel_corpus"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_training_scripts_use_only_the_public_api(path):
    ours = {m for m in imported_modules(path) if m.split(".")[0] == "keras_transformer"}
    assert ours and ours <= PUBLIC, ours - PUBLIC
    assert len(path.read_text().splitlines()) <= 130  # read in one sitting


def test_the_package_does_not_import_the_repository_tools():
    for path in PACKAGE:
        roots = {m.split(".")[0] for m in imported_modules(path)}
        assert not roots & {"benchmarks", "training", "tests"}, path


def test_no_layer_is_looked_up_by_name():
    for path in PACKAGE:
        text = path.read_text()
        assert "get_layer(" not in text, path
        assert "layer.name ==" not in text, path


def test_no_issue_numbers_in_the_code():
    """Readers of the code cannot look the project's issues up."""
    pattern = re.compile(r"(?<![\w&/])#\d+\b|\bissue \d+|\bissue #")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in PACKAGE + SCRIPTS + BENCHMARKS
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found


def test_backend_imports_in_few_modules():
    """TensorFlow, JAX and PyTorch are imported by backend.py, and by the
    modules about per-backend trainer behaviour (fault safety, data
    parallelism, several JAX processes); the commands start TensorFlow with
    its C++ logs silenced (on the TensorFlow backend only), and the SavedModel export
    builds a TensorFlow graph; a Marian checkpoint saved as
    ``pytorch_model.bin`` is read with PyTorch."""
    allowed = {
        "pretrained/marian.py",
        "backend.py",
        "_guards/fault_safe.py",
        "distribute/parallel.py",
        "distribute/cluster.py",
        "cli/_process.py",
        "export/saved_model.py",
        "export/saved_model_graph.py",
    }
    for path in PACKAGE:
        frameworks = {m.split(".")[0] for m in imported_modules(path)} & {
            "tensorflow",
            "jax",
            "torch",
        }
        where = path.relative_to(ROOT / "keras_transformer").as_posix()
        assert not frameworks or where in allowed, (path, frameworks)


def _calls(node):
    return {
        n.func.id if isinstance(n.func, ast.Name) else n.func.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
    }


def test_process_settings_are_made_in_the_commands_main_only():
    """Nothing changes the process on import; each command's main does, and
    nothing below the commands sees argparse."""
    for path in PACKAGE:
        tree = ast.parse(path.read_text())
        definitions = (ast.FunctionDef, ast.ClassDef)
        top = [n for n in tree.body if not isinstance(n, definitions)]
        for node in top:
            called = _calls(node)
            settings = {"keep_freed_memory", "prepare_process", "mallopt"}
            assert not called & settings, path
        inside_cli = path.parent.name == "cli"
        if not inside_cli:
            assert "argparse" not in set(imported_modules(path)), path
    for name in ("train", "evaluate", "translate", "attention", "serve"):
        path = ROOT / "keras_transformer" / "cli" / f"{name}.py"
        tree = ast.parse(path.read_text())
        (main,) = [n for n in tree.body if getattr(n, "name", None) == "main"]
        assert "prepare_process" in _calls(main), name


# Run again in this process, a module another test imported warns about it.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("name", COMMANDS)
def test_python_m_runs_each_command(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(f"keras_transformer.cli.{name}", run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: kt-{name} ")


# The subsystems from the bottom up (docs/design.md draws them): a package
# imports its own modules and packages of a lower rank only. A new module or
# package gets its place here on purpose.
RANKS = {
    "special_tokens": 0,
    "backend": 0,
    "atomic": 0,
    "progress": 0,
    "_lazy": 0,
    "_moved": 0,
    # Imports the modules that register classes with Keras only once Keras
    # is imported, by name (not edges here).
    "saving": 0,
    "data": 1,
    "distribute": 1,
    "_guards": 2,
    "layers": 3,
    "search": 3,
    "model": 4,
    "pretrained": 5,
    "translate": 6,
    "trainer": 7,
    "export": 7,
    "serving": 7,
    "cli": 8,
}
# The package itself: importing it runs its table of lazy names and imports
# nothing more, so any module may import it; each name it resolves is an
# edge to the defining module, found where the name is used.
TOP = "keras_transformer"
RANKS[""] = 0  # _subsystem(TOP)
# 0.3.0's module paths, each bound to its new module (tests/test_moved.py):
# above everything, for old programs; the package never imports them.
OLD_PATHS = {old.split(".")[1] for old in MOVED if old.count(".") == 1}
RANKS.update(dict.fromkeys(OLD_PATHS, 9))


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted):
    base = ROOT / dotted.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _lazy_names(package):
    """A package's ``_PUBLIC`` table (name -> the module that defines it);
    empty for a module or a package without one. Importing a package of
    this one runs only its table (see the test of what the package imports
    on import)."""
    if not (ROOT / package.replace(".", "/") / "__init__.py").exists():
        return {}
    return getattr(importlib.import_module(package), "_PUBLIC", {})


def _resolve(module, name):
    """The module that ``module.name`` imports (a submodule, or the module
    that defines a lazy name), or None (a plain attribute)."""
    if _is_module(f"{module}.{name}"):
        return f"{module}.{name}"
    return _lazy_names(module).get(name)


def _named_module(node, bound):
    """The module that the expression ``node`` (``a``, ``a.b``, ...) names,
    or None; ``bound``: local name -> the module it names."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        module = _named_module(node.value, bound)
        if module is not None and _is_module(f"{module}.{node.attr}"):
            return f"{module}.{node.attr}"
    return None


def _imports_of(tree):
    """The package's modules that ``tree`` imports (see ``package_imports``)."""
    found, bound = set(), {}  # bound: local name -> the module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
                # ``import a.b`` binds ``a``; ``import a.b as x`` binds ``a.b``.
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = alias.name if alias.asname else name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_module(full):
                    found.add(full)
                    bound[alias.asname or alias.name] = full
                else:  # the package's __init__, then the module it names
                    found.add(node.module)
                    found.add(_lazy_names(node.module).get(alias.name))
    # A package's lazy name used as an attribute (``kt.build_model``,
    # ``kt.data.CorpusFiles``).
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            module = _named_module(node.value, bound)
            if module is not None and module.split(".")[0] == TOP:
                found.add(_resolve(module, node.attr))
    found |= _modules_run(tree)
    return {m for m in found - {None} if m == TOP or m.startswith(f"{TOP}.")}


def _modules_run(tree):
    """The modules a command line written in ``tree`` runs with ``python
    -m`` (``[sys.executable, "-m", "keras_transformer.x.y", ...]``): a
    subprocess imports its module as surely as an import statement does."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [getattr(item, "value", None) for item in node.elts]
            found.update(
                module
                for flag, module in zip(words, words[1:], strict=False)
                if flag == "-m" and isinstance(module, str)
            )
    return found


def package_imports():
    """``{module: {imported module, ...}}`` over the package, every import
    (function-level ones too); ``from package import module`` counts as the
    module, not the package's ``__init__``; a name of a package's lazy table
    (``from keras_transformer import build_model``, or ``kt.build_model``
    after ``import keras_transformer as kt``) counts as the module that
    defines it too, after the package; so does a module a subprocess runs
    with ``python -m``."""
    return {
        _module_name(path): _imports_of(ast.parse(path.read_text())) for path in PACKAGE
    }


def _subsystem(module):
    return module.split(".")[1] if "." in module else ""


def test_every_subsystem_has_a_rank():
    subsystems = {_subsystem(m) for m in package_imports()}
    assert subsystems <= set(RANKS), subsystems - set(RANKS)


def _imported_on_import(package):
    """The package's modules that ``package``'s ``__init__.py`` imports
    outside its functions."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(init.read_text())
    body = [n for n in tree.body if not isinstance(n, ast.FunctionDef)]
    return _imports_of(ast.Module(body=body, type_ignores=[]))


def test_the_package_imports_nothing_more_on_import():
    """``keras_transformer/__init__.py`` runs ``_lazy``, ``saving`` (which
    imports no module of the package until Keras is imported) and the
    tables of the subpackages its API names (each runs ``_lazy`` alone); its
    ``__getattr__`` imports the rest, name by name."""
    assert _imported_on_import(TOP) == {f"{TOP}._lazy", f"{TOP}.saving"}
    saving = ast.parse((ROOT / TOP / "saving.py").read_text())
    assert not _imports_of(saving)
    for package in kt._API:
        assert _imported_on_import(package) == {f"{TOP}._lazy"}, package


def test_no_module_of_the_package_imports_an_old_path():
    old = {f"{TOP}.{name}" for name in OLD_PATHS} | set(MOVED)
    found = {
        f"{module} -> {imported}"
        for module, imports in package_imports().items()
        for imported in imports & old
    }
    assert not found


def test_imports_go_only_downward():
    upward = [
        f"{module} -> {imported}"
        for module, imports in package_imports().items()
        if module != TOP  # the public API's table reaches all
        for imported in imports
        if _subsystem(imported) != _subsystem(module)
        and RANKS[_subsystem(imported)] >= RANKS[_subsystem(module)]
    ]
    assert not upward


def test_a_module_run_with_python_m_is_an_import_edge():
    """A subprocess's ``python -m`` module is an edge like an import: one
    from the exports to a command would go upward, and the SavedModel
    export's child process is found where it runs."""
    code = (
        "import subprocess, sys\n"
        "def write(path):\n"
        "    command = [sys.executable, '-m', 'keras_transformer.cli.export', path]\n"
        "    subprocess.run(command, check=True)\n"
    )
    (imported,) = _imports_of(ast.parse(code))
    assert imported == "keras_transformer.cli.export"
    assert RANKS[_subsystem(imported)] > RANKS["export"]
    edges = package_imports()["keras_transformer.export.saved_model"]
    assert "keras_transformer.export._saved_model_child" in edges


def test_no_import_cycles():
    graph = package_imports()
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                cycles.append(path[path.index(imported) :] + [imported])
            elif imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles


def test_no_private_name_imported_across_packages():
    """``_guards`` is the one private package every subsystem may use; a
    private name of another subsystem stays in it."""
    found = []
    for path in PACKAGE:
        module = _module_name(path)
        modules = {}  # local name -> the module it names
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_module(full):
                        modules[alias.asname or alias.name] = full
                    elif (
                        alias.name.startswith("_")
                        and node.module.startswith("keras_transformer.")
                        and _subsystem(node.module) != _subsystem(module)
                    ):
                        found.append(
                            f"{module}: from {node.module} import {alias.name}"
                        )
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.value.id in modules
                and _subsystem(modules[node.value.id])
                not in (_subsystem(module), "_guards")
            ):
                found.append(f"{module}: {modules[node.value.id]}.{node.attr}")
    assert not found
