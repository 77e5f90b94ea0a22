"""Train a Transformer translator with ``model.fit`` and save ``translator.keras``.

Built-in task (no download), English number words to German::

    kt-train --task numbers --config tiny --out runs/numbers

Parallel text (``train.{src,tgt}`` and ``val.{src,tgt}``, plain or ``.gz``,
one sentence per line)::

    kt-train --data ../shared/data/multi30k --source de \\
        --target en --config small --out runs/multi30k

The options are built from the fields of
``keras_transformer.trainer.TrainConfig`` (and of ``NumbersSettings``, the
numbers task's): their names, defaults and help texts. This command parses
them into a checked ``TrainConfig``, and ``keras_transformer.trainer.train``
does the rest (docs/training.md describes the run folder, resuming and
every option). Bad settings, data or ``--out`` (or another run on it): exit status
2 and one line. A run that diverges or finds the disk full stops with exit
status 1, and one stopped by SIGTERM or SIGINT with 143 or 130, after one
line that says what was kept.
"""

import argparse
import dataclasses
import os
import sys
import typing

from keras_transformer.cli._extras import exit_if_missing, require
from keras_transformer.cli._process import (
    keras_without_tensorflow,
    prepare_process,
    start_tensorflow,
)
from keras_transformer.trainer import (
    NumbersSettings,
    RunStopped,
    TrainConfig,
    UsageError,
    train,
)
from keras_transformer.trainer.run_folder import CHECKPOINTS_DIR
from keras_transformer.trainer.tasks import TASKS

# Where the command's default differs from the field's, and why: ``None``
# tells whether --verbose was given at all (given, it also shows the
# frameworks' start-up logs); not given, the run gets the field's "auto".
COMMAND_DEFAULTS = {"verbose": None}

# kt-train needs one of these (``TrainConfig.checked()`` says the same to a
# program); argparse says it in the usage line.
ONE_OF = ("task", "data")

# Fields that are not options of their own: the numbers task's settings are
# the options of ``NumbersSettings``' fields.
NOT_OPTIONS = ("numbers",)


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-train", description=__doc__.split("\n\n")[0]
    )
    one_of = parser.add_mutually_exclusive_group(required=True)
    for field in dataclasses.fields(TrainConfig):
        if field.name not in NOT_OPTIONS:
            _add_option(one_of if field.name in ONE_OF else parser, field)
    numbers = parser.add_argument_group(
        "the numbers task", _spelled("with `task` numbers")
    )
    for field in dataclasses.fields(NumbersSettings):
        _add_option(numbers, field)
    return parser


def _add_option(parser, field):
    """The option of a field: its default (``COMMAND_DEFAULTS`` aside), its
    help, and a type, choices or flag from its annotation and metadata."""
    meta = field.metadata
    options = {"dest": field.name, "help": _help(field)}
    if field.default is dataclasses.MISSING:
        options["required"] = True
    else:
        options["default"] = COMMAND_DEFAULTS.get(field.name, field.default)
    kind = _kind(field.type)
    if kind is bool:
        options["action"] = "store_true"
    else:
        options["type"] = _int_list if kind is tuple else kind
        options.update({k: meta[k] for k in ("choices", "metavar") if k in meta})
        if "const" in meta:  # the option alone means ``const``
            options.update(nargs="?", const=meta["const"])
    parser.add_argument(option(field.name), **options)


def _kind(annotation):
    """``int`` of ``int | None``; ``tuple`` of ``tuple[int, ...]``."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is not tuple and len(kinds) == 1:
        annotation = kinds[0]  # X | None
    return typing.get_origin(annotation) or annotation


def _help(field):
    """The field's help, its settings spelled as options, and its default:
    the field's, or each task's when the task fills it in."""
    text = field.metadata["help"]
    per_task = [
        (task, task.DEFAULTS[field.name])
        for task in TASKS.values()
        if field.name in task.DEFAULTS
    ]
    if per_task:
        default = ", ".join(
            f"{value} with {_chosen_by(task)}" for task, value in per_task
        )
    elif field.default in (None, False, dataclasses.MISSING):
        default = None  # the help says what None means
    else:
        default = field.default  # also where COMMAND_DEFAULTS differs
    if default is not None and text.endswith(")"):  # within the help's
        text = f"{text[:-1]}; default: {default})"
    elif default is not None:
        text = f"{text} (default: {default})"
    return _spelled(text).replace("%", "%%")  # argparse formats help with %


def _chosen_by(task):
    """The setting that chooses ``task``: `data`, or `task` and its name."""
    return "`data`" if task.name == "data" else f"`task` {task.name}"


def _spelled(text):
    """``text`` with its settings (`batch_tokens`) spelled as options, as
    the errors' messages are."""
    return UsageError(text).text(option)


def _int_list(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 16,32; got {text!r}") from None
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected increasing lengths; got {text!r}")
    return tuple(values)


_FIELDS = {field.name for field in dataclasses.fields(TrainConfig)} - set(NOT_OPTIONS)
_NUMBERS_FIELDS = [field.name for field in dataclasses.fields(NumbersSettings)]


def option(field):
    """The option that sets a ``TrainConfig`` or ``NumbersSettings`` field
    (``--batch-tokens``)."""
    if field not in _FIELDS and field not in _NUMBERS_FIELDS:
        return f"`{field}`"
    return "--" + field.replace("_", "-")


def parse_config(argv=None):
    """The checked ``TrainConfig`` of a command line (exit status 2 and
    usage for bad settings), and whether ``--verbose`` was given."""
    parser = _parser()
    given = vars(parser.parse_args(argv))
    verbose_given = given["verbose"] is not None
    if not verbose_given:
        del given["verbose"]  # the field's default
    numbers = {name: given.pop(name) for name in _NUMBERS_FIELDS}
    # With --data, refused where they differ from their defaults.
    if given["task"] is not None or numbers != dataclasses.asdict(NumbersSettings()):
        given["numbers"] = NumbersSettings(**numbers)
    try:
        config = TrainConfig(**given).checked()
    except UsageError as error:
        parser.error(error.text(option))
    return config, verbose_given


def main(argv=None):
    """Run the command; returns the report's results (None on a process
    other than 0 of a multi-process run)."""
    config, verbose = parse_config(argv)
    prepare_process(verbose)
    # A missing package is one line naming its extra, before the run
    # folder is touched.
    with exit_if_missing("kt-train", "train"):
        start_tensorflow(verbose)  # quietly, before Keras starts it (its backend only)
        require("train")
    try:
        with keras_without_tensorflow(), exit_if_missing("kt-train", "train"):
            return train(config)
    except UsageError as error:
        print(f"kt-train: error: {error.text(option)}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunStopped as error:  # diverged, a full disk, a signal
        print(f"kt-train: {error.text(option)}", file=sys.stderr)
        raise SystemExit(error.exit_status) from None
    except KeyboardInterrupt:
        print(
            "\ninterrupted: run the same command again to continue (from the last "
            f"checkpoint in {os.path.join(config.out, CHECKPOINTS_DIR)}, or with "
            "the report)",
            file=sys.stderr,
        )
        raise SystemExit(130) from None


def command():
    """The installed ``kt-train`` command (``[project.scripts]``)."""
    main()


if __name__ == "__main__":  # kt-launch starts the processes this way
    command()
