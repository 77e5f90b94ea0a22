"""The ``kt-*`` commands in subprocesses, as a user runs them, for tests.

- ``command(name)``: the installed console script beside this Python (the
  package decides what to import from the script's name), else a stand-in
  that sets ``sys.argv[0]`` to that name first;
- ``environment(...)``: this environment with the backend and
  ``TF_CPP_MIN_LOG_LEVEL`` set or removed;
- ``sitecustomize(folder, hide=..., report=...)``: what makes a process
  fail to import some packages, as if they were not installed, and write
  the names of the modules it imported when it exits (``imported``);
- ``Server``: ``kt-serve`` started until its ready line, then stopped with
  SIGTERM.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"kt-serve: ready on (http://\S+)")
# The frameworks Keras runs on, Keras itself and what brings TensorFlow.
HEAVY = (
    "keras",
    "keras_hub",
    "tensorflow",
    "tensorflow_text",
    "jax",
    "jaxlib",
    "torch",
)

_SITECUSTOMIZE = '''
import atexit, json, os, sys

_HIDDEN = set(json.loads(os.environ.get("KT_TEST_HIDE", "[]")))
_REPORT = os.environ.get("KT_TEST_MODULES")


class _NotInstalled:
    """Imports of the hidden packages fail as if they were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if _HIDDEN:
    sys.meta_path.insert(0, _NotInstalled())


def _report():
    with open(_REPORT, "w") as file:
        json.dump(sorted(sys.modules), file)


if _REPORT:
    atexit.register(_report)
'''


def command(name):
    """The command line that runs the console script ``name``."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(script):
        return [script]
    module = name.removeprefix("kt-")
    return [
        sys.executable,
        "-c",
        f"import sys; sys.argv[0] = {name!r}; "
        f"from keras_transformer.cli.{module} import command; command()",
    ]


def environment(backend=None, log_level=None, **changes):
    """This process's environment, with ``KERAS_BACKEND`` and
    ``TF_CPP_MIN_LOG_LEVEL`` as given (None: removed, as a user who never
    set them has it) and ``changes``."""
    env = dict(os.environ, **changes)
    chosen = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": log_level}
    for name, value in chosen.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def sitecustomize(folder, env, hide=(), report=None):
    """``env`` changed so that the process imports ``folder/sitecustomize.py``:
    it hides the packages ``hide`` and, with ``report``, writes the names of
    the modules it imported to that file at exit."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as file:
        file.write(_SITECUSTOMIZE)
    env = dict(env, KT_TEST_HIDE=json.dumps(list(hide)))
    if report is not None:
        env["KT_TEST_MODULES"] = str(report)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(folder), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def imported(report):
    """The modules a process reported (``sitecustomize(report=...)``)."""
    with open(report) as file:
        return set(json.load(file))


def heavy(modules):
    """The modules among ``modules`` that belong to ``HEAVY`` packages."""
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


class Server:
    """``kt-serve ARGS --port 0`` until its ready line; ``stop`` sends
    SIGTERM and returns the exit status."""

    def __init__(self, args, env=None, timeout=600):
        self.process = subprocess.Popen(
            [*command("kt-serve"), *args, "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        timer = threading.Timer(timeout, self.process.kill)
        timer.start()
        try:
            self.ready_line = self.process.stdout.readline()  # or EOF
        finally:
            timer.cancel()
        match = READY.search(self.ready_line)
        self.url = match and urllib.parse.urlsplit(match.group(1))

    def _read_stderr(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def post(self, path, body):
        """``(status, decoded JSON body)`` of a POST."""
        connection = http.client.HTTPConnection(
            self.url.hostname, self.url.port, timeout=120
        )
        try:
            connection.request(
                "POST", path, json.dumps(body), {"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        self._reader.join(timeout=10)
        self.process.stdout.close()
        self.process.stderr.close()
        return status
