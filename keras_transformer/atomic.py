"""Files written all or nothing, and a full disk as an error that says so.

Every file goes to a temporary name in its folder and is renamed into place
when complete: a reader (or a run killed half-way) sees the old file or the
new one, never half of one. Temporary names are unique to each write, so two
writers never share one, and ``temporary_target`` recognises them.

Out of space (``ENOSPC``, or a quota), a write raises ``DiskFullError``,
naming what it wrote, where, and the room left, after removing its partial
file. Large writes check the room first (``ensure_room``): HDF5, under
Keras' weight files, can crash the process when the disk fills mid-write.
"""

import errno
import json
import os
import re
import shutil
import uuid

import numpy as np

_PARTIAL = ".partial.keras"  # save_model_atomic's temporary file
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """No room left to write a file; the partial file was removed.

    Attributes:
        what: str, what was being written ("checkpoint", "translator", ...).
        path: str, where.
        free: int or None, bytes free there afterwards.
        needed: int or None, bytes the write needed, when it was estimated.
    """

    def __init__(self, what, path, needed=None):
        self.what, self.path, self.needed = what, os.fspath(path), needed
        self.free = free_bytes(self.path)
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    def __str__(self):
        need = f", {human(self.needed)} needed" if self.needed else ""
        free = human(self.free) if self.free is not None else "unknown"
        return f"no space left to write the {self.what} {self.path} ({free} free{need})"


def human(size):
    """``size`` bytes in words: 512 bytes, 3.2 MiB."""
    if size < 1024:
        return f"{size:,} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            return f"{size:,.1f} {unit}"


def free_bytes(path):
    """Bytes free on the file system of ``path`` (or of its nearest existing
    parent); None if that cannot be read."""
    path = os.path.abspath(os.fspath(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_disk_full(error):
    return isinstance(error, OSError) and error.errno in _FULL


def full_disk(error, what, path, needed):
    """The ``DiskFullError`` that ``error`` (raised while writing ``needed``
    bytes to ``path``) stands for, or None. HDF5's errors need not carry an
    errno: a failed write with less room left than it needed counts too."""
    if isinstance(error, DiskFullError):
        return None  # already says so
    full = is_disk_full(error) or (
        isinstance(error, Exception) and (free_bytes(path) or needed) < needed
    )
    return DiskFullError(what, path, needed) if full else None


def ensure_room(what, path, needed):
    """``DiskFullError`` unless ``needed`` bytes are free where ``path`` goes."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise DiskFullError(what, path, needed)


def temporary_target(name):
    """The file that ``name`` was to become, if ``name`` is the temporary file
    of a ``write_atomic`` or ``save_model_atomic`` (left by a kill); else None.
    """
    match = re.fullmatch(r"\.(.+)\.[0-9a-f]{8}\.tmp", name)
    if match:
        return match.group(1)
    match = re.fullmatch(r"\.(.+)\.[0-9a-f]{8}" + re.escape(_PARTIAL), name)
    if match:
        return match.group(1) + ".keras"
    if name.endswith(_PARTIAL) and len(name) > len(_PARTIAL):  # older versions'
        return name[: -len(_PARTIAL)] + ".keras"
    return None


def write_atomic(path, data, what="file"):
    """Write ``data`` (str as UTF-8, or bytes) so that readers see all or nothing.

    The data goes to a temporary file in the same folder (created if
    missing), which then replaces ``path`` in one ``os.replace``; on failure
    the temporary file is removed and ``path`` is as it was. Out of space:
    ``DiskFullError`` naming ``what``.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    temp = os.path.join(
        directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
    )
    try:
        # os.open with 0o666 gives the permissions open() would (less the
        # umask); tempfile.mkstemp's 0o600 would survive the rename.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException as error:
        if os.path.exists(temp):
            os.unlink(temp)
        if is_disk_full(error):
            raise DiskFullError(what, path) from error
        raise


def write_json_atomic(path, data, what="file"):
    """Write ``data`` as indented JSON to ``path`` with ``write_atomic``."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", what)


def save_model_atomic(model, path, what="model"):
    """``model.save(path)`` through a temporary ``.keras`` file and a rename.

    A reader never sees a half-written file at ``path``: it holds either the
    previous model or the new one. The room is checked first, from the
    weights' size; out of space, ``DiskFullError``.
    """
    path = os.fspath(path)
    if not path.endswith(".keras"):
        raise ValueError(f"The path must end with .keras. Received: {path!r}")
    head, name = os.path.split(path)
    tmp = os.path.join(
        head, f".{name[: -len('.keras')]}.{uuid.uuid4().hex[:8]}{_PARTIAL}"
    )
    needed = variable_bytes(model.weights) + (1 << 20)  # + config and assets
    ensure_room(what, path, needed)
    try:
        model.save(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        full = full_disk(error, what, path, needed)
        if full is not None:
            raise full from error
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def variable_bytes(variables):
    """The bytes of ``variables``' values (a weights file holds about that)."""
    total = 0
    for variable in variables:
        count = 1
        for dim in variable.shape:
            count *= int(dim)
        dtype = str(variable.dtype)  # NumPy knows bfloat16 only through JAX
        total += count * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    return total


def fsync_dir(path):
    """Make the renames in ``path`` durable (POSIX); directories cannot be
    opened on Windows, where there is nothing to do."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_folder_atomic(folder, fill, what, needed, check=None):
    """Write ``folder`` by ``fill(temporary)`` into a temporary sibling, then
    rename it into place: a reader sees the old folder or the whole new
    one. A previous non-empty folder is moved aside first and removed only
    once the new one is in place (put back if that fails). ``check()``, if
    given, runs again just before the rename: the folder may have appeared
    while this one was written. ``needed`` bytes are checked for first, and
    a disk that fills on the way raises ``DiskFullError`` naming ``what``;
    nothing temporary is left."""
    parent, name = os.path.split(folder)
    os.makedirs(parent, exist_ok=True)
    ensure_room(what, folder, needed)
    temporary = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    old = None
    try:
        os.mkdir(temporary)
        fill(temporary)
        fsync_dir(temporary)
        if check is not None:
            check()
        if os.path.isdir(folder) and os.listdir(folder):
            old = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.old.tmp")
            os.replace(folder, old)
        os.replace(temporary, folder)  # over an empty folder too
    except BaseException as error:
        if old is not None and not os.path.exists(folder):
            os.replace(old, folder)  # put the previous folder back
            old = None
        shutil.rmtree(temporary, ignore_errors=True)
        full = full_disk(error, what, folder, needed)
        if full is not None:
            raise full from error
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(parent)
