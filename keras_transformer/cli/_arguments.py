"""Argument types and options shared by the commands."""

import argparse
import os

from keras_transformer.search import options
from keras_transformer.translate.glossary import GlossaryError, read_glossary_file


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
    """--beam-size, --length-penalty and --length-penalty-form (and
    --batch-size), checked as ``SearchOptions`` checks them; left out, the
    model's own (``default_search``: the paper's, §6.1, for a model trained
    here; its generation config's for an imported one)."""
    parser.add_argument(
        "--beam-size",
        type=_checked_by(int, options.check_beam_size, "beam_size"),
        help="hypotheses kept per sentence (default: the model's; the paper's "
        f"{options.BEAM_SIZE} for a model trained here; 1 = greedy)",
    )
    parser.add_argument(
        "--length-penalty",
        type=_checked_by(float, options.check_length_penalty, "length_penalty"),
        help="alpha of the length penalty (default: the model's; the paper's "
        f"{options.LENGTH_PENALTY} for a model trained here)",
    )
    parser.add_argument(
        "--length-penalty-form",
        choices=options.LENGTH_PENALTY_FORMS,
        help="gnmt: the paper's search, ((5 + |Y|) / 6) ** alpha; transformers: "
        "transformers' generate, |Y| ** alpha (default: the model's; gnmt for "
        "a model trained here)",
    )
    if batch_size:
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            help="sentences searched together (default: the engine's, 64 for "
            "a .keras model, measured values for a CTranslate2 export)",
        )


def add_target_language_argument(parser):
    """--target-language, for a model that translates into several."""
    parser.add_argument(
        "--target-language",
        help="the language to translate into, for a model that translates "
        "into several (an imported multi-target Marian model: fra for >>fra<<)",
    )


def add_glossary_argument(parser):
    """``--glossary``: terms the translations must use."""
    parser.add_argument(
        "--glossary",
        metavar="FILE.tsv",
        help="terms the translations must use: UTF-8 text, one "
        "'source term<TAB>target term' per line (# starts a comment); each "
        "source term a sentence holds makes its target term part of the "
        "translation",
    )


def read_glossary_argument(parser, path):
    """The glossary at ``--glossary``'s ``path`` (None without one), read
    before the model loads: a bad file ends the command at once with status
    2 and a message naming the file and line, not after seconds of loading.
    """
    if path is None:
        return None
    try:
        return read_glossary_file(path)
    except GlossaryError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


def check_glossary(translator, texts, glossary):
    """Raise ``ValueError`` now for what would stop the search at its start,
    so that a command reports it like other bad input: a glossary for an
    engine that cannot follow one, or a target term of an entry ``texts``
    use that the model's vocabulary cannot spell."""
    if glossary is not None:
        translator.constraint_ids(texts, glossary)


SEARCH_FLAGS = ("beam_size", "length_penalty", "length_penalty_form", "batch_size")


def search_options(args, translator, **fields):
    """The ``SearchOptions`` of a command with ``add_search_arguments``: the
    translator's own, with the flags given and ``fields`` replacing its
    fields (``verbose=1``: progress on stderr)."""
    given = {
        name: getattr(args, name)
        for name in SEARCH_FLAGS
        if getattr(args, name, None) is not None
    }
    return translator.search_options(**given, **fields)


VERBOSE_HELP = (
    "show TensorFlow's, CUDA's and absl's logs at your TF_CPP_MIN_LOG_LEVEL "
    "(hidden by default, whatever it says)"
)


def add_verbose_argument(parser):
    """``--verbose``: the frameworks' start-up logs back."""
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
