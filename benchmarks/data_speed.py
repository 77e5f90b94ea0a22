"""A corpus larger than memory, made up, and what training on it costs in
memory and batch rate.

    python -m benchmarks.data_speed make --pairs 4500000 \
        --like ../shared/data/multi30k --out corpora/big
    python -m benchmarks.data_speed measure --data corpora/big --out runs/big \
        --minutes 3

``make`` writes ``train.src``/``train.tgt`` (and a 1,000-pair ``val``) of
made-up sentences: each pair's lengths in words are those of a pair drawn
from the ``--like`` corpus's training split (so lengths are distributed like
Multi30k's; ``--length-scale`` stretches them), its words drawn from that
split's words by frequency. Nobody would learn to translate from it; it has
the size and the shape that matter for reading, tokenising and batching.

``measure`` runs ``kt-train --data ... --tokenizer-sample N`` on it for
``--minutes`` of training (which tokenises it once into an id store in
``--out``), reports the command's peak resident memory (the largest of its
processes' ``ru_maxrss``), then times ``--batches`` batches of
``--batch-tokens`` tokens made from the id store by one process, and prints
one JSON object with the figures.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks import python_module
from keras_transformer.cli._process import prepare_process


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.data_speed",
        description="Make a corpus larger than memory; measure kt-train's peak "
        "memory and the id store's batch rate on it.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="write a made-up corpus")
    make.add_argument("--pairs", type=int, default=4_500_000)
    make.add_argument("--like", required=True, help="a corpus folder (train.*)")
    make.add_argument("--source", default="de")
    make.add_argument("--target", default="en")
    make.add_argument("--length-scale", type=float, default=1.0)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--out", required=True)
    measure = commands.add_parser("measure", help="train on it, time its batches")
    measure.add_argument("--data", required=True)
    measure.add_argument("--out", required=True, help="kt-train's --out")
    measure.add_argument("--minutes", type=float, default=3.0)
    measure.add_argument("--tokenizer-sample", type=int, default=200_000)
    measure.add_argument("--batch-tokens", type=int, default=25_000)
    measure.add_argument("--batches", type=int, default=300)
    measure.add_argument(
        "--train-args",
        default="--config tiny --beam-size 1 --average-last 1",
        help="more kt-train arguments (one string)",
    )
    return parser.parse_args(argv)


def make_corpus(args):
    from keras_transformer import data as ktd

    rng = np.random.default_rng(args.seed)
    sources, targets = ktd.read_split(args.like, "train", args.source, args.target)
    source_words, target_words = ([w for s in side for w in s.split()]
                                  for side in (sources, targets))  # fmt: skip
    lengths = np.array([(len(s.split()), len(t.split()))
                        for s, t in zip(sources, targets, strict=True)])  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    for split, count in (("train", args.pairs), ("val", 1000)):
        paths = [os.path.join(args.out, f"{split}.{lang}")
                 for lang in (args.source, args.target)]  # fmt: skip
        with open(paths[0], "w") as src, open(paths[1], "w") as tgt:
            for start in range(0, count, 100_000):
                n = min(100_000, count - start)
                drawn = lengths[rng.integers(0, len(lengths), n)]
                drawn = np.maximum(1, np.rint(drawn * args.length_scale)).astype(int)
                for file, words, side in ((src, source_words, 0),
                                          (tgt, target_words, 1)):  # fmt: skip
                    picks = rng.integers(0, len(words), int(drawn[:, side].sum()))
                    ends = np.cumsum(drawn[:, side])
                    chosen = [words[i] for i in picks]
                    spans = zip(ends, drawn[:, side], strict=True)
                    lines = [" ".join(chosen[e - k : e]) for e, k in spans]
                    file.write("\n".join(lines) + "\n")
    print(json.dumps({"pairs": args.pairs, "out": args.out}))


def measure(args):
    from keras_transformer.data import batching, id_store

    command = [
        *python_module("keras_transformer.cli.train"),
        "--data", args.data, "--source", "de", "--target", "en",
        "--tokenizer-sample", str(args.tokenizer_sample),
        "--max-minutes", str(args.minutes), "--out", args.out,
        *args.train_args.split(),
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(done.returncode)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    kept = ("id store:", "tokenizer:", "model:", "trained")
    log = [line for line in done.stdout.splitlines() if line.startswith(kept)]

    store = id_store.IdStore(os.path.join(args.out, "ids"))
    lengths = np.maximum(store.source.lengths, store.target.lengths + 1)
    longest = int(min(lengths.max(), 256))
    boundaries = batching.bucket_boundaries(longest)
    opened = time.monotonic()
    dataset = batching.BucketedDataset(
        store.source, store.target, args.batch_tokens, boundaries, seed=1
    )
    plan_seconds = time.monotonic() - opened
    count = min(args.batches, len(dataset))
    tokens = 0
    start = time.monotonic()
    for index in range(count):
        inputs, labels = dataset[index]
        tokens += labels.size
    seconds = time.monotonic() - start
    print(json.dumps({
        "pairs": len(store), "kt_train_wall_seconds": round(wall, 1),
        "kt_train_peak_rss_gib": round(peak / 2**30, 2), "kt_train_log": log,
        "batches_per_epoch": len(dataset), "plan_seconds": round(plan_seconds, 2),
        "batches_timed": count, "batches_per_second": round(count / seconds, 1),
        "padded_tokens_per_batch": round(tokens / count),
    }, indent=1))  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    prepare_process()
    return make_corpus(args) if args.command == "make" else measure(args)


if __name__ == "__main__":
    main()
