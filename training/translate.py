"""Translate sentences with a saved translator.

    python -m training.translate --model runs/numbers/translator.keras \\
        "three hundred forty-two" "twenty-one thousand five"
    cat sentences.txt | python -m training.translate --model runs/x/translator.keras

Sentences come from the command line, or one per line from standard input
when none are given; translations go to standard output, one per line, in
the same order. Decoding is beam search with 4 beams and length penalty 0.6
by default, as in the paper (§6.1); ``--beam-size 1`` is greedy. With
``--n-best N`` each sentence gives its N best translations, one per line as
``score<TAB>translation``, then an empty line.
"""

import argparse
import sys

from training.evaluate import (
    add_search_arguments,
    load_translator,
    positive_int,
    translate,
)


def main(argv=None, stdin=None, stdout=None):
    """Run the command; returns the translations (list of str)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    parser = argparse.ArgumentParser(
        prog="python -m training.translate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a saved translator.keras")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    add_search_arguments(parser)
    parser.add_argument(
        "--n-best", type=positive_int, help="print the N best (N <= --beam-size)"
    )
    parser.add_argument("sentences", nargs="*", help="default: lines of stdin")
    args = parser.parse_args(argv)
    if args.n_best is not None and args.n_best > args.beam_size:
        parser.error(
            f"--n-best {args.n_best} is more than --beam-size {args.beam_size}"
        )
    try:
        translator = load_translator(args.model)
    except (OSError, TypeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    sentences = args.sentences or [line.rstrip("\r\n") for line in stdin]
    if args.n_best is not None:
        n_best = translator.n_best(
            sentences,
            n=args.n_best,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            batch_size=args.batch_size,
        )
        for hypotheses in n_best:
            for text, score in hypotheses:
                print(f"{score:.4f}\t{text}", file=stdout)
            print(file=stdout)
        return n_best
    translations = translate(
        translator, sentences, args.batch_size, args.beam_size, args.length_penalty
    )
    for translation in translations:
        print(translation, file=stdout)
    return translations


if __name__ == "__main__":
    main()
