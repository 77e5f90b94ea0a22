"""Translation speed, BLEU and peak memory of a translator and its exports.

    python -m benchmarks.deploy_speed --model runs/multi30k/translator.keras \\
        --source ../shared/data/multi30k/val.de.gz \\
        --reference ../shared/data/multi30k/val.en.gz --sentences 1000

Each system translates the same sentences in a process of its own: once to
warm up (every compiled shape is built), then once timed. Systems:
``keras-<backend>`` (``Translator.translate``, the search in float32),
``keras-tensorflow-policy`` (the model's own dtype policy, e.g.
``mixed_bfloat16``), ``ctranslate2-float32`` and ``ctranslate2-int8``
(``kt-export --format ctranslate2``, the export's default batching; Keras on
its NumPy backend in that process, so no TensorFlow or JAX is loaded), and
``saved_model`` (``Translator.export``, loaded with ``tf.saved_model.load`` in
a process that imports only TensorFlow and tensorflow-text). Exports are
written under ``--work`` first. Reported per system and search (beam 4,
greedy): seconds, sentences per second, sacreBLEU against the references,
the process's peak resident memory (``VmHWM``), and the fraction of outputs
equal to the float32 ``Translator``'s on the fastest Keras backend.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import child_env, python_module

KERAS = ("keras-tensorflow", "keras-jax", "keras-torch", "keras-tensorflow-policy")
EXPORTS = ("ctranslate2-float32", "ctranslate2-int8", "saved_model")
SYSTEMS = KERAS + EXPORTS
SEARCHES = {"beam4": 4, "greedy": 1}


def peak_memory_bytes():
    """This process's peak resident memory (Linux ``VmHWM``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def read_lines(path, limit=None):
    """The first ``limit`` lines of a text file, gzipped or not (plain
    Python: the SavedModel's process must not import this package)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        lines = [line.rstrip("\r\n") for line in file]
    return lines[:limit] if limit else lines


def _timed(translate, texts):
    translate(texts)  # warm-up: compiles every shape the timed call meets
    start = time.perf_counter()
    outputs = translate(texts)
    return outputs, time.perf_counter() - start


def run_system(system, model, work, texts, search):
    """Translate ``texts`` with ``system`` in this process; the result dict."""
    beam = SEARCHES[search]
    if system.startswith("keras-"):
        from keras_transformer.translate.evaluation import load_translator

        translator = load_translator(model)
        if system.endswith("-policy"):
            translator.search_dtype = "policy"
        dtype = translator.search_compute_dtype
        outputs, seconds = _timed(
            lambda t: translator.translate(t, beam_size=beam), texts
        )
    elif system.startswith("ctranslate2-"):
        from keras_transformer.export.ctranslate2 import load_ctranslate2

        translator = load_ctranslate2(os.path.join(work, system))
        dtype = system.split("-", 1)[1]
        outputs, seconds = _timed(
            lambda t: translator.translate(t, beam_size=beam), texts
        )
    else:
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (the SentencePiece op)

        signature = tf.saved_model.load(os.path.join(work, f"saved_model-{search}"))
        signature = signature.signatures["translate"]
        dtype = "float32"

        def translate(batch):
            result = signature(texts=tf.constant(batch))["translations"]
            return [text.decode("utf-8") for text in result.numpy().tolist()]

        outputs, seconds = _timed(translate, texts)
        assert "keras_transformer" not in sys.modules
    return {
        "system": system,
        "search": search,
        "dtype": dtype,
        "seconds": round(seconds, 2),
        "sentences_per_second": round(len(texts) / seconds, 1),
        "peak_memory_bytes": peak_memory_bytes(),
        "outputs": outputs,
    }


def write_exports(model, work, systems):
    """The exports the systems need, under ``work`` (in this process)."""
    from keras_transformer.translate.evaluation import load_translator

    translator = load_translator(model)
    for system in systems:
        if system.startswith("ctranslate2-"):
            from keras_transformer.export.ctranslate2 import export_ctranslate2

            quantization = system.split("-", 1)[1]
            export_ctranslate2(
                translator,
                os.path.join(work, system),
                quantization=None if quantization == "float32" else quantization,
                overwrite=True,
            )
        elif system == "saved_model":
            from keras_transformer.export.saved_model import export_saved_model

            for search, beam in SEARCHES.items():
                export_saved_model(
                    translator,
                    os.path.join(work, f"saved_model-{search}"),
                    beam_size=beam,
                    overwrite=True,
                )


def _child(args):
    texts = read_lines(args.source, args.sentences)
    result = run_system(args.child, args.model, args.work, texts, args.search)
    print(json.dumps(result, ensure_ascii=False))


def _run_child(system, search, args, work):
    # An export's process needs no deep-learning backend: Keras (imported
    # with this package) runs on NumPy there, TensorFlow stays out.
    backend = system.split("-")[1] if system.startswith("keras-") else "numpy"
    command = python_module(
        "benchmarks.deploy_speed",
        "--child",
        system,
        "--search",
        search,
        "--model",
        args.model,
        "--source",
        args.source,
        "--sentences",
        str(args.sentences),
        "--work",
        work,
    )
    env = child_env(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{system} {search} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    parser.add_argument("--searches", nargs="+", choices=SEARCHES, default=SEARCHES)
    parser.add_argument("--work", help="where the exports go (default: a temp dir)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--search", choices=SEARCHES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)

    work = args.work or tempfile.mkdtemp(prefix="deploy-speed-")
    write_exports(args.model, work, args.systems)
    references = read_lines(args.reference, args.sentences) if args.reference else None
    results = []
    for search in args.searches:
        for system in args.systems:
            result = _run_child(system, search, args, work)
            results.append(result)
            print(
                f"{system:24s} {search:7s} {result['seconds']:7.2f} s  "
                f"{result['sentences_per_second']:7.1f} sent/s  "
                f"{result['peak_memory_bytes'] / 2**30:5.2f} GiB  {result['dtype']}",
                flush=True,
            )
    _compare(results, references)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1, ensure_ascii=False)
    return results


def _compare(results, references):
    """BLEU per result, and outputs equal to the fastest float32 Keras run's."""
    for search in {r["search"] for r in results}:
        runs = [r for r in results if r["search"] == search]
        keras_runs = [
            r
            for r in runs
            if r["system"].startswith("keras-") and r["dtype"] == "float32"
        ]
        base = min(keras_runs, key=lambda r: r["seconds"]) if keras_runs else None
        for r in runs:
            if references is not None:
                import sacrebleu

                r["bleu"] = round(
                    sacrebleu.corpus_bleu(r["outputs"], [references]).score, 2
                )
            if base is not None:
                same = sum(
                    a == b for a, b in zip(r["outputs"], base["outputs"], strict=True)
                )
                r["same_as"] = base["system"]
                r["same_fraction"] = round(same / len(r["outputs"]), 4)
                r["speed_up"] = round(base["seconds"] / r["seconds"], 2)
                r["memory_ratio"] = round(
                    r["peak_memory_bytes"] / base["peak_memory_bytes"], 3
                )
            nan = float("nan")
            print(
                f"{search:7s} {r['system']:24s} BLEU {r.get('bleu', nan):6.2f}  "
                f"same {r.get('same_fraction', nan):.3f}  "
                f"x{r.get('speed_up', nan):.2f}  "
                f"memory x{r.get('memory_ratio', nan):.2f}"
            )


if __name__ == "__main__":
    main()
