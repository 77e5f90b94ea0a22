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

This module does not import matplotlib.
"""

import dataclasses
import warnings

import keras
import numpy as np

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
        translator: a ``keras_transformer.Translator``.
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
    tokenizer, model = translator.tokenizer, translator.transformer
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

    encoder_inputs = np.array([source_ids], "int32")  # (1, S)
    decoder_inputs = np.array([[tokenizer.start_id, *body]], "int32")  # (1, T)
    encoder_outputs, encoder_mask, encoder_scores = model.encode(
        encoder_inputs, return_attention_scores=True
    )
    _, self_scores, cross_scores = model.decode(
        decoder_inputs, encoder_outputs, encoder_mask, return_attention_scores=True
    )

    def pieces(names, ids):
        return [str(names[int(i)]) for i in ids]

    return AttentionMaps(
        source_tokens=pieces(tokenizer.source_pieces(), source_ids),
        target_tokens=pieces(tokenizer.target_pieces(), [*body, tokenizer.end_id]),
        encoder_self_attention=_stack(encoder_scores),
        decoder_self_attention=_stack(self_scores),
        cross_attention=_stack(cross_scores),
    )


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


def _stack(scores):
    """Per-layer ``(1, H, Q, K)`` tensors -> float32 ``(L, H, Q, K)``."""
    return np.stack(
        [keras.ops.convert_to_numpy(s)[0].astype("float32") for s in scores]
    )
