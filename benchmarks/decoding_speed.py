"""Decoding speed: cached vs uncached greedy search, and beam search.

    KERAS_BACKEND=jax python -m benchmarks.decoding_speed
    python -m benchmarks.decoding_speed --all-backends   # one process each

The setting: the ``tiny`` config (untrained: speed does not
depend on the weights), a batch of 32 sources of 16 tokens, 64 generated
tokens per sentence (the end token is ignored, so every row runs all 64
steps), the vocabulary of the built-in task (200). Each search is run once to
compile, then ``--repeats`` times; the median time is reported, with target
tokens per second (32 x 64 tokens for every search, beam search counting the
best hypothesis' tokens only). For scale, greedy search on 4 x 32 rows (as
many decoder rows as beam search with 4 beams) is timed too. ``--batch``,
``--source-length`` and ``--steps`` change the setting (its tests run it
small).
"""

import argparse
import json
import os
import platform
import subprocess

from benchmarks import child_env, python_module
from benchmarks.timing import time_call
from keras_transformer.cli._process import prepare_process

BACKENDS = ("tensorflow", "jax", "torch")


def measure(batch=32, source_length=16, steps=64, vocab=200, repeats=3, seed=0):
    """Time the searches on the current backend; returns a dict of results."""
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer.search import decoding

    keras.utils.set_random_seed(seed)
    model = kt.build_model("tiny", src_vocab_size=vocab)
    rng = np.random.default_rng(seed)
    sources = rng.integers(3, vocab, (batch, source_length)).astype("int32")
    sources[:, -1] = decoding.END_ID

    searches = {
        "greedy, uncached": lambda: decoding.greedy_search(
            model, sources, steps, use_cache=False, end_id=None
        ),
        "greedy, cached": lambda: decoding.greedy_search(
            model, sources, steps, end_id=None
        ),
        "beam 4, cached": lambda: decoding.beam_search(
            model, sources, steps, beam_size=4, end_id=None
        ),
        # As many decoder rows as beam 4: what beam search costs before its
        # own bookkeeping (top-k, reordering the caches).
        "greedy x4 rows, cached": lambda: decoding.greedy_search(
            model, np.repeat(sources, 4, axis=0), steps, end_id=None
        ),
    }
    results = {}
    for name, search in searches.items():
        first, seconds = time_call(search, repeats)
        results[name] = {
            "seconds": round(seconds, 4),
            "first_call_seconds": round(first, 2),
            "tokens_per_second": round(batch * steps / seconds, 1),
        }
    greedy = results["greedy, cached"]["seconds"]
    return {
        "backend": keras.backend.backend(),
        "setting": {
            "config": "tiny",
            "batch": batch,
            "source_length": source_length,
            "generated_tokens": steps,
            "vocab_size": vocab,
            "repeats": repeats,
        },
        "searches": results,
        "cache_speedup": round(results["greedy, uncached"]["seconds"] / greedy, 2),
        "beam4_over_greedy": round(results["beam 4, cached"]["seconds"] / greedy, 2),
        "greedy_x4_rows_over_greedy": round(
            results["greedy x4 rows, cached"]["seconds"] / greedy, 2
        ),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
    }


def table(runs):
    """Markdown table of one result per backend."""
    lines = [
        "| backend | greedy, uncached (tok/s) | greedy, cached (tok/s) "
        "| beam 4, cached (tok/s) | cache speed-up | beam 4 / greedy time "
        "| greedy on 4 x 32 rows / greedy time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run["searches"]
        lines.append(
            f"| {run['backend']} "
            f"| {s['greedy, uncached']['tokens_per_second']:,.0f} "
            f"| {s['greedy, cached']['tokens_per_second']:,.0f} "
            f"| {s['beam 4, cached']['tokens_per_second']:,.0f} "
            f"| {run['cache_speedup']:.1f}x | {run['beam4_over_greedy']:.2f}x "
            f"| {run['greedy_x4_rows_over_greedy']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decoding_speed",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--all-backends", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64, help="tokens generated")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    prepare_process()
    setting = ["--repeats", str(args.repeats), "--batch", str(args.batch)]
    setting += ["--source-length", str(args.source_length), "--steps", str(args.steps)]
    if args.all_backends:
        runs = []
        for backend in BACKENDS:
            env = child_env(KERAS_BACKEND=backend)
            command = python_module("benchmarks.decoding_speed", *setting)
            command += ["--json", "-"]
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, check=True
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        runs = [
            measure(
                batch=args.batch,
                source_length=args.source_length,
                steps=args.steps,
                repeats=args.repeats,
            )
        ]
    if args.json == "-":
        print(json.dumps(runs[0]))
        return runs
    print(table(runs))
    if args.json:
        from keras_transformer.trainer.checkpoints import write_json_atomic

        write_json_atomic(args.json, runs)
    return runs


if __name__ == "__main__":
    main()
