"""Argument types and options shared by the commands."""

import argparse
import os


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text):
    """argparse type: a float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_model_argument(parser):
    """``--model``: a saved translator, or a CTranslate2 export's directory
    (what ``evaluation.load_translator`` reads)."""
    parser.add_argument(
        "--model",
        required=True,
        help="a saved translator.keras, or a CTranslate2 export's directory",
    )


def model_engine(path):
    """What will translate the ``--model`` at ``path``: ``"ctranslate2"`` for
    a directory (the commands take no directory but an export's), else
    ``"keras"``.

    Read from the path alone, importing nothing: a command given an export
    then never loads Keras, a backend or TensorFlow, and a command given a
    ``.keras`` file starts them quietly before the model loads.
    """
    return "ctranslate2" if os.path.isdir(path) else "keras"


def add_search_arguments(parser):
    """--beam-size and --length-penalty, with the paper's defaults (§6.1)."""
    parser.add_argument(
        "--beam-size",
        type=positive_int,
        default=4,
        help="hypotheses kept per sentence (default 4, the paper's; 1 = greedy)",
    )
    parser.add_argument(
        "--length-penalty",
        type=non_negative_float,
        default=0.6,
        help="alpha of the length penalty ((5 + |Y|) / 6) ** alpha (default 0.6)",
    )


def search_options(args):
    """The ``Translator`` search arguments of a command with
    ``add_search_arguments`` and ``--batch-size``, with progress on."""
    return {
        "beam_size": args.beam_size,
        "length_penalty": args.length_penalty,
        "batch_size": args.batch_size,
        "verbose": 1,
    }


VERBOSE_HELP = (
    "show TensorFlow's, CUDA's and absl's logs at your TF_CPP_MIN_LOG_LEVEL "
    "(hidden by default, whatever it says)"
)


def add_verbose_argument(parser):
    """``--verbose``: the frameworks' start-up logs back."""
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
