"""docs/commands.md says what the commands' parsers say, and names every
installed command."""

import pathlib
import re

import pytest

from keras_transformer.cli import export, reference

pytestmark = pytest.mark.once

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
