"""Data for training and evaluation: built-in task, corpora, tokenizer, batching."""

from keras_transformer.data.batching import (
    BucketedDataset,
    bucket_boundaries,
    make_batches,
    padding_fraction,
)
from keras_transformer.data.corpus import (
    CorpusError,
    iter_lines,
    iter_parallel,
    read_lines,
    read_parallel,
    read_split,
    split_path,
)
from keras_transformer.data.id_store import (
    CorpusFiles,
    IdStore,
    build_id_store,
    sample_pairs,
)
from keras_transformer.data.numbers import (
    EDGE_NUMBERS,
    LIMIT,
    SHORT_REPEATS,
    WHOLE_WORDS,
    english,
    german,
    make_splits,
    sample_numbers,
)
from keras_transformer.data.tokenizer import (
    END_ID,
    PAD_ID,
    START_ID,
    UNK_ID,
    decode,
    encode,
    make_tokenizer,
    train_tokenizer,
)

__all__ = [
    "EDGE_NUMBERS",
    "END_ID",
    "LIMIT",
    "PAD_ID",
    "SHORT_REPEATS",
    "START_ID",
    "UNK_ID",
    "WHOLE_WORDS",
    "BucketedDataset",
    "CorpusError",
    "CorpusFiles",
    "IdStore",
    "build_id_store",
    "iter_lines",
    "iter_parallel",
    "sample_pairs",
    "bucket_boundaries",
    "decode",
    "encode",
    "english",
    "german",
    "make_batches",
    "make_splits",
    "make_tokenizer",
    "padding_fraction",
    "read_lines",
    "read_parallel",
    "read_split",
    "sample_numbers",
    "split_path",
    "train_tokenizer",
]
