"""A real Redis for the rate-limit tests: Debian's ``redis-server`` on a
free port of 127.0.0.1 and a Unix socket, saving nothing, in a temporary
folder (``tests/run_all.sh`` installs it where it can). Nothing is fetched.

    with RedisServer() as redis:
        ...redis.url, redis.unix_url...
        redis.stop()    # an outage: connections are refused
        redis.start()   # back, on the same port and socket, empty
        redis.pause()   # SIGSTOP: connections open, and nothing answers
        redis.resume()
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

REDIS_SERVER = os.environ.get("KT_REDIS_SERVER", "redis-server")


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(port, timeout=0.5):
    """Whether a Redis on ``port`` of 127.0.0.1 answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A ``redis-server`` process on 127.0.0.1 (``start``ed on entering a
    ``with``, stopped and its folder removed on leaving). A test that needs
    it fails, rather than skips, where ``redis-server`` is missing."""

    def __init__(self):
        self.binary = shutil.which(REDIS_SERVER)
        if self.binary is None:
            pytest.fail(
                f"no {REDIS_SERVER}: install Debian's redis-server (apt-get "
                "install redis-server; tests/run_all.sh does it as root)"
            )
        self.port = free_port()
        self.directory = None
        self.process = None
        self._paused = False

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    @property
    def unix_url(self):
        return f"redis+unix://{self.directory}/redis.sock"

    def start(self, timeout=10.0):
        """Starts it (again, on the same port and socket) and waits until it
        answers PING."""
        if self.directory is None:
            # A short path: a Unix socket's is limited to about 100 bytes.
            self.directory = tempfile.mkdtemp(prefix="kt-redis-")
        log = open(os.path.join(self.directory, "redis.log"), "ab")
        with log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--unixsocket",
                    os.path.join(self.directory, "redis.sock"),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self.directory,
                ],  # fmt: skip
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while not answers(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{self.binary} did not start:\n{self.log()}")
            time.sleep(0.02)

    def stop(self):
        """Stops it (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None:
            return
        self.resume()  # a stopped process would not act on SIGTERM
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def pause(self):
        """Freezes it: the kernel still accepts connections, nothing answers."""
        self.process.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self):
        if self._paused:
            self.process.send_signal(signal.SIGCONT)
            self._paused = False

    def log(self):
        try:
            with open(os.path.join(self.directory, "redis.log"), errors="replace") as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
