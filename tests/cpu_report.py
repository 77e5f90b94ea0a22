"""Per-test CPU time (a pytest plugin that conftest.py loads).

With ``KT_CPU_REPORT=path`` set, each test's CPU time (user + system, of the
process and of the child processes it waited for: getrusage's SELF and
CHILDREN) over its setup, call and teardown is recorded, and at the end of
the session a report sorted by CPU time is written to ``path`` (to
``path.gwN`` in each pytest-xdist worker). On two shared cores wall time says
more about what else runs than about the test; CPU time is what the suite
costs. A module- or session-scoped fixture counts in the first test that
uses it, which is why the report also sums the time per file. Under
pytest-xdist the controller writes ``path`` too, with no tests: its total
includes its workers' (children it waited for), so it is the run's total.
"""

import collections
import glob
import os
import resource
import time

import pytest

_PATH = os.environ.get("KT_CPU_REPORT")
# The heading above the per-test lines: written by the plugin, looked for by
# read().
_BY_TEST = "## by test (CPU s, wall s)"


def _cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Recorder:
    def __init__(self, path):
        self.path = path
        self.wall_start = time.perf_counter()
        self.tests = []  # (cpu seconds, wall seconds, node id)
        if os.path.exists(self._partial()):
            os.remove(self._partial())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall = _cpu_seconds(), time.perf_counter()
        yield
        done = (_cpu_seconds() - cpu, time.perf_counter() - wall, item.nodeid)
        self.tests.append(done)
        # As it goes, too: a run stopped half-way still shows its costs.
        with open(self._partial(), "a", encoding="utf-8") as out:
            out.write(f"{done[0]:9.2f} {done[1]:9.2f}  {done[2]}\n")

    def _partial(self):
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        return f"{self.path}.{worker}.partial" if worker else f"{self.path}.partial"

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        path = f"{self.path}.{worker}" if worker else self.path
        total = _cpu_seconds()  # since the process started
        in_tests = sum(cpu for cpu, _, _ in self.tests)
        by_file = {}
        for cpu, _, nodeid in self.tests:
            name = nodeid.split("::", 1)[0]
            by_file[name] = by_file.get(name, 0.0) + cpu
        backend = os.environ.get("KERAS_BACKEND", "?")
        lines = [
            f"# backend {backend}: {len(self.tests)} tests, CPU {total:.1f} s "
            f"in all ({in_tests:.1f} s in tests, {total - in_tests:.1f} s "
            f"importing, collecting and starting), wall "
            f"{time.perf_counter() - self.wall_start:.1f} s",
            "",
            "## by file (CPU s)",
        ]
        for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1]):
            lines.append(f"{cpu:9.2f}  {name}")
        lines += ["", _BY_TEST]
        for cpu, wall, nodeid in sorted(self.tests, reverse=True):
            lines.append(f"{cpu:9.2f} {wall:9.2f}  {nodeid}")
        with open(path, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")


def pytest_configure(config):
    if _PATH:
        config.pluginmanager.register(_Recorder(_PATH), "kt_cpu_report")


def read(prefix):
    """{test node id: {backend: CPU seconds}} from the reports written to
    ``prefix.*`` (one per backend's run, one per pytest-xdist worker; the
    backend is read from each report's first line)."""
    cost = collections.defaultdict(dict)
    for path in glob.glob(f"{prefix}.*"):
        if path.endswith(".partial"):
            continue
        with open(path, encoding="utf-8") as report:
            header = report.readline().split()
            if len(header) < 3 or header[:2] != ["#", "backend"]:
                raise ValueError(f"{path}:1: not a CPU report of this plugin")
            backend = header[2].rstrip(":")
            tests = False
            for line in report:
                if line.startswith("## "):
                    tests = line.rstrip("\n") == _BY_TEST
                    continue
                parts = line.split(None, 2)
                if tests and len(parts) == 3:
                    cost[parts[2].strip()][backend] = float(parts[0])
    return dict(cost)
