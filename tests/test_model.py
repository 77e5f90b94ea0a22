"""Tests of the full encoder-decoder model (`build_model`, `Transformer`).

Runs under every KERAS_BACKEND (tensorflow, jax, torch). Models are tiny
(d_model=32, one or two layers, vocabulary 40) to keep the file fast on two
CPU cores; only the parameter-count tests build "base" and "big".
"""

import os
import re
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer.model.transformer import Transformer

BACKEND = keras.backend.backend()
VOCAB = 40
MAX_LENGTH = 32
# Tiny architecture; dropout 0 so that calls are deterministic.
SMALL = dict(
    num_layers=1, d_model=32, num_heads=4, d_ff=64, max_length=MAX_LENGTH, dropout=0.0
)
ATOL = 1e-5


def small_model(num_layers=1, **kwargs):
    overrides = {**SMALL, "num_layers": num_layers}
    src_vocab_size = kwargs.pop("src_vocab_size", VOCAB)
    overrides.update(kwargs)
    return kt.build_model("tiny", src_vocab_size=src_vocab_size, **overrides)


def to_np(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


_JAX_FORWARD = {}  # id(model) -> (model, jitted forward); keeps the model alive


def _jax_forward(model):
    import jax

    if id(model) not in _JAX_FORWARD:

        def forward(trainable, non_trainable, x):
            return model.stateless_call(trainable, non_trainable, x, training=False)[0]

        _JAX_FORWARD[id(model)] = (model, jax.jit(forward))
    return _JAX_FORWARD[id(model)][1]


def forward(model, x):
    """Eval-mode logits as a backend tensor.

    An eager call on TensorFlow and PyTorch. On JAX an eager call compiles op
    by op for every new input shape (seconds each), and so do `predict` and
    `fit`, which first run the model eagerly on one batch (the package's
    never-built attention sub-layers make Keras rebuild every time); a jitted
    `stateless_call` is much faster. `test_eager_call_matches_predict` checks
    that the paths agree.
    """
    if BACKEND == "jax":
        return _jax_forward(model)(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            x,
        )
    return model(x, training=False)


def logits_of(model, src, tgt):
    """Eval-mode logits as float32 NumPy."""
    return to_np(forward(model, {"encoder_inputs": src, "decoder_inputs": tgt}))


def random_ids(rng, shape, low=1, high=VOCAB):
    """Non-padding token ids (never 0)."""
    return rng.integers(low, high, size=shape).astype("int32")


def seq2seq_batch(rng, batch=4, src_len=7, tgt_len=6):
    """A padded batch: rows of different real lengths, padding (0) at the end."""
    src = random_ids(rng, (batch, src_len))
    tgt = random_ids(rng, (batch, tgt_len + 1))
    for i in range(1, batch):  # row i ends with i padding tokens
        src[i, src_len - i :] = 0
        tgt[i, tgt_len + 1 - i :] = 0
    x = {"encoder_inputs": src, "decoder_inputs": tgt[:, :-1]}
    y = tgt[:, 1:]
    return x, y


def padding_rows_batch(rng):
    """Row 1: source entirely padding. Row 2: decoder input entirely padding."""
    x, y = seq2seq_batch(rng, batch=4)
    x["encoder_inputs"][1] = 0
    x["decoder_inputs"][2] = 0
    y[2] = 0
    return x, y


@pytest.fixture(scope="module")
def model():
    """A float32, dropout-free, two-layer model shared by the property tests."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(42)
    return small_model(num_layers=2)


# ---------------------------------------------------------------------------
# 1. Parameter counts and configuration
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.once
@pytest.mark.parametrize(
    "name, d_model, expected",
    [("base", 512, 63_082_496), ("big", 1024, 214_245_376)],
)
def test_parameter_count_matches_paper_configs(name, d_model, expected):
    model = kt.build_model(name, src_vocab_size=37000, share_embeddings=True)
    assert model.count_params() == expected
    # Tied embeddings: one (37000, d_model) matrix serves source, target and
    # the pre-softmax projection, and the projection has no bias.
    vocab_sized = [w for w in model.weights if 37000 in tuple(w.shape)]
    assert [tuple(w.shape) for w in vocab_sized] == [(37000, d_model)]
    assert model.output.shape[-1] == 37000


@pytest.mark.slow
def test_untied_embeddings_have_own_matrices_and_target_vocab_output():
    model = small_model(share_embeddings=False, src_vocab_size=100, tgt_vocab_size=120)
    # Two embedding matrices, the target one doubling as the projection: no
    # other vocabulary-sized weight (no separate projection, no bias).
    vocab_sized = sorted(
        tuple(w.shape) for w in model.weights if {100, 120} & set(w.shape)
    )
    assert vocab_sized == [(100, 32), (120, 32)]
    rng = np.random.default_rng(0)
    src = random_ids(rng, (2, 5), high=100)
    tgt = random_ids(rng, (2, 4), high=120)
    assert logits_of(model, src, tgt).shape == (2, 4, 120)
    # Target ids in [100, 120) are valid for the decoder, not for the encoder.
    with pytest.raises(ValueError, match="vocab_size=100"):
        model({"encoder_inputs": np.full((2, 5), 110, "int32"), "decoder_inputs": tgt})


def test_shared_embeddings_with_different_vocab_sizes_raises():
    with pytest.raises(ValueError, match="share_embeddings"):
        kt.build_model("tiny", src_vocab_size=100, tgt_vocab_size=120)
    with pytest.raises(ValueError, match="tgt_vocab_size=120"):
        small_model(src_vocab_size=100, tgt_vocab_size=120, share_embeddings=True)


@pytest.mark.slow
def test_keyword_overrides_of_named_config():
    model = kt.build_model(
        "base", src_vocab_size=100, num_layers=1, d_model=64, num_heads=4, d_ff=128
    )
    assert len(model.encoder_blocks) == len(model.decoder_blocks) == 1
    assert model.source_embedding is model.target_embedding
    assert model.target_embedding.embeddings.shape == (100, 64)
    block = model.encoder_blocks[0]
    assert (block.d_model, block.num_heads, block.d_ff) == (64, 4, 128)
    # The parts keep the names of 0.1.0, under which its files saved weights.
    names = {layer.name for layer in model.layers}
    assert {"encoder_block_0", "decoder_block_0", "shared_embedding"} <= names
    # Untouched fields keep the named config's values ("base": dropout 0.1).
    assert block.dropout == pytest.approx(0.1)
    assert model.encoder_position.max_length == 512

    tiny = kt.build_model("tiny", src_vocab_size=40)
    tiny_names = {layer.name for layer in tiny.layers}
    assert {
        f"{p}_block_{i}" for p in ("encoder", "decoder") for i in (0, 1)
    } <= tiny_names
    assert "encoder_block_2" not in tiny_names


# ---------------------------------------------------------------------------
# 2. Output contract
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "global_policy, dtype_arg, compute",
    [
        ("float32", None, "float32"),
        ("mixed_float16", None, "float16"),
        ("mixed_bfloat16", None, "bfloat16"),
        ("float32", "mixed_float16", "float16"),
        ("float32", "mixed_bfloat16", "bfloat16"),
    ],
)
def test_logits_shape_and_float32_dtype(global_policy, dtype_arg, compute):
    keras.config.set_dtype_policy(global_policy)
    model = small_model(
        share_embeddings=False, src_vocab_size=VOCAB, tgt_vocab_size=30, dtype=dtype_arg
    )
    # The policy really reaches the layers (else the float32 check is trivial).
    block = model.decoder_blocks[0]
    assert block.compute_dtype == compute
    assert block.self_attention.query_dense.compute_dtype == compute
    assert model.target_embedding.embeddings.dtype == "float32"
    rng = np.random.default_rng(1)
    x = {
        # (4, 7) and (4, 6), the shapes of `seq2seq_batch`: JAX's eager op
        # cache is shared with the other eager calls.
        "encoder_inputs": random_ids(rng, (4, 7)),
        "decoder_inputs": random_ids(rng, (4, 6), high=30),
    }
    # Symbolic output spec.
    assert tuple(model.output.shape) == (None, None, 30)
    assert keras.backend.standardize_dtype(model.output.dtype) == "float32"
    out = forward(model, x)
    assert tuple(out.shape) == (4, 6, 30)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert np.isfinite(to_np(out)).all()


@pytest.mark.slow
def test_eager_call_matches_predict(model):
    rng = np.random.default_rng(13)
    x, _ = seq2seq_batch(rng, batch=4)
    out = model(x, training=False)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    eager = to_np(out)
    predicted = model.predict(x, verbose=0)
    assert predicted.dtype == np.float32
    np.testing.assert_allclose(predicted, eager, atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.predict_on_batch(x), eager, atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        logits_of(model, x["encoder_inputs"], x["decoder_inputs"]),
        eager,
        atol=ATOL,
        rtol=0,
    )
    # The logits carry the decoder padding mask, for Keras losses and metrics.
    mask = getattr(out, "_keras_mask", None)
    assert mask is not None
    np.testing.assert_array_equal(ops.convert_to_numpy(mask), x["decoder_inputs"] != 0)
    assert not ops.convert_to_numpy(mask).all()


# ---------------------------------------------------------------------------
# 3. Properties of the function the model computes (eval mode, dropout 0)
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_source_padding_does_not_change_logits(model):
    rng = np.random.default_rng(2)
    src = random_ids(rng, (3, 6))
    src[1, 4:] = 0
    tgt = random_ids(rng, (3, 5))
    expected = logits_of(model, src, tgt)
    padded = np.concatenate([src, np.zeros((3, 9), "int32")], axis=1)
    np.testing.assert_allclose(
        logits_of(model, padded, tgt), expected, atol=ATOL, rtol=0
    )
    # Sanity: the source does matter, so the check above can fail.
    changed = src.copy()
    changed[0, 2] = changed[0, 2] % (VOCAB - 1) + 1
    assert np.abs(logits_of(model, changed, tgt)[0] - expected[0]).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("t", [0, 3, 6])
def test_decoder_is_causal(model, t):
    rng = np.random.default_rng(3)
    src = random_ids(rng, (2, 6))
    tgt = random_ids(rng, (2, 7))
    base = logits_of(model, src, tgt)
    changed = tgt.copy()
    changed[0, t] = changed[0, t] % (VOCAB - 1) + 1  # another non-padding id
    out = logits_of(model, src, changed)
    # Earlier positions do not see position t.
    np.testing.assert_allclose(out[:, :t], base[:, :t], atol=ATOL, rtol=0)
    # Position t itself does; the other row does not.
    assert np.abs(out[0, t] - base[0, t]).max() > 1e-3
    np.testing.assert_allclose(out[1], base[1], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_rows_are_independent_and_permutation_equivariant(model):
    rng = np.random.default_rng(4)
    x, _ = seq2seq_batch(rng, batch=4)
    src, tgt = x["encoder_inputs"], x["decoder_inputs"]
    batch = logits_of(model, src, tgt)
    for i in range(4):
        row = logits_of(model, src[i : i + 1], tgt[i : i + 1])
        np.testing.assert_allclose(row[0], batch[i], atol=ATOL, rtol=0)
    perm = np.array([2, 0, 3, 1])
    permuted = logits_of(model, src[perm], tgt[perm])
    np.testing.assert_allclose(permuted, batch[perm], atol=ATOL, rtol=0)
    # Rows really differ, so the comparisons above are not trivially true.
    assert np.abs(batch[0] - batch[1]).max() > 1e-3


@pytest.mark.slow
def test_decoder_padding_does_not_change_real_positions(model):
    rng = np.random.default_rng(5)
    src = random_ids(rng, (2, 6))
    tgt = random_ids(rng, (2, 5))
    tgt[1, 3:] = 0
    expected = logits_of(model, src, tgt)
    padded = np.concatenate([tgt, np.zeros((2, 6), "int32")], axis=1)
    out = logits_of(model, src, padded)
    assert out.shape == (2, 11, VOCAB)
    np.testing.assert_allclose(out[0, :5], expected[0, :5], atol=ATOL, rtol=0)
    np.testing.assert_allclose(out[1, :3], expected[1, :3], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------
# 4-5. Training under mixed precision; fully padded rows
# ---------------------------------------------------------------------------
def compile_small(model, learning_rate=1e-3):
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training_and_padding_rows_are_finite(policy):
    keras.config.set_dtype_policy(policy)
    model = compile_small(small_model(num_layers=1))
    assert model.encoder_blocks[0].compute_dtype == policy.split("_")[1]
    rng = np.random.default_rng(6)
    # Two steps: a plain batch, then one with an all-padding source row and
    # an all-padding decoder row.
    x, y = seq2seq_batch(rng, batch=4)
    px, py = padding_rows_batch(rng)
    both = {k: np.concatenate([x[k], px[k]]) for k in x}
    history = model.fit(
        both, np.concatenate([y, py]), batch_size=4, epochs=1, shuffle=False, verbose=0
    )
    assert np.isfinite(history.history["loss"]).all()
    for weight in model.trainable_weights:
        assert np.isfinite(to_np(weight)).all(), weight.path
    out = forward(model, px)
    assert tuple(out.shape) == (4, 6, VOCAB)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert np.isfinite(to_np(out)).all()


@pytest.mark.slow
@pytest.mark.early("torch")  # a long torch.compile: not last in the run
@(pytest.mark.no_cover if BACKEND == "torch" else lambda test: test)
def test_compiled_training_under_mixed_bfloat16():
    """``jit_compile=True`` trains under ``mixed_bfloat16`` on every backend:
    XLA on JAX and TensorFlow, ``torch.compile`` on PyTorch. On PyTorch the
    first step's compilation is long on two cores, longer still under
    coverage's tracer: hence ``no_cover`` there (pytest-cov's marker; the
    lines it runs are covered by the other training tests)."""
    model = small_model(num_layers=1, dropout=0.1, dtype="mixed_bfloat16")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    assert model.jit_compile is True
    x, y = seq2seq_batch(np.random.default_rng(8), batch=4)
    before = [to_np(w) for w in model.trainable_weights]
    if BACKEND == "torch":
        import torch
        from torch._dynamo.utils import counters

        counters.clear()
        # What Keras changes on the first step, on which dynamo guards, so
        # that the second step would trace and compile it all again: the
        # layers' name-scope paths (set at their first call: an eager call
        # sets them) and the weights' gradients (`zero_grad()` tests `p.grad
        # is None`: gradients present from the start, replaced by the first
        # step's). Then the four steps run one compilation.
        model(x, training=True)
        for weight in model.trainable_weights:
            weight.value.grad = torch.zeros_like(weight.value)
    with warnings.catch_warnings():
        if BACKEND == "torch":
            # torch.compile (torch 2.13) warns as it traces: about deprecated
            # modules it imports, about `.grad` of the tensors it inspects.
            # Under the suite's filterwarnings=error dynamo turns them into
            # errors.
            warnings.simplefilter("ignore")
        losses = [
            float(model.train_on_batch(x, y, return_dict=True)["loss"])
            for _ in range(4)
        ]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]  # the same batch four times: it learns it
    changed = [
        not np.array_equal(to_np(w), b)
        for w, b in zip(model.trainable_weights, before, strict=True)
    ]
    assert all(changed)
    if BACKEND != "torch":
        return
    # Graph breaks only at Keras' `loss.backward()` (counted once per trace,
    # and one trace for the four steps):
    # no value check leaves the graph (the batch is checked on the host
    # first), nor Keras' probe for a flash-attention kernel. Each break would
    # cost the first step more tracing (docs/results.md).
    breaks = counters["graph_break"]
    assert breaks and all("Tensor.backward()" in reason for reason in breaks), list(
        breaks
    )
    assert sum(breaks.values()) == 1, "the train step was traced more than once"
    # That host check stops a bad streamed batch before the compiled update.
    bad = dict(x, encoder_inputs=_replace(x["encoder_inputs"], (1, 3), VOCAB + 10))
    trained = [to_np(w) for w in model.trainable_weights]
    with pytest.raises(ValueError, match=BAD_ID_ERROR):
        model.fit(_Batches([(bad, y)]), epochs=1, verbose=0)
    assert int(to_np(model.optimizer.iterations)) == 4
    for w, t in zip(model.trainable_weights, trained, strict=True):
        np.testing.assert_array_equal(to_np(w), t)


def test_all_padding_rows_give_finite_logits_float32(model):
    px, _ = padding_rows_batch(np.random.default_rng(7))
    direct = logits_of(model, px["encoder_inputs"], px["decoder_inputs"])
    assert np.isfinite(direct).all()
    predicted = model.predict(px, verbose=0)
    assert np.isfinite(predicted).all()
    np.testing.assert_allclose(predicted, direct, atol=ATOL, rtol=0)
    # Every row entirely padding, on both sides.
    zeros = np.zeros((2, 4), "int32")
    assert np.isfinite(logits_of(model, zeros, zeros)).all()


# ---------------------------------------------------------------------------
# 6. Saving and loading
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_save_load_round_trip_and_training_continues(tmp_path):
    model = compile_small(small_model(num_layers=1))
    rng = np.random.default_rng(8)
    x, y = seq2seq_batch(rng, batch=4)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    expected = logits_of(model, x["encoder_inputs"], x["decoder_inputs"])

    path = str(tmp_path / "model.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)  # no custom_objects
    assert type(reloaded) is Transformer
    np.testing.assert_allclose(
        logits_of(reloaded, x["encoder_inputs"], x["decoder_inputs"]),
        expected,
        atol=1e-6,
        rtol=0,
    )
    assert int(to_np(reloaded.optimizer.iterations)) == 2

    # Fitting continues from the restored optimizer state: one more step on
    # the original and on the reloaded model gives the same weights.
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    history = reloaded.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(to_np(reloaded.optimizer.iterations)) == 3
    after = logits_of(model, x["encoder_inputs"], x["decoder_inputs"])
    assert np.abs(after - expected).max() > 1e-4  # the step changed something
    np.testing.assert_allclose(
        logits_of(reloaded, x["encoder_inputs"], x["decoder_inputs"]),
        after,
        atol=1e-5,
        rtol=0,
    )
    # The reloaded model still validates its inputs.
    with pytest.raises(ValueError, match="vocab_size"):
        reloaded.predict(
            {
                "encoder_inputs": x["encoder_inputs"] + VOCAB,
                "decoder_inputs": x["decoder_inputs"],
            }
        )


@pytest.mark.parametrize("entry", ["fit", "train_on_batch"])
def test_optimizer_is_built_before_the_first_step_is_traced(entry):
    """The loss runs while the train step is traced: by then the optimizer has
    its variables. Keras' TensorFlow trainer (3.15) otherwise creates them
    inside the first traced step, which tf.function then traces twice
    (``[False, True]`` here) and fills with a conditional initializer per
    variable (Transformer._build_optimizer). On JAX and PyTorch Keras first
    runs the loss once on symbolic values, before it builds the optimizer;
    only the last call is the step's."""
    model = small_model(num_layers=1)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    built_when_traced = []

    def loss(y_true, y_pred):
        built_when_traced.append(model.optimizer.built)
        return cross_entropy(y_true, y_pred)

    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    x, y = seq2seq_batch(np.random.default_rng(3), batch=2)
    if entry == "fit":
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    else:
        model.train_on_batch(x, y)
    assert built_when_traced[-1], built_when_traced
    if BACKEND == "tensorflow":
        assert built_when_traced == [True], "the step was traced more than once"
    assert model.optimizer.iterations.numpy() == 1


@pytest.mark.slow
@pytest.mark.once
def test_user_snippet_tiny_fit_save_load(tmp_path):
    # A user's first snippet, with "tiny": compile, fit on a dict, save, load.
    import keras_transformer

    model = keras_transformer.build_model("tiny", src_vocab_size=1000)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    src = np.random.randint(1, 1000, size=(8, 12))
    tgt = np.random.randint(1, 1000, size=(8, 11))
    model.fit(
        {"encoder_inputs": src, "decoder_inputs": tgt[:, :-1]},
        tgt[:, 1:],
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    model.save(str(tmp_path / "tiny.keras"))
    restored = keras.saving.load_model(str(tmp_path / "tiny.keras"))

    assert isinstance(restored, Transformer)
    src, tgt = src.astype("int32"), tgt[:, :-1].astype("int32")
    np.testing.assert_allclose(
        logits_of(restored, src, tgt), logits_of(model, src, tgt), atol=1e-6, rtol=0
    )


# ---------------------------------------------------------------------------
# 7. One .keras file, three backends
# ---------------------------------------------------------------------------
# Each backend's run saves a model here and starts one subprocess on the next
# backend of the ring tensorflow -> jax -> torch -> tensorflow, which loads that
# file and saves its own for this run to load. A run of the three backends
# thus checks all six (saved under, loaded under) pairs, with one subprocess
# per run instead of one per pair.
RING = ("tensorflow", "jax", "torch")
NEXT_BACKEND = RING[(RING.index(BACKEND) + 1) % len(RING)]

CROSS_SCRIPT = textwrap.dedent(
    """
    import sys

    import keras
    import numpy as np

    import keras_transformer as kt

    out, loaded_from = sys.argv[1], sys.argv[2]
    backend = keras.backend.backend()

    # 1. The file saved under the other backend, loaded here.
    model = kt.load_model(f"{out}/{loaded_from}.keras")
    assert type(model) is kt.Transformer, type(model)
    x = {
        "encoder_inputs": np.load(f"{out}/{loaded_from}_src.npy"),
        "decoder_inputs": np.load(f"{out}/{loaded_from}_tgt.npy"),
    }
    logits = keras.ops.convert_to_numpy(model(x, training=False))
    np.save(f"{out}/{loaded_from}_logits_under_{backend}.npy", logits)

    # 2. A model saved here, for the other backend to load.
    keras.utils.set_random_seed(7)
    model = kt.build_model(
        "tiny", src_vocab_size=40, num_layers=1, d_model=32, num_heads=4,
        d_ff=64, max_length=32, dropout=0.0,
    )
    rng = np.random.default_rng(11)
    src = rng.integers(1, 40, size=(3, 7)).astype("int32")
    tgt = rng.integers(1, 40, size=(3, 5)).astype("int32")
    src[1, 4:] = 0
    tgt[2, 3:] = 0
    x = {"encoder_inputs": src, "decoder_inputs": tgt}
    logits = keras.ops.convert_to_numpy(model(x, training=False))
    model.save(f"{out}/{backend}.keras")
    np.save(f"{out}/{backend}_src.npy", src)
    np.save(f"{out}/{backend}_tgt.npy", tgt)
    np.save(f"{out}/{backend}_logits.npy", logits)
    """
)


@pytest.fixture(scope="module")
def cross_backend(tmp_path_factory):
    """This backend's model saved, then the next backend's subprocess run."""
    out = tmp_path_factory.mktemp("cross_backend")
    keras.utils.set_random_seed(5)
    model = small_model(dropout=0.0)
    rng = np.random.default_rng(3)
    src = random_ids(rng, (2, 6))
    tgt = random_ids(rng, (2, 4))
    src[0, 3:] = 0
    tgt[1, 2:] = 0
    np.save(out / f"{BACKEND}_src.npy", src)
    np.save(out / f"{BACKEND}_tgt.npy", tgt)
    np.save(out / f"{BACKEND}_logits.npy", logits_of(model, src, tgt))
    model.save(out / f"{BACKEND}.keras")
    # Not compiled before saving: a model compiled but never fitted would not
    # reload under `filterwarnings = error` (Keras warns that the saved,
    # unbuilt optimizer has fewer variables than the rebuilt one).
    env = dict(os.environ, KERAS_BACKEND=NEXT_BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", CROSS_SCRIPT, str(out), BACKEND],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"the {NEXT_BACKEND} subprocess failed:\n{done.stdout[-2000:]}"
        f"{done.stderr[-3000:]}"
    )
    return out


@pytest.mark.slow
def test_keras_file_from_next_backend_gives_same_logits(cross_backend):
    out = cross_backend
    src = np.load(out / f"{NEXT_BACKEND}_src.npy")
    tgt = np.load(out / f"{NEXT_BACKEND}_tgt.npy")
    expected = np.load(out / f"{NEXT_BACKEND}_logits.npy")
    assert expected.shape == (3, 5, VOCAB) and np.isfinite(expected).all()
    loaded = keras.saving.load_model(str(out / f"{NEXT_BACKEND}.keras"))
    assert type(loaded) is Transformer
    np.testing.assert_allclose(logits_of(loaded, src, tgt), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_keras_file_loads_under_next_backend_with_same_logits(cross_backend):
    out = cross_backend
    expected = np.load(out / f"{BACKEND}_logits.npy")
    assert expected.shape == (2, 4, VOCAB) and np.isfinite(expected).all()
    there = np.load(out / f"{BACKEND}_logits_under_{NEXT_BACKEND}.npy")
    np.testing.assert_allclose(there, expected, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------
# 8. Bad input: same exception and message from every entry point
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled_model():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(43)
    return compile_small(small_model(num_layers=1))


def _ids(shape):
    return random_ids(np.random.default_rng(9), shape)


def _with(src=None, tgt=None):
    return {
        "encoder_inputs": _ids((2, 5)) if src is None else src,
        "decoder_inputs": _ids((2, 4)) if tgt is None else tgt,
    }


def _replace(ids, index, value):
    ids = ids.copy()
    ids[index] = value
    return ids


BAD_INPUTS = {
    "source_id_too_large": (
        _with(src=_replace(_ids((2, 5)), (1, 2), VOCAB)),
        ValueError,
        r"^Token ids in encoder_inputs must be in \[0, 40\) \(vocab_size=40\)\. "
        r"Received ids from \d+ to 40\.$",
    ),
    "target_id_too_large": (
        _with(tgt=_replace(_ids((2, 4)), (0, 3), 1000)),
        ValueError,
        r"Token ids in decoder_inputs .*vocab_size=40",
    ),
    "negative_id": (
        _with(src=_replace(_ids((2, 5)), (0, 0), -1)),
        ValueError,
        r"Token ids in encoder_inputs must be in \[0, 40\).*from -1 ",
    ),
    "float_ids": (
        _with(src=_ids((2, 5)).astype("float32")),
        TypeError,
        r"encoder_inputs must hold integer token ids.*float32",
    ),
    "source_too_long": (
        _with(src=_ids((2, MAX_LENGTH + 1))),
        ValueError,
        r"encoder_inputs is longer than the model's max_length=32",
    ),
    "target_too_long": (
        _with(tgt=_ids((2, MAX_LENGTH + 1))),
        ValueError,
        r"decoder_inputs is longer than the model's max_length=32",
    ),
    "batch_size_mismatch": (
        _with(tgt=_ids((3, 4))),
        ValueError,
        r"same number of rows \(batch size\).*'encoder_inputs': 2.*'decoder_inputs': 3",
    ),
    "missing_key": (
        {"encoder_inputs": _ids((2, 5))},
        ValueError,
        r"Missing model inputs \['decoder_inputs'\]",
    ),
}


def _run_entry_point(model, entry, x, y=None):
    if entry == "call":
        return model(x, training=False)
    if entry == "predict":
        return model.predict(x, verbose=0)
    if y is None:
        rows = len(x["decoder_inputs"]) if "decoder_inputs" in x else 2
        y = np.ones((rows, 4), "int32")
    if entry == "fit":
        return model.fit(x, y, epochs=1, verbose=0)
    return model.evaluate(x, y, verbose=0)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_numpy_input_raises_same_error_everywhere(compiled_model, case):
    x, error, pattern = BAD_INPUTS[case]
    messages = {}
    for entry in ("call", "predict", "fit", "evaluate"):
        with pytest.raises(error) as info:
            _run_entry_point(compiled_model, entry, x)
        assert type(info.value) is error, entry
        assert re.search(pattern, str(info.value)), (entry, str(info.value))
        messages[entry] = str(info.value)
    # One message, whichever entry point the bad data came through (a batch
    # size message also lists the targets' rows when there are targets).
    assert messages["call"] == messages["predict"], messages
    assert messages["fit"] == messages["evaluate"], messages
    if case != "batch_size_mismatch":
        assert messages["call"] == messages["fit"], messages


def test_targets_with_other_batch_size_raise(compiled_model):
    x = _with()
    for entry in ("fit", "evaluate"):
        with pytest.raises(ValueError, match=r"batch size.*'targets': 3"):
            _run_entry_point(compiled_model, entry, x, y=np.ones((3, 4), "int32"))


def test_out_of_range_backend_tensor_raises_eagerly(compiled_model):
    """Backend tensors skip the NumPy pre-check; the embedding layer catches them."""
    x, _ = seq2seq_batch(np.random.default_rng(14), batch=4)
    src, tgt = x["encoder_inputs"], x["decoder_inputs"]
    with pytest.raises(
        ValueError, match=r"Token ids must be in \[0, 40\) for 'shared_embedding'"
    ):
        compiled_model(
            {
                "encoder_inputs": ops.convert_to_tensor(
                    _replace(src, (0, 1), VOCAB + 3)
                ),
                "decoder_inputs": ops.convert_to_tensor(tgt),
            },
            training=False,
        )
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, 40\).*from -4 "):
        compiled_model(
            {
                "encoder_inputs": ops.convert_to_tensor(src),
                "decoder_inputs": ops.convert_to_tensor(_replace(tgt, (1, 1), -4)),
            },
            training=False,
        )
    # Valid backend tensors give finite logits (JAX's gather would give NaN
    # for a bad id; nothing invalid may get through as a number).
    out = compiled_model(
        {
            "encoder_inputs": ops.convert_to_tensor(src),
            "decoder_inputs": ops.convert_to_tensor(tgt),
        },
        training=False,
    )
    assert np.isfinite(to_np(out)).all()


class _Batches(keras.utils.PyDataset):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        batch = self.batches[index]
        return batch if isinstance(batch, tuple) else (batch,)


# The exception raised inside a compiled predict step depends on the backend
# (documented in keras_transformer/_checks.py); the message does not:
#   tensorflow: tf.debugging.Assert in the tf.function graph -> InvalidArgumentError
#   jax:        jax.debug.callback in the jitted step        -> JaxRuntimeError
#   torch:      eager step, checked at once                  -> ValueError
COMPILED_STEP_ERROR = {
    "tensorflow": "InvalidArgumentError",
    # JAX: the jitted check's error is raised once predict's loop is over.
    "jax": "ValueError",
    "torch": "ValueError",
}


# The model's host check names the input; the embedding layer's in-graph
# check names the layer.
BAD_ID_ERROR = r"Token ids (in \w+ )?must be in \[0, 40\)"


def _streams():
    """A valid batch and the same batch with one id out of range."""
    good, _ = seq2seq_batch(np.random.default_rng(10), batch=4)
    bad = dict(
        good, encoder_inputs=_replace(good["encoder_inputs"], (1, 3), VOCAB + 10)
    )
    return good, bad


@pytest.fixture
def fresh_model():
    keras.utils.set_random_seed(45)
    return compile_small(small_model(num_layers=1))


# A generator has no length, so Keras warns when it runs dry; on JAX the
# token-id error is raised after the loop, when that warning has been given.
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
@pytest.mark.parametrize("source", ["pydataset", "generator"])
def test_predict_on_streamed_out_of_range_ids_raises(fresh_model, source):
    good, bad = _streams()
    # The bad batch comes second: the first batch may be used to build the
    # model eagerly (JAX does), the second goes through the compiled step.
    if source == "pydataset":
        data = _Batches([good, bad])
    else:
        data = ((batch,) for batch in (good, bad))
    with pytest.raises(Exception, match=BAD_ID_ERROR) as info:
        fresh_model.predict(data, verbose=0)
    assert type(info.value).__name__ == COMPILED_STEP_ERROR[BACKEND]


@pytest.mark.slow
def test_streamed_valid_ids_predict_finite_logits(fresh_model):
    good, _ = _streams()
    valid = fresh_model.predict(_Batches([good, good]), verbose=0)
    assert valid.shape == (8, 6, VOCAB)
    assert np.isfinite(valid).all()
    np.testing.assert_allclose(
        valid[:4],
        logits_of(fresh_model, good["encoder_inputs"], good["decoder_inputs"]),
        atol=ATOL,
        rtol=0,
    )


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["predict", "evaluate"])
def test_model_still_usable_after_streamed_bad_ids(fresh_model, entry):
    good, bad = _streams()
    expected = logits_of(fresh_model, good["encoder_inputs"], good["decoder_inputs"])
    targets = np.ones((4, 6), "int32")
    batches = [(good, targets), (bad, targets)] if entry == "evaluate" else [good, bad]
    with pytest.raises(Exception, match=BAD_ID_ERROR):
        getattr(fresh_model, entry)(_Batches(batches), verbose=0)
    # The user fixes the data and carries on with the same model.
    np.testing.assert_allclose(
        fresh_model.predict(_Batches([good]), verbose=0), expected, atol=ATOL, rtol=0
    )
    np.testing.assert_allclose(
        logits_of(fresh_model, good["encoder_inputs"], good["decoder_inputs"]),
        expected,
        atol=ATOL,
        rtol=0,
    )


@pytest.mark.slow
@pytest.mark.skipif(
    BACKEND == "torch", reason="torch.compile is too slow for this suite"
)
def test_predict_on_streamed_out_of_range_ids_fails_under_jit_compile(fresh_model):
    """XLA compiles the step. TensorFlow's XLA drops Assert ops, so there the
    bad batch's logits are NaN instead of an exception: never finite garbage."""
    fresh_model.compile(jit_compile=True)
    good, bad = _streams()
    if BACKEND == "tensorflow":
        logits = fresh_model.predict(_Batches([good, bad]), verbose=0)
        assert np.isfinite(logits[:4]).all()
        assert np.isnan(logits[4:]).all()
    else:
        with pytest.raises(Exception, match=BAD_ID_ERROR):
            fresh_model.predict(_Batches([good, bad]), verbose=0)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's compiled steps")
def test_compiled_torch_steps_check_each_batch_on_the_host(monkeypatch):
    """Under ``jit_compile=True`` on PyTorch the model checks each batch on
    the host and runs the step with the checks left out of its graph
    (``_fault_safe.checked_torch_step``). ``torch.compile`` is the identity
    here, so that the steps run eagerly in milliseconds: this tests that
    wrapper (the same training as an uncompiled model, each bad batch
    refused before any update with the eager message), not Dynamo, which
    ``test_compiled_training_under_mixed_bfloat16`` runs."""
    import torch

    from keras_transformer._guards import checks as _checks

    monkeypatch.setattr(torch, "compile", lambda function: function)
    flags = []
    call = Transformer.__call__

    def spy(self, *args, **kwargs):
        if kwargs.get("training"):  # a training step (not Keras' spec probes)
            flags.append(_checks.inputs_were_checked())
        return call(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "__call__", spy)
    x, y = seq2seq_batch(np.random.default_rng(12), batch=4)
    models = {}
    for jit_compile in (False, True):
        keras.utils.set_random_seed(46)
        model = small_model(num_layers=1)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
        flags.clear()
        model.fit(_Batches([(x, y)] * 2), epochs=1, shuffle=False, verbose=0)
        models[jit_compile] = model, list(flags)
    (eager, eager_flags), (compiled, compiled_flags) = models[False], models[True]
    assert eager_flags == [False, False]
    assert compiled_flags == [True, True]  # no check inside the step
    for a, b in zip(eager.trainable_weights, compiled.trainable_weights, strict=True):
        np.testing.assert_allclose(to_np(a), to_np(b), atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        compiled.predict(x, verbose=0), eager.predict(x, verbose=0), atol=1e-6
    )

    _, bad = _streams()
    trained = [to_np(w) for w in compiled.trainable_weights]
    for call_with_bad_batch in (
        lambda: compiled.fit(_Batches([(bad, y)]), epochs=1, verbose=0),
        lambda: compiled.evaluate(_Batches([(bad, y)]), verbose=0),
        lambda: compiled.predict(_Batches([bad]), verbose=0),
    ):
        with pytest.raises(ValueError, match=BAD_ID_ERROR):
            call_with_bad_batch()
    assert int(to_np(compiled.optimizer.iterations)) == 2
    for w, t in zip(compiled.trainable_weights, trained, strict=True):
        np.testing.assert_array_equal(to_np(w), t)


# ---------------------------------------------------------------------------
# 9. Construction errors
# ---------------------------------------------------------------------------
def test_d_model_not_divisible_by_num_heads_names_both_numbers():
    with pytest.raises(ValueError, match=r"divisible") as info:
        kt.build_model("tiny", src_vocab_size=40, d_model=30, num_heads=4)
    assert "num_heads=4" in str(info.value)
    assert "d_model=30" in str(info.value)


def test_unknown_config_name_raises():
    with pytest.raises(ValueError, match=r"Unknown config name.*'huge'"):
        kt.build_model("huge", src_vocab_size=40)


def test_unknown_keyword_raises():
    with pytest.raises(TypeError, match="num_layer"):
        kt.build_model("tiny", src_vocab_size=40, num_layer=2)


# ---------------------------------------------------------------------------
# 10. The fused attention kernel is used wherever it can be
# ---------------------------------------------------------------------------
def _spy_on_fused_attention(monkeypatch):
    """Record the query dtype of every `keras.ops.dot_product_attention` call.

    The layers call it as `ops.dot_product_attention` after `from keras import
    ops`, and that `ops` is the `keras.ops` module: patching its attribute
    reaches them. Install the spy after building a functional model, whose
    construction calls the layers symbolically.
    """
    calls = []
    original = keras.ops.dot_product_attention

    def spy(*args, **kwargs):
        query = kwargs["query"] if "query" in kwargs else args[0]
        calls.append(keras.backend.standardize_dtype(query.dtype))
        return original(*args, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    return calls


def _fused_calls_in_one_forward(model, x, training, monkeypatch):
    """The spy's record of one forward pass of ``model``.

    An eager call on TensorFlow and PyTorch. On JAX the pass is traced
    (`jax.eval_shape` of `stateless_call`, no compilation): which path each
    layer takes is decided in Python, so the trace runs the same branches as
    an eager call, which would compile op by op (seconds per case).
    """
    calls = _spy_on_fused_attention(monkeypatch)
    if BACKEND == "jax":
        import jax

        def run(trainable, non_trainable, inputs):
            return model.stateless_call(
                trainable, non_trainable, inputs, training=training
            )[0]

        out = jax.eval_shape(
            run,
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            x,
        )
    else:
        out = model(x, training=training)
    assert tuple(out.shape) == x["decoder_inputs"].shape + (VOCAB,)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize(
    "attention_dropout, training, dtype, fused",
    [
        (0.0, True, None, True),
        (0.1, True, None, False),  # dropout on the weights needs the weights
        (0.1, False, None, True),  # ... but only in training
        # PyTorch's CPU kernel in bfloat16 is slower than the explicit path
        # (backend.fused_attention_is_slower); the suite runs on the CPU.
        (0.0, True, "mixed_bfloat16", BACKEND != "torch"),
    ],
    ids=["train", "attention_dropout-train", "attention_dropout-eval", "bfloat16"],
)
def test_forward_pass_uses_the_fused_attention_kernel(
    monkeypatch, attention_dropout, training, dtype, fused
):
    num_layers = 2
    model = small_model(
        num_layers=num_layers,
        dropout=0.1,
        attention_dropout=attention_dropout,
        dtype=dtype,
    )
    # Padded rows: the padding masks go to the kernel with the queries.
    x, _ = seq2seq_batch(np.random.default_rng(11), batch=2, src_len=5, tgt_len=4)
    calls = _fused_calls_in_one_forward(model, x, training, monkeypatch)
    # Per layer: encoder self-attention, decoder self-attention, cross-attention.
    assert len(calls) == (3 * num_layers if fused else 0)
    compute_dtype = "bfloat16" if dtype else "float32"
    assert calls == [compute_dtype] * len(calls)


@pytest.mark.slow
def test_train_on_batch_traces_the_fused_attention_kernel(monkeypatch):
    num_layers = 1
    model = compile_small(
        small_model(num_layers=num_layers, dropout=0.1, attention_dropout=0.0)
    )
    x, y = seq2seq_batch(np.random.default_rng(12), batch=2, src_len=5, tgt_len=4)
    calls = _spy_on_fused_attention(monkeypatch)
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    # Compiled steps call it while tracing, eager ones on every call; either
    # way every forward pass makes all three attentions of a layer fused.
    assert len(calls) > 0
    assert len(calls) % (3 * num_layers) == 0


@pytest.mark.slow
def test_attention_weights_requests_take_the_explicit_path(monkeypatch):
    rng = np.random.default_rng(13)
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    memory = rng.normal(size=(2, 6, 32)).astype("float32")
    blocks = dict(d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    encoder, decoder = kt.EncoderBlock(**blocks), kt.DecoderBlock(**blocks)
    calls = _spy_on_fused_attention(monkeypatch)
    # As kt.attention_maps asks for them: the weights need the explicit path.
    _, weights = encoder(x, return_attention_scores=True)
    _, (self_weights, cross_weights) = decoder(x, memory, return_attention_scores=True)
    assert calls == []
    assert tuple(weights.shape) == (2, 4, 5, 5)
    assert tuple(self_weights.shape) == (2, 4, 5, 5)
    assert tuple(cross_weights.shape) == (2, 4, 5, 6)
    # The same blocks without weights take the kernel.
    encoder(x)
    decoder(x, memory)
    assert len(calls) == 3


def test_the_model_holds_its_config_and_derives_get_config_from_it():
    model = kt.build_model("tiny", src_vocab_size=40, d_model=32, num_heads=2)
    assert model.config == kt.transformer_config("tiny", d_model=32, num_heads=2)
    assert model.d_model == 32 and model.num_layers == model.config.num_layers == 2
    config = model.get_config()
    assert {k: config[k] for k in ("src_vocab_size", "tgt_vocab_size")} == {
        "src_vocab_size": 40,
        "tgt_vocab_size": 40,
    }
    assert kt.TransformerConfig(**{
        k: v for k, v in config.items()
        if k not in ("name", "trainable", "dtype", "src_vocab_size", "tgt_vocab_size")
    }) == model.config  # fmt: skip
    again = Transformer.from_config(config)
    assert again.config == model.config and again.count_params() == model.count_params()


def test_the_old_names_still_work_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="transformer_config"):
        assert kt.get_config("tiny", d_model=64) == kt.transformer_config(
            "tiny", d_model=64
        )
    from keras_transformer.trainer import allocator

    with pytest.warns(DeprecationWarning, match="keras_transformer.trainer.allocator"):
        assert kt.keep_freed_memory is allocator.keep_freed_memory
    assert "keep_freed_memory" not in kt.__all__ and "get_config" not in kt.__all__
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        kt.missing  # noqa: B018
