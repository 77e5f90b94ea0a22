"""Which costly tests reach no code that other tests do not (a tool, not a test).

Coverage's tracer roughly doubles the CPU time of the Python it watches, and
most of the suite's costly tests (whole training runs, servers, compiled
searches) run lines that cheaper tests run too. ``conftest.UNTRACED`` lists
tests that run without recording coverage; this script chooses them. Run the
suite with test contexts and per-test CPU times::

    KT_CPU_REPORT=/tmp/cpu/r bash tests/run_all.sh --cov-context=test
    python -m tests.redundant_coverage .coverage /tmp/cpu/r >> tests/untraced.txt

It goes through the traced tests, costliest first, and marks one untraced
when every line and branch it reaches is reached by a test still traced; it
prints the chosen node ids and the CPU seconds each took, in the form of
``tests/untraced.txt``. Leave out the tests that start processes (servers,
commands): what a process records carries no test's name, so its lines look
reached by every test and would be lost with the test. Untracing can only
lower the coverage a run reports (a line reached only by an untraced test
counts as not run), never raise it; rerun this after changing the suite.
"""

import collections
import sys

from tests import cpu_report
from tests.backend_coverage import context_arcs


def arcs_by_test(path):
    """{test node id: {(source file, from, to), ...}} from a combined data
    file recorded with ``--cov-context=test``."""
    found = collections.defaultdict(set)
    for source, context, start, end in context_arcs(path):
        test = context.rsplit("|", 1)[0]  # "|setup", "|run", "|teardown"
        found[test].add((source, start, end))
    return found


def cpu_by_test(prefix):
    """{test node id: CPU seconds, summed over the backends' runs} from the
    reports ``tests/cpu_report.py`` wrote to ``prefix.*``."""
    return {test: sum(by.values()) for test, by in cpu_report.read(prefix).items()}


def untraceable(arcs, cost):
    """The tests, costliest first, whose arcs other traced tests all reach."""
    reached = collections.Counter(
        arc for test_arcs in arcs.values() for arc in test_arcs
    )
    chosen = []
    for test in sorted(arcs, key=lambda t: -cost.get(t, 0.0)):
        if not test or cost.get(test, 0.0) < 1.0:
            continue  # "": imports and collection, recorded in every run
        if all(reached[arc] > 1 for arc in arcs[test]):
            chosen.append(test)
            reached.subtract(arcs[test])
    return chosen


def main(data_file, cpu_prefix):
    arcs = arcs_by_test(data_file)
    cost = cpu_by_test(cpu_prefix)
    chosen = untraceable(arcs, cost)
    for test in sorted(chosen):
        print(f"{test}  # {cost[test]:.1f} s")
    total = sum(cost[t] for t in chosen)
    print(
        f"{len(chosen)} tests, {total:.0f} s of CPU with coverage on", file=sys.stderr
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
