"""NumPy reference implementations, written from the paper's equations.

Vaswani et al., "Attention Is All You Need" (2017). Everything here computes
in float64 and never calls the code under test: the test modules compare the
Keras layers against these functions. Only the two weight readers at the end
(`mha_weights`, `block_weights`) touch a Keras layer, and they only copy its
variables out.

Conventions (the same as Keras'):

* masks are boolean and True means "may attend" / "real token";
* arrays carry a leading batch axis: sequences are ``(B, T, d)``, padding
  masks ``(B, T)``, attention masks broadcastable to ``(B, T_q, T_k)``;
* a masked logit is replaced by a large negative number (not -inf), so a row
  whose keys are all masked becomes a uniform average over all keys.

Weight dictionaries:

* multi-head attention: ``query_kernel``, ``key_kernel``, ``value_kernel``
  ``(d_in, d_model)``, ``output_kernel`` ``(d_model, d_model)`` and the four
  ``*_bias`` ``(d_model,)`` (a missing or None bias means "no bias");
* layer normalization: ``{"gamma": (d,), "beta": (d,)}``;
* feed-forward network: ``{"w1": (d_model, d_ff), "b1": (d_ff,),
  "w2": (d_ff, d_model), "b2": (d_model,)}``;
* encoder block: ``self_attention`` (MHA dict), ``self_attention_norm``,
  ``ffn``, ``ffn_norm``; a decoder block adds ``cross_attention`` and
  ``cross_attention_norm``.
"""

import math

import numpy as np

# Fill for masked logits: far below any real logit, yet finite, so that a fully
# masked row gives equal logits and hence a uniform softmax.
MASK_FILL = -1e30


def _f64(x):
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------
def causal_mask(query_length, key_length=None):
    """``(T_q, T_k)`` boolean mask, True where query ``i`` may see key ``j``.

    §3.2.3: a position may not attend to later positions. With
    ``T_q == T_k`` this is the lower triangle ``j <= i``. With ``T_q < T_k``
    (queries are the newest ``T_q`` of ``T_k`` positions, as when decoding
    against a cache) query ``i`` sits at position ``i + T_k - T_q``.
    """
    key_length = query_length if key_length is None else key_length
    offset = key_length - query_length
    i = np.arange(query_length)[:, None] + offset
    j = np.arange(key_length)[None, :]
    return j <= i


def combine_masks(
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    causal=False,
    query_length=None,
    key_length=None,
):
    """AND of padding masks, an explicit attention mask and a causal mask.

    Returns a boolean array broadcastable to ``(B, T_q, T_k)`` (or to
    ``(B, H, T_q, T_k)`` if ``attention_mask`` is 4-D), or None if no mask
    applies. ``query_mask`` is ``(B, T_q)``, ``key_mask`` is ``(B, T_k)``.
    The lengths are only needed for ``causal`` when no padding mask gives them.
    """
    parts = []
    if query_mask is not None:
        query_mask = np.asarray(query_mask, bool)
        query_length = query_mask.shape[-1]
        parts.append(query_mask[:, :, None])  # (B, T_q, 1)
    if key_mask is not None:
        key_mask = np.asarray(key_mask, bool)
        key_length = key_mask.shape[-1]
        parts.append(key_mask[:, None, :])  # (B, 1, T_k)
    if causal:
        if query_length is None or key_length is None:
            raise ValueError("causal=True needs the query and key lengths.")
        parts.append(causal_mask(query_length, key_length)[None])  # (1, T_q, T_k)
    merged = None
    for part in parts:
        merged = part if merged is None else merged & part
    if attention_mask is not None:
        attention_mask = np.asarray(attention_mask, bool)
        if merged is not None and attention_mask.ndim == 4:
            merged = merged[:, None]  # heads axis
        merged = attention_mask if merged is None else merged & attention_mask
    return merged


# ---------------------------------------------------------------------------
# §3.2.1: scaled dot-product attention
# ---------------------------------------------------------------------------
def softmax(x, axis=-1):
    """Numerically stable softmax, float64."""
    x = _f64(x)
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V  (eq. 1).

    Args:
        q: ``(..., T_q, d_k)``; k: ``(..., T_k, d_k)``; v: ``(..., T_k, d_v)``.
        mask: optional boolean, broadcastable to ``(..., T_q, T_k)``,
            True = may attend. Masked logits become ``MASK_FILL``.

    Returns:
        ``(output (..., T_q, d_v), weights (..., T_q, T_k))``, float64.
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    d_k = q.shape[-1]
    logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(d_k)
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, bool), logits.shape)
        logits = np.where(mask, logits, MASK_FILL)
    weights = softmax(logits, axis=-1)
    return weights @ v, weights


# ---------------------------------------------------------------------------
# §3.2.2: multi-head attention
# ---------------------------------------------------------------------------
def dense(x, kernel, bias=None):
    """x W + b."""
    y = _f64(x) @ _f64(kernel)
    if bias is not None:
        y = y + _f64(bias)
    return y


def multi_head_attention(query, value, weights, num_heads, mask=None, key=None):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O  (§3.2.2).

    ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``. The per-head
    projections ``W_i^Q`` are the columns ``i*d_k : (i+1)*d_k`` of the
    ``(d_in, d_model)`` kernel ``weights["query_kernel"]`` (likewise for keys
    and values), with ``d_k = d_model / num_heads``.

    Args:
        query: ``(B, T_q, d_q)``; value: ``(B, T_k, d_v)``; key: optional
            ``(B, T_k, d_k_in)``, defaults to ``value``.
        weights: dict, see the module docstring.
        num_heads: int.
        mask: optional boolean mask broadcastable to ``(B, T_q, T_k)`` (same
            for every head) or ``(B, H, T_q, T_k)``; build it with
            ``combine_masks``.

    Returns:
        ``(output (B, T_q, d_model), weights (B, H, T_q, T_k))``, float64.
    """
    key = value if key is None else key
    q = dense(query, weights["query_kernel"], weights.get("query_bias"))
    k = dense(key, weights["key_kernel"], weights.get("key_bias"))
    v = dense(value, weights["value_kernel"], weights.get("value_bias"))
    d_model = q.shape[-1]
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
    d_k = d_model // num_heads
    if mask is not None:
        mask = np.asarray(mask, bool)

    heads, head_weights = [], []
    for i in range(num_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        head_mask = mask
        if mask is not None and mask.ndim == 4:
            head_mask = mask[:, i if mask.shape[1] > 1 else 0]
        head, w = scaled_dot_product_attention(
            q[..., cols], k[..., cols], v[..., cols], head_mask
        )
        heads.append(head)
        head_weights.append(w)
    concat = np.concatenate(heads, axis=-1)  # (B, T_q, d_model)
    output = dense(concat, weights["output_kernel"], weights.get("output_bias"))
    return output, np.stack(head_weights, axis=1)  # (B, H, T_q, T_k)


# ---------------------------------------------------------------------------
# Layer normalization and §3.3 feed-forward network
# ---------------------------------------------------------------------------
def layer_norm(x, gamma, beta, eps=1e-6):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (Ba et al.)."""
    x = _f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased variance
    return (x - mean) / np.sqrt(var + eps) * _f64(gamma) + _f64(beta)


def ffn(x, w1, b1, w2, b2):
    """FFN(x) = max(0, x W1 + b1) W2 + b2  (eq. 2)."""
    return dense(np.maximum(0.0, dense(x, w1, b1)), w2, b2)


def _ffn_from(weights):
    return lambda x: ffn(x, weights["w1"], weights["b1"], weights["w2"], weights["b2"])


def _norm_from(weights, eps):
    return lambda x: layer_norm(x, weights["gamma"], weights["beta"], eps)


def sublayer_connection(x, sublayer, norm, norm_first=False):
    """§3.1: LayerNorm(x + Sublayer(x)) (post-LN, the paper's form), or
    x + Sublayer(LayerNorm(x)) (pre-LN) when ``norm_first``."""
    x = _f64(x)
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


# ---------------------------------------------------------------------------
# §3.1: encoder and decoder layers
# ---------------------------------------------------------------------------
def encoder_block(
    x,
    weights,
    num_heads,
    pad_mask=None,
    norm_first=False,
    eps=1e-6,
    return_attention_scores=False,
):
    """One encoder layer: self-attention, then the feed-forward network.

    ``pad_mask`` ``(B, T)``: the self-attention masks both padded queries and
    padded keys (like Keras' MultiHeadAttention). Returns ``(B, T, d_model)``,
    or ``(output, attention weights (B, H, T, T))``.
    """
    mask = combine_masks(pad_mask, pad_mask)
    scores = []

    def attend(h):
        out, w = multi_head_attention(h, h, weights["self_attention"], num_heads, mask)
        scores.append(w)
        return out

    x = sublayer_connection(
        x, attend, _norm_from(weights["self_attention_norm"], eps), norm_first
    )
    x = sublayer_connection(
        x, _ffn_from(weights["ffn"]), _norm_from(weights["ffn_norm"], eps), norm_first
    )
    return (x, scores[0]) if return_attention_scores else x


def decoder_block(
    y,
    memory,
    weights,
    num_heads,
    dec_mask=None,
    enc_mask=None,
    norm_first=False,
    eps=1e-6,
    causal=True,
    return_attention_scores=False,
):
    """One decoder layer: masked self-attention, cross-attention, FFN (§3.1).

    The self-attention is causal (§3.2.3) and masks padded target positions
    (``dec_mask`` ``(B, T)``) as queries and keys. The cross-attention takes
    queries from the decoder and keys/values from ``memory`` ``(B, S, d)``;
    its mask is query = ``dec_mask``, key = ``enc_mask`` ``(B, S)`` (the
    encoder's padding). Returns ``(B, T, d_model)``, or
    ``(output, (self weights (B, H, T, T), cross weights (B, H, T, S)))``.
    """
    y, memory = _f64(y), _f64(memory)
    t, s = y.shape[1], memory.shape[1]
    self_mask = combine_masks(
        dec_mask, dec_mask, causal=causal, query_length=t, key_length=t
    )
    cross_mask = combine_masks(dec_mask, enc_mask, query_length=t, key_length=s)
    scores = []

    def self_attend(h):
        out, w = multi_head_attention(
            h, h, weights["self_attention"], num_heads, self_mask
        )
        scores.append(w)
        return out

    def cross_attend(h):
        out, w = multi_head_attention(
            h, memory, weights["cross_attention"], num_heads, cross_mask
        )
        scores.append(w)
        return out

    x = sublayer_connection(
        y, self_attend, _norm_from(weights["self_attention_norm"], eps), norm_first
    )
    x = sublayer_connection(
        x, cross_attend, _norm_from(weights["cross_attention_norm"], eps), norm_first
    )
    x = sublayer_connection(
        x, _ffn_from(weights["ffn"]), _norm_from(weights["ffn_norm"], eps), norm_first
    )
    return (x, tuple(scores)) if return_attention_scores else x


# ---------------------------------------------------------------------------
# §3.5: sinusoidal positional encoding
# ---------------------------------------------------------------------------
def sinusoidal_pe(positions, d_model, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    ``positions``: iterable of positions; returns ``(len(positions), d_model)``
    float64. For odd ``d_model`` the last column is the sine of the last
    frequency (it has no cosine partner).
    """
    positions = [float(p) for p in np.asarray(positions).reshape(-1)]
    pe = np.zeros((len(positions), d_model), dtype=np.float64)
    for row, pos in enumerate(positions):
        for i in range((d_model + 1) // 2):
            angle = pos / base ** (2 * i / d_model)
            pe[row, 2 * i] = math.sin(angle)
            if 2 * i + 1 < d_model:
                pe[row, 2 * i + 1] = math.cos(angle)
    return pe


# ---------------------------------------------------------------------------
# §6.1: beam search with a length penalty (Wu et al., 2016)
# ---------------------------------------------------------------------------


def beam_search(next_log_probs, beam_size, alpha, limit, end_id=2, banned=(0, 1)):
    """Beam search written out from its rule, one hypothesis at a time.

    Keeps ``beam_size`` hypotheses ``(tokens, log P, finished)``. At each
    step every unfinished hypothesis is extended by every token not in
    ``banned`` (its log-probabilities from ``next_log_probs(tokens)``, a
    float64 vector over the vocabulary), every finished one is carried over,
    and the ``beam_size`` best candidates by ``log P / lp(|Y|)`` stay, with
    Wu et al.'s ``lp(|Y|) = ((5 + |Y|) / 6) ** alpha``. A hypothesis
    finishes at ``end_id`` or at ``limit`` tokens. Returns the final beam
    best first, as ``(tokens, log P / lp(|Y|))``.
    """

    def lp(length):
        return ((5 + length) / 6) ** alpha

    beam = [((), 0.0, False)]
    while not all(finished for _, _, finished in beam):
        candidates = []
        for tokens, log_p, finished in beam:
            if finished:
                candidates.append((log_p / lp(len(tokens)), tokens, log_p, True))
                continue
            log_probs = next_log_probs(tokens)
            for token, gain in enumerate(log_probs):
                if token in banned:
                    continue
                new = (*tokens, token)
                done = token == end_id or len(new) >= limit
                score = (log_p + gain) / lp(len(new))
                candidates.append((score, new, log_p + gain, done))
        candidates.sort(key=lambda c: -c[0])
        beam = [(t, log_p, done) for _, t, log_p, done in candidates[:beam_size]]
    return [(list(t), log_p / lp(len(t))) for t, log_p, _ in beam]


def log_softmax(x, banned=(0, 1)):
    """Log-softmax over the last axis with the ``banned`` ids left out
    (they get -inf)."""
    x = _f64(x).copy()
    x[..., list(banned)] = -np.inf
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------------------
# Reading weights out of the package's layers (copies only)
# ---------------------------------------------------------------------------
def _value(variable):
    # `.value` is the backend tensor; converting it (rather than the Variable)
    # avoids NumPy 2's __array__(copy=...) deprecation path in Keras 3.
    from keras import ops

    if variable is None:
        return None
    return np.asarray(ops.convert_to_numpy(variable.value), dtype=np.float64)


def _dense_weights(layer):
    return _value(layer.kernel), _value(getattr(layer, "bias", None))


def mha_weights(layer):
    """A ``kt.MultiHeadAttention``'s projections as a ``multi_head_attention`` dict."""
    weights = {}
    for prefix, sub in (
        ("query", layer.query_dense),
        ("key", layer.key_dense),
        ("value", layer.value_dense),
        ("output", layer.output_dense),
    ):
        weights[f"{prefix}_kernel"], weights[f"{prefix}_bias"] = _dense_weights(sub)
    return weights


def layer_norm_weights(layer):
    return {"gamma": _value(layer.gamma), "beta": _value(layer.beta)}


def block_weights(block):
    """An ``EncoderBlock``'s or ``DecoderBlock``'s weights as a nested dict."""
    w1, b1 = _dense_weights(block.ffn_inner)
    w2, b2 = _dense_weights(block.ffn_outer)
    weights = {
        "self_attention": mha_weights(block.self_attention),
        "self_attention_norm": layer_norm_weights(block.self_attention_norm),
        "ffn": {"w1": w1, "b1": b1, "w2": w2, "b2": b2},
        "ffn_norm": layer_norm_weights(block.ffn_norm),
    }
    if hasattr(block, "cross_attention"):
        weights["cross_attention"] = mha_weights(block.cross_attention)
        weights["cross_attention_norm"] = layer_norm_weights(block.cross_attention_norm)
    return weights
