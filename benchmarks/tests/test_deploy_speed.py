"""benchmarks/deploy_speed.py's own arithmetic: the sentences it reads and
how it compares systems (BLEU, outputs equal to the fastest float32 Keras
run's, speed and memory ratios), against values worked out by hand here;
and the command end to end, its children run in this process."""

import contextlib
import gzip
import io
import json
import os
import pathlib
import sys
import types

import keras
import pytest
import sacrebleu

from benchmarks import REPO, deploy_speed

pytestmark = pytest.mark.once


def test_read_lines_reads_gzip_and_text_and_stops_at_the_limit(tmp_path):
    lines = ["ein Hund läuft", "", "zwei Katzen\r"]
    plain, zipped = tmp_path / "a.txt", tmp_path / "a.txt.gz"
    plain.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    with gzip.open(zipped, "wt", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))
    expected = ["ein Hund läuft", "", "zwei Katzen"]
    assert deploy_speed.read_lines(str(plain), 0) == expected
    assert deploy_speed.read_lines(str(zipped), 2) == expected[:2]


def test_compare_scores_against_the_fastest_float32_keras_run(capsys):
    references = ["a brown dog runs in the park", "two small cats sleep on a sofa"]
    results = [
        {
            "system": "keras-jax",
            "search": "beam4",
            "dtype": "float32",
            "seconds": 4.0,
            "peak_memory_bytes": 800,
            "outputs": references,
        },
        {
            "system": "keras-tensorflow",
            "search": "beam4",
            "dtype": "float32",
            "seconds": 2.0,
            "peak_memory_bytes": 1000,
            "outputs": references,
        },
        {
            "system": "keras-tensorflow-policy",
            "search": "beam4",
            "dtype": "bfloat16",
            "seconds": 1.0,
            "peak_memory_bytes": 1000,
            "outputs": ["a brown dog runs in the park", "two cats"],
        },
        {
            "system": "ctranslate2-int8",
            "search": "beam4",
            "dtype": "int8",
            "seconds": 0.5,
            "peak_memory_bytes": 250,
            "outputs": ["a brown dog walks in the park", references[1]],
        },
    ]
    deploy_speed._compare(results, references)
    by_system = {r["system"]: r for r in results}
    # The base is TensorFlow: the fastest float32 Keras run, not bfloat16.
    assert {r["same_as"] for r in results} == {"keras-tensorflow"}
    assert by_system["keras-tensorflow"]["bleu"] == 100.0
    assert by_system["ctranslate2-int8"]["same_fraction"] == 0.5
    assert by_system["ctranslate2-int8"]["speed_up"] == 4.0
    assert by_system["ctranslate2-int8"]["memory_ratio"] == 0.25
    assert by_system["keras-jax"]["speed_up"] == 0.5
    expected = sacrebleu.corpus_bleu(
        ["a brown dog walks in the park", references[1]], [references]
    )
    assert by_system["ctranslate2-int8"]["bleu"] == round(expected.score, 2)
    assert "ctranslate2-int8" in capsys.readouterr().out


# -- the command, end to end ------------------------------------------------------

FIXTURES = pathlib.Path(__file__).parents[2] / "tests" / "fixtures" / "v0_2_0"
KNOWN = json.loads((FIXTURES / "expected.json").read_text())


def _children_in_process(monkeypatch, returncode=0, stderr=""):
    """``subprocess.run`` for the children: each runs here, in turn; their
    command lines and environments are kept."""
    children = []

    def run(command, env, capture_output, text):
        assert capture_output and text
        assert command[:3] == [sys.executable, "-m", "benchmarks.deploy_speed"]
        children.append({"argv": command[3:], "env": env})
        out = io.StringIO()
        if not returncode:
            with contextlib.redirect_stdout(out):
                deploy_speed.main(command[3:])
        return types.SimpleNamespace(
            returncode=returncode, stdout=out.getvalue(), stderr=stderr
        )

    monkeypatch.setattr(deploy_speed.subprocess, "run", run)
    return children


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # keras-hub's vocabulary
def test_a_run_of_a_keras_backend_and_an_export(tmp_path, monkeypatch, capsys):
    """Each system and search in a child (run here), with a clock that gives
    them 2, 0.5, 3 and 1.5 s; the number translator of 0.2.0, whose greedy and
    beam-4 translations are known (tests/fixtures/v0_2_0/expected.json)."""
    backend = keras.backend.backend()
    children = _children_in_process(monkeypatch)
    readings = iter([0.0, 2.0, 10.0, 10.5, 20.0, 23.0, 30.0, 31.5])
    clock = types.SimpleNamespace(perf_counter=lambda: next(readings))
    monkeypatch.setattr(deploy_speed, "time", clock)
    n = 3
    source, reference = tmp_path / "source.txt", tmp_path / "reference.txt.gz"
    source.write_text("".join(f"{s}\n" for s in KNOWN["sentences"]))
    with gzip.open(reference, "wt", encoding="utf-8") as file:
        file.write("".join(f"{s}\n" for s in KNOWN["references"]))
    work, path = tmp_path / "work", tmp_path / "deploy.json"
    systems = [f"keras-{backend}", "ctranslate2-float32"]
    results = deploy_speed.main(
        ["--model", str(FIXTURES / "translator.keras"), "--source", str(source),
         "--reference", str(reference), "--sentences", str(n),
         "--systems", *systems, "--searches", "greedy", "beam4",
         "--work", str(work), "--json", str(path)]
    )  # fmt: skip

    assert os.listdir(work) == ["ctranslate2-float32"]  # the one export asked
    assert [(c["env"]["KERAS_BACKEND"], c["argv"][1:4:2]) for c in children] == [
        (backend, [systems[0], "greedy"]),
        ("numpy", [systems[1], "greedy"]),
        (backend, [systems[0], "beam4"]),
        ("numpy", [systems[1], "beam4"]),
    ]
    for child in children:
        assert child["argv"][child["argv"].index("--sentences") + 1] == str(n)
        assert child["argv"][child["argv"].index("--work") + 1] == str(work)
        assert child["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)

    assert json.loads(path.read_text()) == results
    want = {"greedy": KNOWN["greedy"][:n], "beam4": KNOWN["beam4"][:n]}
    references = KNOWN["references"][:n]
    seconds = [2.0, 0.5, 3.0, 1.5]  # 3 sentences: 1.5, 6, 1 and 2 a second
    base_seconds = {"greedy": 2.0, "beam4": 3.0}
    peaks = {r["search"]: r["peak_memory_bytes"] for r in results[::2]}
    for r, system, search, s in zip(
        results, systems * 2, ["greedy"] * 2 + ["beam4"] * 2, seconds, strict=True
    ):
        assert (r["system"], r["search"], r["dtype"]) == (system, search, "float32")
        assert r["outputs"] == want[search]
        assert r["seconds"] == s and r["sentences_per_second"] == n / s
        assert r["same_as"] == systems[0] and r["same_fraction"] == 1.0
        assert r["speed_up"] == base_seconds[search] / s  # the export: 4, 2
        assert r["memory_ratio"] == round(r["peak_memory_bytes"] / peaks[search], 3)
        bleu = sacrebleu.corpus_bleu(r["outputs"], [references]).score
        assert r["bleu"] == round(bleu, 2)
    out = capsys.readouterr().out
    assert f"{systems[1]:24s} greedy     0.50 s      6.0 sent/s" in out


def test_a_failed_child_names_its_system_and_search(tmp_path, monkeypatch):
    _children_in_process(monkeypatch, returncode=1, stderr="x" * 5000 + "the cause")
    monkeypatch.setattr(deploy_speed, "write_exports", lambda *args: None)
    source = tmp_path / "source.txt"
    source.write_text("one\n")
    argv = ["--model", "m.keras", "--source", str(source), "--work", str(tmp_path)]
    argv += ["--systems", "ctranslate2-int8", "--searches", "greedy"]
    with pytest.raises(RuntimeError) as error:
        deploy_speed.main(argv)
    message = str(error.value)
    assert message.startswith("ctranslate2-int8 greedy failed:\n")
    assert message.endswith("the cause") and len(message) < 3100  # the tail only
