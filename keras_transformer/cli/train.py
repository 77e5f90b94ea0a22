"""Train a Transformer translator with ``model.fit`` and save ``translator.keras``.

Built-in task (no download), English number words to German::

    kt-train --task numbers --config tiny --out runs/numbers

Parallel text (``train.{src,tgt}`` and ``val.{src,tgt}``, plain or ``.gz``,
one sentence per line)::

    kt-train --data ../shared/data/multi30k --source de \\
        --target en --config small --out runs/multi30k

The options are the fields of ``keras_transformer.trainer.TrainConfig``;
this command parses them into one, and ``keras_transformer.trainer.train``
does the rest (docs/training.md describes the run folder, resuming and every
option). Bad settings, data or ``--out`` (or another run on it): exit status
2 and one line. A run that diverges or finds the disk full stops with exit
status 1, and one stopped by SIGTERM or SIGINT with 143 or 130, after one
line that says what was kept.
"""

import argparse
import dataclasses
import os
import sys

from keras_transformer import data as ktd
from keras_transformer.cli._arguments import add_search_arguments, non_negative_float
from keras_transformer.cli._process import prepare_process, start_tensorflow
from keras_transformer.trainer import RunStopped, TrainConfig, UsageError, train
from keras_transformer.trainer.run_folder import CHECKPOINTS_DIR
from keras_transformer.trainer.tasks import NumbersTask, ParallelCorpusTask


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-train", description=__doc__.split("\n\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", choices=["numbers"], help="built-in task")
    source.add_argument("--data", help="folder with train.SRC/TGT and val.SRC/TGT")
    parser.add_argument("--source", help="source language suffix (with --data)")
    parser.add_argument("--target", help="target language suffix (with --data)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a run")
    parser.add_argument("--config", help="tiny, small, base or big")
    for name in ("num_layers", "d_model", "num_heads", "d_ff", "max_length"):
        parser.add_argument("--" + name.replace("_", "-"), type=int)
    parser.add_argument("--dropout", type=float)
    parser.add_argument("--epochs", type=int)
    parser.add_argument(
        "--max-minutes", type=float, help="stop cleanly after this much training"
    )
    parser.add_argument("--batch-tokens", type=int, help="tokens per input per batch")
    parser.add_argument(
        "--bucket-lengths",
        type=_int_list,
        help="padded lengths, e.g. 16,32 (default: steps of 4 to 32, then ×1.2)",
    )
    parser.add_argument("--vocab-size", type=int)
    parser.add_argument("--tokenizer", choices=["unigram", "bpe"])
    parser.add_argument("--warmup-steps", type=int)
    parser.add_argument(
        "--lr-scale",
        type=float,
        help="times the paper's learning rate (default {} for --task, {} for "
        "--data)".format(
            NumbersTask.DEFAULTS["lr_scale"], ParallelCorpusTask.DEFAULTS["lr_scale"]
        ),
    )
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    _add_precision_and_checkpoints(parser)
    _add_scaling(parser)
    parser.add_argument("--seed", type=int, default=0)
    _add_split_sizes(parser)
    parser.add_argument("--max-lines", type=int, help="--data: use the first N")
    parser.add_argument(
        "--verbose",
        choices=["0", "1", "2", "auto"],
        help="Keras' progress: 1 a bar, 2 a line per epoch (and kt-train's lines "
        "within it); auto (the default): 1 on a terminal, else 2. Given at all, "
        "it also shows TensorFlow's, CUDA's and absl's start-up logs",
    )
    parser.add_argument(
        "--progress-seconds",
        type=non_negative_float,
        default=30.0,
        help="with --verbose 2: a progress line within an epoch every N seconds",
    )
    add_search_arguments(parser)  # for the final report
    return parser


def _add_scaling(parser):
    """Options for more data, larger batches and more devices."""
    parser.add_argument(
        "--tokenizer-sample",
        type=int,
        metavar="N",
        help="--data larger than memory: train the tokenizer on N pairs drawn "
        "from the training split, tokenise it once into ids/ in --out "
        "(memory-mapped) and train from there, never holding the text",
    )
    parser.add_argument(
        "--accumulate",
        type=int,
        metavar="N",
        help="one update per N batches, with their mean gradient (e.g. "
        "--batch-tokens 3072 --accumulate 8: about the paper's 25,000 tokens)",
    )
    parser.add_argument("--data-parallel", action="store_true")
    parser.add_argument(
        "--model-parallel",
        type=int,
        metavar="K",
        help="JAX: split the attention and feed-forward weights and the "
        "embedding over K devices (Megatron-style), the batch over the rest",
    )


def _add_precision_and_checkpoints(parser):
    """The dtype policy, checkpoint averaging (§6.1) and checkpoints kept."""
    parser.add_argument(
        "--mixed-precision",
        nargs="?",
        const="mixed_bfloat16",
        choices=["auto", "float32", "mixed_bfloat16", "mixed_float16"],
        default="auto",
        help="dtype policy; auto (the default): mixed_bfloat16 with TensorFlow "
        "on a CPU with BF16 instructions, else float32; the flag alone: "
        "mixed_bfloat16",
    )
    parser.add_argument(
        "--average-last",
        type=int,
        metavar="K",
        help="average the last K checkpoints into the final model (§6.1; "
        "default 1 for --task, 5 for --data)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        metavar="N",
        help="keep the last N checkpoints (default: K of --average-last, at "
        "least 2); 0 keeps them all (to score each)",
    )
    parser.add_argument(
        "--checkpoint-steps",
        type=int,
        default=200,
        help="save a checkpoint every N steps (and at every epoch end)",
    )


def _add_split_sizes(parser):
    """The numbers task's split sizes (``make_splits``)."""
    parser.add_argument(
        "--train-size", type=int, default=50_000, help="numbers task: pairs"
    )
    parser.add_argument("--val-size", type=int, default=1000, help="numbers task")
    parser.add_argument("--test-size", type=int, default=1000, help="numbers task")
    parser.add_argument(
        "--uniform-size",
        type=int,
        default=2000,
        help="numbers task: numbers drawn uniformly for the report (not trained on)",
    )
    parser.add_argument(
        "--short-repeats",
        type=int,
        default=ktd.SHORT_REPEATS,
        help="numbers task: extra rounds of 0-101 in training (default: %(default)s)",
    )


def _int_list(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 16,32; got {text!r}") from None
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected increasing lengths; got {text!r}")
    return tuple(values)


_FIELDS = {field.name for field in dataclasses.fields(TrainConfig)}


def option(field):
    """The option that sets a ``TrainConfig`` field (``--batch-tokens``)."""
    if field not in _FIELDS:
        return f"`{field}`"
    return "--" + field.replace("_", "-")


def parse_config(argv=None):
    """The checked ``TrainConfig`` of a command line (exit status 2 and
    usage for bad settings), and whether ``--verbose`` was given."""
    parser = _parser()
    args = parser.parse_args(argv)
    given = vars(args)
    verbose_given = given["verbose"] is not None
    given["verbose"] = given["verbose"] or "auto"
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
    start_tensorflow(verbose)  # quietly, before the tokenizer needs it
    try:
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
