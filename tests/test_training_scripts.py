"""The training scripts in training/ run as written, briefly, and leave a
translator that reloads and translates."""

import contextlib
import gc
import warnings
import zipfile

import keras
import pytest

from training import numbers, parallel_corpus

# Whether a script runs does not depend on the backend; kt-train's own tests
# train on every backend.
pytestmark = [pytest.mark.once, pytest.mark.slow]


@contextlib.contextmanager
def unclosed_vocabulary_ignored():
    """keras-hub 0.32 reads the vocabulary asset with open() and no close():
    a ResourceWarning when the file is collected, which is not ours to fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()  # the unclosed files, now, inside the filter


def reloaded(path):
    with unclosed_vocabulary_ignored():
        translator = keras.saving.load_model(path)
    assert type(translator).__name__ == "Translator"
    with zipfile.ZipFile(path) as archive:
        assert "optimizer" not in archive.read("config.json").decode()
    return translator


def test_numbers_script(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--train-size", "300", "--test-size", "12"]
    with unclosed_vocabulary_ignored():
        accuracy = numbers.main([*argv, "--epochs", "1", "--minutes", "2"])
    assert 0.0 <= accuracy <= 1.0
    printed = capsys.readouterr().out
    assert f"exact match on 12 test numbers: {accuracy:.1%}" in printed
    assert "three hundred forty-two  ->  " in printed
    translator = reloaded(out / "translator.keras")
    assert all(isinstance(t, str) for t in translator.translate(["seven"]))


def test_parallel_corpus_script(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    animals = ["Hund", "Katze", "Maus", "Pferd", "Vogel", "Fisch"]
    english = ["dog", "cat", "mouse", "horse", "bird", "fish"]
    pairs = [
        (f"{n} {a}", f"{m} {e}")
        for n, m in (("ein", "a"), ("der", "the"), ("kein", "no"))
        for a, e in zip(animals, english, strict=True)
    ]
    for split, rows in (("train", pairs * 4), ("val", pairs[:5])):
        (folder / f"{split}.de").write_text("".join(d + "\n" for d, _ in rows))
        (folder / f"{split}.en").write_text("".join(e + "\n" for _, e in rows))
    out = tmp_path / "run"
    with unclosed_vocabulary_ignored():
        scores = parallel_corpus.main(
            ["--data", str(folder), "--source", "de", "--target", "en", "--out",
             str(out), "--config", "tiny", "--vocab-size", "40", "--epochs", "2",
             "--batch-tokens", "256", "--minutes", "2"]
        )  # fmt: skip
    assert 0.0 <= scores["bleu"] <= 100.0
    assert f"validation BLEU {scores['bleu']:.1f}" in capsys.readouterr().out
    reloaded(out / "translator.keras")
