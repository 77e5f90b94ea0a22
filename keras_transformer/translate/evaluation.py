"""Scoring translations and loading saved translators, for the scripts and
for users: BLEU and chrF (sacreBLEU), and a ``load_translator`` that names
what is wrong with a file that does not hold one.

Keras and the engines are imported only by the branch that loads them: a
CTranslate2 export loads without Keras, a backend or TensorFlow.
"""

import os
import zipfile


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


# The file kt-export writes into a CTranslate2 export's directory.
EXPORT_MARK = "keras_transformer.json"


def load_translator(path):
    """The ``kt.Translator`` saved at ``path`` (a ``.keras`` file), or the
    translator of a CTranslate2 export (a directory from ``kt-export
    --format ctranslate2``), which translates with the same calls.

    Besides what Keras checks, the file must be a readable zip archive
    named ``*.keras`` and the translator's tokenizer must have its
    vocabulary (the asset ``vocabulary.spm``).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory that is not a
            CTranslate2 export.
        ModelFileError: the file is not a readable ``.keras`` archive, Keras
            cannot load it, or the tokenizer lacks its vocabulary.
        TypeError: the file holds another kind of model.
        ImportError: a package the model needs is missing (ctranslate2 for
            an export; sentencepiece for a ``.keras`` file).
    """
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, EXPORT_MARK)):
            raise IsADirectoryError(
                f"{path}: is a directory but not a CTranslate2 export (no "
                f"{EXPORT_MARK}); pass the .keras file inside it"
            )
        from keras_transformer.translate.ctranslate2_translator import load_ctranslate2

        try:
            return load_ctranslate2(path)
        except ImportError:
            raise
        except Exception as error:
            raise ModelFileError(
                path, f"cannot be loaded: {_one_line(error)}"
            ) from error
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such model file")
    _check_archive(path)
    # Keras finds the classes a .keras file names only once registered: ours
    # by importing their modules. A missing package is then an ImportError,
    # not a damaged file.
    import keras
    import sentencepiece  # noqa: F401

    from keras_transformer import saving
    from keras_transformer.translate.keras_translator import Translator

    saving.register()

    try:
        translator = keras.saving.load_model(path)
    except Exception as error:
        # Whatever Keras, h5py, zipfile (a bad CRC) or SentencePiece raise
        # for a damaged member; the original stays chained for a debugger.
        raise ModelFileError(path, f"cannot be loaded: {_one_line(error)}") from error
    if not isinstance(translator, Translator):
        raise TypeError(
            f"{path}: holds a {type(translator).__name__}, not a "
            "keras_transformer Translator"
        )
    try:
        translator.check_tokenizer()
    except ValueError as error:
        raise ModelFileError(path, str(error)) from None
    return translator
