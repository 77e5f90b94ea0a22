"""The graph of ``saved_model``'s export: a ``tf.Module`` with the
tokenizer, the float32 weights and the searches, and its ``translate``
signature (TensorFlow backend only; see ``saved_model`` for what it does)."""

import json
import os
import tempfile

from keras_transformer.search import shapes
from keras_transformer.search.options import EXTRA_OUTPUT_LENGTH

SIGNATURE = "translate"
INPUT = "texts"
OUTPUT = "translations"
METADATA_FILE = "translation.json"


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


def _output_widths(max_length, max_output_length):
    """The output widths a chunk can need: every sentence's output limit is
    ``max_output_length``, or at least ``EXTRA_OUTPUT_LENGTH`` (an empty
    source), never more than ``max_length``; narrower buckets never serve."""
    widths = shapes.widths(max_length)
    if max_output_length is None:
        least = min(EXTRA_OUTPUT_LENGTH, max_length)
        return [w for w in widths if w >= _bucket(widths, least)]
    return [_bucket(widths, min(max_output_length, max_length))]


def _bucket(widths, length):
    return next(w for w in widths if w >= length)


def _metadata(translator, transformer, search, jit_compile):
    import keras_transformer
    from keras_transformer.data.tokenizer import special_ids

    max_output_length = search.max_output_length
    if max_output_length is None:
        max_output_length = translator.max_output_length
    max_length = int(transformer.max_length)
    policy = translator.transformer.get_config().get("dtype")
    if isinstance(policy, dict):  # serialized
        policy = policy.get("config", {}).get("name")
    return {
        "format": "keras_transformer SavedModel translator",
        "keras_transformer_version": keras_transformer.__version__,
        "signature": SIGNATURE,
        "input": INPUT,
        "output": OUTPUT,
        "beam_size": search.beam_size,
        "length_penalty": search.length_penalty,
        "max_output_length": max_output_length,
        "extra_output_length": (
            EXTRA_OUTPUT_LENGTH if max_output_length is None else None
        ),
        "batch_size": search.batch_size,
        "use_cache": search.use_cache,
        "jit_compile": jit_compile,
        "source_widths": shapes.widths(max_length),
        "output_widths": _output_widths(max_length, max_output_length),
        "special_ids": special_ids(translator.tokenizer),
        "compute_dtype": "float32",
        "source_dtype_policy": str(policy),
        "model_config": {
            k: v for k, v in transformer.get_config().items() if k != "dtype"
        },
    }


def write_graph(translator, directory, search, jit_compile=True):
    """Build the module and save it to ``directory`` (TensorFlow backend)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    from keras_transformer.data.tokenizer import special_ids
    from keras_transformer.search import decoding

    transformer = _float32_transformer(translator.transformer)
    ids = decoding.check_special_ids(**special_ids(translator.tokenizer))
    metadata = _metadata(translator, transformer, search, jit_compile)

    module = tf.Module()
    module.tokenizer = tf_text.SentencepieceTokenizer(
        model=translator.tokenizer.proto, out_type=tf.int32
    )
    # The weights, as the plain tf.Variables the traced searches read.
    module.model_variables = [v.value for v in transformer.variables]
    searches = _searches(
        transformer, ids, metadata["output_widths"], search, jit_compile
    )
    translate = _translate_function(
        module.tokenizer, transformer, ids, searches, metadata, search
    )
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


def _best_tokens_function(searches, widths, search):
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
                return tf.pad(tokens, [[0, 0], [0, widths[-1] - widths[i]]])

            return run

        return tf.switch_case(index, [branch(i) for i in range(len(widths))])

    return best_tokens


def _encode_sources(tokenizer, texts, max_length, ids, fixed_limit):
    """The sources as the translator makes them (ragged, END-terminated),
    their lengths and their output limits, in the graph."""
    import tensorflow as tf

    pieces = tokenizer.tokenize(texts)
    # Translator.encode_sources: at most max_length - 1 tokens, then END.
    pieces = pieces[:, : max_length - 1]
    n = pieces.nrows(out_type=tf.int32)
    lengths = pieces.row_lengths() + 1
    lengths = tf.cast(lengths, tf.int32)
    ends = tf.RaggedTensor.from_tensor(tf.fill([n, 1], ids.end))
    sources = tf.concat([tf.cast(pieces, tf.int32), ends], axis=1)
    if fixed_limit is None:
        limits = lengths - 1 + EXTRA_OUTPUT_LENGTH
    else:
        limits = tf.fill([n], fixed_limit)
    limits = tf.minimum(limits, max_length)
    return n, lengths, sources, limits


def _detokenize(tokenizer, tokens, ids, n):
    """The ``[n]`` sentences of the best hypotheses' ``tokens``."""
    import tensorflow as tf

    # tokenizer.decode: cut at the first END (and at the first PAD, where
    # the translator cuts a hypothesis), drop PAD and START.
    stops = tf.logical_or(tf.equal(tokens, ids.end), tf.equal(tokens, ids.pad))
    before = tf.equal(tf.cumsum(tf.cast(stops, tf.int32), axis=1), 0)
    keep = tf.logical_and(before, tf.not_equal(tokens, ids.start))
    kept = tf.ragged.boolean_mask(tokens, keep)
    translations = tokenizer.detokenize(kept)
    return tf.reshape(translations, [n])


def _translate_function(tokenizer, transformer, ids, searches, metadata, search):
    """The ``translate`` signature: sources sorted by length, searched in
    padded chunks of ``batch_size``, translations back in input order."""
    import tensorflow as tf

    max_length = int(transformer.max_length)
    source_widths = tf.constant(metadata["source_widths"], tf.int32)
    widths = metadata["output_widths"]
    output_widths = tf.constant(widths, tf.int32)
    fixed_limit = metadata["max_output_length"]
    batch_size = search.batch_size
    powers = [1]
    while powers[-1] < batch_size:
        powers.append(powers[-1] * 2)
    powers_t = tf.constant(powers, tf.int32)
    best_tokens = _best_tokens_function(searches, widths, search)

    def translate(texts):
        n, lengths, sources, limits = _encode_sources(
            tokenizer, texts, max_length, ids, fixed_limit
        )
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
            (tf.constant(0, tf.int32), tf.zeros([n, widths[-1]], tf.int32)),
            parallel_iterations=1,
        )
        return {OUTPUT: _detokenize(tokenizer, tokens, ids, n)}

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
