"""A missing optional package: one line naming the extra to install, exit
status 2, no traceback.

Each case runs an installed command in a subprocess whose
``sitecustomize`` makes the package's import fail as if it were not
installed (``tests/installed_commands.py``): ctranslate2 or sentencepiece
for an export, starlette or uvicorn for ``kt-serve``, matplotlib for
``kt-attention``, sentencepiece for a ``.keras`` translator, the backend
Keras is asked for. The extras named are checked against
``pyproject.toml``, and the message of a library that wraps the
``ImportError`` is read through to the missing module. Without tensorboardX
``kt-train`` trains all the same, and says which extra writes its
TensorBoard logs.
"""

import os
import subprocess
import sys

import pytest

from keras_transformer.cli import _extras
from keras_transformer.cli import export as kt_export
from tests.installed_commands import ROOT, command, environment, sitecustomize
from tests.test_export_ctranslate2 import FIXTURE

# Processes that stop at their first import: their cost is the same in any
# run, so TensorFlow's (two workers) takes them.
pytestmark = pytest.mark.once("tensorflow")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "ct2"
    kt_export.main(["--model", FIXTURE, "--format", "ctranslate2", "--out", str(out)])
    return str(out)


# name: (command line, with EXPORT and OUT filled in; hidden packages; the
# extra named; KERAS_BACKEND).
CASES = {
    "ctranslate2-export": (
        ["kt-translate", "--model", "EXPORT", "seven"],
        ["ctranslate2"],
        "ctranslate2",
        None,
    ),
    "sentencepiece-export": (
        ["kt-translate", "--model", "EXPORT", "seven"],
        ["sentencepiece"],
        "ctranslate2",
        None,
    ),
    "ctranslate2-serve-export": (
        ["kt-serve", "--model", "EXPORT", "--port", "0"],
        ["ctranslate2"],
        "ctranslate2",
        None,
    ),
    "starlette-serve": (
        ["kt-serve", "--model", "EXPORT", "--port", "0"],
        ["starlette"],
        "serve",
        None,
    ),
    "uvicorn-serve": (
        ["kt-serve", "--model", "EXPORT", "--port", "0"],
        ["uvicorn"],
        "serve",
        None,
    ),
    # PyTorch: kt-attention imports the whole package before its main runs,
    # and on this backend that loads no TensorFlow (whose import prints).
    "matplotlib-attention": (
        ["kt-attention", "--model", FIXTURE, "--out", "OUT", "seven"],
        ["matplotlib"],
        "plot",
        "torch",
    ),
    "sentencepiece-keras": (
        ["kt-translate", "--model", FIXTURE, "seven"],
        ["sentencepiece"],
        "text",
        None,
    ),
    "sentencepiece-train": (
        ["kt-train", "--task", "numbers", "--max-minutes", "1", "--out", "OUT"],
        ["sentencepiece"],
        "text",
        "jax",
    ),
    "backend-keras": (
        ["kt-translate", "--model", FIXTURE, "seven"],
        ["jax", "jaxlib"],
        "jax",
        "jax",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_package_is_one_line_naming_the_extra(case, folder, tmp_path):
    words, hidden, extra, backend = CASES[case]
    fill = {"EXPORT": folder, "OUT": str(tmp_path / "a.png")}
    name, *args = [fill.get(word, word) for word in words]
    env = sitecustomize(tmp_path / "site", environment(backend), hide=hidden)
    done = subprocess.run(
        [*command(name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{name}: error: "), line
    assert line.endswith(f'pip install "keras-transformer-aiayn[{extra}]"'), line
    assert hidden[0] in line
    assert not os.path.exists(fill["OUT"])


# The distribution that installs each module the commands import.
DISTRIBUTIONS = {"prometheus_client": "prometheus-client"}
# What a command does without, naming the extra that adds it.
OPTIONAL = {"tensorboardX": "text"}  # kt-train's TensorBoard logs


def test_the_extras_named_install_the_packages():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]

    def names(extra):
        return {
            requirement.split(">")[0].split("=")[0].split("[")[0].strip()
            for requirement in extras[extra]
        }

    named = [
        (module, extra)
        for _, packages in _extras.NEEDS.values()
        for module, extra in packages.items()
        if extra is not None
    ] + [*_extras.BACKEND_EXTRAS.items(), *OPTIONAL.items()]
    for module, extra in named:
        assert DISTRIBUTIONS.get(module, module) in names(extra), (module, extra)


def test_training_without_tensorboardx_says_which_extra_adds_its_logs(
    monkeypatch, capsys, tmp_path
):
    from keras_transformer.trainer import fitting

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
    assert fitting._tensorboard(str(tmp_path / "logs")) is None
    (line,) = capsys.readouterr().out.splitlines()
    assert "tensorboardX" in line and "no TensorBoard logs" in line
    extra = OPTIONAL["tensorboardX"]
    assert line.endswith(f'pip install "keras-transformer-aiayn[{extra}]")'), line
    assert not os.listdir(tmp_path)


def test_a_wrapped_import_error_is_read_through_to_the_missing_module():
    missing = ModuleNotFoundError("No module named 'ctranslate2'", name="ctranslate2")
    try:
        try:
            raise missing
        except ImportError as error:
            raise ImportError("The CTranslate2 export needs ctranslate2") from error
    except ImportError as wrapped:
        line = _extras.missing_line(wrapped, "ctranslate2")
    assert line == (
        "a CTranslate2 export needs the ctranslate2 package: "
        'pip install "keras-transformer-aiayn[ctranslate2]"'
    )
    other = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert _extras.missing_line(other, "ctranslate2") is None
    # A dependency of a needed package: the package's extra, both named.
    missing = _extras.MissingPackage("keras_hub", "tensorflow_text", "text", "a model")
    assert str(missing) == (
        "a model needs the keras_hub package (which needs tensorflow_text, not "
        'installed): pip install "keras-transformer-aiayn[text]"'
    )


def test_exit_if_missing_passes_other_errors_on(capsys):
    with pytest.raises(ImportError, match="yaml"):
        with _extras.exit_if_missing("kt-x", "serve"):
            raise ModuleNotFoundError("No module named 'yaml'", name="yaml")
    with pytest.raises(SystemExit) as stopped:
        with _extras.exit_if_missing("kt-x", "serve"):
            raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "kt-x: error: kt-serve needs the uvicorn package: "
        'pip install "keras-transformer-aiayn[serve]"\n'
    )
