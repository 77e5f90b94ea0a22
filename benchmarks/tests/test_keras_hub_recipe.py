"""benchmarks.keras_hub_recipe: the comparison's greedy decoding, and a short run
whose curve benchmarks.bleu_curve can draw."""

import dataclasses
import json

import keras
import numpy as np
import pytest

from benchmarks import bleu_curve as curve
from benchmarks import keras_hub_recipe
from benchmarks import training_speed as benchmark
from keras_transformer import data as ktd
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID

# The recipe's short run costs about the same on any backend: JAX's run takes
# it, so that the three runs end together.
pytestmark = pytest.mark.once("jax")


class Scripted:
    """A stand-in for ``argmax_model``: at position t it predicts
    ``plan[row][t]``, and it records the decoder inputs it was given."""

    def __init__(self, plan):
        self.plan, self.seen = plan, []

    def predict_on_batch(self, inputs):
        target = inputs["decoder_inputs"]
        self.seen.append(target.copy())
        ids = np.zeros(target.shape, "int64")
        for row, planned in enumerate(self.plan):
            ids[row, : len(planned)] = planned[: target.shape[1]]
        return ids


def test_greedy_feeds_back_its_tokens_and_stops_at_the_end_token():
    plan = [[5, 6, END_ID, 9, 9], [7, END_ID, 9, 9, 9]]
    model = Scripted(plan)
    sources = np.ones((2, 3), "int32")
    out = keras_hub_recipe.greedy(model, sources, length=6)
    # Up to and with END, then padding (rows that ended are not extended).
    assert out == [[5, 6, END_ID, PAD_ID, PAD_ID], [7, END_ID, PAD_ID, PAD_ID, PAD_ID]]
    # Whole prefixes are rerun: the third call saw START and both tokens so far.
    assert model.seen[2][0].tolist() == [START_ID, 5, 6, 0, 0, 0]
    assert len(model.seen) == 3  # stopped once every row had ended


def test_argmax_model_returns_the_ids_of_the_largest_logits():
    inputs = keras.Input((None,), dtype="int32", name="decoder_inputs")
    logits = keras.layers.Embedding(10, 7)(inputs)
    model = keras.Model({"decoder_inputs": inputs}, logits)
    batch = {"decoder_inputs": np.array([[1, 2, 3], [4, 5, 0]], "int32")}
    expected = np.argmax(model.predict_on_batch(batch), axis=-1)
    got = keras_hub_recipe.argmax_model(model).predict_on_batch(batch)
    assert got.shape == (2, 3) and np.array_equal(got, expected)


def test_padded_cuts_and_pads_to_one_length():
    got = keras_hub_recipe.padded([[4, 5], [4, 5, 6, 7, 8]], 4)
    assert got.tolist() == [[4, 5, 0, 0], [4, 5, 6, 7]] and got.dtype == "int32"


# keras-hub's own sub-layers warn about the mask keras-hub attaches (as in
# test_training_speed.py).
@pytest.mark.filterwarnings(
    r"ignore:Layer '\w+' \(of type \w+\) was passed an input with a mask"
    ":UserWarning"
)
@pytest.mark.slow
def test_a_short_run_writes_a_curve_kt_curve_draws(tmp_path, monkeypatch, capsys):
    numbers = list(range(1, 200, 3))
    for split, chosen in (("train", numbers), ("val", numbers[:12])):
        (tmp_path / f"{split}.en").write_text(
            "".join(ktd.english(n) + "\n" for n in chosen)
        )
        (tmp_path / f"{split}.de").write_text(
            "".join(ktd.german(n) + "\n" for n in chosen)
        )
    small = dataclasses.replace(
        benchmark.CPU_SETTING, num_layers=1, d_model=32, num_heads=2, d_ff=64
    )
    monkeypatch.setattr(benchmark, "CPU_SETTING", small)
    out = tmp_path / "run"
    result = keras_hub_recipe.main(
        ["--data", str(tmp_path), "--source", "en", "--target", "de",
         "--out", str(out), "--max-minutes", "0.15", "--every-minutes", "0.05",
         "--sequence-length", "24", "--vocab-size", "80", "--batch-size", "16"]
    )  # fmt: skip
    saved = json.loads((out / "curve.json").read_text())
    assert saved["points"] == result["points"] and saved["label"] == "keras-hub recipe"
    points = saved["points"]
    assert len(points) >= 2  # snapshots on the way, and the end of training
    steps = [p["step"] for p in points]
    assert steps == sorted(set(steps)) and steps[0] >= 1
    assert all(0.0 <= p["bleu"] <= 100.0 for p in points)
    minutes = [p["minutes"] for p in points]
    assert minutes == sorted(minutes) and minutes[-1] >= 0.15 - 1e-9
    label, drawn_minutes, bleu = curve.read_curve(out / "curve.json")
    assert drawn_minutes == minutes and bleu == [p["bleu"] for p in points]
    assert "BLEU" in capsys.readouterr().out
    # The index lists every snapshot with its training time; --score-only
    # scores them again from the saved files and tokenizer alone.
    index = json.loads((out / "snapshots" / "index.json").read_text())
    assert [e["step"] for e in index["snapshots"]] == steps
    # (Both rounded: the index to 0.01 s, the curve to 0.001 minute.)
    listed = [e["seconds"] / 60 for e in index["snapshots"]]
    assert listed == pytest.approx(minutes, abs=1e-3)
    (tmp_path / "train.en").unlink()  # not needed to score
    again = keras_hub_recipe.main(
        ["--data", str(tmp_path), "--source", "en", "--target", "de",
         "--out", str(out), "--score-only", "--sequence-length", "24"]
    )  # fmt: skip
    assert [(p["step"], p["bleu"]) for p in again["points"]] == [
        (p["step"], p["bleu"]) for p in points
    ]
    # Minutes again from the index's seconds (0.01 s), rounded to 0.001: a
    # time on a rounding boundary may come out 0.001 apart (0.1 vs 0.101),
    # which in floating point is a hair over 1e-3.
    assert [p["minutes"] for p in again["points"]] == pytest.approx(minutes, abs=1.5e-3)


def test_bad_corpus_or_nothing_to_score_exits_2_naming_the_file(tmp_path, capsys):
    (tmp_path / "val.en").write_text("one\ntwo\n")
    (tmp_path / "val.de").write_text("eins\n")
    common = ["--data", str(tmp_path), "--source", "en", "--target", "de"]
    with pytest.raises(SystemExit) as exit_:
        keras_hub_recipe.main(
            [*common, "--out", str(tmp_path / "r"), "--max-minutes", "1"]
        )
    assert exit_.value.code == 2
    assert "train.en" in capsys.readouterr().err  # no train split
    (tmp_path / "val.de").write_text("eins\nzwei\n")
    with pytest.raises(SystemExit) as exit_:
        keras_hub_recipe.main([*common, "--out", str(tmp_path / "r"), "--score-only"])
    assert exit_.value.code == 2
    assert "tokenizer.model" in capsys.readouterr().err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "tokenizer.model").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        keras_hub_recipe.main([*common, "--out", str(tmp_path / "r"), "--score-only"])
    assert "index.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        keras_hub_recipe.main([*common, "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2  # training needs --max-minutes
    assert "--max-minutes" in capsys.readouterr().err
