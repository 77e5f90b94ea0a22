"""Data for training and evaluation: built-in task, corpora, tokenizer, batching.

Names are imported when first used: reading a tokenizer needs neither
Keras nor a backend (the CTranslate2 engine reads one), batching does.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "TRAINING_BUCKETS": "keras_transformer.data.batching",
    "BucketedDataset": "keras_transformer.data.batching",
    "bucket_boundaries": "keras_transformer.data.batching",
    "bucket_length": "keras_transformer.data.batching",
    "make_batches": "keras_transformer.data.batching",
    "padding_fraction": "keras_transformer.data.batching",
    "CorpusError": "keras_transformer.data.corpus",
    "CorpusWarning": "keras_transformer.data.corpus",
    "iter_lines": "keras_transformer.data.corpus",
    "iter_parallel": "keras_transformer.data.corpus",
    "read_lines": "keras_transformer.data.corpus",
    "read_parallel": "keras_transformer.data.corpus",
    "read_split": "keras_transformer.data.corpus",
    "split_path": "keras_transformer.data.corpus",
    "CorpusFiles": "keras_transformer.data.id_store",
    "IdStore": "keras_transformer.data.id_store",
    "build_id_store": "keras_transformer.data.id_store",
    "sample_pairs": "keras_transformer.data.id_store",
    "EDGE_NUMBERS": "keras_transformer.data.numbers",
    "LIMIT": "keras_transformer.data.numbers",
    "SHORT_REPEATS": "keras_transformer.data.numbers",
    "WHOLE_WORDS": "keras_transformer.data.numbers",
    "english": "keras_transformer.data.numbers",
    "german": "keras_transformer.data.numbers",
    "make_splits": "keras_transformer.data.numbers",
    "sample_numbers": "keras_transformer.data.numbers",
    "END_ID": "keras_transformer.data.tokenizer",
    "PAD_ID": "keras_transformer.data.tokenizer",
    "START_ID": "keras_transformer.data.tokenizer",
    "UNK_ID": "keras_transformer.data.tokenizer",
    "SentencePiece": "keras_transformer.data.sentencepiece",
    "TextTokenizer": "keras_transformer.data.contract",
    "SentencePieceTokenizer": "keras_transformer.data.sentencepiece_layer",
    "decode": "keras_transformer.data.tokenizer",
    "encode": "keras_transformer.data.tokenizer",
    "make_tokenizer": "keras_transformer.data.tokenizer",
    "train_tokenizer": "keras_transformer.data.tokenizer",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
