"""benchmarks/marian_parity.py: its batching, and the command end to end on
the number translator of 0.2.0, its children run in this process: the
translator's outputs and transformers' ``generate`` on the folder written
from it agree, search for search."""

import contextlib
import io
import json
import os
import sys
import types

import keras
import pytest

from benchmarks import marian_parity
from benchmarks.tests.test_deploy_speed import FIXTURES, KNOWN

pytestmark = pytest.mark.once


def test_batches_by_length_sorts_then_cuts():
    rows = [[1] * n for n in (5, 1, 3, 2, 4)]
    assert marian_parity.batches_by_length(rows, 2) == [[1, 3], [2, 4], [0]]
    assert marian_parity.batches_by_length([], 2) == []


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # keras-hub's vocabulary
@pytest.mark.filterwarnings("ignore::UserWarning")  # "pip install sacremoses"
def test_ours_and_generate_translate_alike(tmp_path, monkeypatch):
    children = []

    def run(command, env, capture_output, text):
        assert command[:3] == [sys.executable, "-m", "benchmarks.marian_parity"]
        children.append((env["KERAS_BACKEND"], command[4:7]))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            marian_parity.main(command[3:])
        return types.SimpleNamespace(returncode=0, stdout=out.getvalue(), stderr="")

    monkeypatch.setattr(marian_parity.subprocess, "run", run)
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{s}\n" for s in KNOWN["sentences"][:4]))
    backend = keras.backend.backend()
    results = marian_parity.main(
        ["--model", str(FIXTURES / "translator.keras"), "--source", str(source),
         "--systems", f"keras-{backend}", "transformers", "--searches", "greedy",
         "beam4", "--work", str(tmp_path / "work")]
    )  # fmt: skip
    assert children == [
        (backend, ["translate", f"keras-{backend}", "greedy"]),
        ("torch", ["translate", "transformers", "greedy"]),
        (backend, ["translate", f"keras-{backend}", "beam4"]),
        ("torch", ["translate", "transformers", "beam4"]),
    ]
    assert sorted(os.listdir(tmp_path / "work")) == ["ctranslate2-float32", "marian"]
    outputs = {(r["system"], r["search"]): r["outputs"] for r in results}
    for search in ("greedy", "beam4"):
        assert outputs[(f"keras-{backend}", search)] == KNOWN[search][:4]
        assert outputs[("transformers", search)] == KNOWN[search][:4]
    generation = json.loads(
        (tmp_path / "work/marian/generation_config.json").read_text()
    )
    assert generation["num_beams"] == 4
