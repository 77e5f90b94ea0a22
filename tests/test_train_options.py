"""kt-train's options are built from ``TrainConfig``'s fields (and
``NumbersSettings``'): one name, default and help text each; and a run checks
its config once, from the command or from a program."""

import argparse
import dataclasses

import pytest

from keras_transformer.cli import train as command
from keras_transformer.search.options import SearchOptions
from keras_transformer.trainer import (
    ConfigError,
    NumbersSettings,
    NumbersTask,
    ParallelCorpusTask,
    TrainConfig,
    train,
)
from keras_transformer.trainer import run as run_module

# Parsing and checking settings do not depend on the backend.
pytestmark = pytest.mark.once

FIELDS = [
    *(f for f in dataclasses.fields(TrainConfig) if f.name not in command.NOT_OPTIONS),
    *dataclasses.fields(NumbersSettings),
]


def actions():
    """{field name: the parser's action for it}."""
    return {
        action.dest: action
        for action in command._parser()._actions
        if not isinstance(action, argparse._HelpAction)
    }


def test_every_option_is_a_field_with_its_default_and_help():
    by_field = actions()
    assert set(by_field) == {f.name for f in FIELDS}
    for field in FIELDS:
        action = by_field[field.name]
        assert action.option_strings == ["--" + field.name.replace("_", "-")]
        assert field.metadata["help"], field.name
        # The field's help, its settings spelled as options.
        assert action.help.startswith(
            command._spelled(field.metadata["help"]).replace("%", "%%")[:-1]
        ), field.name
        if field.default is dataclasses.MISSING:
            assert action.required, field.name
            continue
        expected = command.COMMAND_DEFAULTS.get(field.name, field.default)
        assert action.default == expected, field.name
        # A default the run gets is in the help, the task's where it fills
        # the field in.
        for task in (NumbersTask, ParallelCorpusTask):
            if field.name in task.DEFAULTS:
                assert str(task.DEFAULTS[field.name]) in action.help, field.name
        if field.default not in (None, False):
            assert f"default: {field.default}" in action.help, field.name


def test_only_verbose_has_a_default_of_the_commands_own():
    assert command.COMMAND_DEFAULTS == {"verbose": None}
    assert TrainConfig.__dataclass_fields__["verbose"].default == "auto"
    config, given = command.parse_config(["--task", "numbers", "--out", "x"])
    assert (config.verbose, given) == ("auto", False)
    config, given = command.parse_config(
        ["--task", "numbers", "--out", "x", "--verbose", "auto"]
    )
    assert (config.verbose, given) == ("auto", True)


def test_types_choices_and_flags_come_from_the_fields():
    by_field = actions()
    assert by_field["epochs"].type is int
    assert by_field["lr_scale"].type is float
    assert by_field["train_size"].type is int
    assert by_field["bucket_lengths"].type is command._int_list
    assert by_field["data_parallel"].nargs == 0  # a flag
    assert by_field["overwrite"].default is False
    assert list(by_field["task"].choices) == ["numbers"]
    assert list(by_field["tokenizer"].choices) == ["unigram", "bpe"]
    precision = by_field["mixed_precision"]
    assert (precision.nargs, precision.const) == ("?", "mixed_bfloat16")
    config = command.parse_config(
        ["--task", "numbers", "--out", "x", "--bucket-lengths", "16,32",
         "--data-parallel", "--train-size", "300"]
    )[0]  # fmt: skip
    assert config.bucket_lengths == (16, 32) and config.data_parallel
    assert config.numbers == NumbersSettings(train_size=300)


def test_the_report_searches_with_the_searchs_defaults():
    by_field = actions()
    assert by_field["beam_size"].default == SearchOptions.beam_size
    assert by_field["length_penalty"].default == SearchOptions.length_penalty
    config = command.parse_config(["--task", "numbers", "--out", "x"])[0]
    assert config.beam_size == SearchOptions().beam_size
    assert config.length_penalty == SearchOptions().length_penalty


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--beam-size", "0"], "--beam-size must be >= 1"),
        (["--length-penalty", "-1"], "--length-penalty must be >= 0"),
        (["--progress-seconds", "-1"], "--progress-seconds must be >= 0"),
        (["--val-size", "0"], "--val-size must be >= 1"),
        (["--bucket-lengths", "32,16"], "expected increasing lengths"),
    ],
)
def test_bad_options_are_usage_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as raised:
        command.parse_config(["--task", "numbers", "--out", "x", *extra])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_numbers_options_are_refused_with_data_unless_left_alone(capsys):
    data = ["--data", "d", "--source", "de", "--target", "en", "--out", "x"]
    assert command.parse_config(data)[0].numbers is None
    # At its default, an option is as good as not given.
    assert command.parse_config([*data, "--test-size", "1000"])[0].numbers is None
    with pytest.raises(SystemExit) as raised:
        command.parse_config([*data, "--train-size", "300"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "--train-size: for --task numbers, not --data corpora" in err


class Stop(Exception):
    """Stands for the rest of the run, once the config is checked."""


@pytest.fixture
def checks(monkeypatch):
    """The configs ``TrainConfig.checked`` is called on, in a run that
    stops right after its checking."""
    calls = []
    checked = TrainConfig.checked

    def counted(self):
        calls.append(self)
        return checked(self)

    def stop(config):
        raise Stop

    monkeypatch.setattr(TrainConfig, "checked", counted)
    monkeypatch.setattr(run_module, "make_task", stop)
    # The process settings of the command's main are not what is tested.
    monkeypatch.setattr(command, "prepare_process", lambda *args, **kwargs: None)
    monkeypatch.setattr(command, "start_tensorflow", lambda *args, **kwargs: None)
    return calls


def test_kt_train_checks_its_config_once(checks, tmp_path):
    with pytest.raises(Stop):
        command.main(["--task", "numbers", "--out", str(tmp_path / "run")])
    assert len(checks) == 1


def test_train_checks_a_programs_config_once(checks, tmp_path):
    with pytest.raises(Stop):
        train(TrainConfig(out=str(tmp_path / "a"), task="numbers"))
    assert len(checks) == 1
    # Checked already: not again.
    config = TrainConfig(out=str(tmp_path / "b"), task="numbers").checked()
    assert config.is_checked
    with pytest.raises(Stop):
        train(config)
    assert len(checks) == 2
    # A copy with a field replaced is checked again.
    changed = dataclasses.replace(config, epochs=0)
    assert not changed.is_checked
    with pytest.raises(ConfigError, match="`epochs` must be >= 1"):
        train(changed)
    assert len(checks) == 3
