"""The id store (corpora larger than memory).

References: SentencePiece's own processor on the same corpus, and the
in-memory path (``BucketedDataset`` over lists of ids).
"""

import gzip

import numpy as np
import pytest
import sentencepiece

from keras_transformer import data as ktd
from keras_transformer.data import id_store
from keras_transformer.data.sentencepiece import SentencePiece

pytestmark = pytest.mark.once

WORDS = "ein zwei drei vier fünf Haus Hund Katze läuft schnell über die Straße".split()


def corpus(folder, pairs=300, seed=0, bad_line=None):
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for _ in range(pairs):
        sources.append(" ".join(rng.choice(WORDS, rng.integers(1, 12))))
        targets.append(" ".join(rng.choice(WORDS, rng.integers(1, 12))).upper())
    if bad_line is not None:
        targets[bad_line - 1] = " "
    paths = folder / "train.de.gz", folder / "train.en"
    with gzip.open(paths[0], "wt", encoding="utf-8") as file:
        file.write("\n".join(sources) + "\n")
    paths[1].write_text("\n".join(targets) + "\n", encoding="utf-8")
    return paths, sources, targets


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    paths, sources, targets = corpus(root)
    proto = ktd.train_tokenizer(sources + targets, 80)
    store = id_store.build_id_store(
        *paths, SentencePiece(proto), root / "ids", chunk_lines=64
    )
    return root, store, proto, sources, targets


def test_the_store_holds_the_ids_of_encode(built):
    _, store, proto, sources, targets = built
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    assert len(store) == len(sources) == 300
    assert store.info["dtype"] == "uint16" and store.info["pairs"] == 300
    digest = id_store.tokenizer_digest(SentencePiece(proto))
    assert store.info["tokenizer"] == digest
    assert (
        id_store.tokenizer_digest(SentencePiece(ktd.train_tokenizer(sources, 60)))
        != digest
    )
    src = [row + [ktd.END_ID] for row in processor.encode(sources)]
    tgt = processor.encode(targets)
    for i in range(len(sources)):
        assert store.source[i].tolist() == src[i]
        assert store.target[i].tolist() == tgt[i]
    assert store.source.lengths.tolist() == [len(s) for s in src]
    assert isinstance(store.source.ids, np.memmap)


def test_batches_from_the_store_are_the_in_memory_batches(built):
    _, store, proto, sources, targets = built
    tokenizer = SentencePiece(proto)
    args = dict(batch_tokens=96, boundaries=[8, 16, 24], seed=4, rows_multiple=2)
    lists = ktd.BucketedDataset(
        ktd.encode(tokenizer, sources),
        ktd.encode(tokenizer, targets, add_end=False),
        **args,
    )
    stored = ktd.BucketedDataset(store.source, store.target, **args)
    assert len(stored) == len(lists) > 10 and stored.dropped == lists.dropped
    for epoch in (0, 1):
        a, b = lists.epoch_view(epoch), stored.epoch_view(epoch)
        for index in range(len(a)):
            (xa, ya), (xb, yb) = a[index], b[index]
            np.testing.assert_array_equal(ya, yb)
            for name in xa:
                np.testing.assert_array_equal(xa[name], xb[name])
            assert a.target_tokens(index) == b.target_tokens(index)


def test_a_bad_line_names_file_and_line_and_leaves_no_store(tmp_path):
    paths, sources, targets = corpus(tmp_path, pairs=100, bad_line=70)
    proto = ktd.train_tokenizer(sources + targets[:60], 60)
    with pytest.raises(ktd.CorpusError, match=r"train\.en:70: whitespace-only"):
        id_store.build_id_store(
            *paths, SentencePiece(proto), tmp_path / "ids", chunk_lines=16
        )
    assert not (tmp_path / "ids").exists()
    with pytest.raises(ValueError, match="no finished id store"):
        id_store.IdStore(tmp_path / "ids.partial")


def test_a_damaged_store_is_refused(built, tmp_path):
    root, store, proto, *_ = built
    copy = tmp_path / "ids"
    copy.mkdir()
    for name in ("source.ids", "target.ids", "index.npz", "store.json"):
        (copy / name).write_bytes((root / "ids" / name).read_bytes())
    data = (copy / "target.ids").read_bytes()
    (copy / "target.ids").write_bytes(data[:-6])  # 3 ids short
    with pytest.raises(ValueError, match=r"target\.ids holds \d+ ids.*damaged"):
        id_store.IdStore(copy)


def test_unequal_files_name_the_first_line_only_one_has(tmp_path):
    (tmp_path / "a").write_text("x\ny\nz\n")
    (tmp_path / "b").write_text("x\ny\n")
    with pytest.raises(ktd.CorpusError, match=r"a:3: the files differ in length"):
        list(ktd.iter_parallel(tmp_path / "a", tmp_path / "b"))
    assert list(ktd.iter_parallel(tmp_path / "a", tmp_path / "b", max_lines=2)) == [
        ("x", "x"), ("y", "y")
    ]  # fmt: skip


def test_sample_pairs_is_seeded_uniform_and_in_corpus_order(tmp_path):
    paths, sources, targets = corpus(tmp_path, pairs=1000)
    first = ktd.sample_pairs(*paths, 100, seed=1)
    assert first == ktd.sample_pairs(*paths, 100, seed=1)
    assert first != ktd.sample_pairs(*paths, 100, seed=2)
    position = {pair: i for i, pair in enumerate(zip(sources, targets, strict=True))}
    lines = [position[pair] for pair in zip(*first, strict=True)]
    assert len(lines) == 100 and lines == sorted(lines)
    # Uniform over the file: about as many from each half (binomial sd 5).
    assert 30 < sum(line < 500 for line in lines) < 70
    everything = ktd.sample_pairs(*paths, 5000)
    assert everything == (sources, targets)


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--task", "numbers", "--tokenizer-sample", "10"], "for --data corpora"),
        (
            [
                "--data",
                "d",
                "--source",
                "de",
                "--target",
                "en",
                "--tokenizer-sample",
                "0",
            ],
            "--tokenizer-sample must be >= 1",
        ),  # fmt: skip
        (["--task", "numbers", "--model-parallel", "0"], "--model-parallel must be"),
    ],
)
def test_kt_train_refuses_bad_new_options(bad, message, capsys):
    from keras_transformer.cli import train

    with pytest.raises(SystemExit) as exit_info:
        train.parse_config([*bad, "--out", "x"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
