"""A run's inputs: its tokenizer and its batches by length (§5.1).

The tokenizer is trained once on source and target text together (one joint
vocabulary) and kept in the run folder, so that a resumed run uses the very
same ids. Batches are buckets of similar length padded to one length each,
as many rows as fit the token budget; a corpus larger than memory is
tokenised once into a memory-mapped id store in the run folder.
"""

import base64
import os
import re
import shutil
import time

import numpy as np

from keras_transformer import data as ktd
from keras_transformer.atomic import DiskFullError, is_disk_full
from keras_transformer.data.batching import TRAINING_BUCKETS, bucket_boundaries
from keras_transformer.data.sentencepiece import MODEL_FILE
from keras_transformer.distribute import cluster
from keras_transformer.trainer.config import batch_tokens_error
from keras_transformer.trainer.errors import UsageError
from keras_transformer.trainer.parallel import agreed, log
from keras_transformer.trainer.run_folder import IDS_DIR, TOKENIZER_FILE


def tokenizer(config, task, folder, train, resuming):
    """``(tokenizer, proto)``: the run folder's tokenizer when resuming, else
    a new one trained on ``train``; ``proto`` is a new one's, to be written
    once the settings are checked (None when resuming). With several
    processes, process 0's on every process (their SentencePiece trainings
    need not agree, and only process 0 writes it)."""
    if cluster.process_count() == 1:
        return _own_tokenizer(config, task, folder, train, resuming)

    def on_chief():
        made, proto = _own_tokenizer(config, task, folder, train, resuming)
        text = base64.b64encode(made.export_files()[MODEL_FILE]).decode()
        return {"proto": text, "new": proto is not None}

    got = agreed(on_chief)
    proto = base64.b64decode(got["proto"])
    return ktd.make_tokenizer(proto), proto if got["new"] else None


def _own_tokenizer(config, task, folder, train, resuming):
    path = folder.file(TOKENIZER_FILE)
    if resuming and os.path.exists(path):
        return ktd.make_tokenizer(path), None
    start = time.monotonic()
    if isinstance(train, ktd.CorpusFiles):  # a sample, read in one pass
        try:
            train = ktd.sample_pairs(
                train.source, train.target, config.tokenizer_sample, config.seed,
                train.max_lines,
            )  # fmt: skip
        except ktd.CorpusError as error:
            raise UsageError(str(error)) from None
    proto = _train_tokenizer(config, task, train[0] + train[1])
    made = ktd.make_tokenizer(proto)
    log(
        f"tokenizer: {config.tokenizer}, {made.vocabulary_size()} pieces "
        f"({time.monotonic() - start:.1f} s)"
    )
    return made, proto


def _train_tokenizer(config, task, texts):
    symbols = task.tokenizer_symbols
    try:
        return ktd.train_tokenizer(
            texts,
            config.vocab_size,
            model_type=config.tokenizer,
            seed=config.seed,
            user_defined_symbols=symbols,
        )
    except RuntimeError as error:  # SentencePiece's checks
        message = " ".join(str(error).split())
        needed = re.search(r"required_chars\. \d+ vs (\d+)", message)
        if needed:
            pieces = "the reserved ids"
            if symbols:
                pieces += " and the pieces " + " and ".join(symbols)
            raise UsageError(
                f"`vocab_size` {config.vocab_size} is too small for this text: "
                f"its characters, {pieces} need {needed.group(1)}."
            ) from None
        raise UsageError(
            f"`vocab_size` {config.vocab_size}: SentencePiece cannot train a "
            f"vocabulary of that size on this text ({message})"
        ) from None


def pretrained(config):
    """The translator ``config.init_from`` names: a ``.keras`` translator, or
    a Marian checkpoint (a folder or ``hf://owner/name``); ``UsageError``
    when it cannot be read."""
    from keras_transformer.translate.evaluation import ModelFileError, load_translator
    from keras_transformer.translate.keras_translator import Translator

    source = config.init_from
    try:
        if source.endswith(".keras"):
            translator = load_translator(source)
        else:
            translator = Translator.from_preset(source)
    except (OSError, ValueError, TypeError, ModelFileError) as error:
        raise UsageError(f"`init_from` {source}: {error}") from None
    if not isinstance(translator, Translator):
        raise UsageError(f"`init_from` {source}: an export, not a translator")
    log(f"starting from {source} ({translator.transformer.count_params():,} weights)")
    return translator


def datasets(config, made, data, model_config, replicas, shard, folder):
    """``(train, validation, boundaries)``: batches by length (§5.1), this
    process's ``shard`` of each."""
    if isinstance(data["train"], ktd.CorpusFiles):
        store = _id_store(config, data["train"], made, folder)
        src_ids, tgt_ids = store.source, store.target
        lengths = np.maximum(src_ids.lengths, tgt_ids.lengths + 1)
    else:
        train_src, train_tgt = data["train"]
        src_ids = made.encode(train_src)
        tgt_ids = made.encode_targets(train_tgt)
        pairs = zip(src_ids, tgt_ids, strict=True)
        lengths = [max(len(s), len(t) + 1) for s, t in pairs]
    boundaries = config.bucket_lengths or training_boundaries(
        model_config.max_length, lengths
    )
    boundaries = list(boundaries)
    if config.batch_tokens < boundaries[-1] * replicas:
        raise UsageError(
            batch_tokens_error(
                config.batch_tokens,
                boundaries[-1],
                replicas,
                given=bool(config.bucket_lengths),
            )
        )
    dataset = ktd.BucketedDataset(
        src_ids,
        tgt_ids,
        config.batch_tokens,
        boundaries,
        seed=config.seed,
        rows_multiple=replicas,
        process_shard=shard,
    )
    if len(dataset) == 0:
        raise UsageError(
            f"no training pair fits the longest bucket ({boundaries[-1]} tokens); "
            "raise `max_length` or `bucket_lengths`."
        )
    if dataset.dropped:
        log(
            f"dropped {len(dataset.dropped)} of {len(src_ids)} training pairs "
            f"longer than {boundaries[-1]} tokens"
        )
    val_src, val_tgt = data["validation"]
    val_dataset = ktd.BucketedDataset(
        made.encode(val_src),
        made.encode_targets(val_tgt),
        config.batch_tokens,
        boundaries,
        shuffle=False,
        rows_multiple=replicas,
        process_shard=shard,
    )
    return dataset, val_dataset, boundaries


def training_boundaries(max_length, lengths):
    """The buckets of a run: ``TRAINING_BUCKETS`` up to its longest example,
    capped by the model's ``max_length``."""
    longest = int(max(lengths))
    if max_length is not None:
        longest = min(longest, max_length)
    return bucket_boundaries(longest, **TRAINING_BUCKETS)


def _id_store(config, files, made, folder):
    """The training split's id store in the run folder: reused when it is
    complete and of this tokenizer and corpus, else written (by process 0;
    the others open it once it is there)."""
    path = folder.file(IDS_DIR)

    def usable():
        try:
            store = ktd.IdStore(path)
        except (ValueError, OSError):
            return None
        info = store.info
        paths = [os.path.abspath(p) for p in (files.source, files.target)]
        same = (
            info["tokenizer"] == ktd.id_store.tokenizer_digest(made)
            and [info["source"], info["target"]] == paths
            and info["max_lines"] == files.max_lines
        )
        return store if same else None

    def on_chief():
        if usable() is None:
            folder.will_create(IDS_DIR, IDS_DIR + ".partial")
            start = time.monotonic()
            try:
                store = ktd.build_id_store(
                    files.source, files.target, made, path, files.max_lines
                )
            except ktd.CorpusError as error:
                raise UsageError(str(error)) from None
            except OSError as error:
                if not is_disk_full(error):
                    raise
                shutil.rmtree(path + ".partial", ignore_errors=True)
                raise DiskFullError("id store", path) from error
            log(
                f"id store: {len(store):,} pairs tokenised into {path} "
                f"({time.monotonic() - start:.0f} s)"
            )

    agreed(on_chief)
    store = usable()
    if store is None:
        raise UsageError(f"the id store in {path} does not open")
    return store
