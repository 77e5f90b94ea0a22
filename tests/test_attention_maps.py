"""Attention maps of a translator, their heatmaps, and the plotting command.

Per backend: the maps' shapes and layer 0 against NumPy. Marked `once`: the
choice of target, truncation, plotting and the command.
"""

import dataclasses
import io
import os
import warnings

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.cli import attention as attention_cli
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german
from keras_transformer.search import shapes
from keras_transformer.translate.attention_maps import AttentionMaps, attention_maps
from keras_transformer.translate.plotting import plot_attention, plot_attention_maps

NUMBERS = list(range(0, 1000, 7))
# Two layers, so that "the last layer" and "layer 0" differ; max_length 16
# keeps greedy decoding of an untrained model short.
SMALL = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=16)
SOURCE = "three hundred forty-two"
TARGET = "dreihundertzweiundvierzig"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def proto():
    texts = [english(n) for n in NUMBERS] + [german(n) for n in NUMBERS]
    return tk.train_tokenizer(texts, 60)


@pytest.fixture(scope="module")
def translator(proto):
    # Untrained: the tests check arithmetic and wiring, not what was learned.
    # Module-scoped, built before the per-test seed, so it seeds itself.
    keras.utils.set_random_seed(0)
    tokenizer = tk.make_tokenizer(proto)
    model = kt.build_model("tiny", src_vocab_size=tokenizer.vocabulary_size(), **SMALL)
    return kt.Translator(tokenizer, model)


@pytest.fixture(scope="module")
def maps(translator):
    return attention_maps(translator, SOURCE, TARGET)


def pieces(tokenizer, ids):
    return [tokenizer.id_to_token(i) for i in ids]


# -- attention_maps ------------------------------------------------------------


@pytest.mark.slow
def test_shapes_and_tokens(translator, maps):
    tokenizer = translator.tokenizer
    src = tk.encode(tokenizer, [SOURCE])[0]
    tgt = tk.encode(tokenizer, [TARGET], add_end=False)[0]
    # Different lengths, so that a swapped axis cannot go unnoticed.
    S, T = len(src), len(tgt) + 1
    assert S != T

    assert isinstance(maps, AttentionMaps)
    assert maps.source_tokens == pieces(tokenizer, src)
    assert maps.source_tokens[-1] == "</s>"
    # Row i predicts target piece i; the last row predicts the end token.
    assert maps.target_tokens == pieces(tokenizer, tgt) + ["</s>"]
    assert "".join(maps.target_tokens[:-1]).replace("▁", "") == TARGET
    # No padding anywhere: S and T are the true lengths.
    assert maps.encoder_self_attention.shape == (2, 4, S, S)
    assert maps.decoder_self_attention.shape == (2, 4, T, T)
    assert maps.cross_attention.shape == (2, 4, T, S)
    assert (maps.num_layers, maps.num_heads) == (2, 4)
    for array in (
        maps.encoder_self_attention,
        maps.decoder_self_attention,
        maps.cross_attention,
    ):
        assert isinstance(array, np.ndarray) and array.dtype == np.float32
    with pytest.raises(dataclasses.FrozenInstanceError):
        maps.source_tokens = []


def test_padded_widths_give_the_unpadded_weights(translator):
    """The maps come from one program per pair of padded widths (§3.2.1's
    weights of each layer and head, then cut): they equal the model's eager
    run on the unpadded pair, the padded keys having had no weight."""
    model, tokenizer = translator.transformer, translator.tokenizer
    source, target = "nine hundred ninety-nine", "siebenhundertsiebenundsiebzig"
    got = attention_maps(translator, source, target)
    src = tk.encode(tokenizer, [source])[0]
    dec = [tk.START_ID, *tk.encode(tokenizer, [target], add_end=False)[0]]
    # Both padded (9 -> 16 and 10 -> 16), each its own length.
    assert (len(src), len(dec)) == (9, 10)
    assert shapes.width(9, 16) == shapes.width(10, 16) == 16
    encoder_outputs, mask, encoder_self = model.encode(
        np.array([src], "int32"), return_attention_scores=True
    )
    _, decoder_self, cross = model.decode(
        np.array([dec], "int32"), encoder_outputs, mask, return_attention_scores=True
    )
    for array, scores in (
        (got.encoder_self_attention, encoder_self),
        (got.decoder_self_attention, decoder_self),
        (got.cross_attention, cross),
    ):
        expected = np.stack([keras.ops.convert_to_numpy(s)[0] for s in scores])
        assert array.shape == expected.shape
        np.testing.assert_allclose(array, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.once
def test_a_mixed_precision_model_shows_the_weights_its_search_computes(
    translator, maps
):
    """Under mixed_bfloat16 the translator searches with a float32 copy of
    the weights (``search_dtype="float32"``, the default): the maps are that
    copy's, those of the float32 model; with ``search_dtype="policy"`` they
    are computed in bfloat16, as its search is."""
    model = translator.transformer
    mixed = kt.build_model(
        "tiny",
        src_vocab_size=model.src_vocab_size,
        dtype="mixed_bfloat16",
        **SMALL,
    )
    mixed.set_weights(model.get_weights())
    exact = attention_maps(kt.Translator(translator.tokenizer, mixed), SOURCE, TARGET)
    policy = kt.Translator(translator.tokenizer, mixed, search_dtype="policy")
    rounded = attention_maps(policy, SOURCE, TARGET)
    for kind in ("encoder_self", "decoder_self", "cross"):
        expected = getattr(maps, f"{kind}_attention")
        np.testing.assert_allclose(
            getattr(exact, f"{kind}_attention"), expected, rtol=1e-6, atol=1e-6
        )
        # bfloat16 keeps about 3 significant digits.
        in_bfloat16 = getattr(rounded, f"{kind}_attention")
        assert in_bfloat16.dtype == np.float32
        np.testing.assert_allclose(in_bfloat16, expected, atol=0.05)
    assert not np.allclose(rounded.cross_attention, maps.cross_attention, atol=1e-4)


@pytest.mark.once
def test_rows_are_distributions_and_decoder_is_causal(maps):
    for array in (
        maps.encoder_self_attention,
        maps.decoder_self_attention,
        maps.cross_attention,
    ):
        assert np.all(array >= 0)
        np.testing.assert_allclose(array.sum(-1), 1.0, atol=1e-5)
    # §3.2.3: decoder position i sees only positions <= i.
    T = len(maps.target_tokens)
    upper = np.triu(np.ones((T, T), bool), k=1)
    assert np.all(maps.decoder_self_attention[..., upper] == 0)
    assert np.all(maps.decoder_self_attention[..., ~upper] > 0)
    # The layers and heads differ (the arrays are not one map repeated).
    cross = maps.cross_attention
    assert not np.allclose(cross[0], cross[1], atol=1e-3)
    assert not np.allclose(cross[:, 0], cross[:, 1], atol=1e-3)


@pytest.mark.slow
@pytest.mark.once
def test_default_target_is_the_greedy_translation(translator):
    tokenizer = translator.tokenizer
    # Greedy search, not the default beam search.
    expected = translator.translate_ids([SOURCE], beam_size=1)[0]
    body = expected[: expected.index(tk.END_ID)] if tk.END_ID in expected else expected
    body = body[: translator.target_max_length - 1]
    maps = attention_maps(translator, SOURCE)
    assert maps.target_tokens == pieces(tokenizer, body) + ["</s>"]
    assert maps.cross_attention.shape[2] == len(body) + 1


@pytest.mark.slow
@pytest.mark.once
def test_default_target_stops_at_end_and_fits_the_decoder(translator, monkeypatch):
    tokenizer = translator.tokenizer
    calls = []

    # The greedy translation is asked for.
    def with_beams(texts, beam_size=4):
        calls.append(beam_size)
        return [[7, 8, tk.END_ID, 9]]

    monkeypatch.setattr(translator, "translate_ids", with_beams)
    maps = attention_maps(translator, SOURCE)
    assert calls == [1]
    assert maps.target_tokens == pieces(tokenizer, [7, 8]) + ["</s>"]

    # An output that ran to the limit without END: START + 16 tokens would
    # not fit the decoder's max_length=16, so it keeps 15.
    monkeypatch.setattr(
        translator, "translate_ids", lambda texts, beam_size: [[5] * 16]
    )
    maps = attention_maps(translator, SOURCE)
    assert maps.target_tokens == pieces(tokenizer, [5] * 15) + ["</s>"]
    assert maps.decoder_self_attention.shape[-1] == 16


@pytest.mark.slow
@pytest.mark.once
def test_long_source_is_truncated_with_one_warning(translator, monkeypatch):
    long_source = "seven hundred seventy-seven thousand seven hundred seventy-seven"
    full = tk.encode(translator.tokenizer, [long_source])[0]
    assert len(full) > 16
    real_encode = translator.encode_sources

    def translate_ids(texts, beam_size=4):
        real_encode(texts)  # warns again, as the real one does
        return [[7, tk.END_ID]]

    monkeypatch.setattr(translator, "translate_ids", translate_ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = attention_maps(translator, long_source)
    ours = [w for w in caught if issubclass(w.category, UserWarning)]
    assert len(ours) == 1 and "max_length=16" in str(ours[0].message)
    # The first 15 pieces and the end token, as Translator.encode_sources.
    cut = pieces(translator.tokenizer, full[:15]) + ["</s>"]
    assert maps.source_tokens == cut
    assert maps.cross_attention.shape[-1] == 16


@pytest.mark.once
def test_bad_inputs(translator):
    long_target = "seven hundred seventy-seven thousand seven hundred seventy-seven"
    assert len(tk.encode(translator.tokenizer, [long_target])[0]) > 16
    with pytest.raises(ValueError, match="max_length=16"):
        attention_maps(translator, SOURCE, long_target)
    with pytest.raises(TypeError, match="source"):
        attention_maps(translator, [SOURCE])
    with pytest.raises(TypeError, match="target"):
        attention_maps(translator, SOURCE, [TARGET])


# -- an independent NumPy reference for layer 0 ----------------------------------


def _np(variable):
    return keras.ops.convert_to_numpy(variable).astype("float64")


def sinusoids(length, d_model):
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
    pos = np.arange(length)[:, None]
    inv_freq = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((length, d_model))
    pe[:, 0::2] = np.sin(pos * inv_freq)
    pe[:, 1::2] = np.cos(pos * inv_freq)
    return pe


def layer_norm(x, layer):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    x = (x - mean) / np.sqrt(var + layer.epsilon)
    return x * _np(layer.gamma) + _np(layer.beta)


def multi_head(mha, query, memory, causal=False):
    """§3.2.1-3.2.2 for one sequence: (weights (H, Tq, Tk), output (Tq, d))."""
    heads = mha.num_heads

    def project(dense, x):  # (T, d) -> (H, T, d_k)
        y = x @ _np(dense.kernel) + _np(dense.bias)
        return y.reshape(len(x), heads, -1).transpose(1, 0, 2)

    q = project(mha.query_dense, query)
    k = project(mha.key_dense, memory)
    v = project(mha.value_dense, memory)
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if causal:
        logits = np.where(np.tril(np.ones(logits.shape[1:], bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads_out = (weights @ v).transpose(1, 0, 2).reshape(len(query), -1)
    dense = mha.output_dense
    return weights, heads_out @ _np(dense.kernel) + _np(dense.bias)


def test_layer_0_matches_numpy_reference(translator, maps):
    model = translator.transformer
    tokenizer = translator.tokenizer
    src = tk.encode(tokenizer, [SOURCE])[0]
    dec = [tk.START_ID] + tk.encode(tokenizer, [TARGET], add_end=False)[0]

    d_model = SMALL["d_model"]
    table = _np(model.target_embedding.embeddings)

    def embed(ids):  # §3.4-3.5: E[ids] * sqrt(d_model) + PE
        return table[ids] * np.sqrt(d_model) + sinusoids(len(ids), d_model)

    # Encoder layer 0: self-attention on the embedded source.
    encoder_block = model.encoder_blocks[0]
    weights, _ = multi_head(encoder_block.self_attention, embed(src), embed(src))
    np.testing.assert_allclose(maps.encoder_self_attention[0], weights, atol=1e-5)

    # Decoder layer 0: masked self-attention, then the post-LN residual
    # (§3.1: LayerNorm(x + Sublayer(x))), then cross-attention to the
    # encoder output.
    block = model.decoder_blocks[0]
    assert not block.norm_first
    x = embed(dec)
    weights, out = multi_head(block.self_attention, x, x, causal=True)
    np.testing.assert_allclose(maps.decoder_self_attention[0], weights, atol=1e-5)
    x = layer_norm(x + out, block.self_attention_norm)
    memory, _ = model.encode(np.array([src], "int32"))
    memory = keras.ops.convert_to_numpy(memory)[0].astype("float64")
    weights, _ = multi_head(block.cross_attention, x, memory)
    assert weights.shape == (4, len(dec), len(src))
    # Not uniform: a mix-up of rows, heads or keys would show.
    assert np.ptp(weights, axis=-1).max() > 0.05
    np.testing.assert_allclose(maps.cross_attention[0], weights, atol=1e-5)


# -- plotting ----------------------------------------------------------------------


def labels(ticks):
    return [tick.get_text() for tick in ticks]


def synthetic_maps(rng, layers=2, heads=3, S=5, T=4):
    def softmax_rows(shape):
        x = np.exp(rng.normal(size=shape))
        return (x / x.sum(-1, keepdims=True)).astype("float32")

    return AttentionMaps(
        source_tokens=["▁drei", "ß", "-", "zwei", "</s>"][:S],
        target_tokens=["▁three", "▁hundred", "two", "</s>"][:T],
        encoder_self_attention=softmax_rows((layers, heads, S, S)),
        decoder_self_attention=softmax_rows((layers, heads, T, T)),
        cross_attention=softmax_rows((layers, heads, T, S)),
    )


@pytest.mark.once
def test_plot_attention(rng):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows, columns = ["▁drei", "hundert", "</s>"], ["▁three", "▁hundred", "-", "</s>"]
    weights = rng.uniform(size=(3, 4))
    ax = plot_attention(weights, rows, columns, title="Cross")
    assert labels(ax.get_xticklabels()) == columns
    assert labels(ax.get_yticklabels()) == rows
    assert ax.get_title() == "Cross"
    image = ax.images[0]
    np.testing.assert_allclose(image.get_array(), weights, rtol=1e-6)
    assert image.get_clim() == (0.0, 1.0)
    assert len(ax.figure.axes) == 2  # the heatmap and its colorbar
    # Rendering the pieces ('▁', 'ß') raises nothing (warnings are errors).
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.getvalue().startswith(PNG_MAGIC)

    # Drawing on a given Axes returns it.
    fig, given = pyplot.subplots()
    try:
        assert plot_attention(weights, rows, columns, ax=given) is given
    finally:
        pyplot.close(fig)

    for bad in (weights.T, weights[:, :3], weights[None]):
        with pytest.raises(ValueError, match=r"\(3, 4\)"):
            plot_attention(bad, rows, columns)


@pytest.mark.once
def test_plot_attention_maps(rng):
    maps = synthetic_maps(rng)
    ax = plot_attention_maps(maps)  # cross, last layer, mean of the heads
    assert labels(ax.get_yticklabels()) == maps.target_tokens
    assert labels(ax.get_xticklabels()) == maps.source_tokens
    np.testing.assert_allclose(
        ax.images[0].get_array(), maps.cross_attention[1].mean(0), rtol=1e-6
    )
    assert "layer 2/2" in ax.get_title() and "mean of 3 heads" in ax.get_title()
    assert "source" in ax.get_xlabel() and "target" in ax.get_ylabel()

    ax = plot_attention_maps(maps, "encoder_self", layer=0, head=2)
    assert labels(ax.get_yticklabels()) == maps.source_tokens
    assert labels(ax.get_xticklabels()) == maps.source_tokens
    np.testing.assert_allclose(
        ax.images[0].get_array(), maps.encoder_self_attention[0, 2], rtol=1e-6
    )
    assert "Encoder" in ax.get_title() and "head 3/3" in ax.get_title()

    ax = plot_attention_maps(maps, "decoder_self", head=-1)
    assert labels(ax.get_yticklabels()) == maps.target_tokens
    # Keys are named by what each position reads: START, then the target.
    assert maps.decoder_input_tokens == ["<s>", "▁three", "▁hundred", "two"]
    assert labels(ax.get_xticklabels()) == maps.decoder_input_tokens
    np.testing.assert_allclose(
        ax.images[0].get_array(), maps.decoder_self_attention[1, 2], rtol=1e-6
    )

    with pytest.raises(ValueError, match="kind"):
        plot_attention_maps(maps, "self")
    with pytest.raises(IndexError, match="layer"):
        plot_attention_maps(maps, layer=2)
    with pytest.raises(IndexError, match="head"):
        plot_attention_maps(maps, head=-4)


# -- the command -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.once
def test_command_writes_a_png(translator, tmp_path, capsys):
    model = os.path.join(tmp_path, "translator.keras")
    translator.save(model)
    out = os.path.join(tmp_path, "figures", "attention.png")
    attention_cli.main(
        ["--model", model, "--target", TARGET, "--head", "1", "--out", out, SOURCE]
    )
    assert capsys.readouterr().out.strip() == out
    with open(out, "rb") as file:
        assert file.read(8) == PNG_MAGIC
    # Written atomically: no temporary file is left beside it.
    assert os.listdir(os.path.dirname(out)) == ["attention.png"]

    # A target the model cannot take, or a head it lacks: status 2, no file.
    for extra in (["--target", "seven " * 20], ["--head", "4"]):
        bad = os.path.join(tmp_path, "bad.png")
        with pytest.raises(SystemExit) as exit_info:
            attention_cli.main(["--model", model, "--out", bad, *extra, SOURCE])
        assert exit_info.value.code == 2
        assert not os.path.exists(bad)
    assert "max_length=16" in capsys.readouterr().err


@pytest.mark.once
def test_command_missing_model(tmp_path, capsys):
    missing = os.path.join(tmp_path, "nothing.keras")
    out = os.path.join(tmp_path, "x.png")
    with pytest.raises(SystemExit) as exit_info:
        attention_cli.main(["--model", missing, "--out", out, "seven"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "nothing.keras" in err and "no such model file" in err
    assert not os.path.exists(out)
