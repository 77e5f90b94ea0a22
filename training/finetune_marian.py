"""Fine-tune a pretrained Marian / OPUS-MT model on a parallel corpus with ``fit``.

    python -m training.finetune_marian --preset hf://Helsinki-NLP/opus-mt-de-en \\
        --source train.de --target train.en --minutes 10 --out runs/ft/translator.keras

The checkpoint becomes a translator (``kt.Translator.from_preset``) whose
model trains with ``model.fit`` like one built by ``build_model``: the same
label-smoothed loss (§5.4), but Adam at a small constant rate instead of the
paper's warm-up schedule (§5.3), whose first steps at a rate near its peak
would undo much of what the checkpoint learnt. The sources are spelt with the
checkpoint's source SentencePiece model, the translations with its target
one; the translator is saved with its tokenizer, and prints a few
translations before and after.
"""

import argparse
import os

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer import data
from keras_transformer.trainer.callbacks import TimeBudget

START_ID, END_ID = data.START_ID, data.END_ID  # the reserved ids (special_tokens)


def batches(tokenizer, sources, targets, batch_size, max_length):
    """``(inputs, labels)`` arrays: sources with the end id, decoder inputs
    from the start id, labels ending with the end id, all cut to
    ``max_length`` and padded with 0 to the longest row of each batch."""
    source_ids = [
        row[: max_length - 1] + [END_ID] for row in tokenizer.tokenize(sources)
    ]
    target_ids = [row[: max_length - 1] for row in tokenizer.tokenize_targets(targets)]
    out = []
    for start in range(0, len(source_ids), batch_size):
        src = source_ids[start : start + batch_size]
        tgt = target_ids[start : start + batch_size]
        x = {
            "encoder_inputs": _pad(src),
            "decoder_inputs": _pad([[START_ID, *row] for row in tgt]),
        }
        out.append((x, _pad([[*row, END_ID] for row in tgt])))
    return out


def _pad(rows):
    array = np.zeros((len(rows), max(len(row) for row in rows)), "int32")
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="a folder or hf://owner/name")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--target", required=True, help="their translations")
    parser.add_argument("--out", default="runs/finetuned/translator.keras")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=30.0, help="time budget")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)

    sources, targets = data.read_parallel(args.source, args.target)
    translator = kt.Translator.from_preset(args.preset)
    shown = sources[:3]
    before = translator.translate(shown)

    model = translator.transformer
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=0.1),
        metrics=[kt.MaskedAccuracy()],
    )
    length = model.max_length
    train = batches(translator.tokenizer, sources, targets, args.batch_size, length)
    history = model.fit(
        _repeat(train),
        steps_per_epoch=len(train),
        epochs=args.epochs,
        callbacks=[TimeBudget(60 * args.minutes)],
        shuffle=False,  # _repeat draws the batches' order every epoch
    )

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    translator.save(args.out)
    after = keras.saving.load_model(args.out).translate(shown)
    for source, old, new in zip(shown, before, after, strict=True):
        print(f"  {source}  ->  {old}  =>  {new}")
    return history


def _repeat(items):
    rng = np.random.default_rng(0)
    while True:
        for i in rng.permutation(len(items)):
            yield items[i]


if __name__ == "__main__":
    main()
