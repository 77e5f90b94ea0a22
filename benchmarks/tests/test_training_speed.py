"""Tests of `benchmarks/training_speed.py`, the training-speed comparison.

Runs under every KERAS_BACKEND, in-process (the benchmark's own subprocesses,
`run_isolated`, are replaced by fakes where `main` is tested). The models are
tiny (one layer, d_model=16, batches of 4 x 8 tokens, 2 + 1 steps) to keep
the file fast on two CPU cores: what is tested is the bookkeeping (batches,
FLOPs, the numbers `measure` returns, the table, the arguments), not speed.
"""

import dataclasses
import json
import math

import keras
import numpy as np
import pytest

import keras_transformer as kt
from benchmarks import training_speed as benchmark

BACKEND = keras.backend.backend()
TINY = dataclasses.replace(
    benchmark.CPU_SETTING,
    vocab_size=50,
    num_layers=1,
    d_model=16,
    num_heads=2,
    d_ff=32,
    batch_size=4,
    source_length=8,
    target_length=8,
    steps=2,
    warmup=1,
)

# keras-hub's own sub-layers (its PositionEmbedding inside
# TokenAndPositionEmbedding, the EinsumDense projections inside its attention)
# do not support masking, and Keras warns when they receive the mask that
# keras-hub itself attaches. Third-party; the blocks apply the mask themselves.
KERAS_HUB_MASK_WARNINGS = pytest.mark.filterwarnings(
    r"ignore:Layer '\w+' \(of type \w+\) was passed an input with a mask"
    ":UserWarning"
)


def _positive_finite(x):
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


# ---------------------------------------------------------------------------
# 1. The batches
# ---------------------------------------------------------------------------
@pytest.mark.once
def test_make_batches_shapes_padding_and_shifted_labels():
    s = dataclasses.replace(
        TINY, source_length=12, target_length=10, batch_size=5, steps=30, warmup=2
    )
    source, decoder_inputs, labels = benchmark.make_batches(s)
    rows = (s.steps + s.warmup) * s.batch_size
    assert source.shape == (rows, s.source_length)
    assert decoder_inputs.shape == labels.shape == (rows, s.target_length)
    for a in (source, decoder_inputs, labels):
        assert a.dtype == np.int32

    def real_lengths(a):
        """Non-padding count per row, after checking padding is a tail only."""
        lengths = (a != 0).sum(axis=1)
        prefix = np.arange(a.shape[1])[None, :] < lengths[:, None]
        np.testing.assert_array_equal(a != 0, prefix)
        return lengths

    src_len = real_lengths(source)
    tgt_len = real_lengths(decoder_inputs)
    np.testing.assert_array_equal(real_lengths(labels), tgt_len)
    # Lengths are drawn between half and the full width, both ends reached.
    assert src_len.min() == s.source_length // 2
    assert src_len.max() == s.source_length
    assert tgt_len.min() == s.target_length // 2
    assert tgt_len.max() == s.target_length

    assert (decoder_inputs[:, 0] == benchmark.START_ID).all()
    for i in range(rows):
        n = tgt_len[i]
        # labels = decoder inputs shifted left, END at the last real position.
        np.testing.assert_array_equal(labels[i, : n - 1], decoder_inputs[i, 1:n])
        assert labels[i, n - 1] == benchmark.END_ID
    # Every content token is a real id: not padding, START or END, < vocab.
    content = np.concatenate(
        [
            source[source != 0],
            decoder_inputs[:, 1:][decoder_inputs[:, 1:] != 0],
        ]
    )
    assert content.min() == 3
    assert content.max() == s.vocab_size - 1
    label_ids = labels[labels != 0]
    assert ((label_ids == benchmark.END_ID) | (label_ids >= 3)).all()
    assert label_ids.max() < s.vocab_size
    assert (label_ids == benchmark.END_ID).sum() == rows


@pytest.mark.once
def test_make_batches_is_deterministic_per_seed():
    first = benchmark.make_batches(TINY)
    again = benchmark.make_batches(TINY)
    other = benchmark.make_batches(dataclasses.replace(TINY, seed=1))
    for a, b, c in zip(first, again, other, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.shape == c.shape
        assert not np.array_equal(a, c)


# ---------------------------------------------------------------------------
# 2. Model FLOPs
# ---------------------------------------------------------------------------
def _forward_matmuls(s, batch):
    """Every matrix product ``(m, k, n)`` of one forward pass, one by one.

    The per-head attention products are listed separately for each row and
    head, the projections as one product over all ``batch x length`` rows.
    """
    B, S, T = batch, s.source_length, s.target_length
    d, f, v, h = s.d_model, s.d_ff, s.vocab_size, s.num_heads
    d_k = d // h
    products = []
    for _ in range(s.num_layers):  # encoder layer
        products += [(B * S, d, d)] * 4  # W^Q, W^K, W^V, W^O
        products += [(S, d_k, S), (S, S, d_k)] * (B * h)  # Q Kᵀ, weights V
        products += [(B * S, d, f), (B * S, f, d)]  # feed-forward
    for _ in range(s.num_layers):  # decoder layer
        products += [(B * T, d, d)] * 4  # self-attention W^Q, W^K, W^V, W^O
        products += [(T, d_k, T), (T, T, d_k)] * (B * h)
        products += [(B * T, d, d), (B * S, d, d), (B * S, d, d), (B * T, d, d)]
        products += [(T, d_k, S), (T, S, d_k)] * (B * h)  # cross-attention
        products += [(B * T, d, f), (B * T, f, d)]
    products.append((B * T, d, v))  # pre-softmax projection
    return products


@pytest.mark.once
@pytest.mark.parametrize("num_layers", [1, 2])
def test_training_flops_equal_the_sum_over_every_matrix_product(num_layers):
    # Every dimension different, so that a swapped S/T, d/d_ff or a missing
    # factor shows.
    s = dataclasses.replace(
        TINY,
        num_layers=num_layers,
        vocab_size=50,
        d_model=16,
        num_heads=4,
        d_ff=40,
        source_length=10,
        target_length=6,
        batch_size=3,
    )
    forward = sum(2 * m * k * n for m, k, n in _forward_matmuls(s, 3))
    expected = 3 * forward  # backward = 2 x forward
    assert benchmark.training_flops(s) == expected


# ---------------------------------------------------------------------------
# 3. Measurements on the current backend
# ---------------------------------------------------------------------------
def _check_common_result(r, variant, s):
    assert r["backend"] == BACKEND
    assert r["variant"] == variant
    assert isinstance(r["device"], str) and r["device"]
    for key in (
        "median_step_seconds",
        "first_step_seconds",
        "target_tokens_per_second",
        "model_tflops_per_second",
    ):
        assert _positive_finite(r[key]), (key, r[key])
    assert math.isfinite(r["peak_memory_mib"])
    # Tokens per step: the non-padding labels of a batch, averaged over the
    # batches (the same for every variant, which all train on make_batches).
    labels = benchmark.make_batches(s)[2]
    per_batch = (labels != 0).reshape(-1, s.batch_size * s.target_length).sum(1)
    assert len(per_batch) == s.steps + s.warmup
    assert r["target_tokens_per_step"] == pytest.approx(per_batch.mean())
    assert r["target_tokens_per_second"] == pytest.approx(
        r["target_tokens_per_step"] / r["median_step_seconds"]
    )
    assert r["model_tflops_per_second"] == pytest.approx(
        benchmark.training_flops(s) / r["median_step_seconds"] / 1e12
    )
    json.dumps(r)  # goes through a pipe as JSON in run_isolated


@pytest.mark.slow
def test_measure_ours_trains():
    r = benchmark.measure(TINY, "ours")
    _check_common_result(r, "ours", TINY)
    assert r["parameters"] == benchmark.build_ours(TINY).count_params()
    assert "decoding_tokens_per_second" not in r


@pytest.mark.slow
@pytest.mark.once
def test_measure_ours_with_its_own_loss_compiles_that_loss(monkeypatch):
    import keras

    losses = []
    compile_ = keras.Model.compile

    def spy(model, *args, **kwargs):
        losses.append(kwargs.get("loss"))
        return compile_(model, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "compile", spy)
    r = benchmark.measure(TINY, "ours_own_loss")
    _check_common_result(r, "ours_own_loss", TINY)
    assert isinstance(losses[0], kt.LabelSmoothedCrossEntropy)
    assert losses[0].label_smoothing == 0.1 and losses[0].pad_id == 0
    benchmark.measure(TINY, "ours")
    assert isinstance(losses[1], keras.losses.SparseCategoricalCrossentropy)


# The decoding speeds time `decoding`'s searches, which test_decoding.py checks
# on every backend; what this adds (the keys, one speed per search) is the
# same on all, and compiling both searches is slow on TensorFlow.
@pytest.mark.slow
@pytest.mark.once
def test_measure_ours_decodes():
    r = benchmark.measure(TINY, "ours", decode=True)
    _check_common_result(r, "ours", TINY)
    decoding = r["decoding_tokens_per_second"]
    assert set(decoding) == {"greedy", "beam 4"}
    for name, speed in decoding.items():
        assert _positive_finite(speed), (name, speed)


def _count_layers(model, cls):
    return sum(isinstance(layer, cls) for layer in model.layers)


@pytest.mark.slow
@pytest.mark.once
@KERAS_HUB_MASK_WARNINGS
def test_measure_keras_hub_same_layers_as_ours():
    import keras_hub

    r = benchmark.measure(TINY, "keras_hub", decode=True)
    _check_common_result(r, "keras_hub", TINY)
    assert "decoding_tokens_per_second" not in r  # decoding is ours only
    assert r["parameters"] == benchmark.build_keras_hub(TINY).count_params()

    # Both builders follow the setting's depth and widths.
    s = dataclasses.replace(TINY, num_layers=2)
    hub, ours = benchmark.build_keras_hub(s), benchmark.build_ours(s)
    encoders = [
        layer
        for layer in hub.layers
        if isinstance(layer, keras_hub.layers.TransformerEncoder)
    ]
    decoders = [
        layer
        for layer in hub.layers
        if isinstance(layer, keras_hub.layers.TransformerDecoder)
    ]
    assert len(encoders) == len(decoders) == s.num_layers
    assert _count_layers(ours, kt.EncoderBlock) == s.num_layers
    assert _count_layers(ours, kt.DecoderBlock) == s.num_layers
    for layer in encoders + decoders:
        assert layer.intermediate_dim == s.d_ff
        assert layer.num_heads == s.num_heads
    assert hub.output_shape == ours.output_shape == (None, None, s.vocab_size)


def _nn_transformer_parameters(s):
    """nn.Transformer (post-norm, with final encoder and decoder norms), two
    embeddings and a biased output projection, counted by hand."""
    d, f, v, n = s.d_model, s.d_ff, s.vocab_size, s.num_layers
    attention = 4 * d * d + 4 * d
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder = n * (attention + ffn + 2 * norm) + norm
    decoder = n * (2 * attention + ffn + 3 * norm) + norm
    return 2 * v * d + encoder + decoder + d * v + v


def test_measure_torch_variant_only_under_the_torch_backend():
    if BACKEND != "torch":
        with pytest.raises(ValueError, match=f"KERAS_BACKEND={BACKEND}"):
            benchmark.measure(TINY, "torch")
        return
    r = benchmark.measure(TINY, "torch", decode=True)
    _check_common_result(r, "torch", TINY)
    assert r["parameters"] == _nn_transformer_parameters(TINY)
    assert "decoding_tokens_per_second" not in r


# ---------------------------------------------------------------------------
# 4. The table
# ---------------------------------------------------------------------------
def _result(backend, variant, speed=1000.0, device="cpu", tflops=99.0):
    return {
        "backend": backend,
        "variant": variant,
        "device": device,
        "median_step_seconds": 0.25,
        "first_step_seconds": 2.0,
        "target_tokens_per_step": 250.0,
        "target_tokens_per_second": speed,
        "model_tflops_per_second": tflops,
        "peak_memory_mib": 1536.0,
        "parameters": 1234567,
    }


def _parse_table(markdown):
    """The first markdown table as a list of {column: cell} rows."""
    lines = markdown.splitlines()

    def cells(line):
        assert line.startswith("|") and line.endswith("|"), line
        return [c.strip() for c in line[1:-1].split("|")]

    header = cells(lines[0])
    assert len(cells(lines[1])) == len(header)  # the separator row
    assert set("".join(cells(lines[1]))) <= {"-", ":"}
    rows = []
    for line in lines[2:]:
        if not line:
            break
        row = cells(line)
        assert len(row) == len(header), line
        rows.append(dict(zip(header, row, strict=True)))
    return rows


def _ratio(cell):
    assert cell.endswith("x"), cell
    return float(cell[:-1])


@pytest.mark.once
def test_table_ratios_and_mfu():
    results = [
        _result("torch", "ours", 1000.0, tflops=49.45),
        _result("torch", "keras_hub", 500.0),
        _result("torch", "torch", 800.0),
        _result("jax", "ours", 2000.0),
        _result("jax", "keras_hub", 4000.0),
    ]
    # (ours / this, this / torch nn.Transformer) per row.
    expected = [(1.0, 1.25), (2.0, 0.625), (1.25, 1.0), (1.0, 2.5), (0.5, 5.0)]

    rows = _parse_table(benchmark.table(results))
    assert [(r["backend"], r["variant"]) for r in rows] == [
        (r["backend"], r["variant"]) for r in results
    ]
    for row, (vs_ours, vs_torch) in zip(rows, expected, strict=True):
        assert _ratio(row["ours / this"]) == pytest.approx(vs_ours, abs=0.006)
        assert _ratio(row["this / torch nn.Transformer"]) == pytest.approx(
            vs_torch, abs=0.006
        )
        assert row["step (ms)"] == "250"
        assert row["peak memory (MiB)"] == "1,536"
        assert row["parameters"] == "1,234,567"
    assert rows[0]["target tok/s"] == "1,000"
    assert "MFU" not in rows[0]

    with_mfu = _parse_table(benchmark.table(results, peak_tflops=989.0))
    assert with_mfu[0]["MFU"] == "5.0 %"  # 49.45 / 989
    assert with_mfu[1]["MFU"] == "10.0 %"  # 99 / 989


@pytest.mark.once
def test_ratios_state_both_comparisons():
    results = [
        _result("jax", "ours", 1300.0),
        _result("jax", "ours_own_loss", 1400.0),
        _result("jax", "ours_attention_dropout", 1100.0),
        _result("jax", "keras_hub", 1000.0),
        _result("torch", "ours", 900.0),
        _result("torch", "keras_hub", 1000.0),
        _result("torch", "torch", 1040.0),
    ]
    assert benchmark.ratios(results) == [
        "- jax: ours / keras_hub = 1.30x, with its own loss 1.40x, "
        "with the same attention dropout 1.10x",
        "- torch: ours / keras_hub = 0.90x",
        "- ours on its fastest backend here (jax) / torch nn.Transformer = 1.25x",
    ]
    assert "ours / keras_hub = 1.30x" in benchmark.table(results)


@pytest.mark.once
def test_table_without_native_torch_or_ours():
    rows = _parse_table(benchmark.table([_result("jax", "keras_hub", 300.0)]))
    assert rows[0]["ours / this"] == "–"
    assert rows[0]["this / torch nn.Transformer"] == "–"


@pytest.mark.once
def test_table_lists_decoding_speeds():
    r = _result("jax", "ours")
    r["decoding_tokens_per_second"] = {"greedy": 12345.6, "beam 4": 2345.4}
    text = benchmark.table([r, _result("jax", "keras_hub")])
    assert "| jax | 12,346 | 2,345 |" in text.splitlines()


# ---------------------------------------------------------------------------
# 5. Arguments and main
# ---------------------------------------------------------------------------
def _setting(argv):
    return benchmark.setting_from_args(benchmark.parse_args(argv))


@pytest.mark.once
def test_default_setting_is_the_cpu_setting():
    assert _setting([]) == benchmark.CPU_SETTING


@pytest.mark.once
def test_gpu_flag_selects_base_model_at_25k_tokens_in_bfloat16():
    s = _setting(["--gpu"])
    assert s == benchmark.GPU_SETTING
    base = kt.transformer_config("base")
    assert (s.num_layers, s.d_model, s.num_heads, s.d_ff) == (
        base.num_layers,
        base.d_model,
        base.num_heads,
        base.d_ff,
    )
    assert s.dropout == base.dropout
    assert s.dtype_policy == "mixed_bfloat16"
    # §5.1's ~25,000 target tokens are real tokens: count the padding out.
    _, _, labels = benchmark.make_batches(dataclasses.replace(s, steps=4, warmup=0))
    tokens_per_batch = (labels != 0).sum() / 4
    assert 24_000 <= tokens_per_batch <= 26_000


@pytest.mark.once
def test_config_and_step_arguments_override_the_setting():
    tiny = kt.transformer_config("tiny")
    size = (tiny.num_layers, tiny.d_model, tiny.num_heads, tiny.d_ff)
    s = _setting(["--config", "tiny"])
    assert (s.num_layers, s.d_model, s.num_heads, s.d_ff) == size
    assert s == dataclasses.replace(
        benchmark.CPU_SETTING,
        num_layers=tiny.num_layers,
        d_model=tiny.d_model,
        num_heads=tiny.num_heads,
        d_ff=tiny.d_ff,
    )
    # With --gpu the batch and the dtype policy stay the GPU setting's.
    s = _setting(["--gpu", "--config", "tiny", "--steps", "3", "--warmup", "2"])
    assert (s.num_layers, s.d_model, s.num_heads, s.d_ff) == size
    assert (s.steps, s.warmup) == (3, 2)
    assert s.batch_size == benchmark.GPU_SETTING.batch_size
    assert s.dtype_policy == "mixed_bfloat16"
    assert _setting(["--batch-size", "7"]).batch_size == 7
    assert _setting(["--dtype-policy", "mixed_bfloat16"]).dtype_policy == (
        "mixed_bfloat16"
    )
    assert _setting(["--gpu", "--dtype-policy", "float32"]).dtype_policy == "float32"
    with pytest.raises(ValueError, match="Unknown config name"):
        _setting(["--config", "huge"])


@pytest.mark.once
def test_setting_json_round_trip():
    argv = ["--setting-json", json.dumps(dataclasses.asdict(TINY))]
    assert _setting(argv) == TINY


@pytest.mark.once
def test_peak_tflops_of_known_and_unknown_devices():
    assert benchmark.peak_tflops_of(["NVIDIA H200"]) == 989
    assert benchmark.peak_tflops_of(["cpu", "NVIDIA A100-SXM4-80GB"]) == 312
    assert benchmark.peak_tflops_of(iter(["NVIDIA H100 80GB HBM3"])) == 989
    assert benchmark.peak_tflops_of(["NVIDIA H100 PCIe"]) == 756
    assert benchmark.peak_tflops_of(["cpu"]) is None
    assert benchmark.peak_tflops_of([]) is None


def test_main_in_process_measures_each_variant_and_prints_json(monkeypatch, capsys):
    seen = []

    def fake_measure(s, variant, decode=False):
        seen.append((s, variant, decode))
        return _result(BACKEND, variant)

    monkeypatch.setattr(benchmark, "measure", fake_measure)
    argv = [
        "--in-process",
        "--variants",
        "ours,keras_hub",
        "--setting-json",
        json.dumps(dataclasses.asdict(TINY)),
        "--decode",
        "--json",
        "-",
    ]
    results = benchmark.main(argv)
    assert seen == [(TINY, "ours", True), (TINY, "keras_hub", True)]
    # run_isolated reads the last line of stdout.
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last_line) == results


def _fake_isolated_runs(monkeypatch, device="cpu"):
    runs = []

    def fake_run_isolated(backend, variant, s, decode):
        runs.append((backend, variant, s, decode))
        return _result(backend, variant, device=device)

    monkeypatch.setattr(benchmark, "run_isolated", fake_run_isolated)
    return runs


def test_main_default_variants_on_this_backend_with_mfu_and_json(
    monkeypatch, capsys, tmp_path
):
    runs = _fake_isolated_runs(monkeypatch, device="NVIDIA H200")
    path = tmp_path / "bench.json"
    results = benchmark.main(["--gpu", "--steps", "3", "--json", str(path)])
    s = dataclasses.replace(benchmark.GPU_SETTING, steps=3)
    expected = [
        (BACKEND, "ours", s, True),
        (BACKEND, "ours_own_loss", s, False),
        (BACKEND, "ours_attention_dropout", s, False),
        (BACKEND, "keras_hub", s, False),
    ]
    if BACKEND == "torch":
        expected.append((BACKEND, "torch", s, False))
    assert runs == expected
    out = capsys.readouterr().out
    rows = _parse_table(out[out.index("| backend") :])
    assert [r["MFU"] for r in rows] == ["10.0 %"] * len(expected)  # 99 / 989
    saved = json.loads(path.read_text())
    assert saved == {"setting": dataclasses.asdict(s), "runs": results}


@pytest.mark.once
def test_main_all_backends(monkeypatch, capsys):
    runs = _fake_isolated_runs(monkeypatch)
    benchmark.main(["--all-backends", "--no-decode"])
    assert [(b, v, d) for b, v, _, d in runs] == [
        ("tensorflow", "ours", False),
        ("tensorflow", "ours_own_loss", False),
        ("tensorflow", "ours_attention_dropout", False),
        ("tensorflow", "keras_hub", False),
        ("jax", "ours", False),
        ("jax", "ours_own_loss", False),
        ("jax", "ours_attention_dropout", False),
        ("jax", "keras_hub", False),
        ("torch", "ours", False),
        ("torch", "ours_own_loss", False),
        ("torch", "ours_attention_dropout", False),
        ("torch", "keras_hub", False),
        ("torch", "torch", False),
    ]
    out = capsys.readouterr().out
    assert "MFU" not in out  # a CPU: no known peak
    runs.clear()
    benchmark.main(["--all-backends", "--variants", "ours", "--peak-tflops", "99"])
    assert [(b, v, d) for b, v, _, d in runs] == [
        (b, "ours", True) for b in benchmark.BACKENDS
    ]
    out = capsys.readouterr().out
    rows = _parse_table(out[out.index("| backend") :])
    assert [r["MFU"] for r in rows] == ["100.0 %"] * 3


@pytest.mark.once
def test_time_call_times_a_first_call_then_the_median_of_the_repeats(monkeypatch):
    from benchmarks import timing

    # A fake clock: the first call takes 10 s, the repeats 1, 5 and 2 s.
    durations = iter([10.0, 1.0, 5.0, 2.0])
    clock = [0.0]
    calls = []

    def fn():
        calls.append(1)
        clock[0] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    assert timing.time_call(fn, repeats=3) == (10.0, 2.0)
    assert len(calls) == 4
