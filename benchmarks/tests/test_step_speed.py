"""Tests of ``benchmarks/step_speed.py``: the
paired timing's bookkeeping, the reading of XLA's HLO, the profile's split
into matrix products and the rest, the tables and the arguments. Tiny models
(test_training_speed's TINY); what is tested is the bookkeeping, not speed."""

import dataclasses

import pytest

from benchmarks import step_speed
from benchmarks.tests.test_training_speed import KERAS_HUB_MASK_WARNINGS, TINY
from conftest import BACKEND

HLO = """\
HloModule jit_train_step, entry_computation_layout={()->f32[]}

%inner_dot (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = f32[4,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%outer (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = f32[4,4]{1,0} parameter(1)
  ROOT %nested = f32[4,4]{1,0} fusion(%p0, %p1), kind=kOutput, calls=%inner_dot
}

%elementwise (p0: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  ROOT %exp.2 = f32[4,4]{1,0} exponential(%p0)
}

%body (t: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %t = (s32[], f32[4,4]{1,0}) parameter(0)
  ROOT %copy.9 = (s32[], f32[4,4]{1,0}) copy(%t)
}

%cond (t: (s32[], f32[4,4])) -> pred[] {
  %t = (s32[], f32[4,4]{1,0}) parameter(0)
  ROOT %c = pred[] constant(false)
}

ENTRY %main.3 (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0), metadata={op_name="jit(train_step)/a"}
  %b = f32[4,4]{1,0} parameter(1)
  %ynn_fusion.7 = f32[4,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%outer, metadata={op_name="jit(train_step)/dense/dot_general"}
  %wrapped_exponential = f32[4,4]{1,0} fusion(%ynn_fusion.7), kind=kLoop, calls=%elementwise, metadata={op_name="jit(train_step)/loss/exp"}
  %dot.4 = f32[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %tuple = (s32[], f32[4,4]{1,0}) tuple(%a, %b)
  %while.5 = (s32[], f32[4,4]{1,0}) while(%tuple), condition=%cond, body=%body
  ROOT %add.6 = f32[4,4]{1,0} add(%wrapped_exponential, %dot.4)
}
"""  # noqa: E501 (HLO as XLA writes it)


def test_xla_matmul_ops_finds_dots_at_any_depth():
    ops = step_speed.xla_matmul_ops(HLO)
    assert ops["ynn_fusion.7"] is True  # fusion -> fusion -> dot
    assert ops["dot.4"] is True
    assert ops["nested"] is True
    assert ops["wrapped_exponential"] is False
    assert ops["add.6"] is False
    assert ops["copy.9"] is False
    assert "while.5" not in ops  # its body's operations are timed instead


def test_xla_labels_come_from_the_metadata():
    labels = step_speed._xla_labels(HLO)
    assert labels["ynn_fusion.7"] == "jit(train_step)/dense/dot_general"
    assert labels["wrapped_exponential"] == "jit(train_step)/loss/exp"
    assert "dot.4" not in labels


def test_summary_takes_the_ratio_per_round():
    medians = {"ours": [1.0, 2.0, 4.0], "keras_hub": [2.0, 2.0, 2.0]}
    rows = {r["variant"]: r for r in step_speed.summary("jax", TINY, medians)}
    assert rows["ours"]["median_step_seconds"] == 2.0
    # Per round: 2/1, 2/2, 2/4; not the ratio of the medians alone.
    assert rows["ours"]["speed_over_keras_hub"] == 1.0
    assert rows["ours"]["speed_over_keras_hub_range"] == (0.5, 2.0)
    assert rows["keras_hub"]["speed_over_keras_hub"] == 1.0
    table = step_speed.speed_table(list(rows.values()))
    assert "| jax | float32 | ours |" in table
    assert "1.00x (0.50–2.00)" in table
    assert "page_faults_per_step" not in rows["ours"]


def test_summary_gives_the_median_page_faults_per_step():
    medians = {"ours": [1.0, 1.0, 1.0], "keras_hub": [2.0, 2.0, 2.0]}
    faults = {"ours": [3.0, 90000.0, 5.0], "keras_hub": []}
    rows = {r["variant"]: r for r in step_speed.summary("jax", TINY, medians, faults)}
    assert rows["ours"]["page_faults_per_step"] == 5.0
    assert "page_faults_per_step" not in rows["keras_hub"]
    table = step_speed.speed_table([rows["ours"], rows["keras_hub"]])
    assert table.splitlines()[2].endswith("| 5 |")
    assert table.splitlines()[3].endswith("| – |")


def test_summary_without_keras_hub_has_no_ratio():
    rows = step_speed.summary("jax", TINY, {"ours": [1.0, 1.0]})
    assert "speed_over_keras_hub" not in rows[0]
    assert "| – |" in step_speed.speed_table(rows)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "ours,nope"], "unknown variants"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--profile", "--variants", "ours,step_floor"], "are not models"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        step_speed.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.once  # the turns' bookkeeping; each backend's profile is below
@KERAS_HUB_MASK_WARNINGS
def test_paired_trains_every_variant_in_turns():
    s = dataclasses.replace(TINY, steps=2, warmup=1)
    # ours_own_loss builds as ours does (test_training_speed trains it)
    variants = ["ours", "keras_hub", "matmul_floor", "step_floor"]
    medians, faults = step_speed.paired(s, variants, rounds=2)
    assert set(medians) == set(faults) == set(variants)
    for steps in medians.values():
        assert len(steps) == 2 and all(t > 0 for t in steps)
    for counts in faults.values():
        assert len(counts) == 2 and all(c >= 0 for c in counts)


@pytest.mark.slow
def test_profile_splits_the_step_into_matrix_products_and_the_rest():
    s = dataclasses.replace(TINY, steps=2, warmup=1)
    r = step_speed.profile_isolated(BACKEND, "ours", s)
    assert (r["backend"], r["variant"]) == (BACKEND, "ours")
    assert 0 < r["matmul_seconds_per_step"] < r["op_seconds_per_step"]
    assert 0 < r["matmul_share"] < 1
    assert r["largest_others"] and all(sec > 0 for _, sec in r["largest_others"])
    assert "| ours |" in step_speed.profile_table([r])


def test_short_labels_keep_whole_path_components():
    label = "jit(train_step)/transpose(jvp(loss))/loss_name/jit(log_softmax)/exp"
    assert step_speed._short(label, width=30) == "loss_name/jit(log_softmax)/exp"
    assert step_speed._short("aten::mm") == "aten::mm"
