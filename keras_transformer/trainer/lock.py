"""One writer per run folder: an exclusive lock held for a whole run.

The lock is ``fcntl.flock`` on a file beside the folder (``runs/x.lock`` for
``runs/x``), so it never counts among the folder's own files. The kernel
drops it when its process ends, however it ends: a lock left by a killed run
blocks nothing. The file names its holder (process id, host, start time) for
the message a second run gets. Where ``fcntl`` is missing (Windows) there is
no lock.
"""

import contextlib
import json
import os
import socket
import time

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None


class FolderInUse(Exception):
    """Another process holds the folder; ``holder`` says who (a dict)."""

    def __init__(self, folder, holder):
        self.folder = folder
        self.holder = holder
        who = describe(holder)
        super().__init__(f"{folder} is in use by another run ({who})")


def lock_path(folder):
    folder = os.path.abspath(os.fspath(folder)).rstrip(os.sep) or os.sep
    return folder + ".lock"


def describe(holder):
    if not holder:
        return "a process that has not said who it is yet"
    started = time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0))
    )
    return f"process {holder.get('pid')} on host {holder.get('host')}, since {started}"


class FolderLock:
    """An exclusive, non-blocking lock on ``folder`` for this process.

    ``acquire()`` takes it or raises ``FolderInUse``; ``release()`` gives it
    back and removes the lock file. Re-entrant within one object.
    """

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        self.path = lock_path(folder)
        self._fd = None

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        if self._fd is not None or fcntl is None:
            return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise FolderInUse(self.folder, holder) from None
            # The holder before us may have removed the file between our open
            # and our lock: then we hold a lock on a file nobody else sees.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        # Removed while still held: a process that opens the path afterwards
        # makes a new file (see acquire).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()


def _read(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 4096).decode() or "null")
    except (OSError, ValueError):
        return None
