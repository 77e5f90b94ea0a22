"""benchmarks/constrained_decoding.py: drawing constraints as Post & Vilar
did (pure Python), one real run of the text task on the numbers fixture,
and ``--backends``' children sharing the first one's constraints."""

import json
import random
import sys

import pytest

from benchmarks import REPO
from benchmarks import constrained_decoding as benchmark

pytestmark = pytest.mark.once

REFERENCES = [
    "A man in a red hat, running down the street.",
    "Two dogs play in the snow .",
    "A little girl is climbing into a wooden playhouse.",
    '"Children" sit on a bench near the old church',
]
OUTPUTS = [
    "A man in a hat is running on the street.",
    "Two dog play in snow.",
    "A girl climbs into a playhouse made of wood.",
    "Kids sit on a bench.",
]


def _positions(reference, phrase):
    """Word positions of ``phrase`` in the reference's words (outer
    punctuation stripped), or None."""
    words = [w for run in benchmark._segments(reference) for w in run]
    size = len(phrase.split())
    for start in range(len(words) - size + 1):
        if " ".join(words[start : start + size]) == phrase:
            return set(range(start, start + size))
    return None


@pytest.mark.parametrize("count", [1, 2])
def test_draws_count_phrases_the_output_misses_and_the_reference_holds(count):
    for seed in range(20):
        rng = random.Random(seed)
        for reference, output in zip(REFERENCES, OUTPUTS, strict=True):
            phrases = benchmark.draw_constraints(reference, output, count, rng)
            assert len(phrases) == count
            assert len(set(phrases)) == count
            taken = set()
            for phrase in phrases:
                assert 1 <= len(phrase.split()) <= 3
                assert not benchmark._occurs(phrase, output)
                where = _positions(reference, phrase)
                assert where is not None, (reference, phrase)
                assert not where & taken  # no two overlap
                taken |= where


def test_the_only_non_overlapping_pair_is_the_one_drawn():
    # "red", "car", "red car": only {"red", "car"} do not overlap.
    for seed in range(10):
        drawn = benchmark.draw_constraints("red car", "", 2, random.Random(seed))
        assert drawn == ["red", "car"]
    # One word missing: each phrase drawn holds it, and no two can be drawn.
    holding_red = {"red", "a red", "red car", "a red car"}
    drawn = {
        tuple(benchmark.draw_constraints("a red car", "a car", 1, random.Random(seed)))
        for seed in range(40)
    }
    assert drawn == {(phrase,) for phrase in holding_red}  # each can be drawn
    assert benchmark.draw_constraints("a red car", "a car", 2, random.Random(0)) == []


def test_candidates_are_whole_words_within_punctuation():
    found = {p for _, _, p in benchmark.candidates("A dog, running - fast.", "")}
    assert found == {"A", "dog", "A dog", "running", "fast"}
    # Whole words: "dogs" does not hold "dog"; "dog." does.
    assert benchmark.candidates("dog", "two dogs") == [(0, 1, "dog")]
    assert benchmark.candidates("dog", "the dog.") == []
    # Case counts, as it does for the token ids.
    assert benchmark.candidates("Dog", "dog") == [(0, 1, "Dog")]


def test_nothing_to_draw_gives_no_constraints():
    rng = random.Random(0)
    for count in (1, 2):
        assert benchmark.draw_constraints("A dog.", "A dog runs.", count, rng) == []
        assert benchmark.draw_constraints("- . !", "", count, rng) == []
        assert benchmark.draw_constraints("", "anything", count, rng) == []


def test_the_same_seed_draws_the_same_constraints():
    def draw(seed):
        rng = random.Random(seed)
        return [
            benchmark.draw_constraints(r, o, 2, rng)
            for r, o in zip(REFERENCES, OUTPUTS, strict=True)
        ]

    assert draw(3) == draw(3)
    assert len({json.dumps(draw(seed)) for seed in range(10)}) > 1
    drawn = benchmark.draw_all(REFERENCES, OUTPUTS, seed=5)
    assert drawn == benchmark.draw_all(REFERENCES, OUTPUTS, seed=5)
    assert [len(row) for row in drawn["1"]] == [1] * 4
    assert [len(row) for row in drawn["2"]] == [2] * 4


# The numbers fixture translates English number words into German ones; each
# reference adds words its output lacks, so that constraints are drawn.
SOURCES = ["three", "twelve", "forty"]
TARGETS = ["drei vier", "zwölf, elf", "vierzig und fünf"]


def test_a_run_on_the_numbers_model_holds_every_feasible_constraint(tmp_path, capsys):
    source, reference = tmp_path / "s.txt", tmp_path / "r.txt"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    reference.write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    out = tmp_path / "out.json"
    model = str(REPO / "tests" / "fixtures" / "v0_3_0" / "translator.keras")
    files = ["--source", str(source), "--reference", str(reference)]
    benchmark.main(["--model", model, *files, "--json", str(out)])

    (run,) = json.loads(out.read_text())
    assert run["task"] == "text" and run["sentences"] == 3
    assert run["search"] == {"beam_size": 4, "length_penalty": 0.6}
    assert run["drawn"]["1"] and run["drawn"]["2"][1] == []  # "zwölf, elf": one
    assert sorted(run["sets"]) == ["1", "2"]
    for count, figures in run["sets"].items():
        asked = [row for row in run["drawn"][count] if row]
        assert figures["sentences"] == len(asked)
        assert figures["constraints"] == sum(map(len, asked)) > 0
        assert figures["feasible"] == figures["constraints"]  # all fit
        assert figures["coverage_feasible"] == figures["coverage"] == 1.0
        assert figures["sentences_all_held"] == figures["sentences"]
        assert not figures["warned"]
        for key in ("bleu_plain", "bleu_constrained", "time_ratio"):
            assert figures[key] >= 0
    assert "2016 test set" in capsys.readouterr().out


def test_backends_run_apart_and_share_the_first_ones_constraints(monkeypatch):
    """Each child is run here, in this process, with a canned measurement
    that draws constraints named after its backend."""
    seen = []

    def measure_text(model, source, reference, drawn, seed, repeats, limit):
        backend = seen[-1]["backend"]
        seen[-1]["drawn"] = drawn
        return {
            "task": "text",
            "backend": backend,
            "sentences": 1,
            "source": source,
            "constraints_origin": "drawn from this backend's output",
            "drawn": drawn or {"1": [[backend]], "2": [[]]},
            "sets": {},
        }

    def run(command, env, capture_output, text, check):
        assert command[:3] == [sys.executable, "-m", "benchmarks.constrained_decoding"]
        seen.append({"backend": env["KERAS_BACKEND"]})
        child = benchmark.main(command[3:])
        return type("Done", (), {"stdout": "noise\n" + json.dumps(child[0])})

    monkeypatch.setattr(benchmark, "measure_text", measure_text)
    monkeypatch.setattr(benchmark.subprocess, "run", run)
    runs = benchmark.main(["--backends", "jax", "torch", "tensorflow", "--limit", "1"])

    assert [r["backend"] for r in runs] == ["jax", "torch", "tensorflow"]
    assert seen[0]["drawn"] is None
    assert seen[1]["drawn"] == seen[2]["drawn"] == {"1": [["jax"]], "2": [[]]}
    assert [r["constraints_origin"] for r in runs] == ["drawn from jax's output"] * 3
