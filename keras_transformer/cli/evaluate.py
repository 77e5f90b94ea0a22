"""Translate a test set with a saved Translator and score it (BLEU, chrF).

    kt-evaluate --model runs/x/translator.keras (or a CTranslate2 export's directory) \\
        --source data/val.de.gz --reference data/val.en.gz \\
        [--out runs/x/eval-val.json] [--hypotheses runs/x/val.hyp] [--batch-size N] \\
        [--beam-size N] [--length-penalty A] [--glossary terms.tsv] \\
        [--checkpoint runs/x/checkpoints/step-…]

The source and reference files are checked (same number of lines, no empty
line, valid UTF-8) before the model is loaded, and a bad file, like a missing
or damaged model, stops the run with exit status 2 and a one-line message
naming the file. Scores come from sacrebleu with its default settings
(detokenized text, 13a tokenization for BLEU). Decoding is the model's own
search by default (a translator trained here: the paper's 4 beams and length
penalty 0.6, §6.1; an imported one: its generation config); ``--beam-size 1``
is greedy. ``--glossary`` (one ``source term<TAB>target
term`` per line, read and checked before the model too) makes each
translation hold the target terms of the source terms its sentence holds.
``--checkpoint`` evaluates the weights of one of ``kt-train``'s
checkpoint folders instead of the saved model's (e.g. the last checkpoint
rather than the average of the last few). The JSON written holds the scores,
their sacrebleu signatures and the run's model, checkpoint, data, search
settings, glossary file, backend, engine (``keras jax float32``,
``ctranslate2 int8``, ...) and translation time; by
default it goes next to the model as ``eval-<source name>.json``. Output files
are replaced atomically: a failed run leaves earlier results as they were.
"""

import argparse
import json
import os
import time

from keras_transformer.atomic import write_atomic
from keras_transformer.cli._arguments import (
    add_glossary_argument,
    add_model_argument,
    add_search_arguments,
    add_target_language_argument,
    add_verbose_argument,
    check_glossary,
    model_engine,
    read_glossary_argument,
    search_options,
)
from keras_transformer.cli._extras import exit_if_missing, require
from keras_transformer.cli._process import prepare_process, start_engine
from keras_transformer.data.corpus import CorpusError, read_parallel
from keras_transformer.translate.evaluation import (
    ModelFileError,
    load_translator,
    score,
)


def default_out(model_path, source_path):
    """The default JSON path: ``<model dir>/eval-<source stem>.json``.

    The stem is the file name without ``.gz`` and its last suffix, so
    ``val.de`` and ``val.de.gz`` both give ``eval-val.json``.
    """
    name = os.path.basename(source_path)
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    stem = os.path.splitext(name)[0]
    return os.path.join(os.path.dirname(model_path), f"eval-{stem}.json")


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-evaluate", description=__doc__.splitlines()[0]
    )
    add_model_argument(parser)
    add_verbose_argument(parser)
    parser.add_argument("--source", required=True, help="source sentences")
    parser.add_argument("--reference", required=True, help="reference translations")
    parser.add_argument(
        "--out", help="JSON results (default: <model dir>/eval-<source>.json)"
    )
    parser.add_argument("--hypotheses", help="also write the translations here")
    add_search_arguments(parser, batch_size=True)
    add_target_language_argument(parser)
    add_glossary_argument(parser)
    parser.add_argument(
        "--checkpoint", help="a training checkpoint folder whose weights to use"
    )
    return parser


def _load_checkpoint(translator, args, fail):
    """The weights of ``--checkpoint`` into the translator's model."""
    from keras_transformer.trainer import checkpoints

    weights = os.path.join(args.checkpoint, checkpoints.WEIGHTS_FILE)
    if not os.path.isfile(weights):
        fail(f"{args.checkpoint}: not a checkpoint folder (no {weights})")
    try:
        checkpoints.load_checkpoint(translator.transformer, args.checkpoint)
    except checkpoints.CheckpointError as error:
        fail(str(error))  # damaged: names the folder and what is wrong
    except ValueError as error:
        fail(f"{args.checkpoint}: does not fit {args.model}: {error}")


def main(argv=None):
    """Run the evaluation; ``argv`` as for ``argparse`` (None: ``sys.argv``).

    Returns:
        dict: what the JSON file holds (see the module docstring).

    Raises:
        SystemExit: status 2 for bad arguments, bad data or a missing or
            damaged model.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    engine = model_engine(args.model)
    with exit_if_missing(parser.prog, "score"):
        require("score")
    with exit_if_missing(parser.prog, engine):
        prepare_process(args.verbose)
        start_engine(engine, args.verbose)  # quietly, before the model loads
    out = args.out or default_out(args.model, args.source)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    # Everything that can be checked cheaply is, before the slow part.
    for path in (out, args.hypotheses):
        if path is not None and os.path.isdir(path):
            fail(f"{path}: is a directory, not an output file")
    try:
        sources, references = read_parallel(args.source, args.reference)
    except CorpusError as error:
        fail(str(error))
    glossary = read_glossary_argument(parser, args.glossary)
    try:
        with exit_if_missing(parser.prog, engine):
            translator = load_translator(args.model)
    except (OSError, TypeError, ModelFileError) as error:
        fail(str(error))
    if args.checkpoint is not None:
        if not hasattr(translator, "transformer"):
            fail(f"--checkpoint: {args.model} is an export, not a translator.keras")
        _load_checkpoint(translator, args, fail)

    try:
        sources = translator.with_target_language(sources, args.target_language)
        check_glossary(translator, sources, glossary)
    except ValueError as error:
        fail(str(error))
    search = search_options(args, translator, verbose=1)
    start = time.perf_counter()
    hypotheses = translator.translate(sources, search, glossary=glossary)
    seconds = time.perf_counter() - start

    import keras  # here, not on import: the process settings come first

    result = score(hypotheses, references)
    result.update(
        model=args.model,
        checkpoint=args.checkpoint,
        source=args.source,
        reference=args.reference,
        beam_size=search.beam_size,
        length_penalty=search.length_penalty,
        length_penalty_form=search.length_penalty_form,
        glossary=args.glossary,
        backend=keras.backend.backend(),
        engine=translator.engine,
        seconds=round(seconds, 3),
    )
    # Hypotheses first: the JSON, written last, marks a finished run.
    if args.hypotheses:
        write_atomic(args.hypotheses, "".join(f"{h}\n" for h in hypotheses))
    write_atomic(out, json.dumps(result, indent=2, ensure_ascii=False) + "\n")

    print(
        f"BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  "
        f"({result['sentences']} sentences, {seconds:.1f} s)"
    )
    print(f"  {result['bleu_details']}")
    print(f"  wrote {out}")
    return result


def command():
    """The installed ``kt-evaluate`` command (``[project.scripts]``); ``main``
    returns what it did, for callers in Python."""
    main()


if __name__ == "__main__":
    command()
