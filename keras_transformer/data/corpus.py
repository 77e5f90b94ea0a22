"""Parallel text, one sentence per line, with errors that say where.

A corpus is two files whose line ``i`` holds a sentence and its translation,
e.g. ``train.de`` and ``train.en``. Files may be gzip-compressed (recognised by
their first two bytes, whatever their name). Every problem is a
``CorpusError`` whose message starts with ``path:line:`` (or ``path:`` when no
single line is to blame), like a compiler's, so that it can be found at once.

Encodings are explicit: text is UTF-8; a byte-order mark at the start of a
file is removed, with one ``CorpusWarning`` naming the file; a file of one
line with carriage returns inside it (old Mac text ends its lines with
``\\r`` alone) is a ``CorpusError`` naming the file. The same rule holds for
every file read here: training data, evaluation sources and references.

Only the standard library is used here: reading text needs neither Keras nor
a tokenizer.
"""

import gzip
import os
import warnings
import zlib

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


class CorpusWarning(UserWarning):
    """Something in a corpus file that was fixed on the way in (a UTF-8
    byte-order mark); the message names the file."""


class CorpusError(ValueError):
    """A corpus file that cannot be read as one sentence per line.

    Args:
        path: the file (or directory) at fault.
        line: the 1-based line at fault, or None when there is no one line.
        reason: what is wrong, e.g. ``"empty line (...)"``.

    The message is ``"{path}:{line}: {reason}"``, or ``"{path}: {reason}"``
    without a line. Errors of other line-based files subclass it with their
    own ``AT_LINE`` format.
    """

    AT_LINE = "{path}:{line}"

    def __init__(self, path, line, reason):
        self.path = os.fsdecode(path)
        self.line = line
        self.reason = reason
        where = self.path
        if line is not None:
            where = self.AT_LINE.format(path=self.path, line=line)
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        # The default would call the class with the message and fail; this
        # keeps the error picklable (e.g. raised in a worker process).
        return (type(self), (self.path, self.line, self.reason))


def read_lines(path):
    """The sentences of a file, one per line.

    The file is plain or gzip-compressed UTF-8 text. Line endings (``"\\n"``,
    and a ``"\\r"`` before it) are removed; other whitespace is kept. The last
    line needs no ``"\\n"``.

    Args:
        path: str or path-like.

    Returns:
        list of str, at least one, none empty or only whitespace.

    Raises:
        CorpusError: no such file, a directory, an empty file, an empty or
            whitespace-only line, bytes that are not UTF-8 (with the line and
            the byte offset in it), or a corrupt or truncated gzip stream.
    """
    return list(iter_lines(path))


def iter_lines(path):
    """``read_lines`` one line at a time, for files larger than memory.

    Yields:
        str, each line as ``read_lines`` returns it; the same checks, each
        raised when its line is reached.
    """
    path = os.fsdecode(path)
    if os.path.isdir(path):
        raise CorpusError(path, None, "is a directory, not a text file")
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise CorpusError(path, None, "no such file") from None
    except OSError as error:
        raise CorpusError(path, None, f"cannot open ({error.strerror})") from None
    with raw:
        head = raw.read(2)
        raw.seek(0)
        if not head:
            raise CorpusError(path, None, "empty file (0 lines)")
        compressed = head == _GZIP_MAGIC
        if not compressed and path.endswith(".gz"):
            # Reading it as text would end in a baffling UTF-8 error instead.
            raise CorpusError(
                path,
                None,
                "named .gz but not gzip data (it does not start with 1f 8b); "
                "corrupt, or rename it",
            )
        if not compressed:
            yield from _read_stream(path, raw, compressed)
            return
        with gzip.GzipFile(fileobj=raw) as stream:
            yield from _read_stream(path, stream, compressed)


def _read_stream(path, stream, compressed):
    count = 0
    try:
        for number, data in _old_mac_checked(path, enumerate(stream, 1)):
            if number == 1 and data.startswith(_BOM):
                data = data[len(_BOM) :]
                warnings.warn(
                    f"{path}: starts with a UTF-8 byte-order mark; removed",
                    CorpusWarning,
                    stacklevel=2,
                )
            yield _decode_line(path, number, data)
            count = number
    except (OSError, EOFError, zlib.error) as error:
        # gzip fails mid-stream with BadGzipFile (an OSError) for a bad
        # header or CRC, EOFError when cut short, zlib.error for damaged data.
        problem = "corrupt or truncated gzip stream" if compressed else "read error"
        raise CorpusError(
            path, None, f"{problem} after {count} lines ({error})"
        ) from None
    if not count:
        raise CorpusError(path, None, "empty file (0 lines)")


def _old_mac_checked(path, numbered):
    """``numbered`` as it is, unless its only line holds carriage returns: a
    file whose lines end with ``\\r`` alone reads as one line."""
    first = next(numbered, None)
    if first is None:
        return
    second = next(numbered, None)
    if second is None and b"\r" in first[1].rstrip(b"\r\n"):
        raise CorpusError(
            path,
            1,
            "one line with carriage returns (\\r) inside it: the lines end "
            "with \\r alone (old Mac text); convert them to \\n (e.g. "
            "tr '\\r' '\\n')",
        )
    yield first
    if second is not None:
        yield second
        yield from numbered


def _decode_line(path, number, data):
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorpusError(
            path,
            number,
            f"invalid UTF-8 at byte offset {error.start} of the line (counting "
            f"from 0; byte 0x{data[error.start]:02x}: {error.reason})",
        ) from None
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    if not line:
        raise CorpusError(
            path,
            number,
            f"empty line (line {number} is blank; every line must hold one sentence)",
        )
    if not line.strip():
        raise CorpusError(
            path,
            number,
            f"whitespace-only line (line {number} holds no text; every line "
            "must hold one sentence)",
        )
    return line


def read_parallel(source_path, target_path):
    """Sentence pairs from two files, line ``i`` of one with line ``i`` of the other.

    Args:
        source_path: str or path-like, the source sentences.
        target_path: str or path-like, their translations.

    Returns:
        ``(sources, targets)``: two lists of str of the same length.

    Raises:
        CorpusError: either file cannot be read (see ``read_lines``), or the
            two have different numbers of lines. That error names both files
            and counts, and points at the first line only the longer one has.
    """
    sources = read_lines(source_path)
    targets = read_lines(target_path)
    if len(sources) != len(targets):
        source_path, target_path = os.fsdecode(source_path), os.fsdecode(target_path)
        first = min(len(sources), len(targets)) + 1
        longer, shorter = (
            (source_path, target_path)
            if len(sources) > len(targets)
            else (target_path, source_path)
        )
        raise CorpusError(
            longer,
            first,
            f"the files differ in length: {source_path} has {len(sources)} "
            f"lines, {target_path} has {len(targets)}; line {first} is in "
            f"{longer} but not in {shorter}",
        )
    return sources, targets


def iter_parallel(source_path, target_path, max_lines=None):
    """``read_parallel``'s pairs one at a time (at most ``max_lines``).

    Yields:
        ``(source, target)`` str pairs.

    Raises:
        CorpusError: as ``read_parallel``, when the bad line is reached; a
            difference in length names the first line only one file has.
    """
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    count = 0
    while max_lines is None or count < max_lines:
        source, target = next(sources, None), next(targets, None)
        if source is None and target is None:
            return
        count += 1
        if source is None or target is None:
            paths = [os.fsdecode(source_path), os.fsdecode(target_path)]
            longer, shorter = paths if target is None else paths[::-1]
            raise CorpusError(
                longer,
                count,
                f"the files differ in length: line {count} is in {longer} but "
                f"not in {shorter}, which has {count - 1} lines",
            )
        yield source, target


def split_path(data_dir, split, lang):
    """The file of one split and language: ``{split}.{lang}`` or ``.gz``.

    Args:
        data_dir: str or path-like, the directory holding the corpus.
        split: e.g. ``"train"``, ``"val"``.
        lang: e.g. ``"de"``, ``"en"``.

    Returns:
        str: ``data_dir/{split}.{lang}`` or ``data_dir/{split}.{lang}.gz``,
        whichever exists.

    Raises:
        CorpusError: ``data_dir`` is not a directory, neither file exists, or
            both do (it is unclear which one is meant).
    """
    data_dir = os.fsdecode(data_dir)
    if not os.path.isdir(data_dir):
        reason = "not a directory" if os.path.exists(data_dir) else "no such directory"
        raise CorpusError(data_dir, None, reason)
    plain = os.path.join(data_dir, f"{split}.{lang}")
    packed = plain + ".gz"
    found = [name for name in (plain, packed) if os.path.exists(name)]
    if not found:
        raise CorpusError(
            data_dir, None, f"no {split}.{lang} split (tried {plain} and {packed})"
        )
    if len(found) == 2:
        raise CorpusError(
            data_dir,
            None,
            f"ambiguous {split}.{lang} split: both {plain} and {packed} exist; "
            "remove one",
        )
    return found[0]


def read_split(data_dir, split, source, target, max_lines=None):
    """The sentence pairs of one split of a corpus folder.

    Args:
        data_dir: str or path-like, the folder (see ``split_path``).
        split: e.g. ``"train"``, ``"val"``.
        source, target: the two languages, e.g. ``"de"``, ``"en"``.
        max_lines: keep only the first N pairs (None: all).

    Returns:
        ``(sources, targets)``: two lists of str of the same length.

    Raises:
        CorpusError: as ``split_path`` and ``read_parallel``.
    """
    sources, targets = read_parallel(
        split_path(data_dir, split, source), split_path(data_dir, split, target)
    )
    if max_lines:
        sources, targets = sources[:max_lines], targets[:max_lines]
    return sources, targets
