"""A translator's SavedModel export against the translator itself.

    KERAS_BACKEND=tensorflow python -m benchmarks.saved_model_parity \\
        --model runs/multi30k/translator.keras \\
        --source data/multi30k/val.de.gz

Exports the ``.keras`` translator (``export_saved_model``: float32, the
given beam size and length penalty) to a temporary directory (or
``--output``), loads it with ``tf.saved_model.load`` and translates the
source sentences (one per line; ``.gz`` read as gzip) with its ``translate``
signature and with ``Translator.translate`` in float32 (the reference: a
translator around a float32 copy of the transformer, however it was
trained, with the translator's output limit and default search). A
translator whose tokenizer is not one SentencePiece model's (a Marian
checkpoint's) cannot be exported so: the export's ``ValueError`` says
which formats can. Prints, and
writes as JSON with ``--json``: how many outputs are identical, a few that
differ, the export's time, and each one's time for the whole set after a
warm-up call on the same set (which compiles every shape), the median of
``--repeats`` calls.
"""

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
import warnings

from benchmarks.deploy_speed import read_lines
from benchmarks.timing import call_times
from keras_transformer.cli._process import prepare_process


def float32_reference(translator):
    """A translator that computes in float32 with ``translator``'s weights,
    built here (not by the code under test); its fixed output limit and
    default search are ``translator``'s, which the export reads too."""
    from keras_transformer.translate.keras_translator import Translator

    transformer = translator.transformer
    config = dict(transformer.get_config(), dtype="float32")
    copy = type(transformer).from_config(config)
    copy.set_weights(transformer.get_weights())
    return Translator(
        translator.tokenizer,
        copy,
        max_output_length=translator.max_output_length,
        search=translator.default_search,
    )


def median(times):
    times = sorted(times)
    return times[len(times) // 2]


def export_timed(translator, output, batch_size, jit_compile, search):
    """Export ``translator`` to ``output``; ``(seconds, bytes written)``."""
    from keras_transformer.export.saved_model import export_saved_model

    start = time.perf_counter()
    export_saved_model(
        translator,
        output,
        batch_size=batch_size,
        overwrite=True,
        jit_compile=jit_compile,
        **search,
    )
    export_seconds = time.perf_counter() - start
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(output)
        for name in names
    )
    return export_seconds, size


def callers(loaded, translator, texts, batch_size, search):
    """``(exported, translated)``: the SavedModel's and the float32
    reference's translation of ``texts``, each a call without arguments."""
    import tensorflow as tf

    signature = loaded.signatures["translate"]
    inputs = tf.constant(texts, tf.string)

    def exported():
        result = signature(texts=inputs)["translations"].numpy()
        return [text.decode("utf-8") for text in result]

    reference = float32_reference(translator)

    def translated():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # <unk>, too long
            return reference.translate(texts, batch_size=batch_size, **search)

    return exported, translated


def time_both(exported, translated, repeats):
    """``(got, want, first, warm)``: the outputs, first-call and warm times."""
    first = {}
    start = time.perf_counter()
    got = exported()
    first["saved_model"] = time.perf_counter() - start
    start = time.perf_counter()
    want = translated()
    first["translator"] = time.perf_counter() - start
    warm = {"saved_model": [], "translator": []}
    for _ in range(repeats):  # in turns, so that both see the same load
        warm["saved_model"] += call_times(exported, 1)
        warm["translator"] += call_times(translated, 1)
    return got, want, first, warm


def measure(
    model,
    source,
    beam_size=4,
    length_penalty=0.6,
    batch_size=64,
    limit=None,
    output=None,
    repeats=1,
    jit_compile=True,
):
    """The comparison of the module's docstring, as a JSON-ready dict."""
    import keras
    import tensorflow as tf

    import keras_transformer as kt

    texts = read_lines(source, limit)
    from keras_transformer.translate.evaluation import load_translator

    translator = load_translator(model)
    search = dict(beam_size=beam_size, length_penalty=length_penalty)
    folder = None
    if output is None:
        folder = tempfile.mkdtemp(prefix="saved-model-parity-")
        output = os.path.join(folder, "saved_model")
    try:
        export_seconds, size = export_timed(
            translator, output, batch_size, jit_compile, search
        )
        start = time.perf_counter()
        loaded = tf.saved_model.load(output)
        load_seconds = time.perf_counter() - start
        got, want, first, warm = time_both(
            *callers(loaded, translator, texts, batch_size, search), repeats
        )
        metadata = json.loads(
            tf.io.read_file(loaded.metadata_file.asset_path).numpy().decode()
        )
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    identical = sum(a == b for a, b in zip(got, want, strict=True))
    differ = [
        {"index": i, "source": texts[i], "saved_model": a, "translator": b}
        for i, (a, b) in enumerate(zip(got, want, strict=True))
        if a != b
    ]
    return {
        "model": os.fspath(model),
        "source": os.fspath(source),
        "sentences": len(texts),
        "identical": identical,
        "differ": differ[:10],
        "beam_size": beam_size,
        "length_penalty": length_penalty,
        "batch_size": batch_size,
        "jit_compile": jit_compile,
        "source_dtype_policy": metadata["source_dtype_policy"],
        "export_seconds": round(export_seconds, 2),
        "saved_model_bytes": size,
        "load_seconds": round(load_seconds, 2),
        "first_call_seconds": {k: round(v, 2) for k, v in first.items()},
        "warm_seconds": {k: round(median(v), 3) for k, v in warm.items()},
        "warm_all_seconds": {k: [round(x, 3) for x in v] for k, v in warm.items()},
        "backend": keras.backend.backend(),
        "keras_transformer": kt.__version__,
        "tensorflow": tf.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.saved_model_parity",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--model", required=True, help="a Translator .keras file")
    parser.add_argument(
        "--source", required=True, help="sentences, one per line (.gz: gzip)"
    )
    parser.add_argument("--limit", type=int, help="only the first LIMIT lines")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="warm calls each")
    parser.add_argument(
        "--no-jit-compile",
        dest="jit_compile",
        action="store_false",
        help="export the searches as plain TensorFlow ops (no XLA)",
    )
    parser.add_argument("--output", help="keep the SavedModel here (replaced)")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    prepare_process()
    result = measure(
        args.model,
        args.source,
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        batch_size=args.batch_size,
        limit=args.limit,
        output=args.output,
        repeats=args.repeats,
        jit_compile=args.jit_compile,
    )
    print(
        f"{result['identical']} of {result['sentences']} translations identical "
        f"(beam {result['beam_size']}, α {result['length_penalty']}, "
        f"jit_compile={result['jit_compile']}, model trained as "
        f"{result['source_dtype_policy']})"
    )
    print(
        f"export {result['export_seconds']} s, load {result['load_seconds']} s; "
        f"first call: SavedModel {result['first_call_seconds']['saved_model']} s, "
        f"Translator {result['first_call_seconds']['translator']} s; warm: "
        f"SavedModel {result['warm_seconds']['saved_model']} s, "
        f"Translator {result['warm_seconds']['translator']} s"
    )
    for case in result["differ"]:
        print(json.dumps(case, ensure_ascii=False))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2, ensure_ascii=False)
            file.write("\n")
    return result


if __name__ == "__main__":
    main()
