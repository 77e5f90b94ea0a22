"""Cross-attention as an HTML table that a Jupyter notebook shows by itself.

Encoder-decoder attention (§3.2.3) is where the decoder looks at the source:
for each target token it predicts, each head of each layer puts a softmax
row of weights over the source tokens. The paper's Figures 3 to 5 draw such
weights; ``HeatMap`` draws them as an alignment plot in the manner of
Bahdanau et al. (2015): one row per target token being predicted, one column
per source token, darker for more weight.

``keras_transformer.translate.plotting`` draws the same weights with
matplotlib, for files and papers. This module needs neither matplotlib nor
Keras, only NumPy and the standard library, because a notebook calls
``_repr_html_`` every time it shows an ``AttentionMaps``: the table is plain
HTML with inline styles (no JavaScript, no external resources), so it shows
the same in JupyterLab, in a saved ``.ipynb`` on GitHub, and in nbconvert's
HTML, where scripts and style sheets are often stripped.
"""

import html

import numpy as np

# White for weight 0 to dark blue for weight 1 (the ends of matplotlib's
# "Blues"): one hue, so the eye reads darker as more.
_LOW = np.array([255.0, 255.0, 255.0])
_HIGH = np.array([8.0, 48.0, 107.0])
# Above this weight the background is dark enough that black text is harder
# to read than white.
_LIGHT_TEXT_FROM = 0.5

_TABLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
_CAPTION = "caption-side:top;text-align:left;padding:4px 0;font-weight:bold"
# Every colour is set, text and background together, so that a dark theme's
# light default text never lands on a light cell.
_HEADER = (
    "padding:2px 6px;white-space:pre;font-weight:normal;"
    "background-color:#f7f7f7;color:black"
)
_CELL = "padding:2px 6px;text-align:right;min-width:3em;border:1px solid #eee"


class HeatMap:
    """The cross-attention of one layer and head (or their means) as a table.

    Jupyter shows it through ``_repr_html_``; ``to_dict`` gives the same
    numbers for JSON. Rows are labelled by the target token each decoder
    position predicts (``AttentionMaps.target_tokens``), columns by the
    source tokens. The mean of softmax rows is still a softmax row, so every
    row of ``weights`` sums to 1 whichever layers and heads it averages.

    Args:
        maps: an ``AttentionMaps`` (or anything with its ``cross_attention``,
            ``source_tokens`` and ``target_tokens``).
        layer: int, a Python index into the layers (``-1``: the last), or
            None for the mean over all layers.
        head: int, a Python index into the heads, or None for the mean over
            all heads.

    Attributes:
        weights: float32 ``(T, S)``, the selected or averaged weights.
        source_tokens: list of str, ``S`` column labels.
        target_tokens: list of str, ``T`` row labels.
        layer: the layer as a non-negative index, or None (the mean).
        head: the head as a non-negative index, or None (the mean).
        num_layers, num_heads: how many the maps hold.

    Raises:
        TypeError: ``layer`` or ``head`` is neither an int nor None.
        ValueError: ``layer`` or ``head`` is out of range, or
            ``cross_attention`` does not have the shape
            ``(num_layers, num_heads, T, S)`` that the tokens imply.
    """

    def __init__(self, maps, layer=-1, head=None):
        cross = np.asarray(maps.cross_attention, dtype="float32")
        self.source_tokens = [str(t) for t in maps.source_tokens]
        self.target_tokens = [str(t) for t in maps.target_tokens]
        tokens = (len(self.target_tokens), len(self.source_tokens))
        if cross.ndim != 4 or cross.shape[2:] != tokens:
            raise ValueError(
                "cross_attention must have shape (num_layers, num_heads, "
                f"len(target_tokens), len(source_tokens)) = (L, H, {tokens[0]}, "
                f"{tokens[1]}). Received: cross_attention.shape={cross.shape}"
            )
        self.num_layers, self.num_heads = cross.shape[:2]
        self.layer = _index(layer, self.num_layers, "layer")
        self.head = _index(head, self.num_heads, "head")
        # Select before averaging, so that `head` indexes the heads axis
        # whether or not the layers are averaged.
        cross = cross.mean(axis=0) if self.layer is None else cross[self.layer]
        cross = cross.mean(axis=0) if self.head is None else cross[self.head]
        self.weights = cross  # (T, S)

    @property
    def caption(self):
        """Which weights these are, e.g. "layer 2 of 2, mean of 4 heads"."""
        if self.layer is None:
            layer = f"mean of {self.num_layers} layers"
        else:
            layer = f"layer {self.layer + 1} of {self.num_layers}"
        if self.head is None:
            head = f"mean of {self.num_heads} heads"
        else:
            head = f"head {self.head + 1} of {self.num_heads}"
        return f"{layer}, {head}"

    def to_dict(self):
        """The map as plain lists, str, int and None, ready for ``json.dumps``.

        ``weights`` holds Python floats (the float32 values exactly).
        """
        return {
            "source_tokens": list(self.source_tokens),
            "target_tokens": list(self.target_tokens),
            "layer": self.layer,
            "head": self.head,
            "weights": self.weights.astype("float64").tolist(),
        }

    def _repr_html_(self):
        """A self-contained ``<table>``: one header row of source tokens, then
        one row per target token with one ``<td>`` per source token.

        Each cell's ``data-weight`` holds its weight as the shortest decimal
        that reads back as the same float32, and its ``title`` (the tooltip)
        the pair of tokens and that weight; the cell shows it to 2 decimals.
        """
        esc = html.escape  # quote=True: tokens may hold quotes, used in title=
        head = "".join(
            f'<th style="{_HEADER}">{esc(s)}</th>' for s in self.source_tokens
        )
        corner = f'<th style="{_HEADER}">predicted ↓ · source →</th>'
        rows = [f"<tr>{corner}{head}</tr>"]
        for target, weights in zip(self.target_tokens, self.weights, strict=True):
            cells = "".join(
                _cell(target, source, w)
                for source, w in zip(self.source_tokens, weights, strict=True)
            )
            rows.append(f'<tr><th style="{_HEADER}">{esc(target)}</th>{cells}</tr>')
        caption = f"Cross-attention, {self.caption}"
        return (
            f'<table class="kt-heat-map" style="{_TABLE}">'
            f'<caption style="{_CAPTION}">{esc(caption)}</caption>'
            f"{''.join(rows)}</table>"
        )

    def __repr__(self):
        return (
            f"HeatMap({self.caption}, {len(self.target_tokens)} target x "
            f"{len(self.source_tokens)} source tokens)"
        )


def _cell(target, source, weight):
    """One ``<td>``, its background shaded by ``weight`` on a [0, 1] scale."""
    exact = str(np.float32(weight))  # shortest round-trip repr of a float32
    # A fixed scale, as in plotting.py, so that two tables can be compared;
    # a NaN (not a softmax weight) is drawn as 0 rather than failing.
    shade = float(np.clip(np.nan_to_num(weight), 0.0, 1.0))
    red, green, blue = np.rint(_LOW + shade * (_HIGH - _LOW)).astype(int)
    text = "white" if shade > _LIGHT_TEXT_FROM else "black"
    title = html.escape(f"{target} → {source}: {exact}")
    style = f"{_CELL};background-color:rgb({red},{green},{blue});color:{text}"
    return (
        f'<td style="{style}" title="{title}" data-weight="{exact}">'
        f"{float(weight):.2f}</td>"
    )


def _index(value, size, name):
    """``value`` as a non-negative index into ``size`` items; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None. Received: {name}={value!r}")
    if not -size <= value < size:
        raise ValueError(
            f"{name} must be in [{-size}, {size}) for maps with {size} {name}s, "
            f"or None for their mean. Received: {name}={value}"
        )
    return int(value) % size
