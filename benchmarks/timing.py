"""A timer for the benchmarks: the first call (which compiles) apart."""

import statistics
import time


def call_times(fn, repeats):
    """Seconds of each of ``repeats`` calls of ``fn``, in order."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_call(fn, repeats):
    """``(first, median)``: seconds of a first call of ``fn`` (which compiles)
    and the median of ``repeats`` calls after it."""
    first = call_times(fn, 1)[0]
    return first, statistics.median(call_times(fn, repeats))
