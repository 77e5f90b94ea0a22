"""The attention weights of a translator for one sentence pair (paper §3.2.1).

Every attention sub-layer computes ``softmax(Q Kᵀ / √d_k)`` (§3.2.1, Eq. 1)
before it averages the values: one row of weights per query position, one
column per key position, each row summing to 1. The paper's Figures 3 to 5
show such weights for the encoder's self-attention, as evidence that heads
learn syntactic and anaphoric structure. ``attention_maps`` collects them for
all three kinds of attention in the model (§3.2.3): encoder self-attention,
masked decoder self-attention and encoder-decoder ("cross") attention.

The decoder runs with teacher forcing on a given target (by default the
translator's own greedy translation), so the weights are those the model uses
while predicting each target token. ``keras_transformer.translate.plotting`` draws them.

The encoder and decoder run as one compiled program (``backend.compile_loop``)
per padded source width of ``search.shapes``, as the searches do, with the
decoder input padded to the model's whole width: a new sentence length
reuses a program, and ``Translator.warm_up_attention`` compiles them all
ahead of a server's requests. Padding changes no weight
that is kept: padded source keys and padded decoder keys are masked to
exactly zero weight, and the padded queries' rows are cut off.

This module does not import matplotlib.
"""

import dataclasses
import warnings

import numpy as np
from keras import ops

from keras_transformer._guards import inputs as _inputs
from keras_transformer.search import decoding, shapes
from keras_transformer.translate.heat_map import HeatMap


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """Attention weights of every layer and head for one sentence pair.

    Rows are queries and columns are keys. Decoder position ``i`` has as
    input ``START`` (``i = 0``) or the target piece ``i - 1``, and predicts
    ``target_tokens[i]``: rows are labelled by the token being predicted, the
    usual convention of alignment plots (Bahdanau et al., 2015). There is no
    padding: ``S = len(source_tokens)`` and ``T = len(target_tokens)``.
    ``decoder_input_tokens`` lists what each decoder position reads.

    Attributes:
        source_tokens: list of str, the source pieces as the encoder sees
            them, ending with ``"</s>"``. SentencePiece pieces are kept as
            they are: ``"▁"`` marks the start of a word.
        target_tokens: list of str, the target pieces followed by ``"</s>"``.
        encoder_self_attention: float32 ``(num_layers, num_heads, S, S)``.
        decoder_self_attention: float32 ``(num_layers, num_heads, T, T)``,
            zero above the diagonal (the causal mask of §3.2.3).
        cross_attention: float32 ``(num_layers, num_heads, T, S)``.
    """

    source_tokens: list
    target_tokens: list
    encoder_self_attention: np.ndarray
    decoder_self_attention: np.ndarray
    cross_attention: np.ndarray

    @property
    def decoder_input_tokens(self):
        """The decoder's input pieces: ``"<s>"``, then the target pieces.

        Position ``j`` of the decoder reads ``decoder_input_tokens[j]``: the
        natural labels of the keys (columns) of the decoder self-attention.
        """
        return ["<s>", *self.target_tokens[:-1]]

    @property
    def num_layers(self):
        return self.cross_attention.shape[0]

    @property
    def num_heads(self):
        return self.cross_attention.shape[1]

    def heat_map(self, layer=-1, head=None):
        """The cross-attention of one layer and head as a ``HeatMap``.

        Args:
            layer: int, a Python index into the layers (``-1``: the last), or
                None for the mean over layers.
            head: int, a Python index into the heads, or None (default) for
                the mean over heads.

        Returns:
            A ``keras_transformer.translate.heat_map.HeatMap``, which a
            notebook shows as an HTML table (rows: the target tokens
            predicted, columns: the source tokens).
        """
        return HeatMap(self, layer, head)

    def _repr_html_(self):
        # A notebook cell that ends in `maps` shows where the decoder looked:
        # the last layer, heads averaged, as plot_attention_maps' default.
        return self.heat_map()._repr_html_()


def attention_maps(translator, source, target=None):
    """The attention weights of ``translator`` on one sentence pair.

    Args:
        translator: a ``keras_transformer.Translator``. The model its
            searches run computes the weights: a float32 copy of a
            mixed-precision transformer, unless ``search_dtype="policy"``.
        source: str, one source sentence. A source longer than the model's
            ``max_length`` is truncated, with a ``UserWarning``, as
            ``Translator.encode_sources`` does.
        target: str, the target sentence to force through the decoder; None
            (default) takes the translator's greedy translation of
            ``source``. A greedy output that reached the length limit without
            ``</s>`` is cut to fit the decoder.

    Returns:
        An ``AttentionMaps``.

    Raises:
        TypeError: ``source`` or ``target`` is not a str.
        ValueError: the target (plus the start token) is longer than the
            model's ``max_length``.

    References:
        Vaswani et al., "Attention Is All You Need", 2017, §3.2.1 and
        Figures 3-5.
    """
    for name, value in (("source", source), ("target", target)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be one str. Received: {value!r}")
    tokenizer = translator.tokenizer
    source_ids = translator.encode_sources([source])[0]
    limit = translator.target_max_length
    if target is None:
        body = _greedy_body(translator, source)
        if limit is not None:
            # Only an output that ran to the limit without END is this long.
            body = body[: limit - 1]
    else:
        body = tokenizer.encode_targets([target])[0]
        if limit is not None and len(body) + 1 > limit:
            raise ValueError(
                f"The target has {len(body)} tokens; with the start token the "
                f"decoder input would be longer than the model's "
                f"max_length={limit}."
            )
    # The model the searches run (a float32 copy of a mixed-precision one,
    # unless search_dtype="policy"): the weights shown are those of the
    # computation that chose the translation.
    # The decoder input is padded to the model's whole width: a target's
    # length, read again from its text, is not bounded by the search's
    # output limit, so one program per source width serves every target
    # (warm_up_attention compiles them).
    encoder_self, decoder_self, cross = attention_weights(
        translator._search_model(),
        source_ids,
        [tokenizer.start_id, *body],
        translator.source_max_length,
        limit,
        target_length=limit or 0,
    )

    def pieces(names, ids):
        return [str(names[int(i)]) for i in ids]

    return AttentionMaps(
        source_tokens=pieces(tokenizer.source_pieces(), source_ids),
        target_tokens=pieces(tokenizer.target_pieces(), [*body, tokenizer.end_id]),
        encoder_self_attention=encoder_self,
        decoder_self_attention=decoder_self,
        cross_attention=cross,
    )


def attention_weights(
    model,
    source_ids,
    decoder_ids,
    source_max_length=None,
    target_max_length=None,
    target_length=0,
):
    """The attention weights of every layer and head of ``model`` for one
    source and one decoder input (§3.2.1), computed at padded widths.

    The ids are padded with 0 to ``shapes.width`` of their lengths (capped by
    the max lengths), and the encoder and the decoder run as one program
    compiled per model and pair of widths. The encoder's padding mask gives
    the padded source keys zero weight (self- and cross-attention), the
    decoder's causal and padding masks the padded decoder keys; the rows of
    the padded queries are cut off. The weights are those of the unpadded
    sentences.

    Args:
        model: a ``Transformer`` (``encode`` and ``decode`` with
            ``return_attention_scores``).
        source_ids: list of int, the source ids (the end id last), S of them.
        decoder_ids: list of int, the start id and the target ids, T of them.
        source_max_length, target_max_length: the widths' caps (the model's
            ``max_length``), or None for none.
        target_length: the decoder input is padded to the width of at
            least this many positions (``attention_maps``: the model's
            ``max_length``, one program per source width).

    Returns:
        float32 NumPy arrays ``(encoder_self (L, H, S, S), decoder_self
        (L, H, T, T), cross (L, H, T, S))``.
    """
    S, T = len(source_ids), len(decoder_ids)
    src_width = shapes.width(S, source_max_length)
    tgt_width = shapes.width(max(T, target_length), target_max_length)
    encoder_inputs = np.zeros((1, src_width), "int32")
    encoder_inputs[0, :S] = source_ids
    decoder_inputs = np.zeros((1, tgt_width), "int32")
    decoder_inputs[0, :T] = decoder_ids
    # Checked here, on the host: the compiled program leaves the layers'
    # checks out (each would be a host round trip inside it).
    for name, ids, size in (
        ("encoder_inputs", encoder_inputs, getattr(model, "src_vocab_size", None)),
        ("decoder_inputs", decoder_inputs, getattr(model, "tgt_vocab_size", None)),
    ):
        if size is not None:
            _inputs.check_ids(ids, name, size)
    run = decoding.compiled_function(
        model, ("attention", src_width, tgt_width), _program(model)
    )
    with decoding.unchecked_loop(model):
        encoder_self, decoder_self, cross = run(encoder_inputs, decoder_inputs)
    return (
        _numpy(encoder_self)[:, :, :S, :S],
        _numpy(decoder_self)[:, :, :T, :T],
        _numpy(cross)[:, :, :T, :S],
    )


def _program(model):
    """The function of ``(encoder_inputs, decoder_inputs)`` that
    ``attention_weights`` compiles: the three kinds of weights, each as
    float32 ``(L, H, Q, K)`` of the one row."""

    def stacked(scores):
        return ops.cast(ops.stack([s[0] for s in scores]), "float32")

    def weights(encoder_inputs, decoder_inputs):
        encoder_outputs, encoder_mask, encoder_scores = model.encode(
            encoder_inputs, return_attention_scores=True
        )
        # The logits are not returned: XLA leaves their projection out.
        _, self_scores, cross_scores = model.decode(
            decoder_inputs,
            encoder_outputs,
            encoder_mask,
            return_attention_scores=True,
        )
        return stacked(encoder_scores), stacked(self_scores), stacked(cross_scores)

    return weights


def _numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def _greedy_body(translator, source):
    """The greedy translation's ids, without the end id and what follows."""
    with warnings.catch_warnings():
        # encode_sources has already warned about this source once (too
        # long, or characters the tokenizer does not know); those are the
        # only UserWarnings translate_ids gives.
        warnings.simplefilter("ignore", UserWarning)
        ids = [int(i) for i in translator.translate_ids([source], beam_size=1)[0]]
    end = translator.end_id
    return ids[: ids.index(end)] if end in ids else ids
