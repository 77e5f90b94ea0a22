"""Reading parallel text: happy paths and every error, each naming the file."""

import ast
import gzip
import pickle
from pathlib import Path

import pytest

import keras_transformer.data as data
from keras_transformer.data import corpus
from keras_transformer.data.corpus import (
    CorpusError,
    read_lines,
    read_parallel,
    split_path,
)

# Corpus reading is plain Python: one backend's run covers it.
pytestmark = pytest.mark.once

MULTI30K = Path(__file__).resolve().parents[1].parent / "shared/data/multi30k"


def write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def check(error, path, line, *words):
    """``error`` names ``path`` (and ``line``) first and contains ``words``."""
    where = str(path) if line is None else f"{path}:{line}"
    assert str(error).startswith(where + ": "), str(error)
    assert (error.path, error.line) == (str(path), line)
    for word in words:
        assert word in str(error), (word, str(error))


# -- happy paths ---------------------------------------------------------------


def test_plain_file(tmp_path):
    path = write(tmp_path / "a.de", "Zwei Männer.\nDie Straße ist naß.\n")
    assert read_lines(path) == ["Zwei Männer.", "Die Straße ist naß."]
    assert read_lines(str(path)) == ["Zwei Männer.", "Die Straße ist naß."]


def test_line_endings_and_inner_whitespace(tmp_path):
    # CRLF, a missing final newline and a lone "\r" inside a line; spaces
    # around the text and other Unicode line breaks are part of the sentence.
    content = "one\r\n  two \nthree\rfour\nfive\u2028six\r\nlast"
    path = write(tmp_path / "mixed.en", content)
    expected = ["one", "  two ", "three\rfour", "five\u2028six", "last"]
    assert read_lines(path) == expected
    assert read_lines(write(tmp_path / "one.en", "ß")) == ["ß"]


@pytest.mark.parametrize("name", ["a.de.gz", "a.de"])
def test_gzip_is_detected_by_content(tmp_path, name):
    lines = ["Männer", "ß", "x y"]
    path = write(tmp_path / name, gzip.compress("\n".join(lines).encode() + b"\n"))
    assert read_lines(path) == lines


def test_gzip_with_several_members_and_crlf(tmp_path):
    content = gzip.compress(b"a\r\nb\r\n") + gzip.compress(b"c")
    assert read_lines(write(tmp_path / "m.gz", content)) == ["a", "b", "c"]


def test_read_parallel(tmp_path):
    src = write(tmp_path / "x.de", "Hallo\nWelt\n")
    tgt = write(tmp_path / "x.en.gz", gzip.compress(b"Hello\nworld"))
    assert read_parallel(src, tgt) == (["Hallo", "Welt"], ["Hello", "world"])


def test_split_path(tmp_path):
    write(tmp_path / "train.de", "a\n")
    write(tmp_path / "train.en.gz", gzip.compress(b"a\n"))
    assert split_path(tmp_path, "train", "de") == str(tmp_path / "train.de")
    assert split_path(str(tmp_path), "train", "en") == str(tmp_path / "train.en.gz")


def test_exported_from_data_package():
    for name in ("CorpusError", "read_lines", "read_parallel", "split_path"):
        assert getattr(data, name) is getattr(corpus, name)
        assert name in data.__all__


def test_standard_library_only():
    # Reading text must not pull in Keras, TensorFlow or keras-hub.
    tree = ast.parse(Path(corpus.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= {"gzip", "os", "warnings", "zlib"}, imported


def test_real_multi30k_corpus():
    if not MULTI30K.is_dir():
        pytest.skip(f"{MULTI30K} is absent")
    sources, targets = read_parallel(MULTI30K / "train.de.gz", MULTI30K / "train.en.gz")
    assert len(sources) == len(targets) == 29000
    assert targets[0] == "Two young, White males are outside near many bushes."
    assert sources[0].startswith("Zwei junge weiße Männer")


# -- errors --------------------------------------------------------------------


def test_error_message_format():
    error = CorpusError("data/train.de", 17, "empty line")
    assert str(error) == "data/train.de:17: empty line"
    assert isinstance(error, ValueError)
    assert str(CorpusError(Path("d/x"), None, "no such file")) == "d/x: no such file"
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.path, copy.line) == (str(error), "data/train.de", 17)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.de"
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, None, "no such file")


def test_directory(tmp_path):
    with pytest.raises(CorpusError) as info:
        read_lines(tmp_path)
    check(info.value, tmp_path, None, "directory")


@pytest.mark.parametrize(
    "name, content",
    [("e.de", b""), ("e.de.gz", b""), ("e.gz", gzip.compress(b"", mtime=0))],
)
def test_empty_file(tmp_path, name, content):
    path = write(tmp_path / name, content)
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, None, "empty file", "0 lines")


@pytest.mark.parametrize(
    "content, line",
    [
        ("a\n\nb\n", 2),
        ("\n", 1),
        ("a\nb\n\n", 3),  # a blank line after the last one counts as a line
        ("a\r\n\r\nb\r\n", 2),
    ],
)
def test_empty_line(tmp_path, content, line):
    path = write(tmp_path / "train.de", content)
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, line, "empty line", f"line {line} is blank")


def test_empty_line_example_message(tmp_path):
    path = write(tmp_path / "train.de", "x\n" * 16 + "\nx\n")
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    assert str(info.value) == (
        f"{path}:17: empty line (line 17 is blank; every line must hold one sentence)"
    )


@pytest.mark.parametrize("blank", [" ", "\t \t", "\u00a0", " \r"])
def test_whitespace_only_line(tmp_path, blank):
    path = write(tmp_path / "w.en", f"a\n{blank}\nb\n")
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, 2, "whitespace-only line")


@pytest.mark.parametrize(
    "content, line, offset",
    [
        (b"ok\n\xff\xfe bad\n", 2, 0),
        (b"ab\xc3(\n", 1, 2),  # a broken two-byte sequence
        (b"x\ny\nM\xc3\xa4nner \xe2\x82\n", 3, 8),  # a three-byte sequence cut short
    ],
)
def test_invalid_utf8(tmp_path, content, line, offset):
    path = write(tmp_path / "bad.de", content)
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, line, "invalid UTF-8", f"byte offset {offset} ")


def test_invalid_utf8_in_gzip(tmp_path):
    path = write(tmp_path / "bad.gz", gzip.compress(b"ok\nfine\n\xe9t\xe9\n"))
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, 3, "invalid UTF-8", "byte offset 0 ", "0xe9")


def _truncated():
    whole = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    return whole[: len(whole) // 2]


def _bad_crc():
    whole = bytearray(gzip.compress(b"a\nb\n"))
    whole[-8] ^= 0xFF  # the trailer's CRC-32
    return bytes(whole)


@pytest.mark.parametrize(
    "content",
    [
        _truncated(),
        _bad_crc(),
        b"\x1f\x8b\x00garbage",  # the magic bytes, then no valid header
        gzip.compress(b"a\n")[:12] + b"\xff" * 20,  # damaged deflate data
    ],
    ids=["truncated", "crc", "header", "deflate"],
)
def test_corrupt_gzip(tmp_path, content):
    path = write(tmp_path / "c.en.gz", content)
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, None, "corrupt or truncated gzip stream")


def test_gz_name_without_gzip_content(tmp_path):
    path = write(tmp_path / "plain.en.gz", "not compressed\n")
    with pytest.raises(CorpusError) as info:
        read_lines(path)
    check(info.value, path, None, "not gzip data")


@pytest.mark.parametrize("source_lines, target_lines", [(3, 2), (2, 3)])
def test_parallel_line_counts_differ(tmp_path, source_lines, target_lines):
    src = write(tmp_path / "s.de", "x\n" * source_lines)
    tgt = write(tmp_path / "t.en", "x\n" * target_lines)
    longer, shorter = (src, tgt) if source_lines > target_lines else (tgt, src)
    with pytest.raises(CorpusError) as info:
        read_parallel(src, tgt)
    check(
        info.value,
        longer,
        3,
        f"{src} has {source_lines} lines",
        f"{tgt} has {target_lines}",
        f"line 3 is in {longer} but not in {shorter}",
    )


def test_parallel_reports_a_bad_file(tmp_path):
    src = write(tmp_path / "s.de", "a\nb\n")
    tgt = write(tmp_path / "t.en", "a\n\n")
    with pytest.raises(CorpusError) as info:
        read_parallel(src, tgt)
    check(info.value, tgt, 2, "empty line")
    with pytest.raises(CorpusError) as info:
        read_parallel(src, tmp_path / "none.en")
    check(info.value, tmp_path / "none.en", None, "no such file")


def test_split_path_errors(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(CorpusError) as info:
        split_path(missing, "train", "de")
    check(info.value, missing, None, "no such directory")
    a_file = write(tmp_path / "file", "x\n")
    with pytest.raises(CorpusError) as info:
        split_path(a_file, "train", "de")
    check(info.value, a_file, None, "not a directory")
    plain, packed = tmp_path / "val.de", tmp_path / "val.de.gz"
    with pytest.raises(CorpusError) as info:
        split_path(tmp_path, "val", "de")
    check(info.value, tmp_path, None, str(plain), str(packed))
    write(plain, "x\n")
    write(packed, gzip.compress(b"x\n"))
    with pytest.raises(CorpusError) as info:
        split_path(tmp_path, "val", "de")
    check(info.value, tmp_path, None, "ambiguous", str(plain), str(packed))


# -- encodings -----------------------------------------------------------------


def test_a_byte_order_mark_is_removed_and_said_once(tmp_path):
    path = write(tmp_path / "bom.de", b"\xef\xbb\xbfein Hund\nzwei Katzen\n")
    packed = write(tmp_path / "bom.en.gz", gzip.compress(b"\xef\xbb\xbfa dog\ntwo\n"))
    with pytest.warns(corpus.CorpusWarning) as said:
        assert read_lines(path) == ["ein Hund", "zwei Katzen"]
        assert read_parallel(path, packed) == (
            ["ein Hund", "zwei Katzen"],
            ["a dog", "two"],
        )
    messages = [str(w.message) for w in said]
    assert f"{path}: starts with a UTF-8 byte-order mark; removed" in messages
    assert f"{packed}: starts with a UTF-8 byte-order mark; removed" in messages
    # Only at the start: elsewhere it is text (U+FEFF), as UTF-8 says.
    inner = write(tmp_path / "inner.de", "a\n\ufeffb\n")
    assert read_lines(inner) == ["a", "\ufeffb"]


@pytest.mark.parametrize("ending", [b"\r", b"\r\n", b""])
def test_lines_ended_by_carriage_returns_alone_are_named(tmp_path, ending):
    path = write(tmp_path / "mac.en", b"a dog\rtwo cats\rthree" + ending)
    with pytest.raises(CorpusError) as raised:
        read_lines(path)
    check(raised.value, path, 1, "carriage returns", "old Mac", "tr")
    packed = write(tmp_path / "mac.en.gz", gzip.compress(b"a\rb\rc\r"))
    with pytest.raises(CorpusError, match="old Mac"):
        read_lines(packed)
    # Windows' CRLF, a stray \r in a longer file, and one line without any
    # are fine.
    assert read_lines(write(tmp_path / "crlf.en", b"a\r\nb\r\n")) == ["a", "b"]
    assert read_lines(write(tmp_path / "one.en", b"one line\r\n")) == ["one line"]
    assert read_lines(write(tmp_path / "two.en", b"a\rb\nc\n")) == ["a\rb", "c"]
