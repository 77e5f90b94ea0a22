"""The package as a user gets it: a wheel built from this tree, installed into
a new virtual environment outside the repository, and its commands run from
another folder (no clone on the path).

The new environment borrows the test environment's dependencies (a ``.pth``
line naming its site-packages, which adds the folder without running the
editable install's hook), so that the test installs one wheel instead of
gigabytes; ``keras_transformer`` itself comes from the wheel, which the test
checks.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import keras_transformer

REPO = Path(__file__).resolve().parents[1]
# What a user runs; the measurement tools stay in the repository (benchmarks/).
COMMANDS = (
    "kt-train",
    "kt-evaluate",
    "kt-translate",
    "kt-attention",
    "kt-launch",
    "kt-export",
    "kt-serve",
    "kt-import",
)
SMALL_RUN = [
    "--task", "numbers", "--train-size", "200", "--val-size", "8",
    "--test-size", "8", "--uniform-size", "8", "--num-layers", "1", "--d-model", "32",
    "--num-heads", "2", "--d-ff", "64", "--max-length", "64",
    "--vocab-size", "60", "--batch-tokens", "256", "--bucket-lengths", "16,64",
    "--beam-size", "1", "--epochs", "1", "--max-minutes", "5",
]  # fmt: skip

# Once, in the TensorFlow run: its commands run in their own processes (on
# JAX, as the README's), and the TensorFlow run's two workers finish first.
pytestmark = [pytest.mark.once("tensorflow"), pytest.mark.slow]


def clean_env(**extra):
    """This environment without PYTHONPATH and the suite's TensorFlow log
    level (the commands set their own), plus ``extra``."""
    drop = ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def run(command, cwd, timeout=300, env=None):
    env = clean_env() if env is None else env
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """The ``bin`` folder of a new environment holding the built wheel."""
    root = tmp_path_factory.mktemp("install")
    # The wheel is built from a copy: building in the tree would write build/
    # and *.egg-info into it while the other backends' runs read it.
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "keras_transformer",
        src / "keras_transformer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # "./src", a folder: pip would read a bare "src" as a project's name.
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist"]
    run([*pip, *build, "./src"], root)
    (wheel,) = (root / "dist").glob("*.whl")
    assert (
        wheel.name
        == f"keras_transformer_aiayn-{keras_transformer.__version__}-py3-none-any.whl"
    )

    run([sys.executable, "-m", "venv", "venv"], root)
    python = root / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], root)
    purelib = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        root,
    ).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    Path(purelib, "zz_test_dependencies.pth").write_text(deps + "\n")
    (root / "elsewhere").mkdir()
    return root / "venv" / "bin", root / "elsewhere"


def test_the_wheel_holds_the_package_its_license_and_commands(venv):
    bin_dir, elsewhere = venv
    probe = (
        "import importlib.metadata as md, importlib.util, keras_transformer\n"
        "dist = md.distribution('keras-transformer-aiayn')\n"
        "print(keras_transformer.__file__)\n"
        "print(importlib.util.find_spec('training'))\n"
        "print(importlib.util.find_spec('benchmarks'))\n"
        "print(dist.version, dist.metadata['License-Expression'])\n"
        "print(sorted(p.name for p in dist.files if 'LICENSE' in p.name))\n"
        "print(sorted(e.name for e in dist.entry_points))\n"
        "from keras_transformer.serving.page import page_html\n"
        "print(len(page_html()), '<title>kt-serve</title>' in page_html())\n"
    )
    lines = run([bin_dir / "python", "-c", probe], elsewhere).stdout.splitlines()
    assert lines[0].startswith(str(bin_dir.parent))  # the wheel's copy
    assert lines[1] == "None"  # no top-level `training` package installed
    assert lines[2] == "None"  # nor the measurement tools
    assert lines[3] == f"{keras_transformer.__version__} Apache-2.0"
    assert lines[4] == "['LICENSE']"
    assert lines[5] == str(sorted(COMMANDS))
    # kt-serve's page is package data: in the wheel, read from it.
    assert int(lines[6].split()[0]) > 5000 and lines[6].endswith("True")
    # One version, read from the package by the build.
    assert importlib.metadata.version("keras-transformer-aiayn") == (
        keras_transformer.__version__
    )


HELP_ALL = """
import contextlib, importlib.metadata as md, io, sys
for entry in md.distribution("keras-transformer-aiayn").entry_points:
    sys.argv, out = [entry.name, "--help"], io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        entry.load()()
    print(entry.name, repr(out.getvalue()[:200]))
"""


def test_every_command_answers_help(venv):
    """Each command's script is installed; each answers ``--help`` (in one
    process, through the entry points: the scripts themselves run in the
    training test below)."""
    bin_dir, elsewhere = venv
    for name in COMMANDS:
        assert (bin_dir / name).is_file(), name
    lines = run([bin_dir / "python", "-c", HELP_ALL], elsewhere).stdout.splitlines()
    helps = dict(line.split(" ", 1) for line in lines)
    assert sorted(helps) == sorted(COMMANDS)
    for name, text in helps.items():
        # repr() quotes with ' or, if the text holds a ', with ".
        assert text[1:].startswith(f"usage: {name} "), (name, text)


def own_line(line):
    """A line the commands write to stderr: progress, or a usage error."""
    return re.fullmatch(r"\d+/\d+ sentences, .*", line) is not None


def test_train_evaluate_translate_with_the_installed_commands(venv):
    """As the README's main command: JAX, from another folder; progress, and
    no TensorFlow, CUDA or absl lines on stderr (the machine has no GPU);
    with --verbose no TensorFlow line either: a JAX process never starts
    it."""
    bin_dir, elsewhere = venv
    env = clean_env(KERAS_BACKEND="jax")
    train = [bin_dir / "kt-train", *SMALL_RUN, "--out", "run"]
    trained = run(train, elsewhere, env=env)
    assert "saved " in trained.stdout
    foreign = [line for line in trained.stderr.splitlines() if not own_line(line)]
    assert not foreign, foreign
    model = elsewhere / "run" / "translator.keras"

    (elsewhere / "test.en").write_text("seven\none\ntwenty\n")
    (elsewhere / "test.de").write_text("sieben\neins\nzwanzig\n")
    evaluate = [bin_dir / "kt-evaluate", "--model", model, "--beam-size", "1"]
    evaluate += ["--source", "test.en", "--reference", "test.de"]
    evaluated = run(evaluate, elsewhere, env=env)
    assert (elsewhere / "run" / "eval-test.json").is_file()
    assert [own_line(line) for line in evaluated.stderr.splitlines()] == [True]
    assert evaluated.stderr.startswith("3/3 sentences, ")

    # --verbose leaves the frameworks' logs to the user's level, and on JAX
    # none is TensorFlow's. (kt-translate's quiet default:
    # test_translator_faults.py's python -m keras_transformer.cli.translate.)
    translate = [bin_dir / "kt-translate", "--model", model, "seven", "one"]
    loud = run([*translate, "--verbose"], elsewhere, env=env)
    assert len(loud.stdout.splitlines()) == 2
    assert sum(own_line(line) for line in loud.stderr.splitlines()) == 1
    tensorflow = ("tensorflow", "onednn", "cuda", "absl")
    assert not [
        line
        for line in loud.stderr.splitlines()
        if any(word in line.lower() for word in tensorflow)
    ], loud.stderr


def test_requires_python_is_what_the_pinned_install_needs():
    """pyproject's ``requires-python`` is the highest floor among the
    distributions ``constraints.txt`` pins (as installed here) and Keras' own
    lower bound: lower, the README's commands cannot resolve on it; higher,
    it turns away Pythons that work."""
    import tomllib

    def floor(specifier):
        found = re.search(r">=\s*(\d+)\.(\d+)", specifier or "")
        return (int(found[1]), int(found[2])) if found else (0, 0)

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = re.findall(r"^([\w.-]+)==", (REPO / "constraints.txt").read_text(), re.M)
    floors = {}
    for name in pins:
        try:
            floors[name] = floor(importlib.metadata.metadata(name)["Requires-Python"])
        except importlib.metadata.PackageNotFoundError:
            continue
    assert floors, pins
    assert floor(project["requires-python"]) == max(floors.values()), floors
    readme = (REPO / "README.md").read_text()
    major, minor = floor(project["requires-python"])
    assert f"Python ≥ {major}.{minor}" in readme
