"""kt-train under faults: nothing of the user's is deleted,
nothing of a run is lost, nothing written before the settings are checked.

- ``--overwrite`` clears only what a run of the script wrote;
- a kill during the final report: the rerun writes the report, no training;
- corrupt checkpoints are skipped (named in the log) when resuming and when
  averaging;
- bad ``--batch-tokens`` and ``--vocab-size``: exit 2 before anything is
  written, so the corrected command just runs.
"""

import json
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.cli import train
from keras_transformer.trainer import checkpoints, report
from keras_transformer.translate.evaluation import load_translator

# What the script does with files and settings does not depend on the backend;
# test_train.py trains end to end on every backend.
pytestmark = pytest.mark.once

# As in test_train.py, smaller still: 100 pairs, one bucket (one shape to
# compile), 7 batches an epoch; as many test sentences as examples printed.
SMALL = [
    "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
    "--max-length", "32", "--vocab-size", "120", "--batch-tokens", "512",
    "--beam-size", "1", "--verbose", "0",
]  # fmt: skip
NUMBERS = ["--task", "numbers", "--train-size", "100", "--val-size", "4",
           "--test-size", "4", "--uniform-size", "4"]  # fmt: skip
# Three checkpoints kept (steps 9, 12 and 14), all averaged.
RUN = ["--bucket-lengths", "32", "--epochs", "2", "--average-last", "3",
       "--checkpoint-steps", "3"]  # fmt: skip


def argv(out, *extra):
    return [*NUMBERS, *SMALL, *RUN, "--out", str(out), *extra]


def run(out, *extra):
    return train.main(argv(out, *extra))


def usage_error(capsys, args):
    """The one error line of a run that must stop with exit status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        train.main(args)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def files(folder):
    """{relative path: bytes} of every file under ``folder``."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def without(snapshot, *names):
    return {k: v for k, v in snapshot.items() if k not in names}


def weights(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The folder of a finished run with three checkpoints, shared read-only."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run(out)
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()
    return out


@pytest.fixture
def copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def unfinish(out):
    """What a kill after the last checkpoint leaves: no model, no report."""
    info = json.loads((out / "run.json").read_text())
    info["status"] = "running"
    info.pop("trained_seconds", None)
    (out / "run.json").write_text(json.dumps(info))
    (out / "translator.keras").unlink()
    (out / "results.json").unlink()


# -- --overwrite deletes only what the script wrote -----------------------------


def test_overwrite_refuses_a_folder_of_user_files_named_like_ours(tmp_path, capsys):
    out = tmp_path / "run"
    mine = {
        "logs/mine.txt": b"my notes\n",
        "checkpoints/notes.txt": b"keep me\n",
        "results.json": b'{"mine": true}\n',
    }
    for name, data in mine.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    line = usage_error(capsys, argv(out, "--overwrite"))
    assert str(out) in line
    assert all(name in line for name in ("logs", "checkpoints", "results.json"))
    assert files(out) == mine


@pytest.mark.slow
def test_overwrite_refuses_user_files_inside_a_run(copy, capsys):
    (copy / "logs" / "mine.txt").write_bytes(b"my notes\n")
    (copy / "checkpoints" / "notes.txt").write_bytes(b"keep me\n")
    before = files(copy)
    line = usage_error(capsys, argv(copy, "--overwrite"))
    assert "logs/mine.txt" in line and "checkpoints/notes.txt" in line
    assert files(copy) == before


@pytest.mark.slow
def test_overwrite_clears_a_run_and_trains_again(copy):
    old = set(files(copy))
    before = (copy / "translator.keras").read_bytes()
    run(copy, "--overwrite", "--epochs", "1", "--seed", "1")
    assert sorted(os.listdir(copy)) == [
        "checkpoints", "logs", "results.json", "run.json", "tokenizer.model",
        "translator.keras",
    ]  # fmt: skip
    assert (copy / "translator.keras").read_bytes() != before
    # Nothing of the first run is left: its checkpoints and event files are
    # gone, the new ones are of a one-epoch run.
    assert not {p for p in old if p.startswith(("checkpoints/", "logs/"))} & set(
        files(copy)
    )
    last = checkpoints.list_checkpoints(copy / "checkpoints")[-1]
    assert checkpoints.read_state(last)["epoch"] == 1
    assert json.loads((copy / "run.json").read_text())["status"] == "finished"


# -- a kill during the report ---------------------------------------------------


@pytest.mark.slow
def test_rerun_writes_a_missing_report_without_training(copy, capsys):
    (copy / "results.json").unlink()  # as older versions left a kill in the report
    before = without(files(copy), "run.json")
    capsys.readouterr()
    results = run(copy)
    output = capsys.readouterr().out
    assert "resuming" not in output and "averaged" not in output
    # No training: no checkpoint, TensorBoard event or model file changed.
    assert without(files(copy), "run.json", "results.json") == before
    assert json.loads((copy / "results.json").read_text()) == pytest.approx(results)
    assert results["split"] == "test" and 0.0 <= results["exact_match"] <= 1.0
    assert json.loads((copy / "run.json").read_text())["status"] == "finished"
    # Now the run is finished for good.
    assert "finished run" in usage_error(capsys, argv(copy))


class Killed(Exception):
    """Stands for a kill -9 in the middle of the report."""


@pytest.mark.slow
def test_report_killed_then_rerun(copy, capsys, monkeypatch):
    unfinish(copy)

    def killed(path):
        raise Killed(path)

    monkeypatch.setattr(report, "load_translator", killed)
    with pytest.raises(Killed):
        run(copy)
    assert (copy / "translator.keras").exists()
    assert not (copy / "results.json").exists()
    monkeypatch.undo()

    before = without(files(copy), "run.json")
    results = run(copy)
    assert without(files(copy), "run.json", "results.json") == before
    assert json.loads((copy / "results.json").read_text()) == pytest.approx(results)
    assert json.loads((copy / "run.json").read_text())["status"] == "finished"


# -- corrupt checkpoints --------------------------------------------------------


@pytest.mark.slow
def test_resume_skips_corrupt_checkpoints(copy, capsys):
    unfinish(copy)
    first, middle, newest = checkpoints.list_checkpoints(copy / "checkpoints")
    weights_file = Path(newest) / checkpoints.WEIGHTS_FILE
    weights_file.write_bytes(weights_file.read_bytes()[:1000])  # truncated
    (Path(middle) / checkpoints.STATE_FILE).write_bytes(b"")
    capsys.readouterr()
    results = run(copy)
    output = capsys.readouterr().out
    skipped = [line for line in output.splitlines() if "skipping" in line]
    assert len(skipped) == 2
    assert newest in skipped[0] and checkpoints.WEIGHTS_FILE in skipped[0]
    assert middle in skipped[1] and checkpoints.STATE_FILE in skipped[1]
    assert f"resuming from {first}" in output
    assert "averaged the last 3 checkpoints" in output
    # Trained on from the first, writing good checkpoints over the bad.
    paths = checkpoints.list_checkpoints(copy / "checkpoints")
    assert paths == [first, middle, newest]
    model = load_translator(copy / "translator.keras").transformer
    states = [checkpoints.load_checkpoint(model, path) for path in paths]
    assert [s["iterations"] for s in states] == [9, 12, 14]
    assert (states[-1]["epoch"], states[-1]["batch"]) == (2, 0)
    assert json.loads((copy / "results.json").read_text()) == pytest.approx(results)


@pytest.mark.slow
def test_averaging_leaves_out_a_corrupt_checkpoint(copy, capsys):
    model = load_translator(copy / "translator.keras").transformer
    unfinish(copy)
    first, middle, newest = checkpoints.list_checkpoints(copy / "checkpoints")
    good = []
    for path in (first, newest):
        checkpoints.load_checkpoint(model, path)
        good.append(weights(model))
    garbage = bytes(range(256)) * 64
    (Path(middle) / checkpoints.WEIGHTS_FILE).write_bytes(garbage)
    capsys.readouterr()
    run(copy)
    output = capsys.readouterr().out
    assert f"resuming from {newest}" in output  # the end: nothing to train
    skipped = [line for line in output.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and middle in skipped[0]
    assert "averaged 2 of the last 3 checkpoints" in output
    final = load_translator(copy / "translator.keras").transformer
    for a, b, mean in zip(*good, weights(final), strict=True):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6)
    # The bad checkpoint is left as it was, for whoever wants to look at it.
    assert (Path(middle) / checkpoints.WEIGHTS_FILE).read_bytes() == garbage


def test_no_checkpoint_loads(copy, capsys):
    unfinish(copy)
    for path in checkpoints.list_checkpoints(copy / "checkpoints"):
        (Path(path) / checkpoints.STATE_FILE).write_text('{"epoch": 2, "batch"')
    before = without(files(copy), "run.json")
    line = usage_error(capsys, argv(copy))
    assert str(copy / "checkpoints") in line and "--overwrite" in line
    assert without(files(copy), "run.json") == before


def tiny_model():
    model = kt.build_model(
        "tiny", src_vocab_size=20, d_model=16, num_heads=2, d_ff=32,
        num_layers=1, max_length=16, dropout=0.0,
    )  # fmt: skip
    model.compile(
        optimizer=kt.transformer_optimizer(16, 10),
        loss=kt.LabelSmoothedCrossEntropy(),
    )
    model.optimizer.build(model.trainable_variables)
    return model


def train_step(model, step):
    """New weights and step count, as after a training step (none compiled)."""
    rng = np.random.default_rng(step)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    model.optimizer.iterations.assign(step)


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: bytes(reversed(data)),
}


def test_corrupt_checkpoint_files_are_named_and_skipped(tmp_path):
    model = tiny_model()
    good = tmp_path / "good"
    for step in (1, 2):
        train_step(model, step)
        checkpoints.save_checkpoint(model, good, {"iterations": step})
    for file in (checkpoints.WEIGHTS_FILE, checkpoints.STATE_FILE):
        for damage, change in DAMAGE.items():
            folder = tmp_path / f"{damage}-{file}"
            shutil.copytree(good, folder)
            older, newest = checkpoints.list_checkpoints(folder)
            path = Path(newest) / file
            path.write_bytes(change(path.read_bytes()))
            with pytest.raises(checkpoints.CheckpointError) as raised:
                checkpoints.load_checkpoint(model, newest)
            message = str(raised.value)
            assert newest in message and file in message, message
            assert "\n" not in message
            skipped = []
            path, state = checkpoints.load_latest(model, folder, skipped.append)
            assert (path, state) == (older, {"iterations": 1})
            assert [error.path for error in skipped] == [newest]


def test_average_checkpoints_leaves_out_those_that_do_not_load(tmp_path):
    model = tiny_model()
    snapshots = []
    for step in (1, 2, 3):
        train_step(model, step)
        checkpoints.save_checkpoint(model, tmp_path, {"iterations": step})
        snapshots.append(weights(model))
    paths = checkpoints.list_checkpoints(tmp_path)
    # The last one bad: the model then holds the mean of the first two, and
    # the optimizer's state of the second.
    (Path(paths[2]) / checkpoints.WEIGHTS_FILE).write_bytes(b"\x89HDF\r\n")
    with pytest.raises(checkpoints.CheckpointError, match="step-000000003"):
        checkpoints.average_checkpoints(model, paths)
    skipped = []
    checkpoints.average_checkpoints(model, paths, on_skip=skipped.append)
    assert [error.path for error in skipped] == [paths[2]]
    for a, b, mean in zip(*snapshots[:2], weights(model), strict=True):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
    for path in paths[:2]:
        (Path(path) / checkpoints.STATE_FILE).write_bytes(b"")
    with pytest.raises(checkpoints.CheckpointError, match="no checkpoint"):
        checkpoints.average_checkpoints(model, paths, on_skip=skipped.append)


def test_keep_never_deletes_for_a_later_checkpoint(tmp_path):
    """After resuming from an older checkpoint, a later bad one is no reason
    to delete the good ones being written."""
    model = tiny_model()
    train_step(model, 0)
    for step in (1, 2, 9):
        checkpoints.save_checkpoint(model, tmp_path, {"iterations": step})
    checkpoints.save_checkpoint(model, tmp_path, {"iterations": 3}, keep=2)
    names = [os.path.basename(p) for p in checkpoints.list_checkpoints(tmp_path)]
    assert names == ["step-000000002", "step-000000003", "step-000000009"]


# -- settings checked before anything is written --------------------------------


@pytest.mark.slow
def test_bad_settings_fail_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    command = [*NUMBERS, *SMALL, "--epochs", "1", "--out", str(out)]
    for bad, option in [
        (["--bucket-lengths", "16,32", "--batch-tokens", "24"], "--batch-tokens"),
        # Buckets from the lengths of the tokenized data: known only once the
        # tokenizer is trained.
        (["--batch-tokens", "8"], "--batch-tokens"),
        # Fewer pieces than the text has characters (SentencePiece refuses).
        (["--vocab-size", "10"], "--vocab-size"),
        (["--vocab-size", "4"], "--vocab-size"),
    ]:
        line = usage_error(capsys, [*command, *bad])
        assert option in line, (bad, line)
        assert not out.exists() or not os.listdir(out), (bad, os.listdir(out))
    # (With buckets from these 100 training pairs, every validation pair
    # would be too long; hence --bucket-lengths.)
    results = train.main([*command, "--bucket-lengths", "32"])
    assert results["sentences"] == 4
    assert (out / "translator.keras").exists()
