"""Translate sentences with a saved translator.

    python -m training.translate --model runs/numbers/translator.keras \\
        "three hundred forty-two" "twenty-one thousand five"
    cat sentences.txt | python -m training.translate --model runs/x/translator.keras

Sentences come from the command line, or one per line from standard input
when none are given; translations go to standard output, one per line, in
the same order. Decoding is greedy for now.
"""

import argparse
import sys

import keras_transformer as kt
from training.evaluate import load_translator, translate


def main(argv=None, stdin=None, stdout=None):
    """Run the command; returns the translations (list of str)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    parser = argparse.ArgumentParser(
        prog="python -m training.translate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a saved translator.keras")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("sentences", nargs="*", help="default: lines of stdin")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    try:
        translator = load_translator(args.model)
    except OSError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not isinstance(translator, kt.Translator):
        parser.exit(
            2,
            f"{parser.prog}: error: {args.model}: holds a "
            f"{type(translator).__name__}, not a keras_transformer Translator\n",
        )
    sentences = args.sentences or [line.rstrip("\r\n") for line in stdin]
    translations = translate(translator, sentences, args.batch_size)
    for translation in translations:
        print(translation, file=stdout)
    return translations


if __name__ == "__main__":
    main()
