"""translate.scheduler: sort by length, cut into batches, search, put back
in order, for every engine and the server. Plain Python: no model."""

import pytest

from keras_transformer.translate import scheduler

pytestmark = pytest.mark.once

WORDS = ["ccc", "a", "bb", "", "dddd", "b", "cc", "e"]


def one_at_a_time(seen):
    """A search that reads a batch, records it and answers it: each item's
    result is the item itself, marked."""

    def search(batches):
        for batch in batches:
            seen.append(list(batch))
            yield [("found", item) for item in batch]

    return search


def all_first(seen):
    """A search that reads every batch before it answers any (as one that
    runs several at once reads ahead)."""

    def search(batches):
        read = [list(batch) for batch in batches]
        seen.extend(read)
        for batch in read:
            yield [("found", item) for item in batch]

    return search


def test_by_length_is_a_stable_sort():
    order = scheduler.by_length(WORDS)
    assert [len(WORDS[i]) for i in order] == sorted(map(len, WORDS))
    # Ties keep the caller's order: "a" (1), "b" (5), "e" (7).
    assert [i for i in order if len(WORDS[i]) == 1] == [1, 5, 7]
    assert scheduler.by_length(sorted(WORDS, key=len)) == list(range(len(WORDS)))


def test_results_come_back_in_the_callers_order():
    seen = []
    results = scheduler.schedule(WORDS, 3, one_at_a_time(seen))
    assert results == [("found", i) for i in range(len(WORDS))]
    # The search saw the indexes shortest first, three at a time.
    assert [len(batch) for batch in seen] == [3, 3, 2]
    assert [WORDS[i] for batch in seen for i in batch] == sorted(WORDS, key=len)
    assert scheduler.schedule([], 3, one_at_a_time(seen)) == []


@pytest.mark.parametrize("search", [one_at_a_time, all_first])
def test_a_search_that_reads_ahead_gets_the_same_results(search):
    seen = []
    assert scheduler.in_batches(list("abcdefg"), 2, search(seen)) == [
        ("found", item) for item in "abcdefg"
    ]
    assert seen == [["a", "b"], ["c", "d"], ["e", "f"], ["g"]]


def test_progress_is_reported_after_each_batch():
    done = []
    scheduler.in_batches(list("abcdefg"), 3, one_at_a_time([]), report=done.append)
    assert done == [3, 6, 7]


def test_keep_decides_when_a_batch_is_cut():
    """A client gone while the first batch is searched: its items in later
    batches are left out (None) and never searched; ``keep`` is asked about
    a batch only when the search reads it."""
    gone, seen, asked = set(), [], []

    def search(batches):
        for batch in batches:
            seen.append(batch)
            gone.update({"b", "e", "f"})  # their client leaves meanwhile
            yield [item.upper() for item in batch]

    def keep(batch):
        asked.append(list(batch))
        return [item not in gone for item in batch]

    done = []
    results = scheduler.in_batches(
        list("abcdef"), 2, search, keep=keep, report=done.append
    )
    assert results == ["A", "B", "C", "D", None, None]
    assert seen == [["a", "b"], ["c", "d"]]
    assert asked == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert done == [2, 4, 6]


def test_a_search_must_answer_each_batch_it_reads():
    def stops_early(batches):
        yield [1] * len(next(batches))

    with pytest.raises(RuntimeError, match="before it answered every batch"):
        scheduler.in_batches(list("abcd"), 2, stops_early)

    def answers_too_much(batches):
        for batch in batches:
            yield [1] * len(batch)
        yield [1]

    with pytest.raises(RuntimeError, match="more batches of results"):
        scheduler.in_batches(list("abcd"), 2, answers_too_much)

    def one_short(batches):
        for batch in batches:
            yield [1] * (len(batch) - 1)

    with pytest.raises(ValueError):  # zip(strict=True)
        scheduler.in_batches(list("abcd"), 2, one_short)
