"""Executes every teaching notebook in notebooks/ from top to bottom.

Each ``notebooks/*.ipynb`` runs in a fresh Jupyter kernel ("python3", via
nbclient, at most 600 s per cell) on a temporary copy of the ``notebooks/``
folder: the committed notebooks and their outputs are never overwritten, and
files a notebook writes land in the temporary folder (the kernel's working
directory), which pytest removes. The kernel's environment has:

* ``KERAS_BACKEND`` = this pytest run's backend (``keras.backend.backend()``).
  Notebooks choose their backend with ``os.environ.setdefault`` in their first
  code cell, so this value wins.
* ``KT_NOTEBOOK_QUICK=1``: a notebook that trains reads this parameter and
  shrinks its training (fewer steps, less data) so that it finishes quickly
  here; run by hand without it, the notebook trains at full size.
* ``PYTHONPATH`` starting with the repository root, so ``import
  keras_transformer`` gets this checkout even when it is not installed.
* no ``MPLBACKEND``, so figures use the kernel's inline backend, as in Jupyter.

A failing cell fails the test, with the notebook, the cell's source and the
traceback in the message.

In ``tests/run_all.sh`` (and so CI) the notebooks are executed in one
backend's run only (``@pytest.mark.once``, see conftest.py: PyTorch's, the
lightest run), for the suite's time budget; a plain ``pytest`` run executes
them on its backend.

The cheap checks need no kernel: every committed notebook is valid nbformat,
was saved executed (every code cell has an execution count, no error outputs),
and its first code cell sets ``KERAS_BACKEND`` with ``os.environ.setdefault``.
"""

import os
import pathlib
import re
import shutil
import time

import keras
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
NOTEBOOK_IDS = [path.name for path in NOTEBOOKS]

KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600
KERNEL_STARTUP_TIMEOUT_S = 180  # a loaded CI machine can be slow to start one

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
SETS_BACKEND = re.compile(r"""os\.environ\.setdefault\(\s*["']KERAS_BACKEND["']""")


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


@pytest.mark.once
@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_committed_notebook_is_valid_and_executed(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = _code_cells(nb)
    assert code, f"{path.name} has no code cells"
    not_run = [i for i, cell in enumerate(code) if cell.execution_count is None]
    assert not not_run, (
        f"{path.name} was not saved executed: code cells {not_run} (counting code "
        "cells from 0) have no execution_count. Run it top to bottom and save it "
        "with its outputs."
    )
    errors = [
        i
        for i, cell in enumerate(code)
        if any(out.output_type == "error" for out in cell.outputs)
    ]
    assert not errors, f"{path.name} was saved with errors in code cells {errors}"
    assert SETS_BACKEND.search(code[0].source), (
        f"{path.name}: the first code cell must choose the backend with "
        'os.environ.setdefault("KERAS_BACKEND", ...) so that the environment '
        f"(and this test) can override it. It is:\n{code[0].source}"
    )


@pytest.mark.once
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_notebook_executes(path, tmp_path, monkeypatch):
    backend = keras.backend.backend()
    workdir = tmp_path / "notebooks"
    shutil.copytree(
        NOTEBOOK_DIR, workdir, ignore=shutil.ignore_patterns(".ipynb_checkpoints")
    )
    copy = workdir / path.name

    monkeypatch.setenv("KERAS_BACKEND", backend)
    monkeypatch.setenv("KT_NOTEBOOK_QUICK", "1")
    pythonpath = os.environ.get("PYTHONPATH")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), pythonpath]))
    )
    monkeypatch.delenv("MPLBACKEND", raising=False)

    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=KERNEL_STARTUP_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except CellExecutionError as error:
        # The failing cell's source and the traceback, without colour codes.
        failure = ANSI_ESCAPE.sub("", str(error))
    finally:
        nbformat.write(nb, copy)  # the executed copy, for a look at the outputs
    if failure is not None:  # failed outside `except`: no chained traceback
        pytest.fail(
            f"{path.name} failed on the {backend} backend:\n{failure}", pytrace=False
        )
    print(f"{path.name} ran in {time.perf_counter() - start:.1f} s on {backend}")
