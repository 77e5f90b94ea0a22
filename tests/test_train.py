"""kt-train end to end: outputs, resume after kill -9, bad input, --out."""

import contextlib
import errno
import gzip
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import backend
from keras_transformer.cli import train
from keras_transformer.trainer import checkpoints, tasks
from keras_transformer.translate.evaluation import load_translator

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"

# A model small enough that a run takes seconds.
SMALL = [
    "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
    "--max-length", "64", "--vocab-size", "60", "--batch-tokens", "256",
    "--bucket-lengths", "16,64", "--beam-size", "1",
]  # fmt: skip
NUMBERS = ["--task", "numbers", "--train-size", "300", "--val-size", "16",
           "--test-size", "16", "--uniform-size", "12"]  # fmt: skip


def run(out, *extra):
    return train.main([*NUMBERS, *SMALL, "--out", str(out), *extra])


def config_of(argv):
    """The checked ``TrainConfig`` that kt-train makes of ``argv``."""
    return train.parse_config(argv)[0]


def usage_error(capsys, argv):
    with pytest.raises(SystemExit) as raised:
        train.main(argv)
    assert raised.value.code == 2
    return capsys.readouterr().err


def weights(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def stored_arrays(path):
    """The names of the arrays in a ``.keras`` file or a checkpoint's weights."""
    names = []

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            names.append(name)

    if str(path).endswith(".keras"):
        with zipfile.ZipFile(path) as archive:
            raw = io.BytesIO(archive.read("model.weights.h5"))
    else:
        raw = path
    with h5py.File(raw, "r") as h5:
        h5.visititems(visit)
    return names


def _shared_run_data_parallel():
    """TensorFlow's and JAX's one end-to-end run each trains with
    --data-parallel (JAX: when it has several devices, as tests/run_all.sh
    gives it), so that the same run checks that a data-parallel run writes
    everything a plain one does, and test_data_parallel needs no run of its
    own. The plain path is PyTorch's shared run and the resume test's, and on
    JAX the README's main command itself, which test_install.py runs as
    ``kt-train``. PyTorch has no data parallel."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.device_count() > 1
    return keras.backend.backend() == "tensorflow"


SHARED_RUN_DATA_PARALLEL = _shared_run_data_parallel()


@pytest.fixture(scope="module")
def history():
    """What Keras' ``History`` kept of each epoch of the ``finished`` run
    (which fills it): ``{name: [(epoch, value), ...]}``."""
    return {}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, history):
    """A finished two-epoch run on the number task: (out folder, results,
    what it printed).

    The end-to-end run of each backend's test run, shared by the tests that
    need a trained run (``SHARED_RUN_DATA_PARALLEL``: with
    ``--data-parallel`` on TensorFlow)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    extra = ["--data-parallel"] if SHARED_RUN_DATA_PARALLEL else []
    printed = io.StringIO()

    def keep(self, logs=None):  # kt-train runs one fit per epoch
        for name, values in self.history.items():
            history.setdefault(name, []).extend(zip(self.epoch, values, strict=True))

    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
            patch.setattr(keras.callbacks.History, "on_train_end", keep)
            results = run(
                out, "--epochs", "2", "--average-last", "2", "--checkpoint-steps",
                "3", "--beam-size", "2", "--train-size", "150", *extra,
            )  # fmt: skip
    finally:
        keras.distribution.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()
    return out, results, printed.getvalue()


@pytest.mark.slow
def test_numbers_run_writes_everything(finished):
    out, results, _ = finished
    assert sorted(os.listdir(out)) == [
        "checkpoints", "logs", "results.json", "run.json", "tokenizer.model",
        "translator.keras",
    ]  # fmt: skip
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["status"] == "finished"
    assert run_info["backend"] == keras.backend.backend()
    saved = json.loads((out / "results.json").read_text())
    assert saved == pytest.approx(results)
    assert saved["split"] == "test" and saved["sentences"] == 16
    assert 0.0 <= saved["exact_match"] <= 1.0
    # Beam search as asked (the last --beam-size wins), and greedy to compare.
    assert saved["beam_size"] == 2 and saved["length_penalty"] == 0.6
    assert 0.0 <= saved["exact_match_greedy"] <= 1.0
    # Beside the stratified test split: numbers drawn uniformly, and the edge
    # numbers, each one right or named with its translation.
    assert saved["uniform_sentences"] == 12
    assert 0.0 <= saved["exact_match_uniform"] <= 1.0
    assert saved["edge_numbers"] == 8 and 0 <= saved["edge_numbers_right"] <= 8
    # The numbers task's tokenizer keeps "zero" and "null" whole.
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    assert [pieces.encode(w, out_type=str) for w in ("zero", "null")] == [
        ["▁", "zero"],
        ["▁", "null"],
    ]
    assert run_info["settings"]["short_repeats"] == 20
    # TensorBoard event files for training and validation
    # (test_the_event_files_hold_the_history_of_the_run reads them).
    logs = [str(p) for p in (out / "logs").rglob("events.out.tfevents.*")]
    assert any("train" in p for p in logs) and any("validation" in p for p in logs)

    translator = load_translator(out / "translator.keras")
    assert type(translator).__name__ == "Translator"
    # The task's pair, for servers that name it (LibreTranslate's API).
    assert translator.languages == ("en", "de")
    # translator.keras: the model's weights and no optimizer state; a
    # checkpoint keeps the optimizer's (Adam's moments), for resuming.
    assert getattr(translator.transformer, "optimizer", None) is None
    kept = stored_arrays(out / "translator.keras")
    assert len(kept) == len(translator.transformer.weights)
    assert not any("optimizer" in name for name in kept)
    last = checkpoints.list_checkpoints(out / "checkpoints")[-1]
    in_checkpoint = stored_arrays(os.path.join(last, checkpoints.WEIGHTS_FILE))
    assert sum("optimizer" in name for name in in_checkpoint) > 2 * len(kept)
    assert all(isinstance(t, str) for t in translator.translate(["one", "two"]))

    # --average-last 2: the final model is the mean of the two checkpoints
    # kept, the last of which is the end of training.
    paths = checkpoints.list_checkpoints(out / "checkpoints")
    assert len(paths) == 2
    assert checkpoints.read_state(paths[-1])["epoch"] == 2
    model = translator.transformer
    snapshots = []
    for path in paths:
        checkpoints.load_checkpoint(model, path)
        snapshots.append(weights(model))
    final = load_translator(out / "translator.keras").transformer
    for a, b, mean in zip(*snapshots, weights(final), strict=True):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6)
    assert any(not np.array_equal(a, b) for a, b in zip(*snapshots, strict=True))


def scalars(folder):
    """The scalars of the event files in ``folder``: ``{tag: [(step, value),
    ...]}``, the files in the order of their names.

    Read as TensorBoard reads them where TensorFlow is missing (its stub's
    record reader, which checks every record's checksums), so that reading
    imports no TensorFlow; a scalar is a value, or a scalar tensor (Keras'
    callback).
    """
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (
        PyRecordReader_New,
    )
    from tensorboard.util import tensor_util

    found = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        reader = PyRecordReader_New(str(path))
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:
                break
            event = event_pb2.Event.FromString(reader.record())
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.metadata.plugin_data.plugin_name == "scalars":
                    number = float(tensor_util.make_ndarray(value.tensor))
                else:  # Keras' callback writes the model's config as text
                    continue
                found.setdefault(value.tag, []).append((event.step, number))
    return found


def as_float32(points):
    return [(step, np.float32(value)) for step, value in points]


@pytest.mark.slow
def test_the_event_files_hold_the_history_of_the_run(finished, history):
    """TensorBoard's curves, written without TensorFlow: each epoch's
    training logs in train/, its validation logs (``val_*``) in validation/,
    tagged as Keras' TensorBoard callback tags them, the learning rate at
    the epoch's end, and the validation logs by step."""
    out = finished[0]
    shown = {
        folder: {
            tag: as_float32(p) for tag, p in scalars(out / "logs" / folder).items()
        }
        for folder in ("train", "validation")
    }
    rate = shown["train"].pop("epoch_learning_rate")
    expected = {"train": {}, "validation": {}}
    for name, points in history.items():
        folder = "validation" if name.startswith("val_") else "train"
        expected[folder][f"epoch_{name.removeprefix('val_')}"] = as_float32(points)
    assert {"epoch_loss", "epoch_masked_accuracy"} <= set(expected["validation"])
    # Keras' evaluation_*_vs_iterations: the same values, at each epoch's
    # last update.
    last = checkpoints.list_checkpoints(out / "checkpoints")[-1]
    iterations = checkpoints.read_state(last)["iterations"]
    for tag, points in list(expected["validation"].items()):
        name = tag.removeprefix("epoch_")
        expected["validation"][f"evaluation_{name}_vs_iterations"] = [
            (step, value)
            for step, (_, value) in zip(
                (iterations // 2, iterations), points, strict=True
            )
        ]
    assert shown == expected
    # The rate of the schedule after the last update.
    settings = json.loads((out / "run.json").read_text())["settings"]
    schedule = kt.TransformerSchedule(
        settings["d_model"],
        warmup_steps=settings["warmup_steps"],
        scale=settings["lr_scale"],
        accumulate=settings["accumulate"] or 1,
    )
    assert [step for step, _ in rate] == [0, 1]
    assert rate[-1][1] == pytest.approx(
        float(keras.ops.convert_to_numpy(schedule(iterations))), rel=1e-6
    )


@pytest.mark.backends("tensorflow")
def test_the_event_files_hold_the_scalars_of_keras_tensorboard_callback(tmp_path):
    """The same scalars, tags and steps as Keras' own callback (which needs
    TensorFlow) writes."""
    from keras_transformer.trainer.event_log import EpochScalars

    rng = np.random.default_rng(0)
    x, y = rng.random((32, 3), "float32"), rng.random((32, 1), "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5)
    model.compile(keras.optimizers.Adam(decay), "mse", metrics=["mae"])
    ours = EpochScalars(str(tmp_path / "ours"))
    theirs = keras.callbacks.TensorBoard(str(tmp_path / "keras"), update_freq="epoch")
    model.fit(
        x, y, epochs=2, validation_split=0.25, batch_size=8, verbose=0,
        callbacks=[ours, theirs],
    )  # fmt: skip
    for folder in ("train", "validation"):
        assert scalars(tmp_path / "ours" / folder) == scalars(
            tmp_path / "keras" / folder
        )
    assert set(scalars(tmp_path / "ours" / "train")) == {
        "epoch_loss", "epoch_mae", "epoch_learning_rate",
    }  # fmt: skip


@pytest.mark.once
def test_event_files_that_cannot_be_written_stop_the_logs_not_the_run(
    tmp_path, monkeypatch, capsys
):
    from keras_transformer.trainer import event_log

    def full(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    logs = event_log.EpochScalars(str(tmp_path))
    logs.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    # tensorboardX as the trainer imports it (without PyTorch).
    monkeypatch.setattr(event_log._tensorboardx().RecordWriter, "flush", full)
    for epoch in range(2):
        logs.on_epoch_end(epoch, {"loss": 1.0, "val_loss": 2.0})
        logs.on_train_end()
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"TensorBoard logs stopped: cannot write to {tmp_path}")
    assert line.endswith("No space left on device")
    assert logs.failed and not logs._files


@pytest.mark.slow
@pytest.mark.once
def test_curve_scores_each_checkpoint_averaged_as_the_run_averages(
    finished, tmp_path, monkeypatch, capsys
):
    from benchmarks import bleu_curve as curve
    from keras_transformer import data as ktd
    from keras_transformer.cli import evaluate

    out = finished[0]
    numbers = [0, 3, 17, 101, 342, 1001]
    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("".join(ktd.english(n) + "\n" for n in numbers))
    reference.write_text("".join(ktd.german(n) + "\n" for n in numbers))
    files = ["--source", str(source), "--reference", str(reference)]
    # The weights each point translates with, caught at translate().
    seen = []
    real_load = curve.load_translator

    def spying_load(path):
        translator = real_load(path)
        real_translate = translator.translate

        def translate(texts, *search, **options):
            seen.append(weights(translator.transformer))
            return real_translate(texts, *search, **options)

        translator.translate = translate
        return translator

    monkeypatch.setattr(curve, "load_translator", spying_load)
    json_path = tmp_path / "curve.json"
    result = curve.main(
        ["score", "--run", str(out), *files, "--beam-size", "1", "--label", "ours",
         "--out", str(json_path)]
    )  # fmt: skip
    assert json.loads(json_path.read_text()) == result
    assert result["label"] == "ours" and result["average_last"] == 2  # the run's
    paths = checkpoints.list_checkpoints(out / "checkpoints")
    states = [checkpoints.read_state(p) for p in paths]
    points = result["points"]
    assert [p["checkpoint"] for p in points] == [os.path.basename(p) for p in paths]
    assert [p["step"] for p in points] == [s["iterations"] for s in states]
    minutes = [round(s["elapsed_seconds"] / 60, 3) for s in states]
    assert [p["minutes"] for p in points] == minutes
    assert [p["averaged"] for p in points] == [1, 2]
    # First point: the first checkpoint alone; last: the mean of both, which
    # is the run's own translator.keras (--average-last 2).
    model = load_translator(out / "translator.keras").transformer
    checkpoints.load_checkpoint(model, paths[0])
    for got, want in zip(seen[0], weights(model), strict=True):
        np.testing.assert_array_equal(got, want)
    final = weights(load_translator(out / "translator.keras").transformer)
    for got, want in zip(seen[1], final, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # The same scores kt-evaluate gives those weights.
    for point, extra in ((points[0], ["--checkpoint", paths[0]]), (points[1], [])):
        scored = evaluate.main(
            ["--model", str(out / "translator.keras"), *files, "--beam-size", "1",
             "--out", str(tmp_path / "eval.json"), *extra]
        )  # fmt: skip
        assert (point["bleu"], point["chrf"]) == (scored["bleu"], scored["chrf"])
    assert "wrote" in capsys.readouterr().out

    # A damaged checkpoint is named, exit status 2, nothing scored.
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    first = checkpoints.list_checkpoints(damaged / "checkpoints")[0]
    with open(os.path.join(first, checkpoints.STATE_FILE), "w") as file:
        file.write("{")
    with pytest.raises(SystemExit) as exit_info:
        curve.main(["score", "--run", str(damaged), *files])
    assert exit_info.value.code == 2
    assert os.path.basename(first) in capsys.readouterr().err
    assert not list(damaged.glob("curve-*"))


@pytest.mark.slow
@pytest.mark.once
def test_finished_run_is_not_clobbered(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    before = (out / "translator.keras").read_bytes()
    err = usage_error(capsys, [*NUMBERS, *SMALL, "--out", str(out), "--epochs", "2"])
    assert "finished run" in err and "--overwrite" in err
    assert (out / "translator.keras").read_bytes() == before
    # Bad data fails before --overwrite clears anything.
    data = tmp_path / "data"
    write_corpus(data, GOOD)
    (data / "val.en").write_bytes(b"a \xff dog\n")
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    bad = ["--data", str(data), "--source", "de", "--target", "en"]
    err = usage_error(capsys, [*bad, *SMALL, "--out", str(out), "--overwrite"])
    assert "val.en:1" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == files
    # --overwrite trains again; a different seed gives a different model.
    run(out, "--epochs", "1", "--seed", "1", "--overwrite")
    assert (out / "translator.keras").read_bytes() != before


@pytest.mark.once
def test_out_with_foreign_files_or_other_settings_is_refused(tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        err = usage_error(capsys, [*NUMBERS, *SMALL, "--out", str(foreign), *extra])
        assert str(foreign) in err
    assert (foreign / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(foreign)) == ["notes.txt"]

    # An unfinished run resumes only with the same settings.
    out = tmp_path / "run"
    out.mkdir()
    argv = [*NUMBERS, *SMALL, "--out", str(out)]
    info = {"status": "running", "settings": config_of(argv).settings()}
    (out / "run.json").write_text(json.dumps(info))
    err = usage_error(
        capsys, [*NUMBERS, *SMALL, "--out", str(out), "--label-smoothing", "0.2"]
    )
    assert "other settings" in err and "label_smoothing: 0.1 there, 0.2 now" in err


@pytest.mark.once
def test_learning_rate_scale_defaults_per_task_and_is_checked(tmp_path, capsys):
    numbers = config_of([*NUMBERS, "--out", str(tmp_path / "a")])
    assert numbers.lr_scale == 0.5  # half the paper's rate on numbers
    data = ["--data", str(tmp_path), "--source", "de", "--target", "en"]
    assert config_of([*data, "--out", str(tmp_path / "b")]).lr_scale == 1.0
    given = [*NUMBERS, "--lr-scale", "2", "--out", str(tmp_path / "c")]
    assert config_of(given).lr_scale == 2.0
    for bad in ("0", "-1", "nan"):
        err = usage_error(capsys, [*NUMBERS, "--lr-scale", bad, "--out", "x"])
        assert "--lr-scale must be > 0" in err


@pytest.mark.once
def test_precision_averaging_and_kept_checkpoints_default_per_task(
    tmp_path, capsys, monkeypatch
):
    numbers = [*NUMBERS, "--out", str(tmp_path / "a")]
    data = ["--data", str(tmp_path), "--source", "de", "--target", "en", "--out", "b"]
    # The final Multi30k model is the mean of the last 5 checkpoints.
    assert config_of(numbers).average_last == 1
    assert config_of(data).average_last == 5
    assert config_of(numbers).checkpoints_kept() == 2  # one spare for resuming
    assert config_of(data).checkpoints_kept() == 5
    assert config_of([*data, "--keep-checkpoints", "0"]).checkpoints_kept() is None
    assert config_of([*data, "--keep-checkpoints", "9"]).checkpoints_kept() == 9
    for bad, why in (("4", "0 (all) or >= 5"), ("-1", "0 (all) or >= 5")):
        err = usage_error(capsys, [*data, "--keep-checkpoints", bad])
        assert f"--keep-checkpoints must be {why}" in err

    # The precision: "auto" (the default) asks the backend module; float32
    # is recorded as no policy, as before the option took it.
    chosen = []
    for policy in ("mixed_bfloat16", "float32"):
        monkeypatch.setattr(backend, "fastest_policy", lambda p=policy: p)
        chosen.append(config_of(data).mixed_precision)
    assert chosen == ["mixed_bfloat16", None]
    given = {
        (): None,  # fastest_policy says float32 (still patched)
        ("--mixed-precision",): "mixed_bfloat16",
        ("--mixed-precision", "float32"): None,
        ("--mixed-precision", "mixed_float16"): "mixed_float16",
    }
    for extra, policy in given.items():
        assert config_of([*data, *extra]).mixed_precision == policy


@pytest.mark.once
def test_fastest_policy_is_bfloat16_only_for_tensorflow_on_bf16_cpus(
    tmp_path, monkeypatch
):
    from keras_transformer import backend

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512_bf16 amx_bf16\n")
    assert backend.cpu_flags(str(info)) == {"fpu", "sse2", "avx512_bf16", "amx_bf16"}
    assert backend.cpu_flags(str(tmp_path / "missing")) == set()
    cases = {
        ("tensorflow", "avx512_bf16"): "mixed_bfloat16",
        ("tensorflow", "amx_bf16"): "mixed_bfloat16",
        ("tensorflow", "avx512f"): "float32",
        ("jax", "amx_bf16"): "float32",
        ("torch", "amx_bf16"): "float32",
    }
    for (name, flag), policy in cases.items():
        monkeypatch.setattr(backend, "name", lambda n=name: n)
        assert backend.fastest_policy({flag, "fpu"}) == policy, (name, flag)


@pytest.mark.once
def test_short_repeats_default_is_a_setting_and_is_checked(tmp_path, capsys):
    argv = [*NUMBERS, "--out", str(tmp_path / "a")]
    assert config_of(argv).numbers.short_repeats == 20  # 0-101 more often
    assert config_of([*argv, "--short-repeats", "0"]).numbers.short_repeats == 0
    err = usage_error(capsys, [*argv, "--short-repeats", "-1"])
    assert "--short-repeats must be >= 0" in err
    # A run from before the option (no short_repeats in its run.json) was
    # trained on other numbers: resuming it is refused, naming the option.
    out = tmp_path / "run"
    out.mkdir()
    before = config_of([*NUMBERS, "--out", str(out)]).settings()
    del before["short_repeats"]
    (out / "run.json").write_text(json.dumps({"status": "running", "settings": before}))
    err = usage_error(capsys, [*NUMBERS, "--out", str(out)])
    assert "short_repeats: None there, 20 now" in err


def write_corpus(folder, pairs, suffix=""):
    folder.mkdir(parents=True, exist_ok=True)
    for split, (de, en) in pairs.items():
        for lang, lines in (("de", de), ("en", en)):
            data = "".join(line + "\n" for line in lines).encode("utf-8")
            path = folder / f"{split}.{lang}{suffix}"
            path.write_bytes(gzip.compress(data) if suffix == ".gz" else data)


GOOD = {
    "train": (
        ["ein Hund", "zwei Katzen", "ein Haus"],
        ["a dog", "two cats", "a house"],
    ),
    "val": (["ein Hund"], ["a dog"]),
}


@pytest.mark.once
@pytest.mark.parametrize(
    "case, file, line, message",
    [
        ("different line counts", "train.en", 3, "line"),
        ("empty line", "train.de", 2, "empty"),
        ("invalid UTF-8", "val.en", 1, "UTF-8"),
        ("missing file", "val.de", None, "no val.de"),
        ("empty file", "train.de", None, "empty"),
        ("old Mac line endings", "train.en", 1, "old Mac"),
    ],
)
def test_bad_parallel_files_fail_before_anything_is_written(
    tmp_path, capsys, case, file, line, message
):
    data = tmp_path / "data"
    write_corpus(data, GOOD)
    path = data / file
    if case == "different line counts":
        path.write_text("a dog\ntwo cats\n")
        line = 3  # the line train.de has and train.en lacks
        file = "train.de"
    elif case == "empty line":
        path.write_text("ein Hund\n\nein Haus\n")
    elif case == "invalid UTF-8":
        path.write_bytes(b"a \xff dog\n")
    elif case == "missing file":
        path.unlink()
    elif case == "empty file":
        path.write_bytes(b"")
    elif case == "old Mac line endings":
        path.write_bytes(b"a dog\rtwo cats\ra house\r")
    out = tmp_path / "out"
    argv = ["--data", str(data), "--source", "de", "--target", "en", *SMALL]
    err = usage_error(capsys, [*argv, "--out", str(out)])
    assert f"{file}:{line}" in err if line else file in err
    assert message.lower() in err.lower()
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.once
def test_parallel_text_path_on_a_few_hundred_lines(tmp_path):
    """The Multi30k code path (gzip files, BPE, BLEU), on 200 lines."""
    data = tmp_path / "data"
    if MULTI30K.is_dir():
        corpus = {}
        for split, size in (("train", 200), ("val", 20)):
            de = gzip.open(MULTI30K / f"{split}.de.gz", "rt").read().splitlines()
            en = gzip.open(MULTI30K / f"{split}.en.gz", "rt").read().splitlines()
            # Short lines, so that no validation source is longer than the
            # test model's max_length (which would warn and truncate).
            pairs = [
                (d, e) for d, e in zip(de, en, strict=True) if max(len(d), len(e)) <= 60
            ]
            corpus[split] = tuple(zip(*pairs[:size], strict=True))
    else:  # a clone without ../shared: the number task's text instead
        from keras_transformer.data import make_splits

        splits = make_splits(0, 200, 20, 1)
        corpus = {"train": splits["train"][::-1], "val": splits["validation"][::-1]}
    write_corpus(data, corpus, suffix=".gz")
    results = train.main(
        ["--data", str(data), "--source", "de", "--target", "en", *SMALL]
        + ["--vocab-size", "300", "--tokenizer", "bpe", "--epochs", "1"]
        + ["--out", str(tmp_path / "out")]
    )
    assert results["split"] == "validation" and results["sentences"] == 20
    assert 0.0 <= results["bleu"] <= 100.0 and 0.0 <= results["chrf"] <= 100.0


@pytest.mark.slow
@pytest.mark.once
def test_time_budget_stops_training_mixed_precision(tmp_path, capsys):
    results = run(
        tmp_path / "run",
        *("--max-minutes", "0.0001", "--epochs", "50"),
        "--mixed-precision",
    )
    output = capsys.readouterr().out
    assert "(time budget)" in output
    translator = load_translator(tmp_path / "run" / "translator.keras")
    assert translator.transformer.dtype_policy.name == "mixed_bfloat16"
    state = checkpoints.read_state(
        checkpoints.list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    )
    assert state["epoch"] == 0 and state["iterations"] == 1
    assert results["trained_seconds"] >= 0.0


def _latest_position(folder):
    found = checkpoints.list_checkpoints(folder)
    if not found:
        return None
    try:
        state = checkpoints.read_state(found[-1])
    except (OSError, ValueError):
        return None
    return state["epoch"], state["batch"]


@pytest.mark.slow
@pytest.mark.once("jax")  # whole-program, same cost anywhere: evens the runs
def test_resume_after_kill_continues_from_last_checkpoint(tmp_path, capsys):
    argv = [*NUMBERS, *SMALL, "--train-size", "100", "--batch-tokens", "128"]
    argv += ["--test-size", "8", "--uniform-size", "0", "--dropout", "0"]
    argv += ["--epochs", "2", "--checkpoint-steps", "1"]
    # The same run, uninterrupted, for reference.
    reference = run_in_process(argv, tmp_path / "reference")
    epoch_length = (
        checkpoints.read_state(
            checkpoints.list_checkpoints(tmp_path / "reference" / "checkpoints")[-1]
        )["iterations"]
        // 2
    )

    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.cli.train", *argv, "--out", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            position = _latest_position(out / "checkpoints")
            if position is not None and position[0] == 0 and position[1] >= 3:
                break
            if process.poll() is not None:
                pytest.fail("the training process ended before it could be killed")
            time.sleep(0.02)
        else:
            pytest.fail("no mid-epoch checkpoint within 240 s")
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    killed_at = _latest_position(out / "checkpoints")
    assert killed_at[0] == 0 and 0 < killed_at[1] < epoch_length
    assert not (out / "translator.keras").exists()

    capsys.readouterr()
    resumed = run_in_process(argv, out)
    assert "resuming from" in capsys.readouterr().out
    final = checkpoints.read_state(
        checkpoints.list_checkpoints(out / "checkpoints")[-1]
    )
    assert (final["epoch"], final["batch"]) == (2, 0)
    assert final["iterations"] == 2 * epoch_length  # no batch trained twice
    assert resumed["sentences"] == reference["sentences"]
    # TensorBoard's curves: each epoch once, as the run never killed has them.
    for folder in ("train", "validation"):
        steps = [
            {tag: [step for step, _ in p] for tag, p in scalars(run / folder).items()}
            for run in (out / "logs", tmp_path / "reference" / "logs")
        ]
        assert steps[0] == steps[1] and steps[0]["epoch_loss"] == [0, 1]
    a = load_translator(tmp_path / "reference" / "translator.keras")
    b = load_translator(out / "translator.keras")
    if keras.backend.backend() != "tensorflow":
        # Same batches in the same order from the same weights and optimizer
        # state (no dropout): the same model. (On TensorFlow a resumed epoch
        # starts with its shortest and longest remaining batch; see
        # BucketedDataset.epoch_view.)
        for x, y in zip(weights(a), weights(b), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def run_in_process(argv, out):
    return train.main([*argv, "--out", str(out)])


@pytest.mark.slow
def test_data_parallel(request, tmp_path, capsys):
    argv = [*NUMBERS, *SMALL, "--epochs", "1", "--data-parallel"]
    if keras.backend.backend() == "torch":
        err = usage_error(capsys, [*argv, "--out", str(tmp_path / "run")])
        assert "torch backend" in err and "--data-parallel" in err
        assert not (tmp_path / "run").exists()  # refused before any write
        return
    if keras.backend.backend() == "jax":
        import jax

        if jax.device_count() < 2:
            pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=4")
    if SHARED_RUN_DATA_PARALLEL:
        # test_numbers_run_writes_everything checks what this run wrote.
        out, results, printed = request.getfixturevalue("finished")
    else:
        out = tmp_path / "run"
        try:
            results = run(out, "--epochs", "1", "--data-parallel")
        finally:
            keras.distribution.set_distribution(None)
        printed = capsys.readouterr().out
    assert "data parallel:" in printed
    assert json.loads((out / "run.json").read_text())["settings"]["data_parallel"]
    assert (out / "translator.keras").is_file()
    assert 0.0 <= results["exact_match"] <= 1.0


@pytest.mark.once
@pytest.mark.slow
def test_progress_lines_within_an_epoch_when_not_on_a_terminal(tmp_path, capsys):
    run(
        tmp_path / "run", "--epochs", "1", "--train-size", "60", "--verbose", "2",
        "--progress-seconds", "0", "--max-minutes", "5",
    )  # fmt: skip
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert lines
    pattern = (
        r"step \d+/\d+, loss \d+\.\d{4}, [\d,]+ target tokens/s, "
        r"learning rate \S+, \d+:\d\d of the time budget left"
    )
    assert all(re.fullmatch(pattern, line) for line in lines), lines[:3]
    assert lines[0].startswith("step 1/")


@pytest.mark.once
def test_report_on_uniform_and_edge_numbers_names_the_wrong_ones(capsys):
    """The numbers task's extra report, with a stand-in translator that
    knows the answers except for zero and seventeen."""
    from keras_transformer.data import EDGE_NUMBERS, english, german
    from keras_transformer.search.options import SearchOptions

    table = {english(n): german(n) for n in (*EDGE_NUMBERS, 5, 4_321, 98_765)}
    table.update({english(0): "neun", english(17): ""})

    class Lookup:
        def translate(self, texts, search=None, **options):
            assert search.beam_size == 3  # the configured search
            return [table[text] for text in texts]

    uniform = (
        [english(n) for n in (5, 4_321, 98_765, 0)],
        [german(n) for n in (5, 4_321, 98_765, 0)],
    )
    search = SearchOptions(beam_size=3)
    results = tasks.uniform_and_edge_numbers(Lookup(), uniform, search)
    assert results == {
        "exact_match_uniform": 0.75,
        "uniform_sentences": 4,
        "edge_numbers": 8,
        "edge_numbers_right": 6,
    }
    out = capsys.readouterr().out
    assert (
        "exact match on 4 numbers drawn uniformly from 0-999,999, beam size 3: 75.0%"
        in out
    )
    assert "2 wrong: 0 -> 'neun'; 17 -> ''" in out
    # All right, and no uniform split (--uniform-size 0).
    table.update({english(0): "null", english(17): "siebzehn"})
    assert tasks.uniform_and_edge_numbers(Lookup(), ([], []), search) == {
        "edge_numbers": 8,
        "edge_numbers_right": 8,
    }
    assert "): all right" in capsys.readouterr().out


@pytest.mark.once
def test_run_folders_of_the_command_before_the_training_library_resume(monkeypatch):
    """``run.json``'s settings as kt-train wrote them before it became a
    thin command over ``keras_transformer.trainer`` (recorded then): the same
    command line gives the same settings, so such a run resumes."""
    path = REPO / "tests" / "fixtures" / "run_settings" / "79fa97d.json"
    recorded = json.loads(path.read_text())
    monkeypatch.setattr(backend, "fastest_policy", lambda: "float32")  # as recorded
    for run in recorded["runs"]:
        assert config_of(run["argv"]).settings() == run["settings"], run["argv"]
