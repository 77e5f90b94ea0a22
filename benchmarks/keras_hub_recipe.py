"""The usual keras-hub recipe on a parallel corpus, for comparison.

    python -m benchmarks.keras_hub_recipe --data ../shared/data/multi30k \\
        --source de --target en --max-minutes 30 --out runs/keras-hub

What keras-hub's translation guides do: ``TokenAndPositionEmbedding``,
``TransformerEncoder``/``TransformerDecoder`` (learnt positions, a separate
``Dense`` output layer), every pair padded to one fixed length, shuffled
batches of a fixed number of pairs, Adam at a constant rate, a plain
``model.fit``, and greedy decoding that reruns the decoder on the whole
prefix at every step. The model has the size of ``kt-train``'s ``small``
(3 + 3 layers, d_model 256, 8 heads, d_ff 1024, dropout 0.1) and the same
joint BPE vocabulary of 8,000 pieces, so the recipe is what differs.

Every ``--every-minutes`` of training the weights are saved in
``<out>/snapshots``, listed with their training seconds and step in
``snapshots/index.json`` as they are taken; the tokenizer is saved as
``<out>/tokenizer.model``. After training each snapshot's greedy
translations of the validation set are scored (sacreBLEU), and the points
are written as ``<out>/curve.json`` in ``benchmarks.bleu_curve``'s format
(its ``plot`` draws it beside a ``kt-train`` run's curve). Training time is
``model.fit``'s, without the scoring. ``--score-only`` scores the snapshots
an earlier run left in ``--out`` without training again.
"""

import argparse
import dataclasses
import json
import os
import time

import keras
import numpy as np

from benchmarks import training_speed as benchmark
from benchmarks.bleu_curve import point as curve_point
from keras_transformer import data as ktd
from keras_transformer.cli._arguments import positive_int
from keras_transformer.cli._process import prepare_process, start_tensorflow
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID
from keras_transformer.trainer.callbacks import TimeBudget
from keras_transformer.trainer.checkpoints import write_atomic
from keras_transformer.translate.evaluation import score


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.keras_hub_recipe",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--data", required=True, help="folder with train.* and val.*")
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-minutes", type=float, help="training time")
    parser.add_argument("--every-minutes", type=float, default=5.0)
    parser.add_argument("--sequence-length", type=positive_int, default=48)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--vocab-size", type=positive_int, default=8000)
    parser.add_argument("--max-lines", type=positive_int, help="use the first N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--score-only",
        action="store_true",
        help="score the snapshots a run left in --out; do not train",
    )
    args = parser.parse_args(argv)
    if args.max_minutes is None and not args.score_only:
        parser.error("--max-minutes is required (unless --score-only)")
    return parser, args


def padded(rows, length):
    """Rows of ids cut or padded to ``length`` (keras-hub's guides pad every
    pair to one fixed length)."""
    out = np.full((len(rows), length), PAD_ID, dtype="int32")
    for i, row in enumerate(rows):
        row = row[:length]
        out[i, : len(row)] = row
    return out


INDEX = "index.json"


class Snapshots(keras.callbacks.Callback):
    """Save the weights every ``every`` seconds of ``budget``'s clock, and
    list them in ``folder/index.json`` as they are taken."""

    def __init__(self, folder, every, budget):
        super().__init__()
        self.folder, self.every, self.budget = folder, every, budget
        self.taken = []  # (path, seconds, step)

    def on_train_batch_end(self, batch, logs=None):
        if self.budget.elapsed >= self.every * (len(self.taken) + 1):
            self.take()

    def steps(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def take(self):
        seconds, step = self.budget.elapsed, self.steps()
        path = os.path.join(self.folder, f"step-{step:09d}.weights.h5")
        self.model.save_weights(path)
        self.taken.append((path, seconds, step))
        index = [
            {"file": os.path.basename(path), "seconds": round(seconds, 2), "step": step}
            for path, seconds, step in self.taken
        ]
        write_atomic(
            os.path.join(self.folder, INDEX),
            json.dumps({"snapshots": index}, indent=2) + "\n",
        )


def read_snapshots(folder):
    """``[(path, seconds, step)]`` from ``folder/index.json``; ValueError
    names the file and what is wrong with it."""
    index = os.path.join(folder, INDEX)
    try:
        with open(index, encoding="utf-8") as file:
            entries = json.load(file)["snapshots"]
        taken = [
            (os.path.join(folder, e["file"]), float(e["seconds"]), int(e["step"]))
            for e in entries
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{index}: no snapshot index ({error!r})") from None
    missing = [path for path, _, _ in taken if not os.path.exists(path)]
    if not taken or missing:
        raise ValueError(f"{index}: no snapshots listed, or missing: {missing}")
    return taken


def argmax_model(model):
    """``model`` with the argmax over the vocabulary taken inside the graph:
    ids come back, not ``batch × length × vocab`` float logits (200 MB a
    call for 128 sentences of 48 tokens over 8,000 pieces)."""
    return keras.Model(model.input, keras.ops.argmax(model.output, axis=-1))


def greedy(model, sources, length, batch_size=128):
    """Greedy decoding as keras-hub's guides do it: the whole decoder input
    is run again for each new token (no cache). ``model`` returns each
    position's most likely id (``argmax_model``)."""
    outputs = []
    for start in range(0, len(sources), batch_size):
        source = sources[start : start + batch_size]
        target = np.full((len(source), length), PAD_ID, dtype="int32")
        target[:, 0] = START_ID
        done = np.zeros(len(source), dtype=bool)
        for t in range(length - 1):
            ids = model.predict_on_batch(
                {"encoder_inputs": source, "decoder_inputs": target}
            )
            next_ids = np.asarray(ids)[:, t].astype("int32")
            next_ids[done] = PAD_ID
            target[:, t + 1] = next_ids
            done |= next_ids == END_ID
            if done.all():
                break
        outputs.extend(target[:, 1:].tolist())
    return outputs


def build(args, tokenizer):
    """keras-hub's layers at ``kt-train``'s ``small`` size (``training_speed``)."""
    setting = dataclasses.replace(
        benchmark.CPU_SETTING,
        vocab_size=tokenizer.vocabulary_size(),
        source_length=args.sequence_length,
        target_length=args.sequence_length,
    )
    return benchmark.build_keras_hub(setting)


def train(args, model, tokenizer, train_pairs):
    """Fit until the time budget is spent; returns the snapshots taken,
    ``[(path, seconds, step)]``."""
    length = args.sequence_length
    sources = padded(ktd.encode(tokenizer, train_pairs[0]), length)
    targets = ktd.encode(tokenizer, train_pairs[1], add_start=True, add_end=True)
    decoder_inputs = padded([row[:-1] for row in targets], length)
    labels = padded([row[1:] for row in targets], length)
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=PAD_ID
        ),
    )
    budget = TimeBudget(60 * args.max_minutes)
    snapshots = Snapshots(
        os.path.join(args.out, "snapshots"), 60 * args.every_minutes, budget
    )
    os.makedirs(snapshots.folder, exist_ok=True)
    model.fit(
        {"encoder_inputs": sources, "decoder_inputs": decoder_inputs},
        labels,
        batch_size=args.batch_size,
        epochs=10_000,  # the time budget stops it
        shuffle=True,
        verbose=2,
        callbacks=[budget, snapshots],
    )
    if not snapshots.taken or snapshots.taken[-1][2] != snapshots.steps():
        snapshots.take()  # the end of training
    return snapshots.taken


def score_snapshots(args, model, tokenizer, val_pairs, taken):
    """Greedy translations of the validation set with each snapshot's
    weights, scored; ``<out>/curve.json`` is rewritten after each point."""
    val_sources = padded(ktd.encode(tokenizer, val_pairs[0]), args.sequence_length)
    translate = argmax_model(model)
    curve = {
        "label": "keras-hub recipe",
        "run": args.out,
        "settings": vars(args),
        "backend": keras.backend.backend(),
        "beam_size": 1,
        "points": [],
    }
    for path, seconds, step in taken:
        model.load_weights(path)
        start = time.perf_counter()
        ids = greedy(translate, val_sources, args.sequence_length)
        result = score(ktd.decode(tokenizer, ids), val_pairs[1])
        done = curve_point(path, step, seconds, result, time.perf_counter() - start)
        curve["points"].append(done)
        curve["bleu_signature"] = result["bleu_signature"]
        write_atomic(os.path.join(args.out, "curve.json"), json.dumps(curve, indent=2))
        print(f"{seconds / 60:.1f} min, step {step}: BLEU {result['bleu']:.2f}")
    return curve


def prepare(args):
    """``(tokenizer, train pairs or None, val pairs, snapshots or None)``:
    a new tokenizer (saved in ``--out``) to train with, or, with
    ``--score-only``, the saved one and the snapshots listed."""
    pairs = {
        split: ktd.read_split(
            args.data, split, args.source, args.target, args.max_lines
        )
        for split in (("val",) if args.score_only else ("train", "val"))
    }
    tokenizer_path = os.path.join(args.out, "tokenizer.model")
    if args.score_only:
        try:
            with open(tokenizer_path, "rb") as file:
                proto = file.read()
        except OSError as error:
            raise ValueError(f"{tokenizer_path}: {error.strerror}") from None
        taken = read_snapshots(os.path.join(args.out, "snapshots"))
        return ktd.make_tokenizer(proto), None, pairs["val"], taken
    train_pairs = pairs["train"]
    proto = ktd.train_tokenizer(
        train_pairs[0] + train_pairs[1], args.vocab_size, model_type="bpe"
    )
    write_atomic(tokenizer_path, proto)
    return ktd.make_tokenizer(proto), train_pairs, pairs["val"], None


def main(argv=None):
    """Train (unless ``--score-only``) and score; returns the curve. An
    unreadable corpus, or nothing to score: exit status 2, one line."""
    parser, args = parse_args(argv)
    prepare_process()
    start_tensorflow()
    keras.utils.set_random_seed(args.seed)
    try:
        tokenizer, train_pairs, val_pairs, taken = prepare(args)
    except (ktd.CorpusError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    model = build(args, tokenizer)
    if taken is None:
        taken = train(args, model, tokenizer, train_pairs)
    return score_snapshots(args, model, tokenizer, val_pairs, taken)


if __name__ == "__main__":
    main()
