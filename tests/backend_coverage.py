"""Which test files reach code that only some backends run (a tool, not a test).

``tests/run_all.sh`` records coverage for every test in the run that runs
the ``once`` tests by default (PyTorch), but on TensorFlow and JAX only for
the ``once`` tests they collect and the test files in
``conftest.PER_BACKEND_COVERAGE``: tracing slows a run markedly, and most
lines run the same on every backend. This script shows which
files that set needs. Record each backend's coverage with test contexts, in
files named ``.coverage.<backend>``, then::

    python tests/backend_coverage.py DIR

It prints the lines and branches that TensorFlow or JAX reach and the
reference run does not, and a smallest set of test files (greedy) whose
tests reach all of them.
"""

import collections
import sqlite3
import sys
from pathlib import Path

REFERENCE = "torch"


def context_arcs(path):
    """``(source file, context, from, to)`` for each arc a coverage data file
    recorded with test contexts holds, once per context that reached it."""
    with sqlite3.connect(path) as db:
        yield from db.execute(
            "select file.path, context.context, arc.fromno, arc.tono from arc "
            "join file on file.id = arc.file_id "
            "join context on context.id = arc.context_id"
        )


def arcs_by_test_file(path):
    """{(source file, from, to): {test file, ...}} from one backend's data."""
    found = collections.defaultdict(set)
    for source, context, start, end in context_arcs(path):
        test_file = context.split("::", 1)[0].rsplit("/", 1)[-1]
        found[(source, start, end)].add(test_file)
    return found


def main(folder):
    folder = Path(folder)
    reference = arcs_by_test_file(folder / f".coverage.{REFERENCE}")
    missing = collections.defaultdict(set)
    for data in sorted(folder.glob(".coverage.*")):
        if data.name == f".coverage.{REFERENCE}":
            continue
        for arc, test_files in arcs_by_test_file(data).items():
            # "": reached while importing or collecting, which every run
            # records.
            if arc not in reference and "" not in test_files:
                missing[arc] |= test_files
    print(f"{len(missing)} arcs reached only outside the {REFERENCE} run:")
    for source, start, end in sorted(missing):
        where = ", ".join(sorted(missing[(source, start, end)]))
        print(f"  {Path(source).name}:{start}->{end}  ({where})")
    chosen, left = [], set(missing)
    while left:
        counts = collections.Counter(f for arc in left for f in missing[arc])
        best, _ = counts.most_common(1)[0]
        chosen.append(best)
        left = {arc for arc in left if best not in missing[arc]}
    print("test files that reach all of them:", ", ".join(sorted(chosen)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
