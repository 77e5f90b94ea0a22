"""Labelled heatmaps of attention weights (cf. the paper's Figures 3-5).

matplotlib is imported inside the functions, so that importing this module
(or ``keras_transformer``) does not need it. Without an ``ax`` the functions
draw on a new ``matplotlib.figure.Figure``, which is not registered with
pyplot: no GUI backend is involved, nothing is shown, and the figure is saved
with ``ax.figure.savefig(...)``.

Tokens are shown as given; for ``AttentionMaps`` those are SentencePiece
pieces, whose ``"▁"`` marks the start of a word (so ``"▁forty", "-", "two"``
is one word split in three). The DejaVu Sans font that matplotlib ships
draws ``"▁"`` as a low bar.
"""

import numpy as np

_KINDS = {
    # kind: (title, AttentionMaps field, row labels, column labels), the
    # labels as (axis label, AttentionMaps attribute). Rows of the decoder's
    # maps are named by the token each position predicts; the keys of its
    # self-attention by the token each position reads (START, then the
    # target shifted right), so that the diagonal is "itself".
    "cross": (
        "Cross-attention",
        "cross_attention",
        ("predicted target token (query)", "target_tokens"),
        ("source token (key)", "source_tokens"),
    ),
    "encoder_self": (
        "Encoder self-attention",
        "encoder_self_attention",
        ("source token (query)", "source_tokens"),
        ("source token (key)", "source_tokens"),
    ),
    "decoder_self": (
        "Decoder self-attention",
        "decoder_self_attention",
        ("predicted target token (query)", "target_tokens"),
        ("decoder input token (key)", "decoder_input_tokens"),
    ),
}


# The kinds of attention in the model (§3.2.3), as named by the functions here.
KINDS = tuple(_KINDS)


def plot_attention(
    weights, row_tokens, column_tokens, ax=None, title=None, cmap="viridis"
):
    """Draw one attention matrix as a heatmap labelled with its tokens.

    Rows are queries (e.g. the target tokens being predicted), columns are
    keys (e.g. the source tokens); the colour scale is fixed to [0, 1], the
    range of softmax weights, so that figures can be compared.

    Args:
        weights: array-like ``(len(row_tokens), len(column_tokens))``.
        row_tokens: list of str, one label per row (query).
        column_tokens: list of str, one label per column (key).
        ax: optional matplotlib ``Axes`` to draw on; by default a new figure
            sized to the number of tokens.
        title: optional str.
        cmap: a matplotlib colormap or its name.

    Returns:
        The ``Axes`` (its figure is ``ax.figure``).

    Raises:
        ValueError: ``weights`` is not 2-D or does not match the numbers of
            labels.
    """
    weights = np.asarray(weights, dtype="float32")
    row_tokens, column_tokens = list(row_tokens), list(column_tokens)
    expected = (len(row_tokens), len(column_tokens))
    if weights.shape != expected:
        raise ValueError(
            "weights must have shape (len(row_tokens), len(column_tokens)) = "
            f"{expected}. Received: weights.shape={weights.shape}"
        )
    own_figure = ax is None
    if own_figure:
        from matplotlib.figure import Figure

        # About 0.4 inch per token, so that rotated labels do not overlap.
        width = 2.5 + 0.4 * len(column_tokens)
        height = 1.5 + 0.4 * len(row_tokens)
        # At least 6 inches wide, so that the default titles fit.
        ax = Figure(figsize=(max(width, 6.0), max(height, 3.0))).add_subplot()
    image = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(column_tokens)), labels=column_tokens)
    ax.set_yticks(range(len(row_tokens)), labels=row_tokens)
    # Rotated labels anchored at their right end stay under their column.
    ax.tick_params(axis="x", labelrotation=60)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if title is not None:
        ax.set_title(title)
    if own_figure:
        # Room for the rotated labels; a caller's own figure keeps its layout.
        ax.figure.tight_layout()
    return ax


def plot_attention_maps(
    maps, kind="cross", layer=-1, head=None, ax=None, title=None, cmap="viridis"
):
    """Plot one layer of an ``AttentionMaps``: one head, or all heads averaged.

    Args:
        maps: from ``keras_transformer.translate.attention_maps.attention_maps``.
        kind: ``"cross"`` (rows: the target tokens predicted, columns: the
            source tokens), ``"encoder_self"`` (source by source) or
            ``"decoder_self"`` (rows: the target tokens predicted, columns:
            the decoder's input tokens, ``<s>`` and the target shifted
            right).
        layer: int, a Python index into the layers (``-1``: the last).
        head: int, a Python index into the heads; None averages the heads
            (the average of softmax rows is still a distribution).
        ax, cmap: as for ``plot_attention``.
        title: optional str; by default it names the kind, the layer and the
            head (counted from 1) or "mean of H heads".

    Returns:
        The ``Axes``.

    Raises:
        ValueError: unknown ``kind``.
        TypeError: ``layer`` or ``head`` is not an int.
        IndexError: ``layer`` or ``head`` out of range.
    """
    if kind not in _KINDS:
        raise ValueError(
            f"kind must be one of {sorted(_KINDS)}. Received: kind={kind!r}"
        )
    name, field, rows, columns = _KINDS[kind]
    weights = getattr(maps, field)  # (L, H, Q, K)
    num_layers, num_heads = weights.shape[:2]
    layer = _index(layer, num_layers, "layer")
    weights = weights[layer]
    if head is None:
        weights = weights.mean(axis=0)
        which = f"mean of {num_heads} heads"
    else:
        head = _index(head, num_heads, "head")
        weights = weights[head]
        which = f"head {head + 1}/{num_heads}"
    if title is None:
        title = f"{name}, layer {layer + 1}/{num_layers}, {which}"
    own_figure = ax is None
    ax = plot_attention(
        weights,
        getattr(maps, rows[1]),
        getattr(maps, columns[1]),
        ax=ax,
        title=title,
        cmap=cmap,
    )
    ax.set_ylabel(rows[0])
    ax.set_xlabel(columns[0])
    if own_figure:
        ax.figure.tight_layout()
    return ax


def _index(value, size, name):
    """``value`` as a non-negative index into ``size`` items, or IndexError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int. Received: {name}={value!r}")
    if not -size <= value < size:
        raise IndexError(
            f"{name} must be in [{-size}, {size}) for a model with {size} "
            f"{name}s. Received: {name}={value}"
        )
    return int(value) % size
