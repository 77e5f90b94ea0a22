"""Atomic checkpoints, resume state, checkpoint averaging and the time budget.

Per backend: weights written, read back and averaged. Marked `once`: the
callbacks' bookkeeping and the file handling, which no backend touches.
"""

import os

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.trainer import checkpoints
from keras_transformer.trainer.callbacks import Checkpointer, TimeBudget


def small_model(seed=0, compile=True):
    keras.utils.set_random_seed(seed)
    model = kt.build_model(
        "tiny",
        src_vocab_size=20,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        max_length=16,
        dropout=0.0,
    )
    if not compile:
        return model
    model.compile(
        optimizer=kt.transformer_optimizer(16, 10),
        loss=kt.LabelSmoothedCrossEntropy(),
    )
    return model


def batch(rows=4, length=6, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 20, (rows, length)).astype("int32")
    tgt = rng.integers(4, 20, (rows, length)).astype("int32")
    src[0, -2:] = 0
    tgt[1, -3:] = 0
    dec = np.concatenate([np.ones((rows, 1), "int32"), tgt[:, :-1]], axis=1)
    dec[1, -2:] = 0
    return {"encoder_inputs": src, "decoder_inputs": dec}, tgt


def values(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


@pytest.mark.slow
def test_save_list_load_round_trip(tmp_path):
    model = small_model()
    x, y = batch()
    model.train_on_batch(x, y)
    path = checkpoints.save_checkpoint(
        model, tmp_path, {"iterations": 1, "epoch": 0, "batch": 1}
    )
    assert os.path.basename(path) == "step-000000001"
    saved = values(model)
    opt_saved = [
        keras.ops.convert_to_numpy(v).copy() for v in model.optimizer.variables
    ]
    model.train_on_batch(x, y)
    changed = values(model)
    assert not all(np.array_equal(a, b) for a, b in zip(saved, changed, strict=True))

    fresh = small_model(seed=5)
    fresh(x)
    state = checkpoints.load_checkpoint(fresh, path)
    assert state == {"iterations": 1, "epoch": 0, "batch": 1}
    for a, b in zip(saved, values(fresh), strict=True):
        np.testing.assert_array_equal(a, b)
    # The optimizer's state (moments, iteration count) comes back too.
    restored = [keras.ops.convert_to_numpy(v) for v in fresh.optimizer.variables]
    for a, b in zip(opt_saved, restored, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(keras.ops.convert_to_numpy(fresh.optimizer.iterations)) == 1


@pytest.mark.once
def test_interrupted_writes_are_ignored_and_cleaned(tmp_path):
    model = small_model()
    model(batch()[0])
    checkpoints.save_checkpoint(model, tmp_path, {"iterations": 3})
    # What a kill -9 during a save leaves: a temporary folder, and a folder
    # whose state file never got written.
    (tmp_path / ".tmp-step-000000004").mkdir()
    (tmp_path / ".tmp-step-000000004" / "model.weights.h5").write_bytes(b"partial")
    (tmp_path / "step-000000009").mkdir()
    found = checkpoints.list_checkpoints(tmp_path)
    assert [os.path.basename(p) for p in found] == ["step-000000003"]
    checkpoints.save_checkpoint(model, tmp_path, {"iterations": 5})
    # Another writer's temporary is not a save's to remove (it may be
    # writing); the folder's only writer (kt-train, holding the folder's
    # lock) knows every one is stale and removes them.
    assert (tmp_path / ".tmp-step-000000004").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-") and "5" in n]
    checkpoints.remove_temporaries(tmp_path)
    assert not (tmp_path / ".tmp-step-000000004").exists()
    assert len(checkpoints.list_checkpoints(tmp_path)) == 2


@pytest.mark.once
def test_keep_deletes_oldest_and_same_step_replaces(tmp_path):
    model = small_model()
    model(batch()[0])
    for step in (1, 2, 3, 4):
        checkpoints.save_checkpoint(model, tmp_path, {"iterations": step}, keep=2)
    names = [os.path.basename(p) for p in checkpoints.list_checkpoints(tmp_path)]
    assert names == ["step-000000003", "step-000000004"]
    checkpoints.save_checkpoint(model, tmp_path, {"iterations": 4, "epoch": 7})
    assert checkpoints.read_state(tmp_path / "step-000000004")["epoch"] == 7
    assert sorted(os.listdir(tmp_path)) == ["step-000000003", "step-000000004"]


@pytest.mark.slow
def test_average_checkpoints_is_the_mean(tmp_path):
    model = small_model()
    x, y = batch()
    snapshots = []
    for step in range(1, 4):
        model.train_on_batch(x, y)
        checkpoints.save_checkpoint(model, tmp_path, {"iterations": step})
        snapshots.append(values(model))
    paths = checkpoints.list_checkpoints(tmp_path)
    averaged = checkpoints.average_checkpoints(small_model(seed=3), paths[-2:])
    for i, weight in enumerate(averaged.weights):
        expected = (
            snapshots[1][i].astype("float64") + snapshots[2][i].astype("float64")
        ) / 2
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(weight), expected, rtol=1e-6, atol=1e-7
        )
    with pytest.raises(ValueError, match="at least one checkpoint"):
        checkpoints.average_checkpoints(model, [])


@pytest.mark.once
def test_save_model_atomic(tmp_path):
    model = small_model(compile=False)
    model(batch()[0])
    path = tmp_path / "m.keras"
    path.write_bytes(b"old")
    checkpoints.save_model_atomic(model, str(path))
    assert sorted(os.listdir(tmp_path)) == ["m.keras"]
    loaded = keras.saving.load_model(path)
    for a, b in zip(values(model), values(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=".keras"):
        checkpoints.save_model_atomic(model, str(tmp_path / "m.h5"))


@pytest.mark.slow
@pytest.mark.once
def test_time_budget_stops_fit_and_accumulates():
    model = small_model()
    x, y = batch(rows=8)
    budget = TimeBudget(max_seconds=1e-6, elapsed=5.0)
    history = model.fit(x, y, batch_size=2, epochs=3, callbacks=[budget], verbose=0)
    # Stopped after the first batch of the first epoch.
    assert len(history.history["loss"]) == 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1
    assert budget.exhausted and budget.elapsed > 5.0
    assert not TimeBudget(None).exhausted
    with pytest.raises(ValueError, match="max_seconds"):
        TimeBudget(0)


@pytest.mark.slow
@pytest.mark.once
def test_checkpointer_records_position(tmp_path):
    model = small_model()
    x, y = batch(rows=8)
    checkpointer = Checkpointer(tmp_path, epoch_length=4, every_steps=3, keep=None)
    model.fit(x, y, batch_size=2, epochs=2, callbacks=[checkpointer], verbose=0)
    states = {
        checkpoints.read_state(p)["iterations"]: checkpoints.read_state(p)
        for p in checkpoints.list_checkpoints(tmp_path)
    }
    assert sorted(states) == [3, 4, 6, 8]
    assert (states[3]["epoch"], states[3]["batch"]) == (0, 3)
    assert (states[4]["epoch"], states[4]["batch"]) == (1, 0)  # epoch end
    assert (states[6]["epoch"], states[6]["batch"]) == (1, 2)
    assert (states[8]["epoch"], states[8]["batch"]) == (2, 0)
    assert "loss" in states[8]["logs"]

    # A stopped epoch records how far it got, counting batches trained
    # before this fit (first_batch). (The same model: its weights do not
    # matter here, and a new one would compile its steps again.)
    for length, expected in ((12, (0, 10)), (10, (1, 0))):
        checkpointer = Checkpointer(tmp_path / str(length), epoch_length=length)
        checkpointer.first_batch = 6
        model.fit(x, y, batch_size=2, epochs=1, callbacks=[checkpointer], verbose=0)
        state = checkpoints.read_state(checkpointer.last_path)
        assert (state["epoch"], state["batch"]) == expected
        assert checkpointer.last_state == state

    # write=False (the processes other than 0 of a multi-process run): the
    # same states, kept in memory, and nothing on disk.
    quiet = Checkpointer(tmp_path / "none", epoch_length=4, every_steps=1, write=False)
    model.fit(x, y, batch_size=2, epochs=1, callbacks=[quiet], verbose=0)
    assert not (tmp_path / "none").exists() and quiet.last_path is None
    assert (quiet.last_state["epoch"], quiet.last_state["batch"]) == (1, 0)


@pytest.mark.slow
@pytest.mark.once
def test_time_budget_acts_on_the_agreed_verdict():
    """With ``agree``, every process stops when process 0's clock says so,
    whatever its own says."""
    model = small_model()
    x, y = batch(rows=8)
    asked = []

    def process_0_says(spent, verdict):
        asked.append(spent)
        return verdict

    for own, verdict, batches in ((1e-6, False, 4), (1e6, True, 1)):
        budget = TimeBudget(own, agree=lambda s, v=verdict: process_0_says(s, v))
        model.fit(x, y, batch_size=2, epochs=1, callbacks=[budget], verbose=0)
        assert len(asked) == batches and asked[0] == (own < 1)
        assert budget.exhausted is verdict
        asked.clear()
