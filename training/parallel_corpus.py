"""Train a Transformer on a folder of parallel text, save it, score it (BLEU).

    python -m training.parallel_corpus --data ../shared/data/multi30k \
        --source de --target en --minutes 30 --out runs/multi30k-script

The folder holds ``train.SRC``, ``train.TGT``, ``val.SRC`` and ``val.TGT``
(plain or ``.gz``, one sentence per line). These are the steps ``kt-train
--data`` takes, written out with the public API; the command adds resuming,
checkpoint averaging (§6.1), mixed precision, several devices and corpora
larger than memory (docs/training.md).
"""

import argparse
import os

import keras

import keras_transformer as kt
from keras_transformer import data
from keras_transformer.trainer.callbacks import TimeBudget
from keras_transformer.translate.evaluation import score


def batches(tokenizer, pairs, batch_tokens, max_length, shuffle=True):
    """Pairs of similar length padded to one length per bucket, as many rows
    as fit ``batch_tokens`` (§5.1); pairs longer than the model's
    ``max_length`` are left out."""
    sources, targets = pairs
    src_ids = data.encode(tokenizer, sources)
    tgt_ids = data.encode(tokenizer, targets, add_end=False)
    pairs = zip(src_ids, tgt_ids, strict=True)
    longest = max(max(len(s), len(t) + 1) for s, t in pairs)
    boundaries = data.bucket_boundaries(
        min(longest, max_length), **data.TRAINING_BUCKETS
    )
    return data.BucketedDataset(
        src_ids, tgt_ids, batch_tokens, boundaries, shuffle=shuffle
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the corpus folder")
    parser.add_argument("--source", required=True, help="e.g. de")
    parser.add_argument("--target", required=True, help="e.g. en")
    parser.add_argument("--out", default="runs/corpus-script")
    parser.add_argument("--minutes", type=float, default=30.0, help="time budget")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--config", default="small", help="tiny, small, base, big")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=3072)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)

    # The text, checked: a bad file stops here, naming the file and line.
    train = data.read_split(args.data, "train", args.source, args.target)
    val = data.read_split(args.data, "val", args.source, args.target)

    # One byte-pair vocabulary for both languages (§5.1).
    proto = data.train_tokenizer(train[0] + train[1], args.vocab_size, "bpe")
    tokenizer = data.make_tokenizer(proto)

    # The model, with one embedding matrix for both sides and the output
    # (§3.4), the paper's optimizer (§5.3) and label smoothing (§5.4).
    model = kt.build_model(args.config, src_vocab_size=tokenizer.vocabulary_size())
    model.compile(
        optimizer=kt.transformer_optimizer(model.d_model, warmup_steps=1000),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=0.1),
        metrics=[kt.MaskedAccuracy()],
    )
    length = model.max_length
    model.fit(
        batches(tokenizer, train, args.batch_tokens, length),
        validation_data=batches(tokenizer, val, args.batch_tokens, length, False),
        epochs=args.epochs,
        callbacks=[TimeBudget(60 * args.minutes)],  # stops after a whole batch
        shuffle=False,  # the dataset draws its own order every epoch
    )

    # Tokenizer, model and beam search in one file; no optimizer state.
    path = os.path.join(args.out, "translator.keras")
    os.makedirs(args.out, exist_ok=True)
    kt.Translator(tokenizer, kt.inference_copy(model)).save(path)
    translator = keras.saving.load_model(path)  # no custom_objects needed

    # Beam search, 4 beams, α = 0.6 (§6.1), scored by sacreBLEU.
    hypotheses = translator.translate(val[0], beam_size=4, length_penalty=0.6)
    scores = score(hypotheses, val[1])
    print(f"validation BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f}")
    for source, target in zip(val[0][:3], hypotheses[:3], strict=True):
        print(f"  {source}  ->  {target}")
    return scores


if __name__ == "__main__":
    main()
