"""Argument types and options shared by the commands."""

import argparse
import os

from keras_transformer.search import options


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


def _checked_by(parse, check, name):
    """argparse type: the text parsed, then ``SearchOptions``' own check of
    the field (one check, whatever the value came from)."""

    def convert(text):
        try:
            return check(parse(text))
        except ValueError as error:
            message = str(error).removeprefix(f"{name} ")
            raise argparse.ArgumentTypeError(message) from None

    convert.__name__ = parse.__name__  # argparse names the type on errors
    return convert


def add_search_arguments(parser, batch_size=False):
    """--beam-size and --length-penalty (and --batch-size), their defaults
    and checks those of ``SearchOptions`` (the paper's, §6.1)."""
    parser.add_argument(
        "--beam-size",
        type=_checked_by(int, options.check_beam_size, "beam_size"),
        default=options.BEAM_SIZE,
        help="hypotheses kept per sentence (default %(default)s, the paper's; "
        "1 = greedy)",
    )
    parser.add_argument(
        "--length-penalty",
        type=_checked_by(float, options.check_length_penalty, "length_penalty"),
        default=options.LENGTH_PENALTY,
        help="alpha of the length penalty ((5 + |Y|) / 6) ** alpha "
        "(default %(default)s)",
    )
    if batch_size:
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            help="sentences searched together (default: the engine's, 64 for "
            "a .keras model, measured values for a CTranslate2 export)",
        )


def search_options(args, **fields):
    """The ``SearchOptions`` of a command with ``add_search_arguments``,
    with ``fields`` added (``verbose=1``: progress on stderr)."""
    return options.SearchOptions(
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        batch_size=getattr(args, "batch_size", None),
        **fields,
    )


VERBOSE_HELP = (
    "show TensorFlow's, CUDA's and absl's logs at your TF_CPP_MIN_LOG_LEVEL "
    "(hidden by default, whatever it says)"
)


def add_verbose_argument(parser):
    """``--verbose``: the frameworks' start-up logs back."""
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
