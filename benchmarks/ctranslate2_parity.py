"""A translator's CTranslate2 export against the translator itself.

    python -m benchmarks.ctranslate2_parity --model runs/multi30k/translator.keras \\
        --source data/multi30k/val.de.gz --reference data/multi30k/val.en.gz

Exports the ``.keras`` translator (``export_ctranslate2``) in float32 and
int8 to a temporary directory (or ``--out``) and translates the source
sentences (one per line; ``.gz`` read as gzip) with:

- ours: ``Translator.translate`` on a float32 copy of the transformer (built
  here, whatever precision the model was trained in), greedy and beam
  search (``--beam-size``, ``--length-penalty``: the GNMT α);
- the export's ``CTranslate2Translator``, float32 and int8, greedy and
  beam search, for each ``--patience`` (how many finished hypotheses
  CTranslate2 collects, ``beam · patience``, before they are re-ranked by
  the GNMT score);
- with ``--native``, CTranslate2's own ranking too (``log P / |Y| ** α``,
  |Y| without the end token, no re-ranking): α as given, and α mapped to
  GNMT's curve (the α' for which ``α' / |Y|`` matches the slope of
  ``α · log((5 + |Y|) / 6)`` on average over our outputs' lengths).

Prints, and writes as JSON with ``--json``: the share of outputs identical to
ours, corpus BLEU (sacreBLEU) against ``--reference`` when given, and the
seconds of each run. ``--speed`` also times beam search for batch sizes
``--batch-sizes`` × ``inter_threads`` in ``--inter-threads`` (intra_threads
= cores / inter_threads), float32 and int8: the measurements behind the
export's defaults. Run it with nothing else running: the times are wall
clock.
"""

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
import warnings

from benchmarks.deploy_speed import read_lines


def load_float32_translator(path):
    """The ``.keras`` translator (it searches in float32, the ``Translator``'s
    default, as CTranslate2's float32 export computes) and the dtype policy
    its model was trained under."""
    from keras_transformer.translate.evaluation import load_translator

    translator = load_translator(path)
    return translator, translator.transformer.target_embedding.dtype_policy.name


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def same_share(outputs, reference):
    return sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(outputs)


def bleu(hypotheses, references):
    if references is None:
        return None
    import sacrebleu

    return round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)


def native(fast, texts, beam_size, alpha, batch_size=None):
    """CTranslate2's own beam search and ranking (``log P / |Y| ** alpha``,
    |Y| without the end token), no re-ranking; sentences sorted by length in
    batches, each with its largest output limit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sources = fast.encode_sources(texts)
    batch_size = batch_size or fast.default_batch_size
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    pending = []
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        limit = max(
            fast.output_limit(len(sources[i]) - 1, fast.max_output_length)
            for i in chunk
        )
        pending.append(
            (
                chunk,
                fast.translator.translate_batch(
                    [[fast._source_pieces[t] for t in sources[i]] for i in chunk],
                    asynchronous=True,
                    beam_size=beam_size,
                    length_penalty=alpha,
                    max_input_length=0,
                    max_decoding_length=limit,
                    min_decoding_length=0,
                    suppress_sequences=fast._suppressed,
                ),
            )
        )
    outputs = [None] * len(sources)
    for chunk, results in pending:
        for i, result in zip(chunk, results, strict=True):
            ids = [fast._target_ids[t] for t in result.result().hypotheses[0]]
            outputs[i] = ids
    return fast.tokenizer.detokenize(outputs)


def differences(translator, fast, texts, outputs, reference, search, most=5):
    """Up to ``most`` sentences where ``outputs`` differ from ``reference``
    (ours), with each one's score by our own GNMT criterion: which search
    found the better hypothesis."""
    rows = [
        i for i, (a, b) in enumerate(zip(outputs, reference, strict=True)) if a != b
    ][:most]
    if not rows:
        return []
    chosen = [texts[i] for i in rows]
    ours = translator.n_best(chosen, n=1, **search)
    theirs = fast.n_best(chosen, n=1, **search)
    return [
        {
            "line": i + 1,
            "ours": a[0][0],
            "ours_score": round(a[0][1], 4),
            "ctranslate2": b[0][0],
            "ctranslate2_score": round(b[0][1], 4),
        }
        for i, a, b in zip(rows, ours, theirs, strict=True)
    ]


def mapped_alpha(alpha, lengths):
    """The α' of CTranslate2's ``|Y'| ** α'`` (|Y'| = |Y| - 1, no end token)
    whose slope in log-length matches GNMT's ``α · log((5 + |Y|) / 6)`` on
    average over ``lengths`` (|Y|, end token included)."""
    ratios = [(n - 1) / (5 + n) for n in lengths if n > 1]
    return alpha * sum(ratios) / len(ratios)


def recorder(result, references):
    """A ``record(name, outputs, seconds, reference_outputs, **extra)`` that
    prints a run's row and adds it to ``result["runs"]``."""

    def record(name, outputs, seconds, reference_outputs, **extra):
        row = {
            "name": name,
            "identical_to_ours": None
            if reference_outputs is None
            else round(same_share(outputs, reference_outputs), 4),
            "bleu": bleu(outputs, references),
            "seconds": round(seconds, 2),
            **extra,
        }
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        return row

    return record


def run_ours(translator, texts, beam_size, length_penalty, record):
    """Our greedy and beam outputs, recorded, and the beam outputs' lengths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # long or unknown sources
        translator.translate(texts[:8], beam_size=1)  # compiles
        translator.translate(texts[:8], beam_size=beam_size)
        ours_greedy, seconds = timed(lambda: translator.translate(texts, beam_size=1))
        record("ours greedy", ours_greedy, seconds, None)
        ours_beam, seconds = timed(
            lambda: translator.translate(
                texts, beam_size=beam_size, length_penalty=length_penalty
            )
        )
        record(f"ours beam {beam_size}", ours_beam, seconds, None)
        ours_lengths = [
            len(ids)
            for ids in translator.translate_ids(
                texts, beam_size=beam_size, length_penalty=length_penalty
            )
        ]
    return ours_greedy, ours_beam, ours_lengths


def export_both(translator, work, result):
    """Export float32 and int8 under ``work``; ``{kind: path}``, timed."""
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    paths = {}
    for kind in ("float32", "int8"):
        paths[kind], seconds = timed(
            lambda kind=kind: export_ctranslate2(
                translator,
                os.path.join(work, kind),
                quantization=None if kind == "float32" else kind,
                overwrite=True,
            )
        )
        result[f"export_{kind}_seconds"] = round(seconds, 2)
    return paths


def run_export(kind, path, translator, texts, ours, search, patience, record):
    """One export's greedy and GNMT re-ranked beam runs, for each patience."""
    from keras_transformer.export.ctranslate2 import load_ctranslate2

    ours_greedy, ours_beam = ours
    beam_size = search["beam_size"]
    fast = load_ctranslate2(path)
    fast.translate(texts[:8])  # warm-up
    outputs, seconds = timed(lambda fast=fast: fast.translate(texts, beam_size=1))
    record(
        f"ctranslate2 {kind} greedy",
        outputs,
        seconds,
        ours_greedy,
        engine=fast.engine,
        batch_size=fast.default_batch_size,
    )
    for value in patience:
        fast = load_ctranslate2(path, patience=value)
        outputs, seconds = timed(
            lambda fast=fast: fast.translate(
                texts, beam_size=beam_size, length_penalty=search["length_penalty"]
            )
        )
        record(
            f"ctranslate2 {kind} beam {beam_size}, GNMT re-ranking, patience {value}",
            outputs,
            seconds,
            ours_beam,
            engine=fast.engine,
            batch_size=fast.default_batch_size,
            differences=differences(
                translator, fast, texts, outputs, ours_beam, search
            ),
        )


def run_native(kind, path, texts, ours_beam, ours_lengths, search, record):
    """One export with CTranslate2's own ranking, alpha as given and mapped."""
    from keras_transformer.export.ctranslate2 import load_ctranslate2

    beam_size, length_penalty = search["beam_size"], search["length_penalty"]
    fast = load_ctranslate2(path)
    fitted = mapped_alpha(length_penalty, ours_lengths)
    for name, alpha in (
        ("as given", length_penalty),
        ("mapped", fitted),
    ):
        outputs, seconds = timed(
            lambda alpha=alpha, fast=fast: native(fast, texts, beam_size, alpha)
        )
        record(
            f"ctranslate2 {kind} beam {beam_size}, its own "
            f"|Y|**alpha, alpha {name} ({alpha:.3f})",
            outputs,
            seconds,
            ours_beam,
        )


def measure(
    model,
    source,
    reference=None,
    limit=None,
    beam_size=4,
    length_penalty=0.6,
    patience=(1.0, 2.0),
    include_native=False,
    speed=False,
    batch_sizes=(16, 32, 64, 128, 256),
    inter_threads=(1, 2),
    repeats=1,
    out=None,
):
    """Every run of the module's docstring, as a JSON-ready dict."""
    import keras

    texts = read_lines(source, limit)
    references = read_lines(reference, limit) if reference else None
    translator, policy = load_float32_translator(model)
    result = {
        "model": os.fspath(model),
        "dtype_policy": policy,
        "backend": keras.backend.backend(),
        "sentences": len(texts),
        "beam_size": beam_size,
        "length_penalty": length_penalty,
        "cpus": os.cpu_count(),
        "runs": [],
    }
    record = recorder(result, references)
    search = dict(beam_size=beam_size, length_penalty=length_penalty)
    ours_greedy, ours_beam, ours_lengths = run_ours(
        translator, texts, beam_size, length_penalty, record
    )

    work = out or tempfile.mkdtemp(prefix="ct2_parity_")
    try:
        paths = export_both(translator, work, result)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for kind, path in paths.items():
                run_export(
                    kind,
                    path,
                    translator,
                    texts,
                    (ours_greedy, ours_beam),
                    search,
                    patience,
                    record,
                )
                if include_native:
                    run_native(
                        kind, path, texts, ours_beam, ours_lengths, search, record
                    )
            if speed:
                result["speed"] = speed_grid(
                    paths,
                    texts,
                    beam_size,
                    length_penalty,
                    batch_sizes,
                    inter_threads,
                    repeats,
                )
    finally:
        if out is None:
            shutil.rmtree(work, ignore_errors=True)
    return result


def speed_only(
    model,
    source,
    out,
    limit=None,
    beam_size=4,
    length_penalty=0.6,
    batch_sizes=(16, 32, 64, 128, 256),
    inter_threads=(1, 2),
    repeats=1,
):
    """The batch grid alone, in a process that has run nothing else."""
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    texts = read_lines(source, limit)
    paths = {kind: os.path.join(out, kind) for kind in ("float32", "int8")}
    missing = [kind for kind, path in paths.items() if not os.path.isdir(path)]
    if missing:
        translator, _ = load_float32_translator(model)
        for kind in missing:
            export_ctranslate2(
                translator,
                paths[kind],
                quantization=None if kind == "float32" else kind,
            )
        del translator
        gc.collect()
    return {
        "sentences": len(texts),
        "cpus": os.cpu_count(),
        "speed": speed_grid(
            paths,
            texts,
            beam_size,
            length_penalty,
            batch_sizes,
            inter_threads,
            repeats,
        ),
    }


def speed_grid(
    paths, texts, beam_size, length_penalty, batch_sizes, inter_threads, repeats=1
):
    """Seconds of beam search on ``texts`` per weight type, batch size and
    ``inter_threads`` (``intra_threads`` = cores / ``inter_threads``): the
    median of ``repeats`` rounds, each round timing every setting once in
    turn (so that a change in the machine's load falls on all of them)."""
    from keras_transformer.export.ctranslate2 import load_ctranslate2

    cores = os.cpu_count() or 1
    settings = []
    for kind, path in paths.items():
        for inter in inter_threads:
            intra = max(cores // inter, 1)
            for batch in batch_sizes:
                fast = load_ctranslate2(
                    path, inter_threads=inter, intra_threads=intra, batch_size=batch
                )
                fast.translate(texts[:8], beam_size=beam_size)  # warm-up
                settings.append(((kind, inter, intra, batch), fast, []))
    for _ in range(repeats):
        for _, fast, times in settings:
            _, seconds = timed(
                lambda fast=fast: fast.translate(
                    texts, beam_size=beam_size, length_penalty=length_penalty
                )
            )
            times.append(seconds)
    rows = []
    for (kind, inter, intra, batch), _, times in settings:
        seconds = sorted(times)[len(times) // 2]
        row = {
            "weights": kind,
            "inter_threads": inter,
            "intra_threads": intra,
            "batch_size": batch,
            "seconds": round(seconds, 2),
            "all_seconds": [round(t, 2) for t in times],
            "sentences_per_second": round(len(texts) / seconds, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a translator.keras")
    parser.add_argument("--source", required=True, help="one sentence a line")
    parser.add_argument("--reference", help="references, for BLEU")
    parser.add_argument("--limit", type=int, help="the first N sentences only")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument(
        "--patience", default="1,2", help="comma-separated values (default 1,2)"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="also CTranslate2's own |Y|**alpha ranking, alpha as given and mapped",
    )
    parser.add_argument("--speed", action="store_true", help="time the batch grid")
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="only the batch grid, on the exports in --out (written if missing)",
    )
    parser.add_argument("--batch-sizes", default="16,32,64,128,256")
    parser.add_argument("--inter-threads", default="1,2")
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds of the batch grid (median)"
    )
    parser.add_argument("--out", help="keep the exports in this directory")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.speed_only:
        if not args.out:
            parser.error("--speed-only needs --out (where the exports are)")
        result = speed_only(
            args.model,
            args.source,
            args.out,
            limit=args.limit,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
            inter_threads=[int(t) for t in args.inter_threads.split(",")],
            repeats=args.repeats,
        )
    else:
        result = measure(
            args.model,
            args.source,
            reference=args.reference,
            limit=args.limit,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            patience=[float(p) for p in args.patience.split(",")],
            include_native=args.native,
            speed=args.speed,
            batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
            inter_threads=[int(t) for t in args.inter_threads.split(",")],
            repeats=args.repeats,
            out=args.out,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
            file.write("\n")
    return result


if __name__ == "__main__":
    main()
