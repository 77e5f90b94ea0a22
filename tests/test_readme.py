"""The README's usage snippets run as written (the model and its halves; the
translator snippet needs a trained file and is the main command's job)."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_results_page_is_current_not_a_diary():
    text = (README.parent / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 400
    assert not re.search(r"(?<![\w&/])#\d+\b", text)  # no issue numbers


def test_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 250
    assert not re.search(r"(?<![\w&/])#\d+\b", README.read_text())  # no issue numbers


@pytest.mark.once
@pytest.mark.slow
def test_model_snippets_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the snippet saves t.keras where it runs
    blocks = python_blocks()
    assert "build_model" in blocks[0] and "decode_step" in blocks[1]
    namespace = {}
    exec(compile(blocks[0] + blocks[1], str(README), "exec"), namespace)
    assert namespace["model"].count_params() > 0
    tokens = namespace["tokens"]
    assert tokens.shape[0] == 32 and np.all(tokens >= 0)
    assert tuple(namespace["step_logits"].shape) == (32, 100)
