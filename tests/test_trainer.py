"""The training library under kt-train: ``TrainConfig`` (one value for every
setting, checked once), ``RunFolder`` (what may happen to an output folder)
and ``train(config)`` called without the command."""

import dataclasses
import json

import pytest

from keras_transformer.search.options import SearchOptions
from keras_transformer.trainer import (
    ConfigError,
    NumbersSettings,
    NumbersTask,
    ParallelCorpusTask,
    RunFolder,
    TrainConfig,
    UsageError,
    train,
)
from keras_transformer.trainer import config as config_module

# Settings and folders do not depend on the backend; test_train.py trains on
# every backend.
pytestmark = pytest.mark.once


def test_a_config_takes_its_tasks_defaults(monkeypatch):
    monkeypatch.setattr(config_module.backend, "fastest_policy", lambda: "float32")
    numbers = TrainConfig(out="a", task="numbers").checked()
    corpus = TrainConfig(out="b", data="d", source="de", target="en").checked()
    for config, task in ((numbers, NumbersTask), (corpus, ParallelCorpusTask)):
        for name, value in task.DEFAULTS.items():
            assert getattr(config, name) == value, name
    assert numbers.task_name == "numbers" and corpus.task_name == "data"
    # The numbers task's own settings, its defaults; a corpus has none.
    assert numbers.numbers == NumbersSettings() and corpus.numbers is None
    assert numbers.numbers.short_repeats == 20  # 0-101 more often
    # The final report searches as a translator does by default (§6.1).
    assert (numbers.beam_size, numbers.length_penalty) == (4, 0.6)
    assert (numbers.beam_size, numbers.length_penalty) == (
        SearchOptions().beam_size,
        SearchOptions().length_penalty,
    )
    # Given settings win; checking twice changes nothing.
    given = TrainConfig(out="a", task="numbers", vocab_size=300, lr_scale=2.0)
    checked = given.checked()
    assert (checked.vocab_size, checked.lr_scale) == (300, 2.0)
    assert checked.checked() == checked
    assert checked.model_config().d_model == 128  # "tiny"
    assert TrainConfig(out="a", task="numbers", d_model=64).checked().model_config(
    ).d_model == 64  # fmt: skip


@pytest.mark.parametrize(
    "changes, message",
    [
        ({}, "give `task` (the built-in task) or `data` (a folder)"),
        ({"task": "numbers", "data": "d"}, "give one of `task` and `data`"),
        ({"data": "d"}, "`data` needs `source` and `target`"),
        ({"task": "numbers", "lr_scale": 0}, "`lr_scale` must be > 0"),
        ({"task": "numbers", "epochs": 0}, "`epochs` must be >= 1"),
        ({"task": "numbers", "keep_checkpoints": 1}, "`keep_checkpoints` must be 0"),
        ({"task": "numbers", "tokenizer_sample": 5}, "`tokenizer_sample` is for"),
        ({"task": "numbers", "config": "huge"}, "Unknown config name"),
        (
            {"task": "numbers", "bucket_lengths": (16, 64), "batch_tokens": 32},
            "`batch_tokens` 32 leaves no room",
        ),
        # The numbers task's settings belong to it.
        (
            {"task": "numbers", "numbers": NumbersSettings(short_repeats=-1)},
            "`short_repeats` must be >= 0",
        ),
        (
            {"task": "numbers", "numbers": NumbersSettings(train_size=0)},
            "`train_size` must be >= 1",
        ),
        (
            {"task": "numbers", "numbers": NumbersSettings(val_size=1.5)},
            "`val_size` must be an int",
        ),
        ({"task": "numbers", "numbers": {"train_size": 5}}, "`numbers` must be a"),
        (
            {
                "data": "d",
                "source": "de",
                "target": "en",
                "numbers": NumbersSettings(train_size=5, test_size=9),
            },
            "`train_size`, `test_size`: for `task` numbers, not `data` corpora",
        ),
        # The report's search, by the search's rules, before any training.
        ({"task": "numbers", "beam_size": 0}, "`beam_size` must be >= 1"),
        ({"task": "numbers", "length_penalty": -1.0}, "`length_penalty` must be"),
        ({"task": "numbers", "progress_seconds": -1}, "`progress_seconds` must be"),
        (
            {"task": "numbers", "init_from": "m.keras", "d_model": 8},
            "`init_from` with `d_model`: a pretrained model brings its own",
        ),
    ],
)
def test_a_config_that_cannot_work_names_its_settings(changes, message):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(out="x", **changes).checked()
    assert message in str(raised.value)
    assert isinstance(raised.value, UsageError) and isinstance(raised.value, ValueError)
    # The command spells the settings as its options.
    spelled = raised.value.text(lambda name: "--" + name.replace("_", "-"))
    assert "`" not in spelled


def test_settings_leave_out_what_a_resumed_run_may_change():
    config = TrainConfig(out="a", task="numbers", bucket_lengths=(16, 32)).checked()
    settings = config.settings()
    assert settings["bucket_lengths"] == [16, 32]  # as JSON keeps it
    resumable = {"out", "epochs", "max_minutes", "beam_size", "keep_checkpoints"}
    assert not resumable & set(settings)
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"numbers"}
    # run.json keeps the numbers task's settings among the others, flat.
    fields |= {f.name for f in dataclasses.fields(NumbersSettings)}
    # init_from only when given, as run folders before it have their settings.
    assert set(settings) == fields - config_module.RESUMABLE - {"init_from"}
    started = dataclasses.replace(config, init_from="pretrained.keras").settings()
    assert started == {**settings, "init_from": "pretrained.keras"}
    longer = dataclasses.replace(config, epochs=40, max_minutes=3.0, out="b")
    assert longer.settings() == settings
    # A corpus run records the numbers task's defaults, as it always has:
    # its run folders from before resume.
    corpus = TrainConfig(out="b", data="d", source="de", target="en").checked()
    assert corpus.settings()["train_size"] == 50_000
    assert corpus.settings()["short_repeats"] == 20
    smaller = NumbersSettings(train_size=100, short_repeats=0)
    given = TrainConfig(out="a", task="numbers", numbers=smaller).checked()
    assert given.settings()["train_size"] == 100
    assert given.settings()["short_repeats"] == 0


def test_a_run_folder_is_new_resumed_or_refused(tmp_path):
    folder = RunFolder(tmp_path / "run")
    settings = {"seed": 0, "task": "numbers"}
    assert folder.check(settings) is None  # missing: a new run
    folder.start(settings, "jax")
    folder.will_create("tokenizer.model")
    (tmp_path / "run" / "tokenizer.model").write_bytes(b"pieces")
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run == {
        "status": "running", "settings": settings, "backend": "jax",
        "created": ["tokenizer.model"],
    }  # fmt: skip
    assert folder.check(settings)["status"] == "running"  # resumed
    with pytest.raises(UsageError, match="seed: 0 there, 1 now"):
        folder.check({**settings, "seed": 1})
    # Foreign files: refused, and never cleared.
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert folder.not_ours(folder.read()) == ["notes.txt"]
    with pytest.raises(UsageError, match="notes.txt"):
        folder.check(settings, overwrite=True)
    with pytest.raises(UsageError, match="refusing to clear"):
        folder.clear()
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    (tmp_path / "run" / "notes.txt").unlink()
    # Finished: refused; overwrite clears only what runs wrote.
    folder.finish({"exact_match": 1.0})
    with pytest.raises(UsageError, match="finished run"):
        folder.check(settings)
    assert folder.check(settings, overwrite=True) is None
    folder.start(settings, "jax", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json"]
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(UsageError, match="is not a folder"):
        RunFolder(file).check(settings)


@pytest.mark.slow
def test_train_without_the_command(tmp_path, capsys):
    splits = NumbersSettings(train_size=100, val_size=4, test_size=4, uniform_size=0)
    config = TrainConfig(
        out=str(tmp_path / "run"), task="numbers", numbers=splits, num_layers=1,
        d_model=16, num_heads=2, d_ff=32, max_length=32, vocab_size=80,
        batch_tokens=512, bucket_lengths=(32,), epochs=1, beam_size=1,
        verbose="0",
    )  # fmt: skip
    results = train(config)
    assert results["split"] == "test" and results["sentences"] == 4
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved == pytest.approx(results)
    assert "saved " in capsys.readouterr().out
    # Library errors name the config's fields, not the command's options.
    with pytest.raises(UsageError, match="`out` .* holds a finished run"):
        train(config)
