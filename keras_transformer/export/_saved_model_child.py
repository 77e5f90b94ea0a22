"""The TensorFlow subprocess of ``export.saved_model`` on JAX and PyTorch.

    python -m keras_transformer.export._saved_model_child JOB.json

``JOB.json`` holds ``model`` (a ``.keras`` translator), ``output`` (the
SavedModel directory to write, which must not exist yet), ``search`` (the
``SearchOptions`` fields), ``jit_compile`` and ``result`` (where the
outcome goes: the metadata, or the error's type and message, which the
parent raises again). The parent writes the job; no person types this
command line, so it has no parser. Not installed as a script; it keeps the
process's settings as they are (its parent chose the environment).
"""

import contextlib
import json
import os
import sys
import traceback

# Not export.saved_model, which starts this process: the graph module
# alone, so that the two never import each other.
from keras_transformer.export.saved_model_graph import check_translator, write_graph

USAGE = "usage: python -m keras_transformer.export._saved_model_child JOB.json"


def export(job):
    """Load the job's ``.keras`` translator on TensorFlow and write its
    SavedModel; the metadata written with it."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from keras_transformer.saving import load_model
    from keras_transformer.search.options import SearchOptions

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "the export subprocess needs KERAS_BACKEND=tensorflow, not "
            f"{keras.backend.backend()}"
        )
    search = SearchOptions(**job.get("search", {}))
    translator = load_model(job["model"])
    check_translator(translator)
    if os.path.lexists(job["output"]):
        raise FileExistsError(f"{job['output']} exists already")
    return write_graph(
        translator, job["output"], search, bool(job.get("jit_compile", True))
    )


def main(argv=None):
    """The subprocess: run the job named by ``argv`` (default
    ``sys.argv[1:]``); 0 once the SavedModel is written, 1 if the export
    failed (the outcome says why), 2 for a command line without one job."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as file:
        job = json.load(file)
    try:
        outcome = {"ok": True, "metadata": export(job)}
    except Exception as error:  # reported to the parent process
        outcome = {
            "ok": False,
            "type": type(error).__name__,
            "message": str(error),
            "traceback": traceback.format_exc(limit=-8),
        }
        print(outcome["traceback"], file=sys.stderr)
    if job.get("result"):
        with open(job["result"], "w", encoding="utf-8") as file:
            json.dump(outcome, file)
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
