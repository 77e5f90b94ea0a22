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

import keras_transformer as kt
from keras_transformer import data
from keras_transformer.trainer.callbacks import TimeBudget

END_ID = data.END_ID  # the reserved id the translators append (special_tokens)


def batches(tokenizer, sources, targets, batch_tokens, max_length):
    """Pairs of similar length padded to one length per bucket (§5.1), as in
    training/parallel_corpus.py: sources spelt with the source model and
    ending with the end id, translations with the target model (the dataset
    adds the start and end ids)."""
    src_ids = [row[: max_length - 1] + [END_ID] for row in tokenizer.tokenize(sources)]
    tgt_ids = [row[: max_length - 1] for row in tokenizer.tokenize_targets(targets)]
    longest = max(
        max(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)
    )
    boundaries = data.bucket_boundaries(
        min(longest, max_length), **data.TRAINING_BUCKETS
    )
    return data.BucketedDataset(src_ids, tgt_ids, batch_tokens, boundaries)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="a folder or hf://owner/name")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--target", required=True, help="their translations")
    parser.add_argument("--out", default="runs/finetuned/translator.keras")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=30.0, help="time budget")
    parser.add_argument("--batch-tokens", type=int, default=2048)
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
    train = batches(translator.tokenizer, sources, targets, args.batch_tokens, length)
    history = model.fit(
        train,
        epochs=args.epochs,
        callbacks=[TimeBudget(60 * args.minutes)],
        shuffle=False,  # the dataset draws its own order every epoch
    )

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    translator.save(args.out)
    after = keras.saving.load_model(args.out).translate(shown)
    for source, old, new in zip(shown, before, after, strict=True):
        print(f"  {source}  ->  {old}  =>  {new}")
    return history


if __name__ == "__main__":
    main()
