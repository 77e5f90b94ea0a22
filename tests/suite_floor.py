"""What the suite's CPU time is made of, and a floor under it (a tool, not
a test).

On two cores the suite is bound by CPU time: both cores stay busy from the
first test to the last. This reads the per-test CPU reports of one run
(``tests/cpu_report.py``)::

    CI=true KT_CPU_REPORT=/tmp/cpu/r bash .ci/run
    python -m tests.suite_floor /tmp/cpu/r [tests/test_more.py ...]

and prints the tests' CPU seconds per backend, by how many of the run's
backends collect each test (every one, some, one), and a floor: the CPU the
same tests would take if only the layers' test files ran on every backend
and every other test ran in one backend's run only, the one where it cost
least (test files named after the prefix are kept on every backend
too). A suite that tests the product, not only its layers, on three
backends cannot cost less than that floor; a bar in wall time that leaves
less CPU than the floor for the tests is out of reach of any reshuffling of
backends.
"""

import sys

from tests import cpu_report

# The guide's rule: every layer, and the model they compose, on every backend.
LAYER_FILES = (
    "tests/test_attention.py",
    "tests/test_blocks.py",
    "tests/test_dropout.py",
    "tests/test_embedding.py",
    "tests/test_model.py",
    "tests/test_position.py",
)


def by_reach(cost):
    """{"every": s, "some": s, "one": s}: the CPU seconds of the tests that
    every backend of the run collected, more than one but not all, one."""
    backends = {backend for by in cost.values() for backend in by}
    totals = {"every": 0.0, "some": 0.0, "one": 0.0}
    for by in cost.values():
        reach = (
            "every" if len(by) == len(backends) else "one" if len(by) == 1 else "some"
        )
        totals[reach] += sum(by.values())
    return totals


def floor(cost, kept=LAYER_FILES):
    """The tests' CPU seconds with the files in ``kept`` on every backend
    they ran on and every other test once, on its cheapest backend."""
    return sum(
        sum(by.values()) if test.split("::", 1)[0] in kept else min(by.values())
        for test, by in cost.items()
    )


def main(prefix, *also_kept):
    cost = cpu_report.read(prefix)
    if not cost:
        raise SystemExit(f"no CPU reports at {prefix}.*")
    per_backend = {}
    for by in cost.values():
        for backend, seconds in by.items():
            per_backend[backend] = per_backend.get(backend, 0.0) + seconds
    total = sum(per_backend.values())
    each = ", ".join(f"{b} {s:.0f}" for b, s in sorted(per_backend.items()))
    print(f"{len(cost)} tests, {total:.0f} s of CPU in tests ({each})")
    reach = by_reach(cost)
    print(
        f"on every backend {reach['every']:.0f} s, on some {reach['some']:.0f} s,"
        f" on one {reach['one']:.0f} s"
    )
    kept = LAYER_FILES + also_kept
    print(
        f"floor: {floor(cost, kept):.0f} s ({', '.join(also_kept + ('the layers',))}"
        " on every backend, every other test once, where it cost least)"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
