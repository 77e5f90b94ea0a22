"""Translate sentences with a saved translator.

    kt-translate --model runs/numbers/translator.keras \\
        "three hundred forty-two" "twenty-one thousand five"
    cat sentences.txt | kt-translate --model runs/x/translator.keras

Sentences come from the command line, or one per line from standard input
when none are given; translations go to standard output, one per line, in
the same order. Decoding is the model's own search by default (a translator
trained here: the paper's 4 beams and length penalty 0.6, §6.1; an imported
one: its generation config); ``--beam-size 1`` is greedy. With
``--n-best N`` each sentence gives its N best translations, one per line as
``score<TAB>translation``, then an empty line. With ``--glossary FILE.tsv``
(one ``source term<TAB>target term`` per line) each translation holds the
target terms of the source terms its sentence holds
(``keras_transformer.translate.glossary`` says how terms match). A missing
or damaged model stops the run with exit status 2 and a one-line message
naming the file, and so do a missing optional package (naming the extra to
install) and a bad glossary file (naming the line, before the model loads).

Given a CTranslate2 export (a directory), the command imports neither Keras
nor a backend nor TensorFlow: the engine is chosen from the path before
anything heavy is imported.
"""

import argparse
import os
import sys

from keras_transformer.cli._arguments import (
    add_glossary_argument,
    add_model_argument,
    add_search_arguments,
    add_target_language_argument,
    add_verbose_argument,
    check_glossary,
    model_engine,
    positive_int,
    read_glossary_argument,
    search_options,
)
from keras_transformer.cli._extras import exit_if_missing
from keras_transformer.cli._process import prepare_process, start_engine
from keras_transformer.translate.evaluation import ModelFileError, load_translator


def read_sentences(arguments, stdin):
    """The sentences to translate: ``arguments``, or else the lines of stdin.

    Raises:
        ValueError: text that is not valid UTF-8, named by where it came from.
    """
    if arguments:
        sentences, source = list(arguments), "argument"
    else:
        source = "standard input, line"
        try:
            sentences = [line.rstrip("\r\n") for line in stdin]
        except UnicodeDecodeError as error:
            # Decoding runs by chunks, so the line is not known.
            raise ValueError(
                f"standard input is not valid UTF-8 text ({error.reason})"
            ) from None
    for number, sentence in enumerate(sentences, 1):
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError:
            # Arguments (and stdin in the C locale) that are not UTF-8 arrive
            # as lone surrogates, which the tokenizer cannot take.
            raise ValueError(
                f"{source} {number} is not valid UTF-8 text: {sentence[:60]!r}"
            ) from None
    return sentences


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-translate", description=__doc__.splitlines()[0]
    )
    add_model_argument(parser)
    add_verbose_argument(parser)
    add_search_arguments(parser, batch_size=True)
    add_target_language_argument(parser)
    add_glossary_argument(parser)
    parser.add_argument(
        "--n-best", type=positive_int, help="print the N best (N <= --beam-size)"
    )
    parser.add_argument("sentences", nargs="*", help="default: lines of stdin")
    return parser


def main(argv=None, stdin=None, stdout=None):
    """Run the command; returns the translations (list of str)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    parser = _parser()
    args = parser.parse_args(argv)
    if args.n_best is not None and args.n_best > (args.beam_size or args.n_best):
        parser.error(
            f"--n-best {args.n_best} is more than --beam-size {args.beam_size}"
        )
    glossary = read_glossary_argument(parser, args.glossary)
    if not os.path.exists(args.model):  # before seconds of imports
        parser.exit(2, f"{parser.prog}: error: {args.model}: no such model file\n")
    engine = model_engine(args.model)
    with exit_if_missing(parser.prog, engine):
        prepare_process(args.verbose, keras=engine == "keras")
        start_engine(engine, args.verbose)  # quietly, before the model loads
        try:
            translator = load_translator(args.model)
        except (OSError, TypeError, ModelFileError) as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
    try:
        sentences = read_sentences(args.sentences, stdin)
        sentences = translator.with_target_language(sentences, args.target_language)
        check_glossary(translator, sentences, glossary)
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    search = search_options(args, translator, verbose=1)
    if args.n_best is not None and args.n_best > search.beam_size:
        parser.exit(
            2,
            f"{parser.prog}: error: --n-best {args.n_best} is more than the "
            f"model's beam size {search.beam_size}\n",
        )
    if args.n_best is not None:
        n_best = translator.n_best(
            sentences, n=args.n_best, search=search, glossary=glossary
        )
        for hypotheses in n_best:
            for text, score in hypotheses:
                print(f"{score:.4f}\t{text}", file=stdout)
            print(file=stdout)
        return n_best
    translations = translator.translate(sentences, search, glossary=glossary)
    for translation in translations:
        print(translation, file=stdout)
    return translations


def command():
    """The installed ``kt-translate`` command (``[project.scripts]``); ``main``
    returns what it did, for callers in Python."""
    main()


if __name__ == "__main__":
    command()
