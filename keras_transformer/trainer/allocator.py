"""Keep freed memory in the process instead of handing it back to the kernel.

On Linux, glibc's ``malloc`` serves a large request (above 32 MiB at most,
by default; above 64 MiB always, in a thread's own arena) with a fresh
``mmap`` and gives it back with ``munmap`` when it is freed. A training step
on the CPU allocates such blocks every time: XLA's buffer for a step's
temporaries, PyTorch's (batch, length, vocabulary) logits and their
gradients. Fresh pages start unmapped, so each step then pays a page fault
and a zero-fill for every 4 KiB of them, a large share of a JAX step on the
CPU (docs/results.md, "Freed memory kept"). Raising glibc's mmap and trim
thresholds to 1 GiB and making all threads share the main arena keeps the
blocks in the heap, where the next step reuses them, at the cost of a
resident size that stays at its peak. TensorFlow keeps memory in its own
allocator and does not change.

The ``kt-*`` commands do this when they start (``keras_transformer.cli``);
a program that trains through the API can call :func:`keep_freed_memory`
itself, first thing.
"""

import ctypes
import os
import sys

# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

THRESHOLD = 1 << 30  # bytes: blocks up to 1 GiB stay in the heap

OFF_VARIABLE = "KT_KEEP_FREED_MEMORY"  # "0" turns it off
_GLIBC_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_ARENA_MAX",
)


def _glibc():
    """The process's C library if it is glibc (it has ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only; musl lacks it)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return libc


def keep_freed_memory(threshold=THRESHOLD):
    """Make glibc's ``malloc`` keep freed blocks up to ``threshold`` bytes,
    in one arena for all threads.

    Returns True if the setting was made; False (and nothing changes) on a C
    library other than glibc, when ``KT_KEEP_FREED_MEMORY=0``, or when the
    user set glibc's own ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_ARENA_MAX`` or a ``glibc.malloc`` tunable (theirs win). Call it
    before the first training step; it lasts for the life of the process
    (threads that allocated before keep the arenas they have, and glibc may
    hand a later thread one of those: call it before importing a framework to
    have every thread share the main arena).

    Args:
        threshold: int, bytes, 1 to 2**31 - 1.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise TypeError(f"threshold must be an int. Received: {threshold!r}")
    if not 0 < threshold < 2**31:
        raise ValueError(
            f"threshold must be between 1 and 2**31 - 1 bytes. Received: {threshold}"
        )
    if os.environ.get(OFF_VARIABLE, "").strip() == "0":
        return False
    if any(name in os.environ for name in _GLIBC_VARIABLES):
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _glibc()
    if libc is None:
        return False
    # Both thresholds: with the mmap one alone raised, freed big blocks land
    # at the top of the heap, and the default trim threshold hands them back.
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, threshold)
    kept = trimmed and libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    # One arena: a thread's own arena grows in heaps of at most 64 MiB and
    # serves anything bigger with mmap whatever the threshold (keras-hub's
    # JAX step would still fault its big blocks in at every step).
    return bool(kept and libc.mallopt(_M_ARENA_MAX, 1))
