"""Tests of the matrix products of one training step, run alone
(benchmarks/matmul_floor.py; ``benchmarks.step_speed``'s
``matmul_floor`` row): the list of products against the benchmark's own
FLOP formula, the backward products' shapes, and the products' values
against NumPy on the backend under test."""

import dataclasses

import numpy as np
import pytest

from benchmarks import matmul_floor
from benchmarks import training_speed as benchmark
from benchmarks.tests.test_training_speed import TINY

# bfloat16's unit roundoff: 8 significant bits, round to nearest.
BF16_U = 2.0**-8

SETTINGS = [
    TINY,
    benchmark.CPU_SETTING,
    benchmark.GPU_SETTING,
    # source and target of different lengths: cross-attention's K and V run
    # over the source's tokens, its Q and output over the target's
    dataclasses.replace(TINY, source_length=12, target_length=5),
]


@pytest.mark.parametrize("s", SETTINGS, ids=range(len(SETTINGS)))
def test_products_count_the_flops_of_the_benchmarks_formula(s):
    # Two counts written separately: training_flops sums the model's
    # layers by formula (backward = twice forward); step_flops multiplies
    # out the shapes of every product it runs.
    assert matmul_floor.step_flops(s) == benchmark.training_flops(s)


def test_every_product_has_its_two_gradients():
    products = matmul_floor.step_products(TINY)
    forward = matmul_floor.forward_products(TINY)
    assert len(products) == 3 * len(forward)
    for i, (a, b) in enumerate(forward):
        assert products[3 * i] == (a, b)
        d_c = products[3 * i + 1][0]
        assert d_c == (*a[:-1], b[-1])  # the shape of C = A·B
        # dC·Bᵀ has A's shape, Aᵀ·dC has B's
        assert (*d_c[:-1], products[3 * i + 1][1][-1]) == a
        assert (*products[3 * i + 2][0][:-1], products[3 * i + 2][1][-1]) == b


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_products_equal_numpys(policy):
    import keras

    s = dataclasses.replace(TINY, dtype_policy=policy)
    outputs = matmul_floor.products_step(s)()
    operands = matmul_floor.step_operands(s)
    assert len(outputs) == len(operands)
    for out, (a, b) in zip(outputs, operands, strict=True):
        assert keras.backend.standardize_dtype(out.dtype) == (
            "float32" if policy == "float32" else "bfloat16"
        )
        expected = a.astype("float64") @ b
        got = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
        if policy == "float32":
            scale = np.sqrt(a.shape[-1])  # each element sums a.shape[-1] products
            np.testing.assert_allclose(got, expected, atol=1e-4 * scale, rtol=0)
            continue
        # bfloat16 keeps 8 significant bits: rounding changes a value by at
        # most BF16_U of itself. Each operand rounds once (a product's error
        # is at most 2 * BF16_U of |a_ik * b_kj|), the sum accumulates in
        # float32 (bfloat16 dot-product instructions do, and so does their
        # emulation, which converts to float32), whose error for these short
        # sums is far below BF16_U, and the result rounds once more.
        # A bound on each element from the operands alone, whatever the
        # CPU's order of summation; 3 for 2 covers the float32 sum and the
        # second-order terms.
        bound = 3 * BF16_U * (np.abs(a) @ np.abs(b)) + BF16_U * np.abs(expected)
        ratio = np.abs(got - expected) / bound
        assert ratio.max() <= 1, (a.shape, b.shape, ratio.max())


def test_loss_and_gradient_equal_numpys():
    import keras

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, 3, 7)).astype("float32")
    labels = rng.integers(0, 7, (2, 3)).astype("int32")
    loss, gradient = matmul_floor.loss_and_gradient(
        keras.ops.convert_to_tensor(logits), keras.ops.convert_to_tensor(labels)
    )
    # NumPy from the definitions: −mean log softmax(z)[y]; (softmax − onehot)/N
    e = np.exp(logits - logits.max(-1, keepdims=True))
    softmax = e / e.sum(-1, keepdims=True)
    onehot = np.eye(7, dtype="float32")[labels]
    expected = -np.log((softmax * onehot).sum(-1)).mean()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(gradient), (softmax - onehot) / 6, atol=1e-6
    )


def test_the_step_floor_updates_ours_variables_with_adam():
    import keras

    run = matmul_floor.step_floor(TINY)

    def values():
        return [np.array(keras.ops.convert_to_numpy(v)) for v in run()]

    first, second = values(), values()
    assert len(first) == len(second) > 0
    # The same gradients twice: Adam moves each weight by about its learning
    # rate (1e-4) again, less where a gradient is within Adam's epsilon of 0.
    pairs = zip(first, second, strict=True)
    moves = np.concatenate([np.abs(b - a).ravel() for a, b in pairs])
    assert moves.max() <= 1.01e-4
    np.testing.assert_allclose(np.median(moves), 1e-4, rtol=1e-2)
