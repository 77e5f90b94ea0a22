"""The one scheduler: sentences sorted by length, cut into batches, each
batch searched, the results put back in the caller's order.

Every engine (``translate.base``) and the server (``serving.searcher``)
schedule their searches here, as fairseq's ``EpochBatchIterator`` and
``SequenceGenerator`` or OpenNMT-py's ``Inference`` do for theirs. Sorting
puts sentences of one length side by side, so that a batch pads few
positions and a compiled search meets few widths; the caller never sees the
order.

What searches is the caller's: a function of an iterator of batches that
yields each batch's results in turn. A search that runs one batch at a time
reads a batch, searches it and yields; one that runs several at once
(CTranslate2's workers) reads ahead before it yields. A batch is cut when
the search reads it, not before, so that ``keep`` decides about a batch as
late as it can (a server's client may have gone meanwhile).

Nothing here knows a model, a tokenizer or a backend.
"""

import collections


def by_length(sequences):
    """The indexes of ``sequences``, shortest first; a stable sort, so that
    sequences of one length keep their order and sorted ones stay put."""
    return sorted(range(len(sequences)), key=lambda i: len(sequences[i]))


def in_length_order(sequences, search):
    """``search(order)``'s results, put back in the order of ``sequences``:
    ``order`` is their indexes, shortest first (``by_length``), and
    ``search`` gives one result per index of ``order``, in that order."""
    order = by_length(sequences)
    results = [None] * len(sequences)
    for i, result in zip(order, search(order), strict=True):
        results[i] = result
    return results


def in_batches(items, batch_size, search, keep=None, report=None):
    """The results of ``items``, searched ``batch_size`` at a time in their
    order.

    Args:
        items: what to search, in the order to search it.
        batch_size: int, the most items in a batch.
        search: ``search(batches)``, given an iterator of batches (lists of
            items), yields one list of results per batch (one result per
            item), batch after batch.
        keep: optional ``keep(batch)``, asked when a batch is cut: one bool
            per item, False for one not to search (its result is None).
        report: optional, called after each batch with the number of items
            done (searched or left out) so far.

    Returns:
        one result per item, in the order of ``items``.
    """
    results = [None] * len(items)
    handed = collections.deque()  # per batch: its positions, items done after it
    finished = False

    def batches():
        nonlocal finished
        for start in range(0, len(items), batch_size):
            stop = min(start + batch_size, len(items))
            positions = range(start, stop)
            if keep is not None:
                flags = keep([items[p] for p in positions])
                positions = [p for p, k in zip(positions, flags, strict=True) if k]
            if positions:
                handed.append((positions, stop))
                yield [items[p] for p in positions]
        finished = True

    done = 0
    for found in search(batches()):
        if not handed:
            raise RuntimeError("The search gave more batches of results than it read.")
        positions, done = handed.popleft()
        for p, result in zip(positions, found, strict=True):
            results[p] = result
        if report is not None:
            report(done)
    if handed or not finished:
        raise RuntimeError("The search stopped before it answered every batch.")
    if report is not None and done < len(items):
        report(len(items))  # the last batches were all left out
    return results


def schedule(sequences, batch_size, search, keep=None, report=None):
    """Sort by length, cut into batches, search, put back in order:
    ``in_batches`` (same arguments) of the indexes of ``sequences``
    shortest first, its results in the order of ``sequences``. ``search``
    and ``keep`` see batches of indexes into ``sequences``."""
    return in_length_order(
        sequences,
        lambda order: in_batches(order, batch_size, search, keep, report),
    )
