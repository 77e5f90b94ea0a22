"""benchmarks/ctranslate2_parity.py run end to end on the trained number
translator of 0.2.0 (tests/fixtures/v0_2_0), whose translations are known
(expected.json: its greedy and beam-4 outputs, which test_compat.py checks
on every backend); with a clock that gives every run 0.5 s, so that the
rates are worked out by hand. And its arithmetic (share of equal outputs,
BLEU, the α mapped to GNMT's length penalty) on values worked out here."""

import gzip
import json
import os
import pathlib
import re
import warnings

import pytest

from benchmarks import ctranslate2_parity as parity

pytestmark = pytest.mark.once

FIXTURES = pathlib.Path(__file__).parents[2] / "tests" / "fixtures" / "v0_2_0"
KNOWN = json.loads((FIXTURES / "expected.json").read_text())
SECONDS = 0.5  # what every timed run takes here


def test_arithmetic_on_hand_worked_values(capsys):
    assert parity.same_share(["a", "b", "c", "d"], ["a", "x", "c", "y"]) == 0.5
    # |Y| = 1 has no |Y'| = 0 to fit; (3-1)/(5+3) = 1/4, (7-1)/(5+7) = 1/2.
    assert parity.mapped_alpha(0.6, [1, 3, 7]) == pytest.approx(0.6 * 0.375)
    # Precisions 4/5, 3/4, 2/3, 1/2 (geometric mean 0.2 ** 0.25), no
    # brevity penalty: the hypothesis is the longer.
    assert parity.bleu(["a b c d e"], ["a b c d"]) == round(100 * 0.2**0.25, 2)
    assert parity.bleu(["a b c d e"], None) is None

    result = {"runs": []}
    record = parity.recorder(result, ["a b c d", "e f"])
    row = record("x", ["a b c d e", "g"], 1.234, ["a b c d e", "e f"], engine="e")
    assert row == {
        "name": "x",
        "identical_to_ours": 0.5,
        "bleu": parity.bleu(["a b c d e", "g"], ["a b c d", "e f"]),
        "seconds": 1.23,
        "engine": "e",
    }
    assert record("ours", ["g", "h"], 2.0, None)["identical_to_ours"] is None
    assert result["runs"][0] is row and len(result["runs"]) == 2
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == result["runs"]


@pytest.fixture
def timed_at_half_a_second(monkeypatch):
    def timed(fn):
        return fn(), SECONDS

    monkeypatch.setattr(parity, "timed", timed)


@pytest.fixture
def bleu_inputs(monkeypatch):
    """What each run's BLEU was computed from: its outputs."""
    seen = []
    real = parity.bleu

    def bleu(hypotheses, references):
        seen.append((list(hypotheses), references))
        return real(hypotheses, references)

    monkeypatch.setattr(parity, "bleu", bleu)
    return seen


def _names():
    """The runs' names, in order; the fitted α' left out."""
    names = ["ours greedy", "ours beam 4"]
    for kind in ("float32", "int8"):
        names += [f"ctranslate2 {kind} greedy"]
        names += [
            f"ctranslate2 {kind} beam 4, GNMT re-ranking, patience {p}"
            for p in (1.0, 2.0)
        ]
        names += [
            f"ctranslate2 {kind} beam 4, its own |Y|**alpha, alpha as given (0.600)",
            f"ctranslate2 {kind} beam 4, its own |Y|**alpha, alpha mapped (α')",
        ]
    return names


def _check_outputs(runs, bleu_inputs, n):
    """Each run's outputs, as its BLEU saw them, against the known ones and
    against what the run reports of them."""
    outputs = {
        r["name"]: hypotheses
        for r, (hypotheses, _) in zip(runs, bleu_inputs, strict=True)
    }
    assert {tuple(refs) for _, refs in bleu_inputs} == {tuple(KNOWN["references"][:n])}
    assert outputs["ours greedy"] == KNOWN["greedy"][:n]
    assert outputs["ours beam 4"] == KNOWN["beam4"][:n]
    assert outputs["ctranslate2 float32 greedy"] == KNOWN["greedy"][:n]
    for r in runs[2:]:
        ours = outputs["ours greedy" if "greedy" in r["name"] else "ours beam 4"]
        assert r["identical_to_ours"] == round(
            parity.same_share(outputs[r["name"]], ours), 4
        )
        if "differences" in r:
            pairs = zip(outputs[r["name"]], ours, strict=True)
            lines = [i + 1 for i, (a, b) in enumerate(pairs) if a != b]
            assert [d["line"] for d in r["differences"]] == lines
            for d in r["differences"]:
                assert d["ours"] == ours[d["line"] - 1]
                assert d["ctranslate2"] == outputs[r["name"]][d["line"] - 1]


def _check_grid(rows, n, batch_sizes, inter, repeats):
    """Each weight type, batch size and thread split, at 0.5 s a round."""
    settings = [(r["weights"], r["batch_size"], r["inter_threads"]) for r in rows]
    assert settings == [(k, b, inter) for k in ("float32", "int8") for b in batch_sizes]
    for row in rows:
        assert row["intra_threads"] == max((os.cpu_count() or 1) // inter, 1)
        assert row["seconds"] == SECONDS and row["all_seconds"] == [SECONDS] * repeats
        assert row["sentences_per_second"] == n / SECONDS


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # keras-hub's vocabulary
def test_a_run_on_the_number_translator(tmp_path, timed_at_half_a_second, bleu_inputs):
    n = 3
    source, reference = tmp_path / "source.txt", tmp_path / "reference.txt.gz"
    source.write_text("".join(f"{s}\n" for s in KNOWN["sentences"]))
    with gzip.open(reference, "wt", encoding="utf-8") as file:
        file.write("".join(f"{s}\n" for s in KNOWN["references"]))
    work, path = tmp_path / "exports", tmp_path / "parity.json"
    common = ["--model", str(FIXTURES / "translator.keras"), "--source", str(source)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # CTranslate2's int8 notes
        result = parity.main(
            [*common, "--reference", str(reference), "--limit", str(n),
             "--patience", "1,2", "--native", "--speed", "--batch-sizes", "2,4",
             "--inter-threads", "1", "--out", str(work), "--json", str(path)]
        )  # fmt: skip
    assert json.loads(path.read_text()) == result
    assert result["sentences"] == n and result["dtype_policy"] == "float32"
    assert result["export_float32_seconds"] == result["export_int8_seconds"] == SECONDS
    assert sorted(os.listdir(work)) == ["float32", "int8"]

    runs = result["runs"]
    mapped = r"alpha mapped \((0\.\d{3})\)$"
    assert [re.sub(mapped, "alpha mapped (α')", r["name"]) for r in runs] == _names()
    # α' = 0.6 times a mean of (|Y| - 1) / (5 + |Y|), each in [0, 1): the
    # same for both exports, since it is fitted to our outputs' lengths.
    fitted = [re.search(mapped, r["name"]) for r in runs]
    (alpha,) = {float(m[1]) for m in fitted if m is not None}
    assert 0 < alpha < 0.6
    assert all(r["seconds"] == SECONDS for r in runs)
    _check_outputs(runs, bleu_inputs, n)
    _check_grid(result["speed"], n, batch_sizes=(2, 4), inter=1, repeats=1)

    # --speed-only: the grid alone, on the exports already in --out.
    grid = parity.main(
        [*common, "--limit", "2", "--speed-only", "--out", str(work),
         "--batch-sizes", "8", "--inter-threads", "2", "--repeats", "3"]
    )  # fmt: skip
    assert grid["sentences"] == 2
    _check_grid(grid["speed"], 2, batch_sizes=(8,), inter=2, repeats=3)


def test_speed_only_needs_the_exports_folder(capsys):
    with pytest.raises(SystemExit) as exit_:
        parity.main(["--model", "m.keras", "--source", "s.txt", "--speed-only"])
    assert exit_.value.code == 2
    assert "--speed-only needs --out" in capsys.readouterr().err
