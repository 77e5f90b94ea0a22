"""The TensorFlow subprocess of ``export.saved_model`` on JAX and PyTorch.

    python -m keras_transformer.cli._saved_model_child MODEL.keras OUT \\
        [--search JSON] [--result RESULT.json] [--no-jit-compile]

Loads a ``.keras`` translator on TensorFlow and exports it to ``OUT``, a
directory that must not exist yet; the outcome (the metadata, or the
error's type and message) goes to ``RESULT.json`` for the parent, which
raises the error again. Not installed as a script; it keeps the process's
settings as they are (its parent chose the environment).
"""

import argparse
import contextlib
import json
import os
import sys
import traceback

from keras_transformer.export.saved_model import check_translator
from keras_transformer.export.saved_model_graph import write_graph


def main(argv=None):
    """The subprocess: load a ``.keras`` translator on TensorFlow and export
    it to a directory that must not exist yet."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.cli._saved_model_child",
        description="Export a Translator (.keras) as a TensorFlow SavedModel.",
    )
    parser.add_argument("model", help="a Translator saved as .keras")
    parser.add_argument("output", help="the SavedModel directory to write")
    parser.add_argument("--search", default="{}", help="SearchOptions fields, as JSON")
    parser.add_argument(
        "--result", help="write {'ok': ..., 'type', 'message'} here as JSON"
    )
    parser.add_argument(
        "--no-jit-compile",
        dest="jit_compile",
        action="store_false",
        help="searches as plain TensorFlow ops, not compiled with XLA",
    )
    args = parser.parse_args(argv)
    try:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import keras

        from keras_transformer.saving import load_model
        from keras_transformer.search.options import SearchOptions

        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "the export subprocess needs KERAS_BACKEND=tensorflow, not "
                f"{keras.backend.backend()}"
            )
        search = SearchOptions(**json.loads(args.search))
        translator = load_model(args.model)
        check_translator(translator)
        if os.path.lexists(args.output):
            raise FileExistsError(f"{args.output} exists already")
        metadata = write_graph(translator, args.output, search, args.jit_compile)
        outcome = {"ok": True, "metadata": metadata}
    except Exception as error:  # reported to the parent process
        outcome = {
            "ok": False,
            "type": type(error).__name__,
            "message": str(error),
            "traceback": traceback.format_exc(limit=-8),
        }
        print(outcome["traceback"], file=sys.stderr)
    if args.result:
        with open(args.result, "w", encoding="utf-8") as file:
            json.dump(outcome, file)
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
