"""Batching by length: buckets, token budgets, padding, and model.fit."""

import collections

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data.batching import (
    BucketedDataset,
    bucket_boundaries,
    make_batches,
    padding_fraction,
)

START, END = 1, 2
VOCAB = 16


def skewed_corpus(n=200, seed=0):
    """Mostly short pairs, a few long ones; target lengths follow the source's.

    Source lengths are geometric (mean 10, capped at 60), target lengths the
    source's give or take 3, as in translation.
    """
    rng = np.random.default_rng(seed)
    src_len = np.minimum(rng.geometric(0.1, n), 60)
    tgt_len = np.clip(src_len + rng.integers(-3, 4, n), 0, 60)
    src = [rng.integers(3, VOCAB, k).tolist() for k in src_len]
    tgt = [rng.integers(3, VOCAB, k).tolist() for k in tgt_len]
    return src, tgt


def unpad(batches):
    """Multiset of (source, target) recovered from padded batches.

    Checks the documented alignment on the way: decoder inputs are START then
    the target, labels the target then END, both padded with 0.
    """
    found = collections.Counter()
    for inputs, labels in batches:
        rows = zip(
            inputs["encoder_inputs"], inputs["decoder_inputs"], labels, strict=True
        )
        for enc, dec, lab in rows:
            if not dec.any():  # a padding row: nothing at all in it
                assert not enc.any() and not lab.any()
                continue
            n = int(np.count_nonzero(dec))
            assert dec[0] == START and lab[n - 1] == END
            assert (dec[n:] == 0).all() and (lab[n:] == 0).all()
            np.testing.assert_array_equal(dec[1:n], lab[: n - 1])
            src = enc[enc != 0]
            assert (enc[len(src) :] == 0).all()  # padding only at the end
            found[(tuple(src.tolist()), tuple(dec[1:n].tolist()))] += 1
    return found


def as_counter(src, tgt, skip=()):
    return collections.Counter(
        (tuple(s), tuple(t))
        for i, (s, t) in enumerate(zip(src, tgt, strict=True))
        if i not in skip
    )


@pytest.mark.once
def test_bucket_boundaries():
    # 8, then x1.25 rounded up to a multiple of 8: 10->16, 20->24, 30->32,
    # 40, 50->56, 70->72, 90->96, 120, (150 > 128) -> 128 closes the list.
    assert bucket_boundaries(128) == [8, 16, 24, 32, 40, 56, 72, 96, 120, 128]
    # x1.5: 12->16, 24, 36->40, 60->64, 96, (144) -> 128.
    assert bucket_boundaries(128, step=1.5) == [8, 16, 24, 40, 64, 96, 128]
    assert bucket_boundaries(6) == [6]
    assert bucket_boundaries(20, min_length=3, step=2) == [8, 16, 20]
    with pytest.raises(ValueError):
        bucket_boundaries(128, step=1.0)
    with pytest.raises(TypeError):
        bucket_boundaries(128.0)


@pytest.mark.once
def test_layout_of_one_example():
    (inputs, labels), *rest = make_batches([[5, 6, END]], [[7, 8, 9]], 8, [8])[0]
    assert rest == []
    np.testing.assert_array_equal(inputs["encoder_inputs"], [[5, 6, 2, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(inputs["decoder_inputs"], [[1, 7, 8, 9, 0, 0, 0, 0]])
    np.testing.assert_array_equal(labels, [[7, 8, 9, 2, 0, 0, 0, 0]])
    for array in (*inputs.values(), labels):
        assert array.dtype == np.int32
    # An empty target still teaches the model to stop: START -> END.
    (inputs, labels), *_ = make_batches([[5]], [[]], 4, [4])[0]
    np.testing.assert_array_equal(inputs["decoder_inputs"], [[1, 0, 0, 0]])
    np.testing.assert_array_equal(labels, [[2, 0, 0, 0]])


@pytest.mark.once
def test_every_example_once_in_budgeted_buckets():
    src, tgt = skewed_corpus()
    boundaries = [8, 16, 24, 40, 64]
    batch_tokens = 128
    batches, dropped = make_batches(src, tgt, batch_tokens, boundaries, seed=3)
    assert dropped == []  # lengths are capped at 61 <= 64
    assert unpad(batches) == as_counter(src, tgt)
    for inputs, labels in batches:
        shapes = {a.shape for a in (*inputs.values(), labels)}
        assert len(shapes) == 1
        ((rows, length),) = shapes
        assert length in boundaries
        assert rows == batch_tokens // length
        assert rows * length <= batch_tokens
        # Each example sits in the smallest bucket that holds it.
        lower = max([0] + [b for b in boundaries if b < length])
        pairs = zip(inputs["encoder_inputs"], inputs["decoder_inputs"], strict=True)
        for enc, dec in pairs:
            if dec.any():
                size = max(np.count_nonzero(enc), np.count_nonzero(dec))
                assert lower < size <= length


@pytest.mark.once
def test_too_long_examples_are_dropped_or_raise():
    # Lengths max(len(src), len(tgt) + 1): 8, 9, 9, 3 against a largest
    # boundary of 8: examples 1 (source) and 2 (target + START) are too long.
    src = [[5] * 8, [5] * 9, [5] * 2, [5] * 3]
    tgt = [[6] * 7, [6] * 2, [6] * 8, [6] * 2]
    batches, dropped = make_batches(src, tgt, 16, [4, 8])
    assert dropped == [1, 2]
    assert unpad(batches) == as_counter(src, tgt, skip={1, 2})
    assert BucketedDataset(src, tgt, 16, [4, 8]).dropped == [1, 2]
    with pytest.raises(ValueError, match="2 examples are longer"):
        make_batches(src, tgt, 16, [4, 8], drop_longer=False)


@pytest.mark.once
def test_orders_are_seeded():
    src, tgt = skewed_corpus()
    boundaries = [8, 16, 24, 40, 64]

    def order(batches):
        return [
            inputs["encoder_inputs"].tobytes() + labels.tobytes()
            for inputs, labels in batches
        ]

    first, _ = make_batches(src, tgt, 128, boundaries, seed=1)
    again, _ = make_batches(src, tgt, 128, boundaries, seed=1)
    other, _ = make_batches(src, tgt, 128, boundaries, seed=2)
    assert order(first) == order(again)
    assert order(first) != order(other)
    assert sorted(order(first)) != sorted(order(other))  # new rows, not just order

    dataset = BucketedDataset(src, tgt, 128, boundaries, seed=1)
    epoch0 = order(dataset)
    dataset.on_epoch_end()
    assert dataset.epoch == 1
    epoch1 = order(dataset)
    assert epoch0 != epoch1 and len(epoch0) == len(epoch1)
    assert unpad(dataset) == as_counter(src, tgt)
    assert order(BucketedDataset(src, tgt, 128, boundaries, seed=1)) == epoch0

    # Unshuffled: input order within buckets on every epoch.
    fixed = BucketedDataset(src, tgt, 128, boundaries, shuffle=False)
    before = order(fixed)
    fixed.on_epoch_end()
    assert order(fixed) == before
    short = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i]) + 1) <= 8]
    inputs, _ = fixed[0]
    expected = [src[i] for i in short[: len(inputs["encoder_inputs"])]]
    assert [row[row != 0].tolist() for row in inputs["encoder_inputs"]] == expected


@pytest.mark.once
def test_first_two_batches_cover_both_extremes():
    # Keras' TensorFlow backend takes the input signature from batches 0 and
    # 1; they must differ in rows and in length.
    src, tgt = skewed_corpus()
    for seed in range(5):
        dataset = BucketedDataset(src, tgt, 128, [8, 16, 24, 40, 64], seed=seed)
        lengths = [dataset[i][1].shape for i in (0, 1)]
        assert lengths == [(128 // 8, 8), (128 // 64, 64)]


@pytest.mark.once
def test_padding_fraction():
    inputs = {
        "encoder_inputs": np.array([[5, 0], [5, 6]]),
        "decoder_inputs": np.array([[1, 0], [1, 7]]),
    }
    assert padding_fraction([(inputs, None)]) == 2 / 8
    assert padding_fraction([]) == 0.0

    src, tgt = skewed_corpus(n=400)
    boundaries, batch_tokens = [8, 16, 24, 32, 40, 56, 64], 256
    sizes = [(len(s), len(t) + 1) for s, t in zip(src, tgt, strict=True)]
    # Naive: every pair padded to the longest sequence in the corpus.
    longest = max(max(pair) for pair in sizes)
    real = sum(a + b for a, b in sizes)
    naive = 1 - real / (2 * len(sizes) * longest)
    assert naive > 0.5  # the waste that bucketing avoids
    # Bucketed, from the lengths alone: each pair takes 2 x its bucket
    # length, and each bucket's last batch is topped up with empty rows.
    counts = collections.Counter(
        min(b for b in boundaries if b >= max(pair)) for pair in sizes
    )
    positions = 0
    for length, count in counts.items():
        rows = batch_tokens // length
        positions += 2 * length * (count + (-count) % rows)
    expected = 1 - real / positions
    batches, _ = make_batches(src, tgt, batch_tokens, boundaries)
    assert padding_fraction(batches) == pytest.approx(expected, abs=1e-12)
    assert expected < naive / 2


@pytest.mark.once
def test_bad_ids_and_budgets():
    with pytest.raises(ValueError, match="0 is padding"):
        make_batches([[5, 0, 6]], [[7]], 8, [8])
    with pytest.raises(ValueError, match="added by the batcher"):
        make_batches([[5, END]], [[7, END]], 8, [8])
    with pytest.raises(ValueError, match="at least the largest"):
        make_batches([[5]], [[7]], 8, [8, 16])
    with pytest.raises(ValueError, match="same number"):
        make_batches([[5], [6]], [[7]], 8, [8])
    with pytest.raises(ValueError, match="increasing"):
        make_batches([[5]], [[7]], 16, [16, 8])


@pytest.mark.once
def test_rows_multiple_for_data_parallel_replicas():
    src, tgt = skewed_corpus()
    boundaries = [8, 16, 24, 40, 64]
    # 256 tokens: 32, 16, 10, 6, 4 rows; in multiples of 4: 32, 16, 8, 4, 4.
    expected = {8: 32, 16: 16, 24: 8, 40: 4, 64: 4}
    batches, _ = make_batches(src, tgt, 256, boundaries, rows_multiple=4)
    assert unpad(batches) == as_counter(src, tgt)
    rows = {labels.shape[1]: labels.shape[0] for _, labels in batches}
    assert rows == expected
    for inputs, labels in batches:
        assert labels.shape[0] * labels.shape[1] <= 256
        assert all(a.shape == labels.shape for a in inputs.values())

    dataset = BucketedDataset(src, tgt, 256, boundaries, rows_multiple=4, seed=1)
    assert {dataset[i][1].shape[0] % 4 for i in range(len(dataset))} == {0}
    assert unpad(dataset) == as_counter(src, tgt)


@pytest.mark.once
def test_process_shards_are_the_row_blocks_of_the_whole_batch():
    src, tgt = skewed_corpus()
    boundaries = [8, 16, 24, 40, 64]
    whole = BucketedDataset(src, tgt, 256, boundaries, rows_multiple=4, seed=3)
    shards = [
        BucketedDataset(
            src, tgt, 256, boundaries, rows_multiple=4, seed=3, process_shard=(i, 2)
        )
        for i in range(2)
    ]
    for epoch_of in (lambda d: d, lambda d: d.epoch_view(2, skip=3)):
        full, parts = epoch_of(whole), [epoch_of(d) for d in shards]
        assert all(len(p) == len(full) for p in parts)
        for index in range(len(full)):
            (x, y), pieces = full[index], [p[index] for p in parts]
            assert all(len(py) == len(y) // 2 for _, py in pieces)
            np.testing.assert_array_equal(np.concatenate([py for _, py in pieces]), y)
            for name in x:
                joined = np.concatenate([px[name] for px, _ in pieces])
                np.testing.assert_array_equal(joined, x[name])
            # Progress counts the whole batch's tokens on every process.
            assert parts[1].target_tokens(index) == full.target_tokens(index)


@pytest.mark.once
@pytest.mark.parametrize(
    "shard, rows_multiple, error",
    [((2, 2), 4, ValueError), ((0, 3), 4, ValueError), ("ab", 4, TypeError)],
)
def test_bad_process_shards_are_refused(shard, rows_multiple, error):
    src, tgt = skewed_corpus(20)
    with pytest.raises(error, match="process_shard|process shards"):
        BucketedDataset(
            src, tgt, 256, [8, 64], rows_multiple=rows_multiple, process_shard=shard
        )


@pytest.mark.once
def test_rows_multiple_default_is_plain_budget():
    src, tgt = skewed_corpus()
    boundaries = [8, 16, 24, 40, 64]
    plain, _ = make_batches(src, tgt, 256, boundaries, seed=5)
    ones, _ = make_batches(src, tgt, 256, boundaries, seed=5, rows_multiple=1)
    assert {labels.shape for _, labels in plain} == {(256 // n, n) for n in boundaries}
    assert len(plain) == len(ones)
    for (a, y), (b, z) in zip(plain, ones, strict=True):
        np.testing.assert_array_equal(y, z)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.once
def test_rows_multiple_too_large_or_malformed():
    # 64 // 24 = 2 rows at the largest bucket: not enough for 4 replicas,
    # even though no example here reaches that bucket.
    message = r"batch_tokens=64 .*rows_multiple=4 .*bucket length 24"
    with pytest.raises(ValueError, match=message):
        make_batches([[5]], [[7]], 64, [8, 16, 24], rows_multiple=4)
    with pytest.raises(ValueError, match=message):
        BucketedDataset([[5]], [[7]], 64, [8, 16, 24], rows_multiple=4)
    batches, _ = make_batches([[5]], [[7]], 64, [8, 16, 24], rows_multiple=2)
    assert batches[0][1].shape == (8, 8)
    with pytest.raises(ValueError, match="rows_multiple must be >= 1"):
        make_batches([[5]], [[7]], 64, [8], rows_multiple=0)
    with pytest.raises(TypeError, match="rows_multiple must be an int"):
        make_batches([[5]], [[7]], 64, [8], rows_multiple=2.0)


class RecordingDataset(BucketedDataset):
    """Remembers the shape of every batch handed to Keras."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shapes = set()

    def __getitem__(self, index):
        inputs, labels = super().__getitem__(index)
        shapes = {name: array.shape for name, array in inputs.items()}
        self.shapes.add((shapes["encoder_inputs"], shapes["decoder_inputs"]))
        assert labels.shape == shapes["decoder_inputs"]
        return inputs, labels


@pytest.mark.slow
def test_model_fit_on_buckets():
    src, tgt = skewed_corpus(n=60, seed=1)
    boundaries = [8, 16, 24]
    # Seed 2 draws two 16-long batches first: without the shortest/longest
    # batches up front, TensorFlow would fix the length at 16 and fail on the
    # first batch of another bucket.
    dataset = RecordingDataset(src, tgt, 64, boundaries, seed=2)
    sizes = [max(len(s), len(t) + 1) for s, t in zip(src, tgt, strict=True)]
    used = {min(b for b in boundaries if b >= n) for n in sizes if n <= 24}
    assert used == {8, 16, 24}
    model = kt.build_model(
        "tiny", src_vocab_size=VOCAB, num_layers=1, d_model=32, num_heads=4, d_ff=64
    )
    model.compile(optimizer="adam", loss=kt.LabelSmoothedCrossEntropy())
    history = model.fit(dataset, epochs=1, verbose=0)
    loss = history.history["loss"]
    assert len(loss) == 1 and np.isfinite(loss[0])
    # One shape per bucket length, not one per batch: (rows, length) with
    # rows = 64 // length.
    expected = {((64 // n, n), (64 // n, n)) for n in used}
    assert dataset.shapes == expected
    # Keras called on_epoch_end (also once before the first epoch).
    assert dataset.epoch >= 1
    keras.utils.clear_session()


def test_epoch_view_is_the_epochs_fixed_order_minus_skipped_batches():
    src, tgt = skewed_corpus()
    dataset = BucketedDataset(src, tgt, 64, [4, 8, 16, 32], seed=3)
    full = dataset.epoch_view(2)
    assert len(full) == len(dataset)
    # The same epoch always gives the same batches; other epochs differ.
    again = dataset.epoch_view(2)
    for i in range(len(full)):
        for name in ("encoder_inputs", "decoder_inputs"):
            np.testing.assert_array_equal(full[i][0][name], again[i][0][name])
    assert any(
        not np.array_equal(full[i][1], dataset.epoch_view(3)[i][1])
        for i in range(len(full))
        if full[i][1].shape == dataset.epoch_view(3)[i][1].shape
    )
    full.on_epoch_end()  # changes nothing
    np.testing.assert_array_equal(full[0][1], again[0][1])

    # Skipping k batches serves exactly the others (in the same order, except
    # on TensorFlow, where the shortest and longest remaining come first).
    rest = dataset.epoch_view(2, skip=5)
    assert len(rest) == len(full) - 5
    key = lambda b: (b[1].shape, b[1].tobytes())  # noqa: E731
    served = [key(rest[i]) for i in range(len(rest))]
    expected = [key(full[i]) for i in range(5, len(full))]
    if keras.backend.backend() == "tensorflow":
        assert sorted(served) == sorted(expected)
        lengths = [shape[1] for shape, _ in expected]
        assert {served[0][0][1], served[1][0][1]} == {min(lengths), max(lengths)}
    else:
        assert served == expected
    assert len(dataset.epoch_view(2, skip=len(dataset))) == 0
    with pytest.raises(ValueError, match="skip"):
        dataset.epoch_view(2, skip=len(dataset) + 1)
    with pytest.raises(IndexError):
        rest[len(rest)]


@pytest.mark.once
def test_target_tokens_count_each_batchs_targets_and_end_tokens():
    src = [[5, 6], [7], [8, 9, 10], [11]]
    tgt = [[5], [6, 7], [8, 9, 10], [4, 4, 4, 4]]
    dataset = BucketedDataset(src, tgt, batch_tokens=64, boundaries=[8], shuffle=False)
    for index in range(len(dataset)):
        _, labels = dataset[index]
        assert dataset.target_tokens(index) == int((labels != 0).sum())
    assert sum(dataset.target_tokens(i) for i in range(len(dataset))) == 14


@pytest.mark.once
def test_one_rule_gives_training_and_decoding_buckets():
    from keras_transformer.data import TRAINING_BUCKETS, bucket_length

    # Training: every multiple of 4 to 32, then about 1.2 times apart (the
    # integer part of 1.2 × 404 = 484.8, rounded up to a multiple of 4), the
    # longest example last.
    assert bucket_boundaries(128, **TRAINING_BUCKETS) == [
        8, 12, 16, 20, 24, 28, 32, 40, 48, 60, 72, 88, 108, 128,
    ]  # fmt: skip
    assert bucket_boundaries(500, **TRAINING_BUCKETS)[-4:] == [336, 404, 484, 500]
    assert bucket_boundaries(10, **TRAINING_BUCKETS) == [8, 10]
    # Decoding: powers of two from 8, capped by the model's max_length, and
    # without end when there is none.
    widths = {"step": 2, "multiple": 8}
    assert [bucket_length(n, 100, **widths) for n in (1, 8, 9, 17, 33, 65, 100)] == [
        8, 8, 16, 32, 64, 100, 100,
    ]  # fmt: skip
    assert bucket_length(300, None, **widths) == 512
    for n in range(1, 129):
        bounds = bucket_boundaries(128, **widths)
        assert bucket_length(n, 128, **widths) == min(b for b in bounds if b >= n)
    with pytest.raises(ValueError, match="step must be > 1"):
        bucket_length(5, step=1)
