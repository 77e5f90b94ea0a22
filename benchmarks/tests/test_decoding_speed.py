"""benchmarks/decoding_speed.py's command: each search run at the size asked
for, the times it reports turned into tokens per second and ratios, the
table and the JSON, and ``--all-backends``' children. The clock is replaced
by times chosen here, so that every figure can be worked out by hand."""

import json
import os
import sys

import numpy as np
import pytest

from benchmarks import REPO
from benchmarks import decoding_speed as benchmark

# (first call, median of the repeats) that each search is given, in the
# order measure() times them.
TIMES = {
    "greedy, uncached": (2.0, 0.5),
    "greedy, cached": (1.0, 0.125),
    "beam 4, cached": (3.0, 0.25),
    "greedy x4 rows, cached": (1.5, 0.375),
}
SIZES = ["--batch", "2", "--source-length", "4", "--steps", "3"]


def _scripted_times(monkeypatch):
    """Each search runs once, for real; its outputs are kept."""
    outputs = []
    times = iter(TIMES.values())

    def time_call(fn, repeats):
        assert repeats == 1
        outputs.append(fn())
        return next(times)

    monkeypatch.setattr(benchmark, "time_call", time_call)
    return outputs


@pytest.mark.once
def test_main_runs_each_search_at_the_size_asked_and_reports_it(
    monkeypatch, capsys, tmp_path
):
    outputs = _scripted_times(monkeypatch)
    path = tmp_path / "decoding.json"
    runs = benchmark.main([*SIZES, "--repeats", "1", "--json", str(path)])

    # With end_id=None every row generates all 3 tokens, none of them padding.
    (uncached, _), (cached, _), (beam, _, _), (rows_x4, _) = outputs
    assert uncached.shape == cached.shape == (2, 3)
    assert beam.shape == (2, 4, 3)
    assert rows_x4.shape == (8, 3)
    for tokens in (uncached, cached, beam, rows_x4):
        assert np.all(tokens != 0)

    (run,) = runs
    assert run["setting"] == {
        "config": "tiny",
        "batch": 2,
        "source_length": 4,
        "generated_tokens": 3,
        "vocab_size": 200,
        "repeats": 1,
    }
    # 2 rows x 3 tokens = 6 tokens per search.
    assert run["searches"] == {
        "greedy, uncached": {
            "seconds": 0.5,
            "first_call_seconds": 2.0,
            "tokens_per_second": 12.0,
        },
        "greedy, cached": {
            "seconds": 0.125,
            "first_call_seconds": 1.0,
            "tokens_per_second": 48.0,
        },
        "beam 4, cached": {
            "seconds": 0.25,
            "first_call_seconds": 3.0,
            "tokens_per_second": 24.0,
        },
        "greedy x4 rows, cached": {
            "seconds": 0.375,
            "first_call_seconds": 1.5,
            "tokens_per_second": 16.0,
        },
    }
    assert run["cache_speedup"] == 4.0  # 0.5 / 0.125
    assert run["beam4_over_greedy"] == 2.0  # 0.25 / 0.125
    assert run["greedy_x4_rows_over_greedy"] == 3.0  # 0.375 / 0.125
    table = capsys.readouterr().out.strip().splitlines()
    assert table[-1] == f"| {run['backend']} | 12 | 48 | 24 | 4.0x | 2.00x | 3.00x |"
    assert json.loads(path.read_text()) == runs


@pytest.mark.once
def test_all_backends_runs_one_child_each_and_tabulates_their_json(monkeypatch, capsys):
    """The parent's command lines and environments, and the children's
    ``--json -`` line that it reads (each child run here, in this process,
    with a canned measurement)."""
    children = []

    def measure(batch, source_length, steps, repeats):
        backend = children[-1]["env"]["KERAS_BACKEND"]
        seconds = {"tensorflow": 0.5, "jax": 0.25, "torch": 1.0}[backend]
        return {
            "backend": backend,
            "size": [batch, source_length, steps, repeats],
            "searches": {
                name: {"tokens_per_second": 64 / seconds}
                for name in ("greedy, uncached", "greedy, cached", "beam 4, cached")
            },
            "cache_speedup": 2.0,
            "beam4_over_greedy": 3.0,
            "greedy_x4_rows_over_greedy": 1.5,
        }

    def run(command, env, capture_output, text, check):
        assert capture_output and text and check
        children.append({"command": command, "env": env})
        assert command[:3] == [sys.executable, "-m", "benchmarks.decoding_speed"]
        benchmark.main(command[3:])
        out = capsys.readouterr().out
        return type("Done", (), {"stdout": "a warning line\n" + out})

    monkeypatch.setattr(benchmark, "measure", measure)
    monkeypatch.setattr(benchmark.subprocess, "run", run)
    runs = benchmark.main(["--all-backends", *SIZES, "--repeats", "2"])

    assert [c["env"]["KERAS_BACKEND"] for c in children] == list(benchmark.BACKENDS)
    for child in children:
        assert child["command"][3:] == ["--repeats", "2", *SIZES, "--json", "-"]
        assert child["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert [r["backend"] for r in runs] == ["tensorflow", "jax", "torch"]
    assert all(r["size"] == [2, 4, 3, 2] for r in runs)
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert rows == [
        "| tensorflow | 128 | 128 | 128 | 2.0x | 3.00x | 1.50x |",
        "| jax | 256 | 256 | 256 | 2.0x | 3.00x | 1.50x |",
        "| torch | 64 | 64 | 64 | 2.0x | 3.00x | 1.50x |",
    ]
