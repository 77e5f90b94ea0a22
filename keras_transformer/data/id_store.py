"""A tokenised corpus on disk, for corpora larger than memory.

``build_id_store`` reads a parallel corpus once, a chunk of lines at a time,
and writes every sentence's token ids end to end into two flat files
(``source.ids``, ``target.ids``; ``uint16`` when the vocabulary allows, else
``int32``) and their lengths into ``index.npz``. ``IdStore`` maps the two
files into memory (``numpy.memmap``): a sentence is a slice, read from disk
when a batch needs it, and the length buckets of ``BucketedDataset`` are
built from the index alone. So training holds the lengths (8 bytes a pair)
and the batches in flight, never the text.

The ids follow ``keras_transformer.data.batching``'s conventions: sources end
with ``END_ID``, targets have neither start nor end id.
"""

import array
import hashlib
import itertools
import json
import os
import shutil
from typing import NamedTuple

import numpy as np

from keras_transformer.data.corpus import CorpusError, iter_parallel

SOURCE_FILE = "source.ids"
TARGET_FILE = "target.ids"
INDEX_FILE = "index.npz"
INFO_FILE = "store.json"  # written last: a folder without it is unfinished


class CorpusFiles(NamedTuple):
    """A corpus split left on disk (read through an ``IdStore``)."""

    source: str
    target: str
    max_lines: int | None = None


class StoredIds:
    """One side of an ``IdStore``: a sequence of id arrays.

    ``store.source[i]`` is sentence ``i``'s ids (a read-only ``numpy`` view
    of the mapped file); ``lengths`` holds every sentence's length.
    """

    def __init__(self, ids, lengths):
        self.ids = ids
        self.lengths = np.asarray(lengths, dtype="int32")
        self.offsets = np.zeros(len(self.lengths) + 1, dtype="int64")
        np.cumsum(self.lengths, out=self.offsets[1:])

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return self.ids[self.offsets[index] : self.offsets[index + 1]]


class IdStore:
    """An id store written by ``build_id_store``, mapped into memory.

    Attributes:
        source, target: ``StoredIds``.
        info: the ``store.json`` dict (pairs, dtype, tokenizer digest, files).

    Raises:
        ValueError: the folder holds no finished store, or its files do not
            match its index.
    """

    def __init__(self, folder):
        folder = os.fsdecode(folder)
        info_path = os.path.join(folder, INFO_FILE)
        if not os.path.isfile(info_path):
            raise ValueError(f"{folder} holds no finished id store (no {INFO_FILE})")
        with open(info_path) as file:
            self.info = json.load(file)
        with np.load(os.path.join(folder, INDEX_FILE)) as index:
            lengths = index["source_lengths"], index["target_lengths"]
        sides = []
        for name, side_lengths in zip((SOURCE_FILE, TARGET_FILE), lengths, strict=True):
            path = os.path.join(folder, name)
            count = int(side_lengths.sum(dtype="int64"))
            size = os.path.getsize(path) // np.dtype(self.info["dtype"]).itemsize
            if size != count:
                raise ValueError(
                    f"{path} holds {size} ids, its index says {count}: damaged store"
                )
            ids = (
                np.memmap(path, dtype=self.info["dtype"], mode="r")
                if count
                else np.zeros(0, self.info["dtype"])
            )
            sides.append(StoredIds(ids, side_lengths))
        self.source, self.target = sides

    def __len__(self):
        return len(self.source)


def tokenizer_digest(tokenizer):
    """A short digest of a tokenizer's files and settings (its kind, its
    ``export_files`` and ``export_settings``): a store is valid for the
    tokenizer that wrote it only."""
    digest = hashlib.sha256(str(tokenizer.kind).encode())
    for name, data in sorted(tokenizer.export_files().items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    digest.update(json.dumps(tokenizer.export_settings(), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def build_id_store(
    source_path, target_path, tokenizer, folder, max_lines=None, chunk_lines=20_000
):
    """Tokenise a parallel corpus into an id store in ``folder``.

    The store is written in ``folder + ".partial"`` and renamed into place
    when complete, so an interrupted build leaves no store that looks
    finished; an existing ``folder`` is replaced.

    Args:
        source_path, target_path: the corpus files (plain or gzip; see
            ``keras_transformer.data.corpus``).
        tokenizer: a ``TextTokenizer`` (``data.contract``): sources are its
            ``encode`` (with the end id), targets its ``encode_targets``.
        folder: where the store goes.
        max_lines: read at most this many pairs (None: all).
        chunk_lines: pairs tokenised at a time (the memory held).

    Returns:
        The ``IdStore``.

    Raises:
        CorpusError: as ``iter_parallel`` (naming the file and line).
    """
    size = max(len(tokenizer.source_pieces()), len(tokenizer.target_pieces()))
    dtype = "uint16" if size <= 2**16 else "int32"
    folder = os.fsdecode(folder)
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    lengths = (array.array("i"), array.array("i"))
    pairs = iter_parallel(source_path, target_path, max_lines)
    with (
        open(os.path.join(partial, SOURCE_FILE), "wb") as source_file,
        open(os.path.join(partial, TARGET_FILE), "wb") as target_file,
    ):
        while chunk := list(itertools.islice(pairs, chunk_lines)):
            sources = tokenizer.encode([s for s, _ in chunk])
            targets = tokenizer.encode_targets([t for _, t in chunk])
            for ids, file, side_lengths in (
                (sources, source_file, lengths[0]),
                (targets, target_file, lengths[1]),
            ):
                side_lengths.extend(len(row) for row in ids)
                flat = [i for row in ids for i in row]
                np.asarray(flat, dtype=dtype).tofile(file)
    if not lengths[0]:
        raise CorpusError(os.fsdecode(source_path), None, "empty file (0 lines)")
    np.savez(
        os.path.join(partial, INDEX_FILE),
        source_lengths=np.frombuffer(lengths[0], dtype="int32"),
        target_lengths=np.frombuffer(lengths[1], dtype="int32"),
    )
    info = {
        "pairs": len(lengths[0]),
        "dtype": dtype,
        "tokenizer": tokenizer_digest(tokenizer),
        "source": os.path.abspath(os.fsdecode(source_path)),
        "target": os.path.abspath(os.fsdecode(target_path)),
        "max_lines": max_lines,
    }
    with open(os.path.join(partial, INFO_FILE), "w") as file:
        json.dump(info, file, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(partial, folder)
    return IdStore(folder)


def sample_pairs(source_path, target_path, count, seed=0, max_lines=None):
    """``count`` pairs drawn uniformly from the corpus in one pass (reservoir
    sampling, Vitter's algorithm R), for training the tokenizer on a sample.

    Returns:
        ``(sources, targets)``, lists of str in corpus order.
    """
    rng = np.random.default_rng(seed)
    kept = []  # (line number, source, target)
    for number, (source, target) in enumerate(
        iter_parallel(source_path, target_path, max_lines)
    ):
        if number < count:
            kept.append((number, source, target))
        else:
            slot = int(rng.integers(0, number + 1))
            if slot < count:
                kept[slot] = (number, source, target)
    kept.sort()
    return [s for _, s, _ in kept], [t for _, _, t in kept]
