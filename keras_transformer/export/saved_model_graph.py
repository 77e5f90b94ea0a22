"""The graph of ``saved_model``'s export: a ``tf.Module`` with the
tokenizer, the float32 weights and the searches, and its ``translate``
signature (TensorFlow backend only; see ``saved_model`` for what it does).

Everything the graph knows of the text comes from the translator and its
tokenizer's contract (``keras_transformer.data.contract``): the
SentencePiece model from ``export_files()``, the special ids from
``special_ids()``, the cut and the output limit from the translator's
``source_max_length``, ``target_max_length``, ``max_output_length`` and
``extra_output_length``. Three of the translator's rules are restated as
TensorFlow ops (``encode_sources``: the cut and the output limit;
``detokenize``: ``decode``'s cut at the end id); the tests compare each
with the rule it restates on the same inputs.
"""

import importlib
import importlib.util
import json
import os
import sys
import tempfile

from keras_transformer.data.sentencepiece import MODEL_FILE
from keras_transformer.search import shapes

SIGNATURE = "translate"
INPUT = "texts"
OUTPUT = "translations"
METADATA_FILE = "translation.json"
# What an export that cannot import TensorFlow or tensorflow-text says.
MISSING_TENSORFLOW = (
    "Exporting a SavedModel needs TensorFlow and tensorflow-text, whose "
    "SentencePiece ops tokenize inside the graph ({module} could not be "
    'imported): pip install "keras-transformer-aiayn[saved-model]"'
)


def require_tensorflow_text(load=True):
    """``ImportError`` naming the extra unless TensorFlow and
    tensorflow-text are installed: imported (``load``), or only found (the
    export subprocess imports them)."""
    for module in ("tensorflow", "tensorflow_text"):
        message = MISSING_TENSORFLOW.format(module=module)
        if load:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise ImportError(message) from error
        elif sys.modules.get(module, False) is None or not importlib.util.find_spec(
            module
        ):
            raise ImportError(message)


def sentencepiece_model(tokenizer):
    """The SentencePiece model's bytes that ``tokenizer`` (a
    ``TextTokenizer``) is, or ``ValueError`` where its ids are not one
    SentencePiece model's piece ids: tensorflow-text's op gives a model's
    own ids, which must be the transformer's."""
    kind = tokenizer.kind
    files = tokenizer.export_files() if kind == "sentencepiece" else {}
    if MODEL_FILE not in files:
        raise ValueError(
            "the SavedModel export tokenizes in TensorFlow with one "
            "SentencePiece model whose piece ids are the model's ids; this "
            f"translator's tokenizer ({kind}: {type(tokenizer).__name__}) is "
            "not one: export it with --format ctranslate2 or --format marian"
        )
    return files[MODEL_FILE]


def check_translator(translator):
    """``TypeError`` or ``ValueError`` unless ``translator`` can be written
    as a SavedModel: a ``Translator`` with a vocabulary, finite position
    limits, and a tokenizer that tensorflow-text's SentencePiece op can
    restate."""
    from keras_transformer.translate.keras_translator import Translator

    if not isinstance(translator, Translator):
        raise TypeError(
            "translator must be a keras_transformer.Translator. "
            f"Received: {type(translator).__name__}"
        )
    translator.check_tokenizer()
    sentencepiece_model(translator.tokenizer)
    for limit in (translator.source_max_length, translator.target_max_length):
        if not isinstance(limit, int):
            raise ValueError("the transformer must have an int max_length to export")


def _float32_transformer(transformer):
    """``transformer`` itself when it computes in float32, else a float32
    copy with its weights (mixed-precision variables are float32 already)."""
    # The functional model keeps float32; its layers carry the policy.
    policies = {layer.dtype_policy.name for layer in transformer.layers}
    if policies <= {"float32"}:
        return transformer
    config = {**transformer.get_config(), "dtype": "float32"}
    copy = type(transformer).from_config(config)
    copy.set_weights(transformer.get_weights())
    return copy


def _output_widths(target_max_length, max_output_length, extra_output_length):
    """The output widths a chunk can need: every sentence's output limit is
    ``max_output_length``, or at least ``extra_output_length`` (an empty
    source), never more than ``target_max_length``; narrower buckets never
    serve."""
    widths = shapes.widths(target_max_length)
    if max_output_length is None:
        least = min(extra_output_length, target_max_length)
        return [w for w in widths if w >= _bucket(widths, least)]
    return [_bucket(widths, min(max_output_length, target_max_length))]


def _bucket(widths, length):
    return next(w for w in widths if w >= length)


def length_rules(translator, search):
    """The translator's cut and output limit as the graph applies them:
    ``source_max_length``, ``target_max_length``, and the search's
    ``max_output_length`` (else the translator's) or, where it is None,
    the translator's ``extra_output_length`` (§6.1's 50 by default)."""
    max_output_length = search.max_output_length
    if max_output_length is None:
        max_output_length = translator.max_output_length
    extra = None
    if max_output_length is None:
        extra = int(translator.extra_output_length)
    return {
        "source_max_length": int(translator.source_max_length),
        "target_max_length": int(translator.target_max_length),
        "max_output_length": max_output_length,
        "extra_output_length": extra,
    }


def special_ids(tokenizer):
    """The tokenizer's special ids (its ``special_ids()``), as the searches
    take them."""
    from keras_transformer.search import decoding

    special = tokenizer.special_ids()
    return decoding.check_special_ids(
        start_id=special["start"], end_id=special["end"], pad_id=special["pad"]
    )


def tokenizer_op(tokenizer):
    """tensorflow-text's SentencePiece tokenizer of ``tokenizer``'s model,
    adding neither start nor end id (``encode`` adds the end id itself)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    return tf_text.SentencepieceTokenizer(
        model=sentencepiece_model(tokenizer), out_type=tf.int32
    )


def _metadata(translator, transformer, search, jit_compile):
    import keras_transformer

    policy = translator.transformer.get_config().get("dtype")
    if isinstance(policy, dict):  # serialized
        policy = policy.get("config", {}).get("name")
    rules = length_rules(translator, search)
    return {
        "format": "keras_transformer SavedModel translator",
        "keras_transformer_version": keras_transformer.__version__,
        "signature": SIGNATURE,
        "input": INPUT,
        "output": OUTPUT,
        "beam_size": search.beam_size,
        "length_penalty": search.length_penalty,
        **rules,
        "batch_size": search.batch_size,
        "use_cache": search.use_cache,
        "jit_compile": jit_compile,
        "source_widths": shapes.widths(rules["source_max_length"]),
        "output_widths": _output_widths(
            rules["target_max_length"],
            rules["max_output_length"],
            rules["extra_output_length"],
        ),
        "special_ids": translator.tokenizer.special_ids(),
        "compute_dtype": "float32",
        "source_dtype_policy": str(policy),
        "model_config": {
            k: v for k, v in transformer.get_config().items() if k != "dtype"
        },
    }


def write_graph(translator, directory, search, jit_compile=True):
    """Build the module and save it to ``directory`` (TensorFlow backend)."""
    require_tensorflow_text()
    import tensorflow as tf

    transformer = _float32_transformer(translator.transformer)
    ids = special_ids(translator.tokenizer)
    metadata = _metadata(translator, transformer, search, jit_compile)

    module = tf.Module()
    module.tokenizer = tokenizer_op(translator.tokenizer)
    # The weights, as the plain tf.Variables the traced searches read.
    module.model_variables = [v.value for v in transformer.variables]
    searches = _searches(
        transformer, ids, metadata["output_widths"], search, jit_compile
    )
    translate = _translate_function(module.tokenizer, ids, searches, metadata, search)
    module.metadata = _metadata_function(metadata)
    _save(module, translate, transformer, metadata, directory)
    return metadata


def _searches(transformer, ids, widths, search, jit_compile):
    """One traced search per output width: the width is a Python int of the
    search, not a tensor."""
    import tensorflow as tf

    from keras_transformer.search import decoding

    beam_size, use_cache = search.beam_size, search.use_cache

    def search_function(width):
        if beam_size == 1:

            def run(src, max_lengths, alpha):
                return decoding.greedy_loop(
                    transformer, src, max_lengths, width, use_cache, ids
                )
        else:

            def run(src, max_lengths, alpha):
                return decoding.beam_loop(
                    transformer,
                    src,
                    max_lengths,
                    width,
                    use_cache,
                    ids,
                    beam_size,
                    alpha,
                    top_n=1,  # only the best is kept: stop once it is settled
                )

        # As backend.compile_loop builds the translator's loop on TensorFlow.
        return tf.function(run, jit_compile=jit_compile, autograph=False)

    return [search_function(width) for width in widths]


def _best_tokens_function(searches, widths, search, ids):
    """``best_tokens(index, src, max_lengths, rows)``: the search of output
    bucket ``index`` picked in the graph (``tf.switch_case``)."""
    import tensorflow as tf

    beam_size = search.beam_size
    alpha = tf.constant(search.length_penalty, tf.float32)

    def best_tokens(index, src, max_lengths, rows):
        """The best hypothesis of each real row, as wide as the widest
        output bucket."""

        def branch(i):
            def run():
                outputs = searches[i](src, max_lengths, alpha)
                tokens = outputs[0]
                if beam_size > 1:
                    tokens = tokens[:, 0]
                tokens = tokens[:rows]
                return tf.pad(
                    tokens,
                    [[0, 0], [0, widths[-1] - widths[i]]],
                    constant_values=ids.pad,
                )

            return run

        return tf.switch_case(index, [branch(i) for i in range(len(widths))])

    return best_tokens


def encode_sources(tokenizer, texts, rules, ids):
    """The sources as ``TranslatorBase.encode_sources`` makes them (ragged,
    ending with the end id), their lengths and their output limits
    (``TranslatorBase.output_limit``), in the graph; ``rules`` as
    ``length_rules`` gives them."""
    import tensorflow as tf

    pieces = tokenizer.tokenize(texts)
    # A source longer than source_max_length keeps its first
    # source_max_length - 1 ids and the end id.
    pieces = pieces[:, : rules["source_max_length"] - 1]
    n = pieces.nrows(out_type=tf.int32)
    lengths = pieces.row_lengths() + 1
    lengths = tf.cast(lengths, tf.int32)
    ends = tf.RaggedTensor.from_tensor(tf.fill([n, 1], ids.end))
    sources = tf.concat([tf.cast(pieces, tf.int32), ends], axis=1)
    if rules["max_output_length"] is None:
        # §6.1: input length (end id excluded) + 50 by default.
        limits = lengths - 1 + rules["extra_output_length"]
    else:
        limits = tf.fill([n], rules["max_output_length"])
    limits = tf.minimum(limits, rules["target_max_length"])
    # An empty source has nothing to translate (TranslatorBase.output_limit).
    limits = tf.where(lengths == 1, 0, limits)
    return n, lengths, sources, limits


def detokenize(tokenizer, tokens, ids, n):
    """The ``[n]`` sentences of the best hypotheses' ``tokens``, by
    ``TextTokenizer.decode``'s rule: each row cut at its first end id,
    padding and start ids dropped."""
    import tensorflow as tf

    ends = tf.cast(tf.equal(tokens, ids.end), tf.int32)
    before = tf.equal(tf.cumsum(ends, axis=1), 0)
    special = tf.logical_or(tf.equal(tokens, ids.pad), tf.equal(tokens, ids.start))
    kept = tf.ragged.boolean_mask(tokens, tf.logical_and(before, ~special))
    translations = tokenizer.detokenize(kept)
    return tf.reshape(translations, [n])


def _translate_function(tokenizer, ids, searches, metadata, search):
    """The ``translate`` signature: sources sorted by length, searched in
    padded chunks of ``batch_size``, translations back in input order."""
    import tensorflow as tf

    source_widths = tf.constant(metadata["source_widths"], tf.int32)
    widths = metadata["output_widths"]
    output_widths = tf.constant(widths, tf.int32)
    batch_size = search.batch_size
    powers = [1]
    while powers[-1] < batch_size:
        powers.append(powers[-1] * 2)
    powers_t = tf.constant(powers, tf.int32)
    best_tokens = _best_tokens_function(searches, widths, search, ids)

    def translate(texts):
        n, lengths, sources, limits = encode_sources(tokenizer, texts, metadata, ids)
        order = tf.argsort(lengths, stable=True)

        def body(start, results):
            stop = tf.minimum(start + batch_size, n)
            chunk = order[start:stop]
            rows = stop - start
            padded = tf.minimum(
                tf.gather(powers_t, tf.searchsorted(powers_t, rows[None])[0]),
                batch_size,
            )
            chunk_lengths = tf.gather(lengths, chunk)
            chunk_limits = tf.gather(limits, chunk)
            src_width = tf.gather(
                source_widths,
                tf.searchsorted(source_widths, tf.reduce_max(chunk_lengths)[None])[0],
            )
            src = tf.gather(sources, chunk).to_tensor(
                default_value=ids.pad, shape=tf.stack([padded, src_width])
            )
            # Padding rows generate nothing (limit 0), as in _decode_batch.
            max_lengths = tf.pad(chunk_limits, [[0, padded - rows]])
            most = tf.reduce_max(chunk_limits)[None]
            out_index = tf.searchsorted(output_widths, most)[0]
            tokens = best_tokens(out_index, src, max_lengths, rows)
            results = tf.tensor_scatter_nd_update(results, chunk[:, None], tokens)
            return start + batch_size, results

        _, tokens = tf.while_loop(
            lambda start, _: start < n,
            body,
            (tf.constant(0, tf.int32), tf.fill([n, widths[-1]], ids.pad)),
            parallel_iterations=1,
        )
        return {OUTPUT: detokenize(tokenizer, tokens, ids, n)}

    # Only as signatures: kept as an attribute of the module as well, the
    # function would be traced (and saved) a second time.
    return tf.function(
        translate,
        input_signature=[tf.TensorSpec([None], tf.string, name=INPUT)],
        autograph=False,
    )


def _metadata_function(metadata):
    """``metadata()``: the metadata's scalars as constants, the model's
    config as a JSON string."""
    import tensorflow as tf

    constants = {
        key: value
        for key, value in metadata.items()
        if isinstance(value, (bool, int, float, str))
    }
    constants["model_config"] = json.dumps(metadata["model_config"], sort_keys=True)

    @tf.function(input_signature=[], autograph=False)
    def metadata_function():
        return {key: tf.constant(value) for key, value in constants.items()}

    return metadata_function


def _save(module, translate, transformer, metadata, directory):
    """Save ``module`` with the metadata as an asset and ``translate`` as
    its signatures."""
    import tensorflow as tf

    from keras_transformer.search import decoding

    with tempfile.TemporaryDirectory() as scratch:
        metadata_path = os.path.join(scratch, METADATA_FILE)
        with open(metadata_path, "w", encoding="utf-8") as file:
            json.dump(metadata, file, indent=2, sort_keys=True)
            file.write("\n")
        module.metadata_file = tf.saved_model.Asset(metadata_path)
        # The layers' host-side id checks stay out of the traced searches:
        # the tokenizer only makes ids of the vocabulary.
        with decoding.unchecked_loop(transformer):
            concrete = translate.get_concrete_function()
            tf.saved_model.save(
                module,
                directory,
                signatures={SIGNATURE: concrete, "serving_default": concrete},
            )
