"""The usual keras-hub recipe on a parallel corpus, for comparison (#16).

    kt-keras-hub-recipe --data ../shared/data/multi30k \\
        --source de --target en --max-minutes 30 --out runs/keras-hub

What keras-hub's translation guides do: ``TokenAndPositionEmbedding``,
``TransformerEncoder``/``TransformerDecoder`` (learnt positions, a separate
``Dense`` output layer), every pair padded to one fixed length, shuffled
batches of a fixed number of pairs, Adam at a constant rate, a plain
``model.fit``, and greedy decoding that reruns the decoder on the whole
prefix at every step. The model has the size of ``kt-train``'s ``small``
(3 + 3 layers, d_model 256, 8 heads, d_ff 1024, dropout 0.1) and the same
joint BPE vocabulary of 8,000 pieces, so the recipe is what differs.

Every ``--every-minutes`` of training the weights are saved; after training
each snapshot's greedy translations of the validation set are scored
(sacreBLEU), and the points are written as ``<out>/curve.json`` in
``kt-curve``'s format (``kt-curve plot`` draws it beside a ``kt-train`` run's
curve). Training time is ``model.fit``'s, without the scoring.
"""

import argparse
import dataclasses
import json
import os
import time

import keras
import numpy as np

from keras_transformer import data as ktd
from keras_transformer.callbacks import TimeBudget
from keras_transformer.checkpoints import write_atomic
from keras_transformer.cli import positive_int
from keras_transformer.commands import benchmark, start_tensorflow
from keras_transformer.evaluation import score
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="kt-keras-hub-recipe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data", required=True, help="folder with train.* and val.*")
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-minutes", type=float, required=True)
    parser.add_argument("--every-minutes", type=float, default=5.0)
    parser.add_argument("--sequence-length", type=positive_int, default=48)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--vocab-size", type=positive_int, default=8000)
    parser.add_argument("--max-lines", type=positive_int, help="use the first N")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def read_split(args, split):
    source = ktd.split_path(args.data, split, args.source)
    target = ktd.split_path(args.data, split, args.target)
    sources, targets = ktd.read_parallel(source, target)
    return sources[: args.max_lines], targets[: args.max_lines]


def padded(rows, length):
    """Rows of ids cut or padded to ``length`` (keras-hub's guides pad every
    pair to one fixed length)."""
    out = np.full((len(rows), length), PAD_ID, dtype="int32")
    for i, row in enumerate(rows):
        row = row[:length]
        out[i, : len(row)] = row
    return out


class Snapshots(keras.callbacks.Callback):
    """Save the weights every ``every`` seconds of ``budget``'s clock."""

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


def greedy(model, sources, length, batch_size=128):
    """Greedy decoding as keras-hub's guides do it: the whole decoder input
    is run again for each new token (no cache)."""
    outputs = []
    for start in range(0, len(sources), batch_size):
        source = sources[start : start + batch_size]
        target = np.full((len(source), length), PAD_ID, dtype="int32")
        target[:, 0] = START_ID
        done = np.zeros(len(source), dtype=bool)
        for t in range(length - 1):
            logits = model.predict_on_batch(
                {"encoder_inputs": source, "decoder_inputs": target}
            )
            next_ids = np.argmax(logits[:, t, :], axis=-1).astype("int32")
            next_ids[done] = PAD_ID
            target[:, t + 1] = next_ids
            done |= next_ids == END_ID
            if done.all():
                break
        outputs.extend(target[:, 1:].tolist())
    return outputs


def train(args, tokenizer, train_pairs):
    """Fit until the time budget is spent; returns (model, snapshots)."""
    length = args.sequence_length
    sources = padded(ktd.encode(tokenizer, train_pairs[0]), length)
    targets = ktd.encode(tokenizer, train_pairs[1], add_start=True, add_end=True)
    decoder_inputs = padded([row[:-1] for row in targets], length)
    labels = padded([row[1:] for row in targets], length)
    setting = dataclasses.replace(
        benchmark.CPU_SETTING,
        vocab_size=tokenizer.vocabulary_size(),
        source_length=length,
        target_length=length,
    )
    model = benchmark.build_keras_hub(setting)
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
    return model, snapshots.taken


def main(argv=None):
    args = parse_args(argv)
    start_tensorflow()
    keras.utils.set_random_seed(args.seed)
    train_pairs, val_pairs = read_split(args, "train"), read_split(args, "val")
    proto = ktd.train_tokenizer(
        train_pairs[0] + train_pairs[1], args.vocab_size, model_type="bpe"
    )
    tokenizer = ktd.make_tokenizer(proto)
    model, taken = train(args, tokenizer, train_pairs)
    val_sources = padded(ktd.encode(tokenizer, val_pairs[0]), args.sequence_length)
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
        ids = greedy(model, val_sources, args.sequence_length)
        result = score(ktd.decode(tokenizer, ids), val_pairs[1])
        curve["points"].append(
            {
                "checkpoint": os.path.basename(path),
                "step": step,
                "minutes": round(seconds / 60, 3),
                "bleu": result["bleu"],
                "chrf": result["chrf"],
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        curve["bleu_signature"] = result["bleu_signature"]
        write_atomic(os.path.join(args.out, "curve.json"), json.dumps(curve, indent=2))
        print(f"{seconds / 60:.1f} min, step {step}: BLEU {result['bleu']:.2f}")
    return curve


def command():
    """The installed ``kt-keras-hub-recipe`` command (``[project.scripts]``)."""
    main()
