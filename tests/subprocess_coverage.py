"""Coverage of the processes a test starts, recorded into the run's own
coverage data while the test's process records it (``tests/run_all.sh``).

The server tests talk to ``kt-serve`` in a process of its own; without
this, the lines it runs would count as never run. The child starts coverage
through coverage.py's own start-up hook (``COVERAGE_PROCESS_START``, the
``.pth`` file it installs) and writes a parallel data file beside the run's,
which the run's ``coverage combine`` adds.
"""

import os
import tempfile


def environment(env=None):
    """``env`` (default: this process's) with ``COVERAGE_PROCESS_START`` set
    when this process records coverage now, else unchanged."""
    env = dict(os.environ if env is None else env)
    try:
        import coverage
    except ImportError:
        return env
    current = coverage.Coverage.current()
    if current is None:  # not measured, or paused for this test
        return env
    config = current.config
    sources = "\n    ".join(config.source or [])
    # The run's omissions too: with `source`, coverage reports every file
    # under it, tests included, unless told to leave them out.
    omitted = "\n    ".join(config.run_omit or [])
    rc = tempfile.NamedTemporaryFile(
        "w", prefix="kt-subprocess-coverage-", suffix=".rc", delete=False
    )
    with rc:
        rc.write(
            "[run]\n"
            f"data_file = {os.path.abspath(config.data_file)}\n"
            "parallel = True\n"
            f"branch = {config.branch}\n"
            f"source =\n    {sources}\n"
            f"omit =\n    {omitted}\n"
            # A server stopped at once ends with os._exit: save the data first.
            "patch = _exit\n"
        )
    env["COVERAGE_PROCESS_START"] = rc.name
    return env
