"""Plot a saved translator's attention weights for one sentence as a PNG.

    kt-attention --model runs/numbers/translator.keras \\
        [--target "zweiundvierzig"] [--kind cross] [--layer -1] [--head N] \\
        --out figure.png "forty-two"

Without ``--target`` the decoder is fed the model's own greedy translation.
``--kind`` is ``cross`` (target tokens by source tokens, the default),
``encoder_self`` or ``decoder_self``; ``--layer`` and ``--head`` are Python
indices (``--layer -1``: the last layer); without ``--head`` the heads are
averaged. The PNG is written atomically and its path printed. A missing or
damaged model, a target too long for the model, or a missing optional
package (matplotlib: the plot extra), stops the run with exit status 2 and
a one-line message.
"""

import argparse
import io
import os

from keras_transformer.cli._arguments import add_verbose_argument, model_engine
from keras_transformer.cli._extras import exit_if_missing, require
from keras_transformer.cli._process import prepare_process, start_engine
from keras_transformer.trainer.checkpoints import write_atomic
from keras_transformer.translate.attention_maps import attention_maps
from keras_transformer.translate.evaluation import ModelFileError, load_translator
from keras_transformer.translate.plotting import KINDS, plot_attention_maps


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-attention", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a saved translator.keras")
    add_verbose_argument(parser)
    parser.add_argument(
        "--target", help="target sentence (default: the greedy translation)"
    )
    parser.add_argument("--kind", choices=KINDS, default="cross")
    parser.add_argument(
        "--layer", type=int, default=-1, help="Python index (default -1: the last)"
    )
    parser.add_argument(
        "--head", type=int, help="Python index (default: the mean of all heads)"
    )
    parser.add_argument("--dpi", type=int, default=100, help="PNG resolution")
    parser.add_argument("--out", required=True, help="the PNG file to write")
    parser.add_argument("source", help="one source sentence")
    return parser


def main(argv=None):
    """Run the command; ``argv`` as for ``argparse`` (None: ``sys.argv``).

    Returns:
        str: the path of the PNG written.

    Raises:
        SystemExit: status 2 for bad arguments, a missing or damaged model
            or a target the model cannot take.
    """
    parser = _parser()
    args = parser.parse_args(argv)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if args.dpi < 1:
        fail("--dpi must be >= 1")
    if os.path.isdir(args.out):
        fail(f"{args.out}: is a directory, not an output file")
    if model_engine(args.model) != "keras":
        fail(f"{args.model}: an export has no attention weights; give the .keras file")
    with exit_if_missing(parser.prog, "plot"):
        require("plot")  # before the slow part
    with exit_if_missing(parser.prog, "keras"):
        prepare_process(args.verbose)
        start_engine("keras", args.verbose)  # quietly, before the model loads
        try:
            translator = load_translator(args.model)
        except (OSError, TypeError, ModelFileError) as error:
            fail(str(error))
    try:
        maps = attention_maps(translator, args.source, args.target)
        ax = plot_attention_maps(maps, args.kind, layer=args.layer, head=args.head)
    except (ValueError, IndexError) as error:
        fail(str(error))
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=args.dpi)
    write_atomic(args.out, buffer.getvalue())
    print(args.out)
    return args.out


def command():
    """The installed ``kt-attention`` command (``[project.scripts]``); ``main``
    returns what it did, for callers in Python."""
    main()


if __name__ == "__main__":
    command()
