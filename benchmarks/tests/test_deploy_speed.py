"""benchmarks/deploy_speed.py's own arithmetic, without translating: the
sentences it reads and how it compares systems (BLEU, outputs equal to the
fastest float32 Keras run's, speed and memory ratios), against values
worked out by hand here."""

import gzip

import pytest
import sacrebleu

from benchmarks import deploy_speed

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
