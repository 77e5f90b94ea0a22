"""The HTML heat map of cross-attention (translate/heat_map.py).

Hand-built ``AttentionMaps`` of random numbers (no model) check the weights
against NumPy and the HTML through the standard library's parser; one test
runs the trained number-task translator of 0.2.0 (tests/fixtures/v0_2_0).
"""

import html.parser
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.translate.attention_maps import AttentionMaps
from keras_transformer.translate.heat_map import HeatMap

FIXTURE = os.path.join(
    os.path.dirname(__file__), "fixtures", "v0_2_0", "translator.keras"
)
HEAT_MAP = sys.modules[HeatMap.__module__].__file__
L, H, T, S = 3, 4, 5, 7  # all different, so that a swapped axis shows
# Tokens that must be escaped, a SentencePiece word start, and an ampersand
# that looks like an entity already.
SOURCE = ["▁a<b>", 'say "hi"', "x&y", "&amp;", "it's", "▁plain", "</s>"]
TARGET = ["▁<s>", "&lt;", '"', "'q'", "</s>"]


def random_maps(seed=0):
    rng = np.random.default_rng(seed)
    # Softmax rows, like the model's, but any numbers would do here.
    logits = rng.normal(size=(L, H, T, S))
    cross = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    return AttentionMaps(
        source_tokens=list(SOURCE),
        target_tokens=list(TARGET),
        encoder_self_attention=np.zeros((L, H, S, S), "float32"),
        decoder_self_attention=np.zeros((L, H, T, T), "float32"),
        cross_attention=cross.astype("float32"),
    )


class TableParser(html.parser.HTMLParser):
    """Rows of (tag, attributes, text) for each th/td, and the caption."""

    def __init__(self):
        super().__init__()  # convert_charrefs: text and attributes unescaped
        self.rows, self.caption, self.cell, self.in_caption = [], "", None, False
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("th", "td"):
            self.cell = [tag, dict(attrs), ""]
            self.rows[-1].append(self.cell)
        elif tag == "caption":
            self.in_caption = True

    def handle_endtag(self, tag):
        if tag in ("th", "td"):
            self.cell = None
        elif tag == "caption":
            self.in_caption = False

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[2] += data
        elif self.in_caption:
            self.caption += data


def parse(text):
    parser = TableParser()
    parser.feed(text)
    parser.close()
    return parser


@pytest.mark.parametrize(
    "layer, head",
    [(None, None), (-1, None), (0, None), (None, 2), (None, -1), (1, 3), (-3, -4)],
)
def test_weights_are_the_selected_slice_or_mean(layer, head):
    maps = random_maps()
    cross = maps.cross_attention.astype("float64")
    if layer is None and head is None:
        expected = cross.mean(axis=(0, 1))
    elif layer is None:
        expected = cross[:, head].mean(axis=0)
    elif head is None:
        expected = cross[layer].mean(axis=0)
    else:
        expected = cross[layer, head]
    heat = maps.heat_map(layer=layer, head=head)
    assert isinstance(heat, HeatMap)
    assert heat.weights.shape == (T, S)
    np.testing.assert_allclose(heat.weights, expected, rtol=0, atol=1e-6)
    # Means of softmax rows are softmax rows.
    np.testing.assert_allclose(heat.weights.sum(axis=-1), 1.0, atol=1e-5)
    assert heat.layer == (None if layer is None else layer % L)
    assert heat.head == (None if head is None else head % H)
    assert (heat.source_tokens, heat.target_tokens) == (SOURCE, TARGET)


def test_a_single_slice_is_exact():
    maps = random_maps(1)
    np.testing.assert_array_equal(
        HeatMap(maps, layer=-2, head=1).weights, maps.cross_attention[1, 1]
    )


@pytest.mark.parametrize("layer, head", [(None, None), (2, 0), (-1, None)])
def test_html_has_one_row_per_target_and_one_cell_per_source(layer, head):
    heat = HeatMap(random_maps(2), layer, head)
    table = parse(heat._repr_html_())
    header, *body = table.rows
    assert [text for tag, _, text in header[1:]] == SOURCE
    assert all(tag == "th" for tag, _, _ in header)
    assert len(body) == T
    for row, target, weights in zip(body, TARGET, heat.weights, strict=True):
        (label_tag, _, label), *cells = row
        assert (label_tag, label) == ("th", target)
        assert [tag for tag, _, _ in cells] == ["td"] * S
        shown = np.array([float(attrs["data-weight"]) for _, attrs, _ in cells])
        np.testing.assert_allclose(shown, weights, rtol=0, atol=1e-6)
        # The shortest repr of a float32 reads back as that float32.
        np.testing.assert_array_equal(shown.astype("float32"), weights)
        for (_, attrs, text), source, w in zip(cells, SOURCE, weights, strict=True):
            assert attrs["title"] == f"{target} → {source}: {attrs['data-weight']}"
            assert float(text) == pytest.approx(w, abs=0.005)


def test_html_is_escaped_self_contained_and_shaded():
    text = HeatMap(random_maps(3), None, None)._repr_html_()
    # The raw tokens never appear unescaped (they would open tags).
    assert "<b>" not in text and 'say "hi"' not in text and "x&y" not in text
    assert "&amp;amp;" in text  # "&amp;" kept as text, not read as "&"
    assert "▁" in text  # SentencePiece's word start kept as it is
    lowered = text.lower()
    for banned in ("<script", "<link", "<style", "src=", "href=", "url(", "@import"):
        assert banned not in lowered
    tags = {tag for tag in parse(text).tags}
    assert tags == {"table", "caption", "tr", "th", "td"}


def test_cell_colour_follows_the_weight():
    maps = random_maps()
    cross = np.zeros((L, H, T, S), "float32")
    cross[..., 0] = 1.0  # every row puts all its weight on the first token
    maps = AttentionMaps(
        maps.source_tokens,
        maps.target_tokens,
        maps.encoder_self_attention,
        maps.decoder_self_attention,
        cross,
    )
    first, *rest = parse(HeatMap(maps)._repr_html_()).rows[1][1:]
    assert "background-color:rgb(8,48,107)" in first[1]["style"]
    assert "color:white" in first[1]["style"].replace("background-color", "")
    for _, attrs, _ in rest:
        assert "background-color:rgb(255,255,255)" in attrs["style"]
        assert "color:black" in attrs["style"].replace("background-color", "")


@pytest.mark.parametrize(
    "layer, head, caption",
    [
        (-1, None, "layer 3 of 3, mean of 4 heads"),
        (0, 1, "layer 1 of 3, head 2 of 4"),
        (None, None, "mean of 3 layers, mean of 4 heads"),
        (None, -1, "mean of 3 layers, head 4 of 4"),
    ],
)
def test_caption_names_layer_and_head(layer, head, caption):
    heat = HeatMap(random_maps(), layer, head)
    assert heat.caption == caption
    assert parse(heat._repr_html_()).caption == f"Cross-attention, {caption}"


def test_attention_maps_show_the_last_layers_mean_in_a_notebook():
    maps = random_maps(4)
    assert maps._repr_html_() == HeatMap(maps, -1, None)._repr_html_()
    assert "layer 3 of 3, mean of 4 heads" in maps._repr_html_()


def test_to_dict_is_json_and_matches():
    heat = HeatMap(random_maps(5), layer=1, head=None)
    back = json.loads(json.dumps(heat.to_dict()))
    assert set(back) == {"source_tokens", "target_tokens", "layer", "head", "weights"}
    assert (back["source_tokens"], back["target_tokens"]) == (SOURCE, TARGET)
    assert (back["layer"], back["head"]) == (1, None)
    np.testing.assert_array_equal(np.array(back["weights"], "float32"), heat.weights)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layer=3), r"layer must be in \[-3, 3\).*Received: layer=3"),
        (dict(layer=-4), r"layer must be in \[-3, 3\).*Received: layer=-4"),
        (dict(head=4), r"head must be in \[-4, 4\).*Received: head=4"),
        (dict(layer=0, head=-5), r"head must be in \[-4, 4\).*Received: head=-5"),
    ],
)
def test_out_of_range_layer_or_head_names_the_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        random_maps().heat_map(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(layer=1.0), dict(head="0"), dict(head=True)])
def test_non_int_layer_or_head_is_a_type_error(kwargs):
    with pytest.raises(TypeError, match="must be an int or None"):
        random_maps().heat_map(**kwargs)


def test_tokens_that_do_not_match_the_weights_are_refused():
    maps = random_maps()
    short = AttentionMaps(
        maps.source_tokens[:-1],
        maps.target_tokens,
        maps.encoder_self_attention,
        maps.decoder_self_attention,
        maps.cross_attention,
    )
    with pytest.raises(ValueError, match=r"\(L, H, 5, 6\).*\(3, 4, 5, 7\)"):
        HeatMap(short)


@pytest.mark.once
def test_the_module_needs_neither_keras_nor_matplotlib():
    """``import keras_transformer`` imports the whole public API (Keras finds
    saved classes that way), so the module is loaded from its file alone."""
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('heat_map', {HEAT_MAP!r}); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
        "print(sorted({'keras', 'matplotlib'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.slow
def test_the_trained_translator_s_cross_attention():
    from keras_transformer.translate.evaluation import load_translator

    translator = load_translator(FIXTURE)
    maps = kt.attention_maps(translator, "three hundred forty-two")
    heat = maps.heat_map(layer=0, head=1)
    np.testing.assert_array_equal(heat.weights, maps.cross_attention[0, 1])
    np.testing.assert_allclose(heat.weights.sum(axis=-1), 1.0, atol=1e-5)
    body = parse(maps._repr_html_()).rows[1:]
    assert [row[0][2] for row in body] == maps.target_tokens
    assert all(len(row) == 1 + len(maps.source_tokens) for row in body)
