"""Attention masks, one convention throughout the package.

A mask is boolean and ``True`` means "may attend" (the convention of Keras and
``keras.ops.dot_product_attention``; PyTorch's ``nn.Transformer`` uses the
opposite). ``PAD_ID`` (0) is padding.
"""

from keras import ops

from keras_transformer.special_tokens import PAD_ID


def padding_mask(token_ids):
    """``(B, T)`` ids -> ``(B, T)`` boolean mask, False where the id is ``PAD_ID``."""
    return ops.not_equal(token_ids, PAD_ID)


def causal_mask(query_length, key_length):
    """``(T_q, T_k)`` mask that lets query ``i`` see keys ``j <= i + offset``.

    The mask is aligned bottom-right: with ``offset = T_k - T_q`` the last query
    sees every key. When ``T_q == T_k`` this is the usual lower triangle (§3.2.3,
    "masking out ... all values in the input of the softmax which correspond to
    illegal connections"); when a decoder attends from its newest ``T_q`` tokens
    to a cache of ``T_k`` keys, the queries are the *last* ``T_q`` positions.
    """
    offset = key_length - query_length
    # An explicit dtype: without one, `arange` infers it from the lengths,
    # which `torch.compile` cannot do for a dynamic (symbolic) length and
    # answers with a graph break. int32 is what it infers for Python ints.
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, 1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)  # (1, T_k)
    return ops.greater_equal(rows, cols)


def merge_masks(*masks):
    """Logical AND of the masks that are not ``None`` (broadcasting)."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def attention_mask_from_padding(query_mask=None, key_mask=None):
    """Combine ``(B, T_q)`` and ``(B, T_k)`` padding masks into ``(B, T_q, T_k)``.

    Either may be ``None``. Returns ``None`` when both are.
    """
    if query_mask is not None:
        query_mask = ops.expand_dims(ops.cast(query_mask, "bool"), -1)  # (B, T_q, 1)
    if key_mask is not None:
        key_mask = ops.expand_dims(ops.cast(key_mask, "bool"), -2)  # (B, 1, T_k)
    return merge_masks(query_mask, key_mask)
