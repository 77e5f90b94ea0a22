"""Gradient accumulation: one update per N batches, with the paper's
schedule counting updates, on every backend.

References: the paper's rate in float64 (as in test_schedules.py), and the
same model trained on the full batch without accumulation.
"""

import json
import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer.cli import train
from keras_transformer.model.schedules import TransformerSchedule, transformer_optimizer
from keras_transformer.trainer import checkpoints
from keras_transformer.trainer.callbacks import Checkpointer
from tests.test_checkpoints import small_model as tiny_model


def paper_rate(step, d_model, warmup_steps):
    """§5.3 in float64; ``step`` counts updates from 1."""
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def test_the_schedule_counts_updates_not_batches():
    schedule = TransformerSchedule(16, warmup_steps=4, accumulate=3)
    batches = np.arange(0, 30)
    rates = ops.convert_to_numpy(schedule(batches)).astype("float64")
    expected = [paper_rate(b // 3 + 1, 16, 4) for b in batches]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert schedule.get_config() == {
        "d_model": 16,
        "warmup_steps": 4,
        "scale": 1.0,
        "accumulate": 3,
    }
    assert TransformerSchedule.from_config(schedule.get_config()).accumulate == 3
    # A schedule saved before the option was added loads as accumulate=1.
    old = TransformerSchedule.from_config(
        {"d_model": 16, "warmup_steps": 4, "scale": 1}
    )
    assert old.accumulate == 1


@pytest.mark.parametrize("bad", [0, -2])
def test_bad_accumulate_is_refused(bad):
    with pytest.raises(ValueError, match=f"accumulate must be an integer >= 1.*{bad}"):
        transformer_optimizer(16, accumulate=bad)
    with pytest.raises(TypeError, match="accumulate must be an integer"):
        TransformerSchedule(16, accumulate=2.0)


def test_the_optimizer_updates_every_n_batches_at_the_rate_of_the_update():
    opt = transformer_optimizer(16, warmup_steps=4, accumulate=2)
    assert opt.gradient_accumulation_steps == 2
    assert transformer_optimizer(16).gradient_accumulation_steps is None
    variable = keras.Variable(np.zeros(3, "float32"))
    g = np.array([0.5, -2.0, 1e-3], "float32")
    grad = ops.convert_to_tensor(g)
    opt.build([variable])
    opt.apply([grad], [variable])
    assert not np.any(ops.convert_to_numpy(variable))  # accumulated, not applied
    for _ in range(3):
        opt.apply([grad], [variable])
    # Two updates of a constant gradient move by lr(update 1) + lr(update 2)
    # (Adam's bias-corrected first steps are lr · sign(g)): the warm-up
    # counts updates, so the second update is step 2, not batch 4.
    moved = paper_rate(1, 16, 4) + paper_rate(2, 16, 4)
    np.testing.assert_allclose(
        ops.convert_to_numpy(variable), -moved * np.sign(g), rtol=1e-5
    )
    assert int(ops.convert_to_numpy(opt.iterations)) == 2
    assert float(ops.convert_to_numpy(opt.learning_rate)) == pytest.approx(
        paper_rate(3, 16, 4), rel=1e-6
    )


def small_model(optimizer):
    # Dropout 0 there: the same forward pass for both runs.
    model = tiny_model(compile=False)
    model.compile(optimizer=optimizer, loss=kt.LabelSmoothedCrossEntropy())
    return model


def batches(count, rows=4, length=6):
    """Full batches without padding: every half holds as many target tokens,
    so the mean of the halves' mean gradients is the full batch's."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        src = rng.integers(4, 20, (rows, length)).astype("int32")
        tgt = rng.integers(4, 20, (rows, length)).astype("int32")
        dec = np.concatenate([np.ones((rows, 1), "int32"), tgt[:, :-1]], axis=1)
        out.append(({"encoder_inputs": src, "decoder_inputs": dec}, tgt))
    return out


def halves(x, y):
    cut = len(y) // 2
    first = ({k: v[:cut] for k, v in x.items()}, y[:cut])
    return [first, ({k: v[cut:] for k, v in x.items()}, y[cut:])]


def moments(optimizer):
    """Adam's first and second moments, by variable (they are linear and
    quadratic in the gradients: they show the gradient that was applied)."""
    return {
        v.path: ops.convert_to_numpy(v)
        for v in optimizer.variables
        if "momentum" in v.path or "velocity" in v.path
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda n: transformer_optimizer(16, warmup_steps=10, accumulate=n),
        lambda n: keras.optimizers.SGD(
            0.5, gradient_accumulation_steps=n if n > 1 else None
        ),
    ],
    ids=["paper_adam", "sgd"],
)
def test_two_half_batches_make_the_update_of_one_full_batch(make_optimizer):
    data = batches(2)
    full = small_model(make_optimizer(1))
    accumulated = small_model(make_optimizer(2))
    initial = [ops.convert_to_numpy(w).copy() for w in full.weights]
    for x, y in data:
        full.train_on_batch(x, y)
        for half_x, half_y in halves(x, y):
            accumulated.train_on_batch(half_x, half_y)
    assert int(ops.convert_to_numpy(accumulated.optimizer.iterations)) == 2
    if isinstance(full.optimizer, keras.optimizers.Adam):
        # Adam's moments are linear and quadratic in the gradients applied:
        # the same moments, the same two updates. (Not the weights: the key
        # biases' gradient is 0 in exact arithmetic, softmax being
        # shift-invariant, and Adam scales its rounding noise, ~1e-9, up to
        # ±lr, differently for any two summation orders.)
        # The tolerance floor is relative to each kind's largest entry: the
        # near-zero entries are float32 summation noise, which no two
        # summation orders (or backends) share.
        ours, theirs = moments(full.optimizer), moments(accumulated.optimizer)
        assert len(ours) == len(theirs) > 0
        scale = {
            kind: max(np.abs(a).max() for n, a in ours.items() if kind in n)
            for kind in ("momentum", "velocity")
        }
        for (name, a), b in zip(ours.items(), theirs.values(), strict=True):
            floor = 1e-5 * scale["momentum" if "momentum" in name else "velocity"]
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=floor, err_msg=name)
        assert max(np.abs(a).max() for a in ours.values()) > 1e-3
        rates = [float(ops.convert_to_numpy(m.optimizer.learning_rate))
                 for m in (full, accumulated)]  # fmt: skip
        assert rates[0] == rates[1]
        return
    for a, b in zip(full.weights, accumulated.weights, strict=True):
        np.testing.assert_allclose(
            ops.convert_to_numpy(b), ops.convert_to_numpy(a), atol=1e-6, err_msg=a.path
        )
    assert any(
        np.abs(ops.convert_to_numpy(a) - w).max() > 1e-3
        for a, w in zip(full.weights, initial, strict=True)
    )  # and they did move


@pytest.mark.slow
@pytest.mark.once
def test_checkpoints_are_taken_after_updates_only(tmp_path, monkeypatch):
    saved = []
    save = checkpoints.save_checkpoint

    def spy(model, directory, state, keep=None):
        saved.append(dict(state))
        return save(model, directory, state, keep=keep)

    monkeypatch.setattr(checkpoints, "save_checkpoint", spy)
    model = small_model(transformer_optimizer(16, warmup_steps=10, accumulate=2))
    [(x, y)] = batches(1, rows=12)
    callback = Checkpointer(tmp_path, epoch_length=6, every_steps=1)
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0,
              callbacks=[callback])  # fmt: skip
    # 6 batches, 3 updates: saved after batches 2, 4 and 6 (then at the epoch
    # end, the same step again, as the next epoch's start).
    assert [(s["iterations"], s["epoch"], s["batch"]) for s in saved] == [
        (1, 0, 2), (2, 0, 4), (3, 1, 0), (3, 1, 0)
    ]  # fmt: skip
    names = [p.rsplit("-", 1)[-1] for p in checkpoints.list_checkpoints(tmp_path)]
    assert names == ["000000001", "000000002", "000000003"]


@pytest.mark.slow
@pytest.mark.once
def test_kt_train_accumulate(tmp_path, capsys):
    argv = ["--task", "numbers", "--train-size", "300", "--val-size", "16",
            "--test-size", "16", "--uniform-size", "12", "--num-layers", "1",
            "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
            "--max-length", "64", "--vocab-size", "60", "--batch-tokens", "256",
            "--bucket-lengths", "16,64", "--beam-size", "1", "--epochs", "1",
            "--out", str(tmp_path / "run")]  # fmt: skip
    train.main([*argv, "--accumulate", "2"])
    out = capsys.readouterr().out
    assert ", one update per 2," in out
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["settings"]["accumulate"] == 2
    last = checkpoints.list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    state = checkpoints.read_state(last)
    per_epoch = int(re.search(r"(\d+) batches of <=", out).group(1))
    assert per_epoch >= 4 and state["iterations"] == per_epoch // 2
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit) as raised:
            train.main([*argv, "--accumulate", bad, "--overwrite"])
        assert raised.value.code == 2
        assert "--accumulate must be >= 1" in capsys.readouterr().err
    # 1 is recorded as no accumulation, as by runs from before the option.
    assert train.parse_config([*argv, "--accumulate", "1"])[0].accumulate is None
