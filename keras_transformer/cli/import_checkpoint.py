"""Import a pretrained translation model as a translator.keras.

    kt-import hf://Helsinki-NLP/opus-mt-de-en --out runs/opus-de-en/translator.keras
    kt-import path/to/marian-checkpoint --out translator.keras [--overwrite]

SOURCE is a Marian / OPUS-MT checkpoint: a folder in Hugging Face's layout
(``config.json``, ``model.safetensors`` or ``pytorch_model.bin``,
``source.spm``, ``target.spm``, ``vocab.json``) or ``hf://owner/name``, which
is read from the Hugging Face cache or downloaded into it. The translator
written translates, evaluates, exports and serves like one trained here
(``kt-translate --model``, ``kt-serve --model``). An existing ``--out`` is
kept unless ``--overwrite`` is given, and the file is written under a
temporary name first. A checkpoint that cannot be read or expressed stops the
run with exit status 2 and one line saying why.
"""

import argparse
import os

from keras_transformer.cli._arguments import add_verbose_argument
from keras_transformer.cli._extras import exit_if_missing, require
from keras_transformer.cli._process import prepare_process, start_engine


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-import", description=__doc__.splitlines()[0]
    )
    parser.add_argument("source", help="a checkpoint folder or hf://owner/name")
    parser.add_argument("--out", required=True, help="the translator.keras to write")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out"
    )
    add_verbose_argument(parser)
    return parser


def main(argv=None):
    """Run the command; returns the path written."""
    parser = _parser()
    args = parser.parse_args(argv)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if not args.out.endswith(".keras"):
        fail(f"--out must end with .keras. Received: {args.out}")
    if os.path.exists(args.out) and not args.overwrite:
        fail(f"{args.out} exists; give --overwrite to replace it")
    prepare_process(args.verbose)
    with exit_if_missing(parser.prog, "pretrained"):
        require("pretrained")
        start_engine("keras", args.verbose)
    from keras_transformer.atomic import DiskFullError, save_model_atomic
    from keras_transformer.translate.keras_translator import Translator

    try:
        with exit_if_missing(parser.prog, "pretrained"):
            translator = Translator.from_preset(args.source)
    except (OSError, ValueError) as error:
        fail(str(error))
    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)
    try:
        save_model_atomic(translator, args.out, what="translator")
    except DiskFullError as error:
        fail(str(error))
    print(f"wrote {args.out} ({translator.engine}) from {args.source}")
    return args.out


def command():
    """The installed ``kt-import`` command (``[project.scripts]``)."""
    main()


if __name__ == "__main__":
    command()
