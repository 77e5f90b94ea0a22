"""benchmarks.data_speed: the made-up corpus, and a short measurement run."""

import json

import numpy as np
import pytest

from benchmarks import data_speed as benchmark_data
from keras_transformer import data as ktd

# A whole measurement run that costs about the same on any backend: JAX's run
# takes it, so that the three runs end together (the suite ends with the last).
pytestmark = [pytest.mark.once("jax"), pytest.mark.slow]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    like = root / "like"
    like.mkdir()
    (like / "train.de").write_text("ein Hund\nzwei Katzen laufen schnell\ndrei\n")
    (like / "train.en").write_text("a dog\ntwo cats run fast\nthree\n")
    out = root / "made"
    benchmark_data.main(["make", "--pairs", "500", "--like", str(like), "--out",
                         str(out), "--length-scale", "2"])  # fmt: skip
    return like, out


def test_make_draws_lengths_and_words_from_the_model_corpus(made):
    like, out = made
    sources, targets = ktd.read_split(out, "train", "de", "en")
    assert len(sources) == len(targets) == 500
    assert len(ktd.read_split(out, "val", "de", "en")[0]) == 1000
    # Lengths of the model's pairs (2, 4, 1 source words with 2, 4, 1
    # target words), doubled; words from its own side only.
    pairs = {
        (len(s.split()), len(t.split())) for s, t in zip(sources, targets, strict=True)
    }
    assert pairs == {(4, 4), (8, 8), (2, 2)}
    words = {w for s in sources for w in s.split()}
    assert words <= {"ein", "Hund", "zwei", "Katzen", "laufen", "schnell", "drei"}
    assert {w for t in targets for w in t.split()}.isdisjoint(words)


def test_measure_trains_on_the_id_store_and_times_batches(made, tmp_path, capsys):
    _, out = made
    benchmark_data.main([
        "measure", "--data", str(out), "--out", str(tmp_path / "run"),
        "--minutes", "0.05", "--tokenizer-sample", "200", "--batch-tokens", "512",
        "--batches", "5", "--train-args",
        "--config tiny --num-layers 1 --d-model 16 --num-heads 2 --d-ff 32 "
        "--vocab-size 40 --beam-size 1 --average-last 1 --max-length 32",
    ])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 500 and report["batches_timed"] == 5
    assert report["batches_per_second"] > 0 and 0 < report["kt_train_peak_rss_gib"] < 8
    assert any(
        line.startswith("id store: 500 pairs") for line in report["kt_train_log"]
    )
    assert np.isfinite(report["padded_tokens_per_batch"])
