"""Train a Transformer on the built-in task, save it, reload it, translate.

    python -m training.numbers --minutes 3 --out runs/numbers-script

The built-in task is English number words to German (0 to 999,999),
generated: no download. These are the steps ``kt-train --task numbers``
takes, written out with the public API; the command adds resuming after an
interruption, checkpoint averaging, several devices and a fuller report
(docs/training.md).
"""

import argparse
import os

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer import data
from keras_transformer.trainer.callbacks import TimeBudget


def batches(tokenizer, pairs, batch_tokens, shuffle=True):
    """Pairs of similar length padded to one length per bucket, as many rows
    as fit ``batch_tokens`` (§5.1). Targets go in without the start and end
    ids: the dataset adds them (decoder inputs and labels)."""
    sources, targets = pairs
    src_ids = data.encode(tokenizer, sources)
    tgt_ids = data.encode(tokenizer, targets, add_end=False)
    pairs = zip(src_ids, tgt_ids, strict=True)
    longest = max(max(len(s), len(t) + 1) for s, t in pairs)
    boundaries = data.bucket_boundaries(longest, **data.TRAINING_BUCKETS)
    return data.BucketedDataset(
        src_ids, tgt_ids, batch_tokens, boundaries, shuffle=shuffle
    )


def exact_match(translator, pairs, **search):
    sources, references = pairs
    outputs = translator.translate(sources, **search)
    return np.mean([out == ref for out, ref in zip(outputs, references, strict=True)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/numbers-script")
    parser.add_argument("--minutes", type=float, default=3.0, help="time budget")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--config", default="tiny", help="tiny, small, base, big")
    parser.add_argument("--train-size", type=int, default=50_000)
    parser.add_argument("--test-size", type=int, default=1_000)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)

    # The data: disjoint train, validation and test numbers.
    splits = data.make_splits(
        seed=0, train_size=args.train_size, val_size=500,
        test_size=args.test_size, uniform_size=0,
    )  # fmt: skip
    train_src, train_tgt = splits["train"]

    # One vocabulary for both languages (§5.1), ids 0-3 reserved for
    # padding, start, end and unknown; "zero" and "null" kept whole.
    proto = data.train_tokenizer(
        train_src + train_tgt, vocab_size=200, user_defined_symbols=data.WHOLE_WORDS
    )
    tokenizer = data.make_tokenizer(proto)

    # The model: one embedding matrix for both sides and the output (§3.4).
    model = kt.build_model(args.config, src_vocab_size=tokenizer.vocabulary_size())
    model.compile(
        # §5.3: Adam with warm-up, at half the paper's rate for this task.
        optimizer=kt.transformer_optimizer(model.d_model, warmup_steps=400, scale=0.5),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=0.1),  # §5.4
        metrics=[kt.MaskedAccuracy()],
    )
    model.fit(
        batches(tokenizer, splits["train"], 2048),
        validation_data=batches(tokenizer, splits["validation"], 2048, False),
        epochs=args.epochs,
        callbacks=[TimeBudget(60 * args.minutes)],  # stops after a whole batch
        shuffle=False,  # the dataset draws its own order every epoch
    )

    # Tokenizer, model and beam search in one file; no optimizer state.
    path = os.path.join(args.out, "translator.keras")
    os.makedirs(args.out, exist_ok=True)
    kt.Translator(tokenizer, kt.inference_copy(model)).save(path)
    translator = keras.saving.load_model(path)  # no custom_objects needed

    accuracy = exact_match(translator, splits["test"], beam_size=4)
    print(f"exact match on {args.test_size} test numbers: {accuracy:.1%}")
    examples = ["three hundred forty-two", "twenty-one thousand five"]
    for source, target in zip(examples, translator.translate(examples), strict=True):
        print(f"  {source}  ->  {target}")
    return accuracy


if __name__ == "__main__":
    main()
