"""Export a saved translator for deployment.

    kt-export --model runs/multi30k/translator.keras --format ctranslate2 \\
        --out runs/multi30k/ct2 [--quantization int8]
    kt-export --model runs/multi30k/translator.keras --format saved_model \\
        --out runs/multi30k/saved_model [--beam-size 4 --length-penalty 0.6]
    kt-export --model runs/multi30k/translator.keras --format marian \\
        --out runs/multi30k/marian [--beam-size 4 --length-penalty 0.6]

``ctranslate2`` writes a CTranslate2 model directory with the tokenizer
beside it and the translator's default search (or the one the search flags
give) as the export's; ``kt-translate`` and ``kt-evaluate`` take that
directory as ``--model``, and
``keras_transformer.export.ctranslate2.load_ctranslate2`` loads it in
Python. ``saved_model`` writes a TensorFlow SavedModel whose
signature ``translate`` maps strings (``texts``) to strings
(``translations``), the tokenizer and the beam search inside the graph, for
``tf.saved_model.load`` or TensorFlow Serving; its beam size and length
penalty are fixed when it is written. ``marian`` writes a Marian checkpoint
folder in Hugging Face's layout (``config.json``, ``model.safetensors``,
``source.spm``, ``target.spm``, ``vocab.json``, and ``generation_config.json``
with the beam size and length penalty), which transformers' ``MarianMTModel``
and ``MarianTokenizer`` load and ``Translator.from_preset`` imports back
(``keras_transformer.export.marian``). An existing non-empty
``--out`` is kept unless ``--overwrite`` is given; nothing half-written is
left behind. A missing or damaged model stops the run with exit status 2 and
one line.
"""

import argparse

from keras_transformer.cli._arguments import (
    add_search_arguments,
    add_verbose_argument,
    model_engine,
    search_options,
)
from keras_transformer.cli._extras import exit_if_missing
from keras_transformer.cli._process import prepare_process, start_engine
from keras_transformer.translate.evaluation import ModelFileError, load_translator

FORMATS = ("ctranslate2", "saved_model", "marian")


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a saved translator.keras")
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--out", required=True, help="the directory to write")
    parser.add_argument(
        "--quantization",
        help="ctranslate2 only: the weights' type (default float32; int8, ...)",
    )
    add_search_arguments(parser)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out"
    )
    add_verbose_argument(parser)
    return parser


def main(argv=None):
    """Run the command; returns the path written."""
    parser = _parser()
    args = parser.parse_args(argv)
    prepare_process(args.verbose)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if args.format != "ctranslate2" and args.quantization is not None:
        fail("--quantization applies to --format ctranslate2 only")
    engine = model_engine(args.model)
    try:
        with exit_if_missing(parser.prog, engine):
            start_engine(engine, args.verbose)  # quietly, before the model loads
            translator = load_translator(args.model)
    except (OSError, TypeError, ModelFileError) as error:
        fail(str(error))
    if not hasattr(translator, "transformer"):
        fail(f"{args.model}: is already an export; give the translator.keras")
    try:
        if args.format == "ctranslate2":
            from keras_transformer.export.ctranslate2 import export_ctranslate2

            path = export_ctranslate2(
                translator,
                args.out,
                quantization=args.quantization,
                overwrite=args.overwrite,
                search=search_options(args, translator),
            )
        elif args.format == "marian":
            from keras_transformer.export.marian import write_marian

            path = write_marian(
                translator,
                args.out,
                overwrite=args.overwrite,
                search=search_options(args, translator),
            )
        else:
            from keras_transformer.export.saved_model import export_saved_model

            path = export_saved_model(
                translator,
                args.out,
                search=search_options(args, translator),
                overwrite=args.overwrite,
            )
    except (FileExistsError, ImportError, ValueError) as error:
        fail(str(error))
    print(f"wrote {path or args.out}")
    return path or args.out


def command():
    """The installed ``kt-export`` command (``[project.scripts]``); ``main``
    returns what it did, for callers in Python."""
    main()


if __name__ == "__main__":
    command()
