"""Validation BLEU against training minutes: score the checkpoints of a run, plot.

    python -m benchmarks.bleu_curve score --run runs/multi30k \\
        --source val.de.gz --reference val.en.gz [--average-last K] \\
        [--beam-size 1] [--label ours] [--out curve.json]
    python -m benchmarks.bleu_curve plot curve.json other.json --out bleu.png

``score`` translates the source file with the weights of each checkpoint of
a ``kt-train`` run (train it with ``--keep-checkpoints 0`` to keep them
all), each averaged with the ones before it as the run's ``--average-last``
averages the final model (§6.1), so every point is the model a run stopped
there would have saved. Each point records the training seconds the
checkpoint was taken at (``elapsed_seconds`` of its state, carried over
resumes), its step and sacreBLEU's BLEU and chrF. The JSON (default
``<run>/curve-<source name>.json``) is rewritten atomically after every
point: an interrupted scoring keeps the points done.

``plot`` draws one line per JSON file (``label`` names it), BLEU against
minutes, with matplotlib (the ``plot`` extra). Other scripts (such as
``benchmarks/keras_hub_recipe.py``) write the same JSON: ``label`` and
``points``, each with ``minutes`` and ``bleu``.
"""

import argparse
import json
import os
import time

from keras_transformer.cli._arguments import (
    add_search_arguments,
    positive_int,
    search_options,
)
from keras_transformer.cli._process import prepare_process, start_tensorflow
from keras_transformer.cli.evaluate import default_out
from keras_transformer.data.corpus import CorpusError, read_parallel
from keras_transformer.trainer import checkpoints
from keras_transformer.trainer.checkpoints import write_atomic
from keras_transformer.translate.evaluation import (
    ModelFileError,
    load_translator,
    score,
)


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bleu_curve", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    scoring = commands.add_parser("score", help="score the checkpoints of a run")
    scoring.add_argument("--run", required=True, help="a kt-train --out folder")
    scoring.add_argument("--source", required=True, help="source sentences")
    scoring.add_argument("--reference", required=True, help="reference translations")
    scoring.add_argument(
        "--average-last",
        type=positive_int,
        help="average each checkpoint with the K-1 before it (default: the run's)",
    )
    scoring.add_argument(
        "--every-minutes",
        type=float,
        default=0.0,
        help="skip checkpoints taken less than M training minutes after the "
        "last one scored (the last checkpoint is always scored)",
    )
    scoring.add_argument("--label", help="the curve's name (default: the run folder)")
    scoring.add_argument("--out", help="JSON (default: <run>/curve-<source>.json)")
    scoring.add_argument("--batch-size", type=positive_int, default=64)
    add_search_arguments(scoring)
    plotting = commands.add_parser("plot", help="draw curves from JSON files")
    plotting.add_argument("curves", nargs="+", help="JSON files of this tool's score")
    plotting.add_argument("--out", required=True, help="image file (.png, .svg)")
    plotting.add_argument("--title", default="Validation BLEU against training time")
    return parser


def _read_run(run, fail):
    """``(translator, run.json's settings, checkpoint folders)`` of a run."""
    try:
        with open(os.path.join(run, "run.json"), encoding="utf-8") as file:
            settings = json.load(file)["settings"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        fail(f"{run}: not a kt-train run folder (run.json: {error})")
    paths = checkpoints.list_checkpoints(os.path.join(run, "checkpoints"))
    if not paths:
        fail(f"{run}: no checkpoints in {os.path.join(run, 'checkpoints')}")
    try:
        translator = load_translator(os.path.join(run, "translator.keras"))
    except (OSError, TypeError, ModelFileError) as error:
        fail(f"{run}: {error} (the run must be finished)")
    return translator, settings, paths


def spaced(minutes, every_minutes):
    """Indices of the points to score, from their training minutes: the
    first, each one at least ``every_minutes`` after the last one kept, and
    the last."""
    kept = []
    for index, value in enumerate(minutes):
        final = index == len(minutes) - 1
        if final or not kept or value - minutes[kept[-1]] >= every_minutes:
            kept.append(index)
    return kept


def point(checkpoint, step, seconds, result, scoring_seconds, **extra):
    """One point of a curve: the checkpoint's file name, its step and
    training minutes, ``extra`` (e.g. ``averaged``), and sacreBLEU's BLEU and
    chrF from ``result`` (``evaluation.score``), with the scoring's seconds."""
    return {
        "checkpoint": os.path.basename(os.path.normpath(checkpoint)),
        "step": step,
        "minutes": round(seconds / 60, 3),
        **extra,
        "bleu": result["bleu"],
        "chrf": result["chrf"],
        "seconds": round(scoring_seconds, 1),
    }


def score_run(args, fail):
    """The ``score`` command: one point per checkpoint, written as it goes."""
    # kt-evaluate's default name, "eval-<source>.json", as "curve-<source>.json".
    name = os.path.basename(default_out("translator.keras", args.source))
    out = args.out or os.path.join(args.run, "curve-" + name[len("eval-") :])
    try:
        sources, references = read_parallel(args.source, args.reference)
    except CorpusError as error:
        fail(str(error))
    translator, settings, paths = _read_run(args.run, fail)
    search = search_options(args, translator)
    average_last = args.average_last or settings.get("average_last") or 1
    curve = {
        "label": args.label or os.path.basename(os.path.normpath(args.run)),
        "run": args.run,
        "source": args.source,
        "reference": args.reference,
        "average_last": average_last,
        "beam_size": search.beam_size,
        "length_penalty": search.length_penalty,
        "points": [],
    }
    try:
        states = [checkpoints.read_state(path) for path in paths]
    except checkpoints.CheckpointError as error:
        fail(str(error))
    seconds = [state.get("elapsed_seconds") or 0.0 for state in states]
    for index in spaced([value / 60 for value in seconds], args.every_minutes):
        path, state = paths[index], states[index]
        window = paths[max(0, index - average_last + 1) : index + 1]
        try:
            checkpoints.average_checkpoints(translator.transformer, window)
        except checkpoints.CheckpointError as error:
            fail(str(error))
        start = time.perf_counter()
        hypotheses = translator.translate(sources, search)
        result = score(hypotheses, references)
        done = point(
            path,
            state.get("iterations"),
            seconds[index],
            result,
            time.perf_counter() - start,
            averaged=len(window),
        )
        curve["points"].append(done)
        curve["bleu_signature"] = result["bleu_signature"]
        write_atomic(out, json.dumps(curve, indent=2) + "\n")
        print(
            f"{done['checkpoint']}: {done['minutes']:.1f} min, "
            f"BLEU {done['bleu']:.2f}, chrF {done['chrf']:.2f}",
            flush=True,
        )
    print(f"wrote {out}")
    return curve


def read_curve(path):
    """A curve JSON's ``(label, minutes, bleu)``; ValueError names the file."""
    try:
        with open(path, encoding="utf-8") as file:
            curve = json.load(file)
        points = curve["points"]
        minutes = [float(p["minutes"]) for p in points]
        bleu = [float(p["bleu"]) for p in points]
        label = str(curve.get("label", os.path.basename(path)))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a curve file ({error!r})") from None
    if not points:
        raise ValueError(f"{path}: not a curve file (no points)")
    return label, minutes, bleu


def plot_curves(curves, out, title):
    """Draw ``(label, minutes, bleu)`` lines into the image file ``out``."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.add_subplot()
    for label, minutes, bleu in curves:
        ax.plot(minutes, bleu, marker="o", markersize=3, label=label)
    ax.set_xlabel("training minutes")
    ax.set_ylabel("validation BLEU (sacreBLEU)")
    ax.set_title(title)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    figure.savefig(out, dpi=120)


def main(argv=None):
    """Run ``score`` or ``plot``; returns the curve (score) or the curves
    drawn (plot). Bad arguments, files or runs: exit status 2, one line."""
    parser = _parser()
    args = parser.parse_args(argv)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if args.command == "plot":
        try:
            curves = [read_curve(path) for path in args.curves]
        except ValueError as error:
            fail(str(error))
        plot_curves(curves, args.out, args.title)
        print(f"wrote {args.out}")
        return curves
    prepare_process()
    start_tensorflow()  # quietly, before the tokenizer needs it
    return score_run(args, fail)


if __name__ == "__main__":
    main()
