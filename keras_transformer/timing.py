"""A timer for the benchmarks: the first call (which compiles) apart."""

import statistics
import time


def time_call(fn, repeats):
    """``(first, median)``: seconds of a first call of ``fn`` (which compiles)
    and the median of ``repeats`` calls after it."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)
