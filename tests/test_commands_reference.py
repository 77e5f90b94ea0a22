"""docs/commands.md says what the commands' parsers say, and names every
installed command. Its generator, ``docs/commands_reference.py``, is a tool
of the repository: it is not in the package."""

import importlib.util
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

from keras_transformer._guards import private_api
from keras_transformer.cli import export

pytestmark = pytest.mark.once

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "docs" / "commands_reference.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("commands_reference", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load_generator()


def test_docs_commands_md_is_what_the_parsers_give():
    written = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    problem = reference.difference(written, reference.render())
    assert problem is None, problem


def test_a_changed_parser_is_reported(monkeypatch):
    built = export._parser

    def with_one_more_option():
        parser = built()
        parser.add_argument("--colour", default="blue", help="a new option")
        return parser

    before = reference.render()
    monkeypatch.setattr(export, "_parser", with_one_more_option)
    problem = reference.difference(before, reference.render())
    assert problem is not None
    assert reference.REGENERATE in problem
    assert "+| `--colour COLOUR` | `blue` | a new option |" in problem


def test_every_installed_command_has_its_section():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    installed = re.findall(r"^(kt-[\w-]+) = ", scripts, re.MULTILINE)
    assert installed == list(reference.COMMANDS)


def test_the_text_does_not_depend_on_the_terminal(monkeypatch):
    wide = reference.render()
    monkeypatch.setenv("COLUMNS", "40")
    assert reference.render() == wide


def test_the_command_prints_or_writes_it(monkeypatch, tmp_path, capsys):
    printed = reference.main([])
    assert capsys.readouterr().out == printed
    path = tmp_path / "commands.md"
    monkeypatch.setattr(reference, "document_path", lambda: path)
    assert reference.main(["--write"]) == printed
    assert path.read_text(encoding="utf-8") == printed


def test_the_generator_is_not_in_the_package():
    assert not (ROOT / "keras_transformer" / "cli" / "reference.py").exists()
    assert importlib.util.find_spec("keras_transformer.cli.reference") is None


def test_it_runs_as_a_script_from_anywhere(tmp_path):
    """``python docs/commands_reference.py`` documents this clone's parsers,
    from any directory."""
    done = subprocess.run(
        [sys.executable, str(GENERATOR)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")


def test_where_argparse_cannot_be_read_each_section_is_its_help(monkeypatch):
    """On a Python the suite did not run, argparse's private lists are left
    alone: one warning, and each command's ``--help`` as it prints it."""
    monkeypatch.setattr(private_api, "_said", set())
    monkeypatch.setattr(private_api, "TESTED_PYTHON", ("2.7",))
    with pytest.warns(RuntimeWarning, match=r"tested with Python 2\.7") as caught:
        text = reference.render()
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1
    parser = reference.build_parser("kt-export")
    section = text.split("## kt-export\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip() == "```\n" + reference._help_text(parser) + "\n```"
    assert "| option | default | help |" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reference.render() == text  # said once


def test_a_parser_without_one_of_argparse_lists_gets_its_help(monkeypatch):
    monkeypatch.setattr(private_api, "_said", set())
    renamed = (*private_api._PARSER_LISTS, "_actions_renamed")
    monkeypatch.setattr(private_api, "_PARSER_LISTS", renamed)
    parser = reference.build_parser("kt-export")
    with pytest.warns(RuntimeWarning, match="has no ArgumentParser._actions_renamed"):
        section = reference._section("kt-export", parser)
    assert section[2:] == ["```", *reference._help_text(parser).splitlines(), "```"]
