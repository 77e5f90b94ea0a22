"""Translate a test set with a saved Translator and score it (BLEU, chrF).

    python -m training.evaluate --model runs/x/translator.keras \\
        --source data/val.de.gz --reference data/val.en.gz \\
        [--out runs/x/eval-val.json] [--hypotheses runs/x/val.hyp] [--batch-size 64] \\
        [--beam-size 4] [--length-penalty 0.6] [--checkpoint runs/x/checkpoints/step-…]

The source and reference files are checked (same number of lines, no empty
line, valid UTF-8) before the model is loaded, and a bad file, like a missing
or damaged model, stops the run with exit status 2 and a one-line message
naming the file. Scores come from sacrebleu with its default settings
(detokenized text, 13a tokenization for BLEU). Decoding is beam search with
4 beams and length penalty 0.6 by default, as in the paper (§6.1);
``--beam-size 1`` is greedy.
``--checkpoint`` evaluates the weights of one of ``training.train``'s
checkpoint folders instead of the saved model's (e.g. the last checkpoint
rather than the average of the last few). The JSON written holds the scores,
their sacrebleu signatures and the run's model, checkpoint, data, search
settings, backend and translation time; by
default it goes next to the model as ``eval-<source name>.json``. Output files
are replaced atomically: a failed run leaves earlier results as they were.
"""

import argparse
import json
import os
import time
import warnings
import zipfile

import keras

import keras_transformer as kt
from keras_transformer import checkpoints
from keras_transformer.checkpoints import write_atomic
from keras_transformer.data.corpus import CorpusError, read_parallel


def score(hypotheses, references):
    """Corpus BLEU and chrF of translations against one reference each.

    Args:
        hypotheses: list of str, the system's translations.
        references: list of str, the reference translations, in the same
            order.

    Returns:
        dict: ``bleu`` and ``chrf`` (floats, 0 to 100), their sacrebleu
        signatures ``bleu_signature`` and ``chrf_signature`` (str),
        ``bleu_details`` (sacrebleu's one-line summary with the n-gram
        precisions and brevity penalty) and ``sentences`` (int).

    Raises:
        ValueError: the two lists differ in length.
    """
    import sacrebleu

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references."
        )
    # The metric objects, rather than sacrebleu.corpus_bleu/corpus_chrf
    # (which compute the same scores), also give the signatures.
    bleu_metric = sacrebleu.BLEU()
    chrf_metric = sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    return {
        "bleu": float(bleu.score),
        "chrf": float(chrf.score),
        "bleu_signature": str(bleu_metric.get_signature()),
        "chrf_signature": str(chrf_metric.get_signature()),
        "bleu_details": str(bleu),
        "sentences": len(hypotheses),
    }


class ModelFileError(ValueError):
    """A model file that exists but does not hold a usable translator.

    Args:
        path: the file at fault.
        reason: what is wrong with it, e.g. ``"empty file (0 bytes)"``.

    The message is ``"{path}: {reason}"``, on one line.
    """

    def __init__(self, path, reason):
        self.path = os.fsdecode(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


# Keras' messages can run to pages (the whole config of an unknown class);
# a script prints the reason on one line.
_REASON_CHARS = 300


def _one_line(error):
    text = " ".join(f"{type(error).__name__}: {error}".split())
    if len(text) > _REASON_CHARS:
        text = text[: _REASON_CHARS - 3] + "..."
    return text


def _check_archive(path):
    """Raise ``ModelFileError`` unless ``path`` is a zip with a Keras config.

    Keras reports an existing file that is not a zip (empty, truncated, or
    something else) as "File not found", and a zip without config.json with
    a bare ``KeyError``.
    """
    if not os.fsdecode(path).endswith(".keras"):
        raise ModelFileError(
            path, "name does not end in .keras (Keras loads no other model files)"
        )
    if os.path.getsize(path) == 0:
        raise ModelFileError(path, "empty file (0 bytes), not a .keras archive")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:
        with open(path, "rb") as file:
            start = file.read(4)
        # A zip starts with a local file header; one that has it but no
        # readable directory at its end was cut short or overwritten.
        if start == b"PK\x03\x04":
            raise ModelFileError(
                path, "truncated or damaged zip archive (unreadable directory)"
            ) from None
        raise ModelFileError(path, "not a zip archive, so not a .keras file") from None
    if "config.json" not in names:
        raise ModelFileError(path, "zip archive with no config.json: not a Keras model")


def load_translator(path):
    """The ``kt.Translator`` saved at ``path`` (a ``.keras`` file).

    Besides what Keras checks, the file must be a readable zip archive
    named ``*.keras`` and the translator's tokenizer must have its
    vocabulary (the asset ``vocabulary.spm``).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory.
        ModelFileError: the file is not a readable ``.keras`` archive, Keras
            cannot load it, or the tokenizer lacks its vocabulary.
        TypeError: the file holds another kind of model.
    """
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"{path}: is a directory; pass the .keras file inside it"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such model file")
    _check_archive(path)
    try:
        with warnings.catch_warnings():
            # keras-hub 0.32 opens the vocabulary asset without closing it; the
            # ResourceWarning is harmless but fatal under -W error.
            warnings.simplefilter("ignore", ResourceWarning)
            translator = keras.saving.load_model(path)
    except Exception as error:
        # Whatever Keras, h5py, zipfile (a bad CRC) or SentencePiece raise
        # for a damaged member; the original stays chained for a debugger.
        raise ModelFileError(path, f"cannot be loaded: {_one_line(error)}") from error
    if not isinstance(translator, kt.Translator):
        raise TypeError(
            f"{path}: holds a {type(translator).__name__}, not a "
            "keras_transformer Translator"
        )
    try:
        translator.check_tokenizer()
    except ValueError as error:
        raise ModelFileError(path, str(error)) from None
    return translator


def translate(translator, sources, batch_size, beam_size=4, length_penalty=0.6):
    """The translations of ``sources``, in order (the scripts' one call site
    of the decoder)."""
    return translator.translate(
        sources,
        beam_size=beam_size,
        length_penalty=length_penalty,
        batch_size=batch_size,
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


def main(argv=None):
    """Run the evaluation; ``argv`` as for ``argparse`` (None: ``sys.argv``).

    Returns:
        dict: what the JSON file holds (see the module docstring).

    Raises:
        SystemExit: status 2 for bad arguments, bad data or a missing or
            damaged model.
    """
    parser = argparse.ArgumentParser(
        prog="python -m training.evaluate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a saved translator.keras")
    parser.add_argument("--source", required=True, help="source sentences")
    parser.add_argument("--reference", required=True, help="reference translations")
    parser.add_argument(
        "--out", help="JSON results (default: <model dir>/eval-<source>.json)"
    )
    parser.add_argument("--hypotheses", help="also write the translations here")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    add_search_arguments(parser)
    parser.add_argument(
        "--checkpoint", help="a training checkpoint folder whose weights to use"
    )
    args = parser.parse_args(argv)
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
    try:
        translator = load_translator(args.model)
    except (OSError, TypeError, ModelFileError) as error:
        fail(str(error))
    if args.checkpoint is not None:
        weights = os.path.join(args.checkpoint, checkpoints.WEIGHTS_FILE)
        if not os.path.isfile(weights):
            fail(f"{args.checkpoint}: not a checkpoint folder (no {weights})")
        try:
            checkpoints.load_checkpoint(translator.transformer, args.checkpoint)
        except checkpoints.CheckpointError as error:
            fail(str(error))  # damaged: names the folder and what is wrong
        except ValueError as error:
            fail(f"{args.checkpoint}: does not fit {args.model}: {error}")

    start = time.perf_counter()
    hypotheses = translate(
        translator, sources, args.batch_size, args.beam_size, args.length_penalty
    )
    seconds = time.perf_counter() - start

    result = score(hypotheses, references)
    result.update(
        model=args.model,
        checkpoint=args.checkpoint,
        source=args.source,
        reference=args.reference,
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        backend=keras.backend.backend(),
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


if __name__ == "__main__":
    main()
