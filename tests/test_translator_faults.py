"""Faults a Translator and the scripts that load one must report clearly.

Bad sentences, bad search arguments and damaged ``.keras`` files each give
an error that names what is wrong (and, for a file, which file), raised
before any decoding; the scripts turn a damaged file into exit status 2 and
one line on stderr.
"""

import io
import os
import re
import subprocess
import sys
import zipfile

import keras
import pytest

import keras_transformer as kt
from keras_transformer.cli import attention, evaluate, translate
from keras_transformer.data import tokenizer as tk
from keras_transformer.search import options
from keras_transformer.translate import evaluation
from tests.test_evaluate import SENTENCES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One decoding setting throughout: the compiled search is built once.
FAST = dict(beam_size=1, max_output_length=3)
TEXTS = ["a man is walking", "the dog and the cat"]


@pytest.fixture(scope="module")
def translator():
    """An untrained tiny translator (the faults need no trained weights)."""
    keras.utils.set_random_seed(0)
    tokenizer = tk.make_tokenizer(tk.train_tokenizer(SENTENCES, 80))
    model = kt.build_model(
        "tiny",
        src_vocab_size=tokenizer.vocabulary_size(),
        share_embeddings=True,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        max_length=16,
    )
    return kt.Translator(tokenizer, model)


@pytest.fixture(scope="module")
def saved(translator, tmp_path_factory):
    """The translator's .keras file and its bytes, to check it stays intact."""
    path = tmp_path_factory.mktemp("model") / "translator.keras"
    translator.save(path)
    return path, path.read_bytes()


def refused(case, error, pattern, call):
    """Check that ``call()`` raises ``error`` with a message matching
    ``pattern``; ``case`` says which of a test's calls failed."""
    try:
        call()
    except error as raised:
        assert re.search(pattern, str(raised)), f"{case}: {raised}"
    else:
        pytest.fail(f"{case}: did not raise {error.__name__}")


def unconsumed(texts):
    """A generator of ``texts`` and the list of those it has handed out."""
    taken = []

    def generate():
        for text in texts:
            taken.append(text)
            yield text

    return generate(), taken


# -- sentences -----------------------------------------------------------------

METHODS = ["translate", "translate_ids", "n_best"]


# Unchecked, the words "None", "b'a man'" ... would be translated, with a
# warning about their unknown characters; ignoring it lets such a run fail
# as "did not raise".
@pytest.mark.once
@pytest.mark.filterwarnings("ignore:.*tokenizer has never seen:UserWarning")
@pytest.mark.parametrize("method", METHODS)
def test_a_sentence_that_is_not_text_is_refused(translator, method):
    search = getattr(translator, method)
    for item, type_name in [
        (None, "NoneType"),
        (b"a man", "bytes"),
        (42, "int"),
        (["a"], "list"),
    ]:
        refused(
            f"{method}([str, {item!r}])",
            TypeError,
            rf"^texts\[1\] must be str, got {type_name}$",
            lambda item=item: search([TEXTS[0], item], **FAST),
        )
    # Not keras-hub's "List elements must be str or bytes".
    refused(
        f"{method}([str, str, lone surrogate])",
        ValueError,
        r"^texts\[2\] cannot be encoded as UTF-8 .*'\\ud800' at index 3$",
        lambda: search([*TEXTS, "abc\ud800"], **FAST),
    )


@pytest.mark.once
def test_iterables_of_str_are_accepted_but_not_one_string(translator):
    expected = translator.translate(TEXTS, **FAST)
    assert translator.translate(tuple(TEXTS), **FAST) == expected
    generator, taken = unconsumed(TEXTS)
    assert translator.translate(generator, **FAST) == expected
    assert taken == TEXTS
    for one in ("a man", b"a man"):
        with pytest.raises(TypeError, match="not one string"):
            translator.translate(one, **FAST)
    with pytest.raises(TypeError, match="texts must be an iterable of str, got int"):
        translator.translate(42, **FAST)


@pytest.mark.once
def test_translate_command_refuses_text_that_is_not_utf8(saved, capsys):
    model = str(saved[0])
    # Bytes that are not UTF-8: from a strict stdin, a UnicodeDecodeError;
    # from the command line (or a C-locale stdin), lone surrogates.
    runs = [
        ([], io.TextIOWrapper(io.BytesIO(b"a man\n\xff\n"), encoding="utf-8")),
        ([], io.StringIO("a man\nabc\udcff\n")),
        (["a man", "abc\udcff"], None),
    ]
    expected = [
        "standard input is not valid UTF-8 text",
        "standard input, line 2 is not valid UTF-8 text: 'abc\\udcff'",
        "argument 2 is not valid UTF-8 text: 'abc\\udcff'",
    ]
    for (sentences, stdin), message in zip(runs, expected, strict=True):
        with pytest.raises(SystemExit) as raised:
            translate.main(["--model", model, *sentences], stdin=stdin)
        assert raised.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("kt-translate: error: ")
        assert message in captured.err and captured.err.count("\n") == 1


@pytest.mark.once
def test_a_tokenizer_without_vocabulary_is_named(saved, tmp_path):
    # keras.saving.load_model (rather than load_translator) accepts the file;
    # translating says what is missing instead of keras-hub's "No vocabulary
    # has been set ... pass a `proto` argument".
    path = damage("no vocabulary", saved, tmp_path)
    loaded = keras.saving.load_model(path)
    with pytest.raises(ValueError, match="tokenizer has no vocabulary.*vocabulary.spm"):
        loaded.translate(TEXTS, **FAST)


# -- search arguments ----------------------------------------------------------

BAD_ARGUMENTS = [
    # (argument, value, error, message)
    ("beam_size", "4", TypeError, "beam_size must be an int"),
    ("beam_size", True, TypeError, "beam_size must be an int"),
    ("beam_size", 2.0, TypeError, "beam_size must be an int"),
    ("beam_size", 0, ValueError, "beam_size must be >= 1"),
    ("length_penalty", "0.6", TypeError, "length_penalty must be a number"),
    ("length_penalty", True, TypeError, "length_penalty must be a number"),
    ("length_penalty", None, TypeError, "length_penalty must be a number"),
    ("length_penalty", -0.5, ValueError, "length_penalty must be >= 0 and finite"),
    ("length_penalty", float("inf"), ValueError, "must be >= 0 and finite"),
    ("length_penalty", float("nan"), ValueError, "must be >= 0 and finite"),
    ("batch_size", "4", TypeError, "batch_size must be an int or None"),
    ("batch_size", True, TypeError, "batch_size must be an int"),
    ("batch_size", 0, ValueError, "batch_size must be >= 1"),
    ("max_output_length", "4", TypeError, "max_output_length must be an int"),
    ("max_output_length", True, TypeError, "max_output_length must be an int"),
    ("max_output_length", 0, ValueError, "max_output_length must be >= 1"),
    ("use_cache", "no", TypeError, "use_cache must be a bool"),
    ("fixed_batch", "yes", TypeError, "fixed_batch must be a bool"),
    ("use_cache", None, TypeError, "use_cache must be a bool"),
]


@pytest.mark.once
@pytest.mark.parametrize("method", METHODS)
def test_bad_search_arguments_are_refused_before_any_work(translator, method):
    search = getattr(translator, method)
    for name, value, error, message in BAD_ARGUMENTS:
        case = f"{method}({name}={value!r})"
        generator, taken = unconsumed(TEXTS)
        refused(
            case,
            error,
            message,
            lambda generator=generator, name=name, value=value: search(
                generator, **{**FAST, name: value}
            ),
        )
        # Refused before a sentence was read (let alone encoded or decoded).
        assert taken == [], f"{case} read sentences before refusing"


@pytest.mark.once
def test_n_best_checks_beam_size_before_n(translator):
    # n defaults to beam_size: a bad beam_size was reported as a bad n.
    with pytest.raises(TypeError, match="beam_size must be an int.*'4'"):
        translator.n_best(TEXTS, beam_size="4")
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        translator.n_best(TEXTS, beam_size=0)
    with pytest.raises(TypeError, match="n must be an int"):
        translator.n_best(TEXTS, n="2", beam_size=2)
    with pytest.raises(ValueError, match="n must be between 1 and beam_size=2"):
        translator.n_best(TEXTS, n=3, beam_size=2)


def test_numpy_numbers_are_search_arguments(translator):
    import numpy as np

    assert options.check_beam_size(np.int64(3)) == 3
    assert options.check_length_penalty(np.float32(0.5)) == 0.5
    assert options.check_length_penalty(1) == 1.0
    assert type(options.check_length_penalty(np.float32(0.5))) is float
    # The checkers that decoding.beam_search uses directly.
    for value in ("0.6", True, None):
        with pytest.raises(TypeError, match="length_penalty must be a number"):
            options.check_length_penalty(value)
    # 1e308 is finite in Python but infinite in float32, where the search
    # computes; an int past float's range too.
    for value in (float("inf"), float("nan"), -1e-9, 1e308, 10**400):
        with pytest.raises(ValueError, match="must be >= 0 and finite"):
            options.check_length_penalty(value)
    expected = translator.translate(TEXTS, **FAST)
    numpy_fast = dict(
        beam_size=np.int32(1),
        max_output_length=np.int64(3),
        length_penalty=np.float64(0.6),
        batch_size=np.int64(64),
        use_cache=np.bool_(True),
    )
    assert translator.translate(TEXTS, **numpy_fast) == expected


# -- damaged files -------------------------------------------------------------


def damage(kind, saved, directory):
    """A damaged copy of the saved translator (or a path with no file)."""
    original, data = saved
    path = directory / "copy.keras"
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "not a zip":
        path.write_text("these are not the weights you are looking for\n" * 20)
    elif kind == "no vocabulary":
        with (
            zipfile.ZipFile(original) as source,
            zipfile.ZipFile(path, "w") as target,
        ):
            for info in source.infolist():
                if "vocabulary" not in info.filename:
                    target.writestr(info, source.read(info))
    elif kind == "no config":
        with zipfile.ZipFile(path, "w") as target:
            target.writestr("notes.txt", "hello")
    elif kind == "not .keras":
        path = directory / "copy.zip"
        path.write_bytes(data)
    elif kind == "missing":
        pass
    else:
        raise AssertionError(kind)
    return path


# (kind, error type, what the message says after "<path>: ")
DAMAGE = [
    ("truncated", "ModelFileError", "truncated or damaged zip archive"),
    ("zero bytes", "ModelFileError", "empty file (0 bytes)"),
    ("not a zip", "ModelFileError", "not a zip archive"),
    ("no vocabulary", "ModelFileError", "tokenizer has no vocabulary"),
    ("no config", "ModelFileError", "no config.json"),
    ("not .keras", "ModelFileError", "name does not end in .keras"),
    ("missing", "FileNotFoundError", "no such model file"),
]


def run_script(script, model, tmp_path):
    """Run a script's main on ``model``; it must exit with status 2 and
    write nothing."""
    if script is evaluate:
        source, reference = tmp_path / "test.de", tmp_path / "test.en"
        source.write_text("ein mann geht\n", encoding="utf-8")
        reference.write_text("a man is walking\n", encoding="utf-8")
        argv = ["--source", str(source), "--reference", str(reference)]
        argv += ["--out", str(tmp_path / "eval.json")]
    elif script is translate:
        argv = ["ein mann geht"]
    else:
        argv = ["--out", str(tmp_path / "figure.png"), "ein mann geht"]
    with pytest.raises(SystemExit) as raised:
        script.main(["--model", str(model), *argv])
    assert raised.value.code == 2
    assert not (tmp_path / "eval.json").exists()
    assert not (tmp_path / "figure.png").exists()


@pytest.mark.once
@pytest.mark.parametrize("kind, error, reason", DAMAGE)
def test_a_damaged_file_is_named_with_its_fault(
    saved, tmp_path, capsys, kind, error, reason
):
    path = damage(kind, saved, tmp_path)
    with pytest.raises(Exception) as raised:
        evaluation.load_translator(path)
    assert type(raised.value).__name__ == error
    # What the scripts catch; ModelFileError is a ValueError.
    assert isinstance(raised.value, (OSError, ValueError))
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and reason in message
    assert "\n" not in message
    if error == "ModelFileError":
        assert raised.value.path == str(path) and reason in raised.value.reason
    # The scripts: status 2 and that message on one line, no traceback.
    for script in (evaluate, translate, attention):
        run_script(script, path, tmp_path)
        captured = capsys.readouterr()
        prog = "kt-" + script.__name__.rsplit(".", 1)[-1]
        assert captured.out == ""
        assert captured.err == f"{prog}: error: {message}\n"
    original, data = saved
    assert original.read_bytes() == data


@pytest.mark.once
def test_load_translator_reads_the_intact_file(translator, saved):
    original, data = saved
    loaded = evaluation.load_translator(original)
    assert loaded.tokenizer.proto == translator.tokenizer.proto
    assert loaded.encode_sources(TEXTS) == translator.encode_sources(TEXTS)
    for a, b in zip(
        loaded.transformer.get_weights(),
        translator.transformer.get_weights(),
        strict=True,
    ):
        assert (a == b).all()
    assert original.read_bytes() == data


@pytest.mark.slow
@pytest.mark.once
def test_python_m_translate_prints_no_traceback(saved, tmp_path):
    model = damage("truncated", saved, tmp_path)
    # Without the suite's TF_CPP_MIN_LOG_LEVEL, as a user runs it: the command
    # itself keeps TensorFlow's start-up lines out (test_install.py checks
    # that --verbose brings them back).
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.translate"]
        + ["--model", str(model), "x"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == ""
    # One line: the error, no traceback, no TensorFlow, CUDA or absl lines.
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"kt-translate: error: {model}: ")
    assert "truncated or damaged zip archive" in line
