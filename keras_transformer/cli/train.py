"""Train a Transformer translator with ``model.fit`` and save ``translator.keras``.

Built-in task (no download), English number words to German::

    kt-train --task numbers --config tiny --out runs/numbers

Parallel text (``train.{src,tgt}`` and ``val.{src,tgt}``, plain or ``.gz``,
one sentence per line)::

    kt-train --data ../shared/data/multi30k --source de \\
        --target en --config small --out runs/multi30k

The paper's recipe: Adam (β1 0.9, β2 0.98, ε 1e-9) with warm-up and inverse
square-root decay (§5.3), label smoothing 0.1 (§5.4), batches by length to a
token budget (§5.1), optional averaging of the last checkpoints (§6.1).

Everything goes to ``--out``: ``run.json`` (settings, status, and the files
the run created), ``tokenizer.model``, ``checkpoints/`` (resumable, written
atomically), ``logs/`` (TensorBoard), ``translator.keras`` and
``results.json``. Run the same command again after an interruption (even
``kill -9``) and training continues from the last checkpoint that loads (or,
killed in the final report, only the report is written); a finished
``--out`` is left alone unless ``--overwrite`` is given, which deletes only
what runs of this script wrote there. Input files and settings are checked
before anything is written.
"""

import argparse
import base64
import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import time

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer import backend as kt_backend
from keras_transformer import checkpoints, cluster
from keras_transformer import data as ktd
from keras_transformer.callbacks import Checkpointer, ProgressLog, TimeBudget
from keras_transformer.cli import add_search_arguments, non_negative_float
from keras_transformer.commands import start_tensorflow
from keras_transformer.evaluation import load_translator, score
from keras_transformer.translator import inference_copy

# Per-task defaults; every one can be overridden on the command line.
TASK_DEFAULTS = {
    "numbers": {
        "config": "tiny",
        "vocab_size": 200,
        "tokenizer": "unigram",
        "batch_tokens": 2048,
        "warmup_steps": 400,
        # Half the paper's rate (§5.3): on 3-minute runs it left a sixth of
        # the errors on uniformly drawn numbers (docs/results.md, #16).
        "lr_scale": 0.5,
        "epochs": 20,
        "average_last": 1,
    },
    "data": {
        "config": "small",
        "vocab_size": 8000,
        "tokenizer": "bpe",
        "batch_tokens": 3072,
        "warmup_steps": 1000,
        "lr_scale": 1.0,
        "epochs": 20,
        # §6.1; about 1 BLEU on Multi30k (docs/results.md).
        "average_last": 5,
    },
}

# Settings that may change when a run is resumed (they don't change what a
# step computes); every other setting must match the interrupted run.
# Settings that may differ between a run and its resumption (the search
# settings only affect the final report).
RESUMABLE_CHANGES = {
    "out",
    "overwrite",
    "epochs",
    "max_minutes",
    "verbose",
    "progress_seconds",
    "beam_size",
    "length_penalty",
    "keep_checkpoints",
}

RUN_FILE = "run.json"
TOKENIZER_FILE = "tokenizer.model"
TRANSLATOR_FILE = "translator.keras"
IDS_DIR = "ids"  # --tokenizer-sample's id store
RESULTS_FILE = "results.json"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
# run.json's status: "running" until translator.keras is saved, "trained"
# until results.json is written, then "finished".
STATUSES = ("running", "trained", "finished")


class UsageError(Exception):
    """A problem with the command line, the data or ``--out``; exit status 2."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="kt-train",
        description=__doc__.split("\n\n")[0],
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
            TASK_DEFAULTS["numbers"]["lr_scale"], TASK_DEFAULTS["data"]["lr_scale"]
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
        default="auto",
        help="Keras' progress: 1 a bar, 2 a line per epoch (and kt-train's lines "
        "within it); auto: 1 on a terminal, else 2. Given at all, it also shows "
        "TensorFlow's, CUDA's and absl's start-up logs",
    )
    parser.add_argument(
        "--progress-seconds",
        type=non_negative_float,
        default=30.0,
        help="with --verbose 2: a progress line within an epoch every N seconds",
    )
    add_search_arguments(parser)  # for the final report
    args = parser.parse_args(argv)
    _check_args(parser, args)
    return args


def _add_scaling(parser):
    """Options for more data, larger batches and more devices (#17)."""
    parser.add_argument(
        "--tokenizer-sample",
        type=int,
        metavar="N",
        help="--data larger than memory: train the tokenizer on N pairs drawn "
        f"from the training split, tokenise it once into {IDS_DIR}/ in --out "
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
        "least 2); 0 keeps them all (kt-curve evaluates each)",
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


def _check_args(parser, args):
    """Fill in the task's defaults and refuse bad settings (exit status 2)."""
    task = "numbers" if args.task else "data"
    if task == "data" and not (args.source and args.target):
        parser.error("--data needs --source and --target, e.g. --source de --target en")
    for name, value in TASK_DEFAULTS[task].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in (
        "epochs",
        "batch_tokens",
        "vocab_size",
        "warmup_steps",
        "train_size",
        "val_size",
        "test_size",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("uniform_size", "short_repeats"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.vocab_size <= ktd.UNK_ID + 1:
        parser.error(
            f"--vocab-size must be > {ktd.UNK_ID + 1}, the reserved ids "
            "(<pad>, <s>, </s>, <unk>)"
        )
    if args.bucket_lengths and args.batch_tokens < args.bucket_lengths[-1]:
        parser.error(_batch_tokens_error(args.batch_tokens, args.bucket_lengths[-1]))
    if args.average_last < 1:
        parser.error("--average-last must be >= 1")
    fewest, keep = max(args.average_last, 2), args.keep_checkpoints
    if keep is not None and (keep < 0 or 0 < keep < fewest):
        parser.error(f"--keep-checkpoints must be 0 (all) or >= {fewest}")
    if args.mixed_precision == "auto":
        args.mixed_precision = kt_backend.fastest_policy()
    if args.mixed_precision == "float32":
        # Recorded as before the flag took "float32": no policy set.
        args.mixed_precision = None
    if args.checkpoint_steps < 1:
        parser.error("--checkpoint-steps must be >= 1")
    if args.tokenizer_sample is not None:
        if task != "data":
            parser.error("--tokenizer-sample is for --data corpora")
        if args.tokenizer_sample < 1:
            parser.error("--tokenizer-sample must be >= 1")
    if args.model_parallel is not None and args.model_parallel < 1:
        parser.error("--model-parallel must be >= 1")
    if args.accumulate is not None and args.accumulate < 1:
        parser.error("--accumulate must be >= 1")
    if args.accumulate == 1:
        args.accumulate = None  # recorded as runs from before the option
    if args.max_minutes is not None and not args.max_minutes > 0:
        parser.error("--max-minutes must be > 0")
    if not args.lr_scale > 0:
        parser.error("--lr-scale must be > 0")
    try:
        model_config(args)
    except (TypeError, ValueError) as error:
        parser.error(str(error))


def _int_list(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 16,32; got {text!r}") from None
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected increasing lengths; got {text!r}")
    return values


def _batch_tokens_error(batch_tokens, longest, replicas=1, given=True):
    need = longest * replicas
    rows = f" × {replicas} replicas" if replicas > 1 else ""
    lower = "the last --bucket-lengths" if given else "--max-length"
    return (
        f"--batch-tokens {batch_tokens} leaves no room for one row of the longest "
        f"bucket ({longest} tokens{rows}); raise it to at least {need}, or lower "
        f"{lower}"
    )


def model_config(args):
    overrides = {
        name: getattr(args, name)
        for name in ("num_layers", "d_model", "num_heads", "d_ff", "max_length")
        + ("dropout",)
        if getattr(args, name) is not None
    }
    return kt.get_config(args.config, **overrides)


def settings(args):
    return {
        key: value
        for key, value in sorted(vars(args).items())
        if key not in RESUMABLE_CHANGES
    }


# -- data -----------------------------------------------------------------------


def load_data(args):
    """``{"train": (sources, targets), "validation": ..., ["test": ...]}``.

    Raises ``UsageError`` (naming file and line) for unusable files, before
    anything is written.
    """
    if args.task == "numbers":
        return ktd.make_splits(
            args.seed,
            args.train_size,
            args.val_size,
            args.test_size,
            args.uniform_size,
            args.short_repeats,
        )
    try:
        splits = {}
        for split, name in (("train", "train"), ("val", "validation")):
            if name == "train" and args.tokenizer_sample:
                splits[name] = ktd.CorpusFiles(
                    ktd.split_path(args.data, split, args.source),
                    ktd.split_path(args.data, split, args.target),
                    args.max_lines,
                )
                continue
            splits[name] = ktd.read_split(
                args.data, split, args.source, args.target, args.max_lines
            )
    except ktd.CorpusError as error:
        raise UsageError(str(error)) from None
    return splits


def boundaries_for(max_length, lengths):
    """Bucket lengths: steps of 4 up to 32, then about 1.2× apart.

    Short steps suit short sentences (the numbers task: 5 to 15 tokens); the
    largest boundary is the longest example, capped by the model's limit.
    """
    longest = int(max(lengths))
    if max_length is not None:
        longest = min(longest, max_length)
    bounds = [8, 12, 16, 20, 24, 28, 32]
    while bounds[-1] < longest:
        bounds.append(-(-int(bounds[-1] * 1.2) // 4) * 4)
    return [b for b in bounds if b < longest] + [longest]


# -- the output folder ----------------------------------------------------------


def prepare_out(args):
    """Check ``--out``; return the previous ``run.json`` dict to continue, or None.

    - missing or empty: a new run;
    - an unfinished run with the same settings: resume it (or, if it was
      trained but its report is missing, write the report);
    - a finished run, another run's settings, or files that are not ours:
      refuse. ``--overwrite`` clears a folder only if a run of this script
      wrote everything in it (see ``not_ours``).

    Only reads; nothing is written or deleted here.
    """
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a folder.")
    entries = set(os.listdir(out)) if os.path.isdir(out) else set()
    if not entries:
        return None
    run = read_run(out)
    if args.overwrite:
        foreign = not_ours(out, run)
        if foreign:
            shown = ", ".join(foreign[:5])
            if len(foreign) > 5:
                shown += f" and {len(foreign) - 5} more"
            if run is not None and "created" not in run:
                shown += f"; its {RUN_FILE} lists none, from an older version?"
            raise UsageError(
                f"--out {out} holds files this script did not write ({shown}); "
                "refusing to clear it. Move them away or choose another --out."
            )
        return None
    if run is None:
        raise UsageError(
            f"--out {out} is not empty and holds no {RUN_FILE} of this script; "
            "choose an empty or new folder."
        )
    reported = os.path.exists(os.path.join(out, RESULTS_FILE))
    if run["status"] == "finished" and reported:
        raise UsageError(
            f"--out {out} holds a finished run ({TRANSLATOR_FILE}). Pass "
            "--overwrite to train again from scratch, or choose another --out."
        )
    if run["status"] == "finished":
        # Marked finished before its report was written (by older versions):
        # the report is all that is left to do.
        run["status"] = "trained"
    now = settings(args)
    changed = [
        f"{key}: {run['settings'].get(key)!r} there, {now.get(key)!r} now"
        for key in sorted(set(run["settings"]) | set(now))
        if run["settings"].get(key) != now.get(key)
    ]
    if changed:
        # The values too: a default that changed between versions (such as
        # the numbers task's lr_scale) shows as a setting the user never gave.
        raise UsageError(
            f"--out {out} holds an unfinished run with other settings "
            f"({'; '.join(changed)}); rerun it with the same settings to resume, "
            "or pass --overwrite."
        )
    return run


def read_run(out):
    """``out``'s ``run.json`` as a dict; None if missing or not this script's."""
    try:
        with open(os.path.join(out, RUN_FILE), encoding="utf-8") as file:
            run = json.load(file)
    except (OSError, ValueError):
        return None
    if (
        not isinstance(run, dict)
        or run.get("status") not in STATUSES
        or not isinstance(run.get("settings"), dict)
        or not isinstance(run.get("created", []), list)
    ):
        return None
    return run


def write_run(out, run):
    checkpoints.write_json_atomic(os.path.join(out, RUN_FILE), run)


def will_create(out, run, *names):
    """Add ``names`` (entries of ``out``) to those ``run.json`` says we created.

    Called before creating them: a kill in between then leaves at worst a
    name listed that was never created, not a file of ours that
    ``--overwrite`` would refuse to clear as someone else's.
    """
    created = sorted(set(run.get("created", [])).union(names))
    if created != run.get("created"):
        run["created"] = created
        write_run(out, run)


def not_ours(out, run):
    """What in ``out`` no run of this script wrote: sorted relative paths.

    Ours are ``run.json`` and the entries it lists as created (``run`` is
    the folder's ``run.json`` dict, or None), with the temporary files of
    their atomic writes; inside ``checkpoints/`` and ``logs/`` only what
    ``save_checkpoint`` and TensorBoard write there. Symbolic links never
    are: we make none.
    """
    ours = {RUN_FILE, *run.get("created", [])} if run is not None else set()
    found = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        link = os.path.islink(path)
        folder = os.path.isdir(path) and not link
        target = checkpoints.temporary_target(name)
        known = name in ours or (target in ours and target not in _FOLDERS)
        if link or not known or folder != (name in _FOLDERS):
            found.append(name + "/" if folder else name)
        elif name == CHECKPOINTS_DIR:
            found += [f"{name}/{p}" for p in checkpoints.foreign_files(path)]
        elif name == LOGS_DIR:
            found += [f"{name}/{p}" for p in _foreign_logs(path)]
    return found


_FOLDERS = (CHECKPOINTS_DIR, LOGS_DIR)


def _foreign_logs(path):
    # Keras' TensorBoard callback writes event files to train/ and validation/.
    found = []
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if (
            name not in ("train", "validation")
            or os.path.islink(folder)
            or not os.path.isdir(folder)
        ):
            found.append(name)
            continue
        for inner in sorted(os.listdir(folder)):
            file = os.path.join(folder, inner)
            if (
                not inner.startswith("events.out.tfevents.")
                or os.path.islink(file)
                or not os.path.isfile(file)
            ):
                found.append(f"{name}/{inner}")
    return found


def clear_out(out):
    """Delete a run's files from ``out``, ``run.json`` (the list of them) last."""
    # prepare_out checked this, but the tokenizer may have trained for a
    # while since: check again right before deleting.
    foreign = not_ours(out, read_run(out))
    if foreign:
        raise UsageError(
            f"--out {out} holds files this script did not write "
            f"({', '.join(foreign[:5])}); refusing to clear it."
        )
    for name in sorted(os.listdir(out), key=lambda name: name == RUN_FILE):
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


# -- training -------------------------------------------------------------------


def log(message):
    if cluster.is_chief():  # one process speaks for a multi-process run
        print(message, flush=True)


def train(args):
    parallel = []
    try:
        return _train(args, parallel)
    finally:
        for setup in parallel:  # put back the global distribution, if any
            setup.close()


def _train(args, opened):
    # Everything that can fail on bad input or settings comes before the
    # first write, so that the corrected command starts from a clean --out.
    # With several processes (multi-process data parallel) all of them read
    # and train, process 0 alone decides what the others must agree on (the
    # run's state, the tokenizer, when to stop) and writes.
    data = load_data(args)
    replicas, scope, shard = _parallel(args, opened)
    chief = cluster.is_chief()
    run = _agreed(lambda: prepare_out(args))
    out = args.out
    resuming = run is not None
    if resuming and run["status"] != "running":
        log(
            f"{out} holds a trained model without its report ({RESULTS_FILE}): "
            "writing the report, no training"
        )
        trained = run.get("trained_seconds", 0.0)
        return (os.path.join(out, TRANSLATOR_FILE), data, trained) if chief else None
    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.mixed_precision or "float32")
    tokenizer, proto = _tokenizer(args, resuming, data["train"])
    config = model_config(args)
    streamed = isinstance(data["train"], ktd.CorpusFiles)
    if chief and streamed:  # the id store is written into --out
        run = _start_run(args, run if resuming else None, proto)
    dataset, val_dataset, boundaries = _datasets(
        args, tokenizer, data, config, replicas, shard, run
    )
    if chief and not streamed:
        run = _start_run(args, run if resuming else None, proto)

    with scope if scope is not None else contextlib.nullcontext():
        model = _compiled_model(args, config, tokenizer)
    per_update = f", one update per {args.accumulate}" if args.accumulate else ""
    log(
        f"model: {args.config} {_describe(config)}, "
        f"{model.count_params():,} parameters; backend {keras.backend.backend()}, "
        f"{keras.config.dtype_policy().name}; "
        f"{len(dataset)} batches of <= {args.batch_tokens} tokens per epoch"
        f"{per_update}, buckets {boundaries}"
    )
    if args.model_parallel:
        held = kt.distribute.weight_bytes_per_device(model).values()
        total = kt.distribute.weight_bytes(model)
        log(
            f"weights per device: {max(held) / 2**20:,.1f} MiB of "
            f"{total / 2**20:,.1f} MiB ({max(held) / total:.0%})"
        )
    ckpt_dir = os.path.join(out, CHECKPOINTS_DIR)
    # Every process loads the checkpoint (from the --out they share): a
    # variable's value is set on all processes' devices at once.
    state = _resume_state(model, ckpt_dir) if resuming else None
    trained = _fit(args, run, model, dataset, val_dataset, ckpt_dir, state)
    if not chief:
        return None  # the rest is process 0's alone
    if cluster.process_count() > 1:
        for setup in opened:  # what follows runs on this process's devices
            setup.close()
        model = _single_process_copy(args, config, tokenizer, model)
    if args.average_last > 1:
        _average(args, model, ckpt_dir)

    translator = kt.Translator(tokenizer, inference_copy(model))
    path = os.path.join(out, TRANSLATOR_FILE)
    will_create(out, run, TRANSLATOR_FILE)
    checkpoints.save_model_atomic(translator, path)
    run["status"] = "trained"
    run["trained_seconds"] = round(trained, 1)
    write_run(out, run)
    log(f"saved {path}")
    return path, data, trained


def _parallel(args, opened):
    """``(replicas, scope, process_shard)`` of ``--data-parallel``;
    ``(1, None, (0, 1))`` without."""
    if not args.data_parallel and not args.model_parallel:
        return 1, None, (0, 1)
    try:
        if args.model_parallel:
            parallel = kt.model_parallel(args.model_parallel)
        else:
            parallel = kt.data_parallel()
    except (ValueError, NotImplementedError) as error:
        raise UsageError(str(error)) from None
    opened.append(parallel)
    log(
        f"{'model' if args.model_parallel else 'data'} parallel: {parallel.description}"
    )
    shard = (parallel.process_index, parallel.num_processes)
    return parallel.num_replicas, parallel.scope(), shard


def _agreed(decide):
    """``decide()`` on process 0, its value (JSON) or its ``UsageError`` on
    every process; just ``decide()`` on one process."""
    if cluster.process_count() == 1:
        return decide()
    outcome, error = None, None
    if cluster.is_chief():
        try:
            outcome = {"value": decide()}
        except UsageError as raised:
            outcome, error = {"error": str(raised)}, raised
    outcome = cluster.broadcast(outcome)
    if error is not None:
        raise error
    if "error" in outcome:
        raise UsageError(f"(process 0) {outcome['error']}")
    return outcome["value"]


def _compiled_model(args, config, tokenizer):
    model = kt.build_model(
        config, src_vocab_size=tokenizer.vocabulary_size(), share_embeddings=True
    )
    model.compile(
        optimizer=kt.transformer_optimizer(
            config.d_model, args.warmup_steps, args.lr_scale, args.accumulate or 1
        ),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=args.label_smoothing),
        metrics=[kt.MaskedAccuracy()],
    )
    return model


def _single_process_copy(args, config, tokenizer, model):
    """``model`` (its weights, its step) on this process alone: the trained
    one's variables span every process's devices, and setting them (as
    averaging does) would wait for the other processes, which have ended."""
    copy = _compiled_model(args, config, tokenizer)
    copy.optimizer.build(copy.trainable_variables)
    copy.set_weights(model.get_weights())
    copy.optimizer.iterations.assign(_steps(model))
    return copy


def _tokenizer(args, resuming, train):
    """``_own_tokenizer``'s, process 0's on every process (their SentencePiece
    trainings need not agree, and only process 0 writes it)."""
    if cluster.process_count() == 1:
        return _own_tokenizer(args, resuming, train)

    def on_chief():
        tokenizer, proto = _own_tokenizer(args, resuming, train)
        text = base64.b64encode(tokenizer.proto).decode()
        return {"proto": text, "new": proto is not None}

    got = _agreed(on_chief)
    proto = base64.b64decode(got["proto"])
    return ktd.make_tokenizer(proto), proto if got["new"] else None


def _own_tokenizer(args, resuming, train):
    """``(tokenizer, proto)``: trained once on source + target text (one joint
    vocabulary, §5.1) and kept in --out, so that a resumed run uses the very
    same ids. ``proto`` is that of a new tokenizer, to be written once the
    settings are checked (None when resuming)."""
    path = os.path.join(args.out, TOKENIZER_FILE)
    if resuming and os.path.exists(path):
        return ktd.make_tokenizer(path), None
    start = time.monotonic()
    if isinstance(train, ktd.CorpusFiles):  # a sample, read in one pass
        try:
            train = ktd.sample_pairs(
                train.source, train.target, args.tokenizer_sample, args.seed,
                train.max_lines,
            )  # fmt: skip
        except ktd.CorpusError as error:
            raise UsageError(str(error)) from None
    proto = _train_tokenizer(args, train[0] + train[1])
    tokenizer = ktd.make_tokenizer(proto)
    log(
        f"tokenizer: {args.tokenizer}, {tokenizer.vocabulary_size()} pieces "
        f"({time.monotonic() - start:.1f} s)"
    )
    return tokenizer, proto


def _datasets(args, tokenizer, data, config, replicas, shard=(0, 1), run=None):
    """``(train, validation, boundaries)``: batches by length (§5.1), this
    process's ``shard`` of each."""
    if isinstance(data["train"], ktd.CorpusFiles):
        store = _id_store(args, data["train"], tokenizer.proto, run)
        src_ids, tgt_ids = store.source, store.target
        lengths = np.maximum(src_ids.lengths, tgt_ids.lengths + 1)
    else:
        train_src, train_tgt = data["train"]
        src_ids = ktd.encode(tokenizer, train_src)
        tgt_ids = ktd.encode(tokenizer, train_tgt, add_end=False)
        pairs = zip(src_ids, tgt_ids, strict=True)
        lengths = [max(len(s), len(t) + 1) for s, t in pairs]
    boundaries = args.bucket_lengths or boundaries_for(config.max_length, lengths)
    if args.batch_tokens < boundaries[-1] * replicas:
        raise UsageError(
            _batch_tokens_error(
                args.batch_tokens,
                boundaries[-1],
                replicas,
                given=bool(args.bucket_lengths),
            )
        )
    dataset = ktd.BucketedDataset(
        src_ids,
        tgt_ids,
        args.batch_tokens,
        boundaries,
        seed=args.seed,
        rows_multiple=replicas,
        process_shard=shard,
    )
    if len(dataset) == 0:
        raise UsageError(
            f"no training pair fits the longest bucket ({boundaries[-1]} tokens); "
            "raise --max-length or --bucket-lengths."
        )
    if dataset.dropped:
        log(
            f"dropped {len(dataset.dropped)} of {len(src_ids)} training pairs "
            f"longer than {boundaries[-1]} tokens"
        )
    val_src, val_tgt = data["validation"]
    val_dataset = ktd.BucketedDataset(
        ktd.encode(tokenizer, val_src),
        ktd.encode(tokenizer, val_tgt, add_end=False),
        args.batch_tokens,
        boundaries,
        shuffle=False,
        rows_multiple=replicas,
        process_shard=shard,
    )
    return dataset, val_dataset, boundaries


def _id_store(args, files, proto, run):
    """The training split's id store in --out: reused when it is complete and
    of this tokenizer and corpus, else written (by process 0; the others
    open it once it is there)."""
    folder = os.path.join(args.out, IDS_DIR)

    def usable():
        try:
            store = ktd.IdStore(folder)
        except (ValueError, OSError):
            return None
        info = store.info
        paths = [os.path.abspath(p) for p in (files.source, files.target)]
        same = (
            info["tokenizer"] == ktd.id_store.tokenizer_digest(proto)
            and [info["source"], info["target"]] == paths
            and info["max_lines"] == files.max_lines
        )
        return store if same else None

    def on_chief():
        if usable() is None:
            will_create(args.out, run, IDS_DIR, IDS_DIR + ".partial")
            start = time.monotonic()
            try:
                store = ktd.build_id_store(
                    files.source, files.target, proto, folder, files.max_lines
                )
            except ktd.CorpusError as error:
                raise UsageError(str(error)) from None
            log(
                f"id store: {len(store):,} pairs tokenised into {folder} "
                f"({time.monotonic() - start:.0f} s)"
            )

    _agreed(on_chief)
    store = usable()
    if store is None:
        raise UsageError(f"the id store in {folder} does not open")
    return store


def _start_run(args, previous, proto):
    """The first writes: run.json (``previous``'s list of entries when
    resuming), then a new tokenizer. run.json comes first: it lists each
    entry before the entry is created, for --overwrite to know what it may
    delete."""
    out = args.out
    if args.overwrite and os.path.isdir(out):
        clear_out(out)
    os.makedirs(out, exist_ok=True)
    run = {
        "status": "running",
        "settings": settings(args),
        "backend": keras.backend.backend(),
        "created": previous.get("created", []) if previous else [],
    }
    write_run(out, run)
    if proto is not None:
        will_create(out, run, TOKENIZER_FILE)
        checkpoints.write_atomic(os.path.join(out, TOKENIZER_FILE), proto)
    return run


def _resume_state(model, ckpt_dir):
    """Load the newest checkpoint that loads; its state, or None if there is
    none. A damaged checkpoint is skipped (and left as it is)."""
    latest, state = checkpoints.load_latest(model, ckpt_dir, _skipping)
    if latest is not None:
        log(
            f"resuming from {latest}: epoch {state['epoch'] + 1}, "
            f"batch {state['batch']}, step {state['iterations']}, "
            f"{state['elapsed_seconds']:.0f} s trained"
        )
        return state
    if checkpoints.list_checkpoints(ckpt_dir):
        # Starting over would soon delete them; that is for the user to say.
        raise UsageError(
            f"no checkpoint in {ckpt_dir} loads (why is above); pass "
            "--overwrite to train again from scratch."
        )
    return None


def _fit(args, run, model, dataset, val_dataset, ckpt_dir, state):
    """Train until ``--epochs`` or ``--max-minutes``, from ``state`` (a
    checkpoint's, or None); returns the seconds trained in all."""
    state = state or {"epoch": 0, "batch": 0, "elapsed_seconds": 0.0}
    chief, several = cluster.is_chief(), cluster.process_count() > 1
    budget = TimeBudget(
        None if args.max_minutes is None else 60 * args.max_minutes,
        elapsed=state["elapsed_seconds"] or 0.0,
        agree=cluster.broadcast_flag if several else None,  # process 0's clock
    )
    checkpointer = Checkpointer(
        ckpt_dir,
        epoch_length=len(dataset),
        every_steps=args.checkpoint_steps,
        keep=_keep(args),
        budget=budget,
        write=chief,
    )
    callbacks = [budget, checkpointer]
    verbose = args.verbose
    verbose = (1 if sys.stdout.isatty() else 2) if verbose == "auto" else int(verbose)
    # Not on a terminal Keras prints one line per epoch: lines in between.
    lines = ProgressLog(every=args.progress_seconds, budget=budget)
    if not chief:
        verbose = 0
    else:
        callbacks.append(_Progress(args.epochs))
        if verbose == 2:
            callbacks.append(lines)
        tensorboard = _tensorboard(os.path.join(args.out, LOGS_DIR))
        if tensorboard is not None:
            callbacks.append(tensorboard)
        logs = [LOGS_DIR] if tensorboard else []
        will_create(args.out, run, CHECKPOINTS_DIR, *logs)
    # One fit() per epoch, each on that epoch's fixed order of batches: a
    # resumed epoch then serves exactly the batches not trained yet.
    epoch, skip = state["epoch"], state["batch"]
    while epoch < args.epochs and not budget.exhausted:
        checkpointer.first_batch = skip
        view = dataset.epoch_view(epoch, skip=skip)
        lines.tokens = view.target_tokens
        model.fit(
            view,
            validation_data=val_dataset,
            initial_epoch=epoch,
            epochs=epoch + 1,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,
        )
        epoch, skip = checkpointer.last_state["epoch"], checkpointer.last_state["batch"]
    reason = "time budget" if budget.exhausted else f"{args.epochs} epochs"
    log(f"trained {budget.elapsed:.0f} s ({reason}), {_steps(model)} steps")
    return budget.elapsed


def _keep(args):
    """How many checkpoints to keep (``None``: all)."""
    if args.keep_checkpoints == 0:
        return None
    return args.keep_checkpoints or max(args.average_last, 2)


def _average(args, model, ckpt_dir):
    """The mean of the last ``--average-last`` checkpoints' weights (§6.1),
    up to this step: later ones (that did not load when resuming) are not of
    this training."""
    paths = checkpoints.list_checkpoints(ckpt_dir, up_to=_steps(model))
    paths = paths[-args.average_last :]
    skipped = []

    def skip_one(error):
        skipped.append(error)
        _skipping(error)

    try:
        checkpoints.average_checkpoints(model, paths, on_skip=skip_one)
    except checkpoints.CheckpointError as error:
        raise UsageError(str(error)) from None
    used = f"{len(paths) - len(skipped)} of " if skipped else ""
    log(f"averaged {used}the last {len(paths)} checkpoints")


def _train_tokenizer(args, texts):
    # The numbers task's rare words as whole pieces (see WHOLE_WORDS).
    symbols = ktd.WHOLE_WORDS if args.task else ()
    try:
        return ktd.train_tokenizer(
            texts,
            args.vocab_size,
            model_type=args.tokenizer,
            seed=args.seed,
            user_defined_symbols=symbols,
        )
    except RuntimeError as error:  # SentencePiece's checks
        message = " ".join(str(error).split())
        needed = re.search(r"required_chars\. \d+ vs (\d+)", message)
        if needed:
            pieces = "the reserved ids"
            if symbols:
                pieces += " and the pieces " + " and ".join(symbols)
            raise UsageError(
                f"--vocab-size {args.vocab_size} is too small for this text: "
                f"its characters, {pieces} need {needed.group(1)}."
            ) from None
        raise UsageError(
            f"--vocab-size {args.vocab_size}: SentencePiece cannot train a "
            f"vocabulary of that size on this text ({message})"
        ) from None


def _skipping(error):
    log(f"skipping checkpoint {error.path}: {error.reason}")


def _steps(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _describe(config):
    fields = ("num_layers", "d_model", "num_heads", "d_ff", "dropout")
    values = dataclasses.asdict(config)
    return "(" + ", ".join(f"{f}={values[f]}" for f in fields) + ")"


def _tensorboard(log_dir):
    try:
        # Keras' TensorBoard callback writes with tf.summary, which needs both.
        import tensorboard  # noqa: F401
        import tensorflow  # noqa: F401
    except ImportError:
        log("TensorFlow or TensorBoard is not installed: no TensorBoard logs")
        return None
    return keras.callbacks.TensorBoard(log_dir=log_dir, update_freq="epoch")


class _Progress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, numbering epochs out of the run's total.

    Each ``fit`` here trains one epoch, so Keras' own logger would print
    "Epoch 3/3" for the third epoch of twenty.
    """

    def __init__(self, total_epochs):
        super().__init__()
        self.total_epochs = total_epochs

    def set_params(self, params):
        super().set_params(params)
        self.epochs = self.total_epochs

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:  # the time budget ended the epoch early
            self.target = self.seen
        super().on_epoch_end(epoch, logs)


# -- after training ---------------------------------------------------------------


def _exact_match(translator, pairs, options):
    """Share of ``pairs``' sources that ``translator`` translates exactly."""
    sources, references = pairs
    hypotheses = translator.translate(sources, batch_size=256, verbose=1, **options)
    return float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)]))


def _uniform_and_edge_numbers(translator, uniform, search):
    """Exact match on numbers drawn uniformly (nine in ten have six digits,
    where the test split has a third), and the edge numbers one by one."""
    results = {}
    if uniform[0]:
        results.update(
            exact_match_uniform=_exact_match(translator, uniform, search),
            uniform_sentences=len(uniform[0]),
        )
        log(
            f"exact match on {len(uniform[0])} numbers drawn uniformly from "
            f"0-{ktd.LIMIT - 1:,}, beam size {search['beam_size']}: "
            f"{results['exact_match_uniform']:.1%}"
        )
    edges = list(ktd.EDGE_NUMBERS)
    outputs = translator.translate([ktd.english(n) for n in edges], **search)
    wrong = {
        n: out for n, out in zip(edges, outputs, strict=True) if out != ktd.german(n)
    }
    # A count, so that results.json stays flat; the log names the wrong ones.
    results.update(edge_numbers=len(edges), edge_numbers_right=len(edges) - len(wrong))
    names = ", ".join(f"{n:,}" for n in edges)
    if wrong:
        shown = "; ".join(f"{n:,} -> {out!r}" for n, out in wrong.items())
        log(f"edge numbers ({names}): {len(wrong)} wrong: {shown}")
    else:
        log(f"edge numbers ({names}): all right")
    return results


def report(path, data, trained, args):
    """Reload the saved translator, score it, print examples, write results."""
    translator = load_translator(path)  # keras.saving.load_model
    log(f"reloaded {path} with keras.saving.load_model")
    search = {"beam_size": args.beam_size, "length_penalty": args.length_penalty}
    results = {
        "trained_seconds": round(trained, 1),
        "backend": keras.backend.backend(),
        **search,
    }
    if args.task == "numbers":
        sources, _ = data["test"]
        # The configured search, then greedy search for comparison.
        runs = [("", search)]
        if args.beam_size > 1:
            runs.append(("_greedy", {"beam_size": 1}))
        for name, options in runs:
            start = time.monotonic()
            results[f"exact_match{name}"] = _exact_match(
                translator, data["test"], options
            )
            results[f"decode_seconds{name}"] = round(time.monotonic() - start, 1)
            log(
                f"exact match on the test split ({len(sources)} numbers), "
                f"beam size {options['beam_size']}: "
                f"{results[f'exact_match{name}']:.1%}"
            )
        results.update(split="test", sentences=len(sources))
        results.update(_uniform_and_edge_numbers(translator, data["uniform"], search))
        examples = [
            "three hundred forty-two",
            "twenty-one thousand five",
            "one hundred one",
            "nine hundred ninety-nine thousand nine hundred ninety-nine",
        ]
    else:
        sources, references = data["validation"]
        start = time.monotonic()
        hypotheses = translator.translate(sources, batch_size=128, verbose=1, **search)
        results.update(
            split="validation",
            sentences=len(sources),
            decode_seconds=round(time.monotonic() - start, 1),
        )
        try:
            scores = score(hypotheses, references)
        except ImportError:
            log("sacrebleu is not installed: no BLEU")
        else:
            results.update(scores)
            log(
                f"validation BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} "
                f"({scores['bleu_signature']})"
            )
        examples = sources[:4]
    translations = translator.translate(examples, **search)
    for source, target in zip(examples, translations, strict=True):
        log(f"  {source}  ->  {target}")
    # The run is finished only once its report is written: killed before,
    # the same command writes the report (and only that).
    run = read_run(args.out)
    will_create(args.out, run, RESULTS_FILE)
    checkpoints.write_json_atomic(os.path.join(args.out, RESULTS_FILE), results)
    run["status"] = "finished"
    write_run(args.out, run)
    return results


def main(argv=None):
    args = parse_args(argv)
    start_tensorflow()  # quietly, before the tokenizer needs it
    try:
        trained = train(args)
        if trained is None:
            return None  # a process other than 0 of a multi-process run
        return report(*trained, args)
    except UsageError as error:
        print(f"kt-train: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(
            "\ninterrupted: run the same command again to continue (from the last "
            f"checkpoint in {os.path.join(args.out, CHECKPOINTS_DIR)}, or with "
            "the report)",
            file=sys.stderr,
        )
        raise SystemExit(130) from None


def command():
    """The installed ``kt-train`` command (``[project.scripts]``); ``main``
    returns what it did, for callers in Python."""
    main()


if __name__ == "__main__":  # kt-launch starts the processes this way
    command()
