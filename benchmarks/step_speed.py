"""Training step speed of ours against keras-hub's layers, measured in pairs.

    KERAS_BACKEND=jax python -m benchmarks.step_speed           # one backend
    python -m benchmarks.step_speed --all-backends --dtype-policy mixed_bfloat16
    KERAS_BACKEND=jax python -m benchmarks.step_speed --profile # where the time goes

The models and batches are ``benchmarks.training_speed``'s (vocabulary 8,000, 3 + 3
layers, d_model 256, batches of 32 × 32). ``benchmarks.training_speed`` trains each
variant in a process of its own, which is right for peak memory but not for
a ratio: on a small, busy machine a process can land in a slow mode for its
whole life (JAX's step time on two cores differs noticeably from one
process to the next), and a ratio of two processes carries both draws. Here
all variants are built in **one** process and trained in turns: ``--rounds``
rounds of ``--steps`` steps each, the order reversed every other round, after
a warm-up that compiles each. The ratio is taken per round (the median step
of keras-hub's layers over ours in that round), and the median and range of
the rounds' ratios is the figure. The last column counts the page faults
the process took per step of each variant (median over the rounds): tens of
thousands mean the step gets fresh memory from the kernel every time
(``keras_transformer.trainer.allocator``).

Variants: ``ours`` (Keras' ``SparseCategoricalCrossentropy``, as keras-hub's
guides train), ``ours_own_loss`` (the loss this package recommends,
``LabelSmoothedCrossEntropy``, ε = 0.1), ``keras_hub``; and two floors
that are not models (``benchmarks/matmul_floor.py``):
``matmul_floor``, the step's matrix products alone, and ``step_floor``, those
with the loss and Adam's update. keras-hub's step over a floor is the most
any implementation of the model could beat keras-hub's layers by.

``--profile`` traces ``--steps`` steps of each variant with the backend's
profiler and reports the share of the operations' time that goes to matrix
products: on JAX every XLA operation that computes a ``dot`` (fused or not),
on PyTorch ``aten::mm``/``bmm``/``addmm``/``baddbmm`` and the fused attention
kernel, on TensorFlow ``MatMul``/``BatchMatMul``/``Einsum`` kernels. Times
are summed over the threads that run operations, so the share is of the CPU
time the step's operations use, not of the wall time.
"""

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import child_env, matmul_floor, python_module, timing
from benchmarks import training_speed as benchmark
from keras_transformer.cli._process import prepare_process

VARIANTS = ("ours", "ours_own_loss", "keras_hub", "matmul_floor", "step_floor")
FLOORS = {
    "matmul_floor": matmul_floor.products_step,
    "step_floor": matmul_floor.step_floor,
}
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v not in FLOORS)


def _fit(model, batches, rows, batch_size):
    """Step times of ``model.fit`` on ``rows`` of ``batches``."""
    return benchmark.fit_step_times(model, [a[rows] for a in batches], batch_size)


def _minor_faults():
    """Page faults the kernel served this process without disk reads so far,
    or None where ``resource`` is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def paired(s, variants, rounds):
    """Median step per variant and per round, all variants in this process;
    and each round's page faults per step (None without ``resource``)."""
    import keras

    keras.config.set_dtype_policy(s.dtype_policy)
    batches = benchmark.make_batches(dataclasses.replace(s, warmup=0))
    rows = slice(0, s.steps * s.batch_size)
    models = {}
    for v in variants:
        if v in FLOORS:
            run = FLOORS[v](s)
            models[v] = lambda _, rows, run=run: timing.call_times(
                run, (rows.stop - rows.start) // s.batch_size
            )
        else:
            model = benchmark.compiled_keras_model(s, v)
            models[v] = functools.partial(_fit, model, batch_size=s.batch_size)
    for step in models.values():  # compiles; not timed
        step(batches, slice(0, s.warmup * s.batch_size))
    medians = {v: [] for v in variants}
    faults = {v: [] for v in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for variant in order:
            before = _minor_faults()
            times = models[variant](batches, rows)
            medians[variant].append(statistics.median(times))
            if before is not None:
                faults[variant].append((_minor_faults() - before) / s.steps)
    return medians, faults


def summary(backend, s, medians, faults=None):
    """One dict per variant: median step over the rounds, tokens per second,
    keras-hub's step over this variant's, per round (median, range), and
    the median page faults per step where ``faults`` has them."""
    labels = benchmark.make_batches(dataclasses.replace(s, warmup=0))[2]
    tokens = benchmark.target_tokens_per_step(labels, s.batch_size)
    hub = medians.get("keras_hub")
    rows = []
    for variant, steps in medians.items():
        row = {
            "backend": backend,
            "dtype_policy": s.dtype_policy,
            "variant": variant,
            "median_step_seconds": statistics.median(steps),
            "target_tokens_per_second": tokens / statistics.median(steps),
            "round_step_seconds": steps,
        }
        if hub:
            ratios = sorted(h / o for h, o in zip(hub, steps, strict=True))
            row["speed_over_keras_hub"] = statistics.median(ratios)
            row["speed_over_keras_hub_range"] = (ratios[0], ratios[-1])
        if faults and faults.get(variant):
            row["page_faults_per_step"] = statistics.median(faults[variant])
        rows.append(row)
    return rows


# -- where the time goes ------------------------------------------------------

_TORCH_MATMUL = (
    "aten::mm",
    "aten::bmm",
    "aten::addmm",
    "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
)
_TF_MATMUL = ("MatMul", "Einsum", "Conv")
_XLA_CONTROL = ("while", "conditional", "call")


def xla_matmul_ops(hlo_text):
    """``{instruction: computes a dot}`` for an optimized HLO module's text.

    A fusion computes a dot when its computation holds one, at any depth.
    Control flow (``while``, ``conditional``, ``call``) is left out: the
    profiler times its body's operations one by one.
    """
    import re

    instruction = re.compile(
        r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\([^=]*?\)|\S+)\s+([\w\-]+)\("
    )
    called = re.compile(
        r"(?:calls|body|condition|to_apply|branch_computations)=\{?%?([\w.\-]+)"
    )
    computations, current, ops = {}, None, {}
    for line in hlo_text.splitlines():
        header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(1), [])
            continue
        found = instruction.match(line)
        if found and current is not None:
            name, op = found.groups()
            current.append((name, op, called.findall(line)))
            ops[name] = (op, called.findall(line))
    has_dot = {}

    def dot_inside(computation, seen=()):
        if computation not in has_dot:
            has_dot[computation] = any(
                op in ("dot", "convolution")
                or any(dot_inside(c, seen + (computation,)) for c in calls)
                for _, op, calls in computations.get(computation, [])
                if computation not in seen
            )
        return has_dot[computation]

    return {
        name: op in ("dot", "convolution") or any(dot_inside(c) for c in calls)
        for name, (op, calls) in ops.items()
        if op not in _XLA_CONTROL
    }


def _xla_labels(hlo_text):
    """``{instruction: the JAX operation it came from}`` (HLO metadata)."""
    import re

    found = re.finditer(
        r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name=\"([^\"]*)\"", hlo_text, re.M
    )
    return {m.group(1): m.group(2) for m in found}


def _profile_jax(fit, workdir):
    """(op seconds by label, matmul seconds) of ``fit()``, from jax.profiler
    and the train step's optimized HLO, which the process dumped to
    ``workdir/hlo`` (``XLA_FLAGS``, set by ``profile_isolated``)."""
    import collections
    import glob

    import jax

    trace = os.path.join(workdir, "trace")
    with jax.profiler.trace(trace):
        fit()
    dumps = [
        p
        for p in glob.glob(os.path.join(workdir, "hlo", "*train_step*.txt"))
        if p.endswith("_after_optimizations.txt")
    ]
    with open(max(dumps, key=os.path.getsize)) as f:
        hlo = f.read()
    is_matmul, labels = xla_matmul_ops(hlo), _xla_labels(hlo)
    path = glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)[0]
    by_label, matmul = collections.Counter(), 0.0
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                if event.name not in is_matmul:
                    continue
                seconds = event.duration_ns / 1e9
                if is_matmul[event.name]:
                    matmul += seconds
                else:
                    by_label[labels.get(event.name, event.name)] += seconds
    return by_label, matmul


def _profile_torch(fit, workdir):
    import collections

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fit()
    by_label, matmul = collections.Counter(), 0.0
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if event.key in _TORCH_MATMUL:
            matmul += seconds
        else:
            by_label[event.key] += seconds
    return by_label, matmul


def _profile_tensorflow(fit, workdir):
    """TensorFlow's trace, read with JAX's reader of the same file format;
    kernel events are named ``node/path:OpType``."""
    import collections
    import glob

    import jax
    import tensorflow as tf

    tf.profiler.experimental.start(workdir)
    try:
        fit()
    finally:
        tf.profiler.experimental.stop()
    path = glob.glob(os.path.join(workdir, "**", "*.xplane.pb"), recursive=True)[0]
    by_label, matmul = collections.Counter(), 0.0
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                node, _, op_type = event.name.rpartition(":")
                if not node or "::" in event.name:  # not a kernel
                    continue
                seconds = event.duration_ns / 1e9
                if any(kind in op_type for kind in _TF_MATMUL):
                    matmul += seconds
                else:
                    by_label[op_type] += seconds
    return by_label, matmul


def _short(label, width=70):
    """The last components of an operation's path that fit ``width``."""
    parts = label.replace("jit(train_step)/", "").split("/")
    while len(parts) > 1 and len("/".join(parts)) > width:
        parts.pop(0)
    return "/".join(parts)


PROFILERS = {
    "jax": _profile_jax,
    "torch": _profile_torch,
    "tensorflow": _profile_tensorflow,
}


def profile(s, variant, workdir):
    """Wall step time, and the operations' time split into matrix products
    and the rest (the largest of the rest by name), per step."""
    import keras

    keras.config.set_dtype_policy(s.dtype_policy)
    batches = benchmark.make_batches(dataclasses.replace(s, warmup=0))
    model = benchmark.compiled_keras_model(s, variant)
    _fit(model, batches, slice(0, s.warmup * s.batch_size), s.batch_size)

    def fit():
        return _fit(model, batches, slice(0, s.steps * s.batch_size), s.batch_size)

    step = statistics.median(fit())
    backend = keras.backend.backend()
    others, matmul = PROFILERS[backend](fit, workdir)
    total = matmul + sum(others.values())
    return {
        "backend": backend,
        "dtype_policy": s.dtype_policy,
        "variant": variant,
        "median_step_seconds": step,
        "op_seconds_per_step": total / s.steps,
        "matmul_seconds_per_step": matmul / s.steps,
        "matmul_share": matmul / total,
        "largest_others": [
            (_short(label), seconds / s.steps)
            for label, seconds in others.most_common(8)
        ],
    }


# -- processes, tables, the command -------------------------------------------


def _run(backend, args, env=None):
    """This module with ``args`` in a fresh process under ``backend``; the
    JSON it prints last."""
    env = dict(env or child_env(), KERAS_BACKEND=backend)
    command = python_module("benchmarks.step_speed")
    done = subprocess.run(
        command + ["--in-process", "--json", "-"] + args,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"{args} on {backend} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_isolated(backend, variant, s):
    """``profile`` in a fresh process; on JAX that process dumps its optimized
    HLO, which tells which profiled operations are matrix products."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kt-profile-") as workdir:
        env = dict(os.environ)
        if backend == "jax":
            dump = f"--xla_dump_to={workdir}/hlo --xla_dump_hlo_as_text"
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {dump}".strip()
        setting = json.dumps(dataclasses.asdict(s))
        args = ["--profile", "--variants", variant, "--setting-json", setting]
        return _run(backend, args + ["--workdir", workdir], env)[0]


def speed_table(rows):
    lines = [
        "| backend | policy | variant | target tok/s | step (ms) "
        "| keras-hub's step / this (range over rounds) | page faults / step |",
        "|---|---|---|---:|---:|---|---:|",
    ]
    for r in rows:
        ratio = "–"
        if "speed_over_keras_hub" in r:
            low, high = r["speed_over_keras_hub_range"]
            ratio = f"{r['speed_over_keras_hub']:.2f}x ({low:.2f}–{high:.2f})"
        faults = r.get("page_faults_per_step")
        lines.append(
            f"| {r['backend']} | {r['dtype_policy']} | {r['variant']} "
            f"| {r['target_tokens_per_second']:,.0f} "
            f"| {1000 * r['median_step_seconds']:.0f} | {ratio} "
            f"| {'–' if faults is None else f'{faults:,.0f}'} |"
        )
    return "\n".join(lines)


def profile_table(rows):
    lines = [
        "| backend | policy | variant | step (ms) | operations (ms) "
        "| matrix products (ms) | share | largest other operations (ms) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        others = "; ".join(
            f"{label} {1000 * seconds:.1f}"
            for label, seconds in r["largest_others"][:4]
        )
        lines.append(
            f"| {r['backend']} | {r['dtype_policy']} | {r['variant']} "
            f"| {1000 * r['median_step_seconds']:.0f} "
            f"| {1000 * r['op_seconds_per_step']:.0f} "
            f"| {1000 * r['matmul_seconds_per_step']:.0f} "
            f"| {100 * r['matmul_share']:.0f} % | {others} |"
        )
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.step_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--all-backends", action="store_true")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma-separated, from "
        + ", ".join(VARIANTS)
        + " (default: the three models)",
    )
    parser.add_argument(
        "--dtype-policy", choices=("float32", "mixed_bfloat16"), default="float32"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3, help="steps that compile")
    parser.add_argument(
        "--profile", action="store_true", help="matrix products' share, per variant"
    )
    parser.add_argument("--json", help="also write the results here ('-': stdout)")
    # internal: one backend in this process
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting-json", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    floors = set(FLOORS) & set(args.variants.split(","))
    if args.profile and floors:
        parser.error(f"--profile profiles models; {sorted(floors)} are not models")
    for name in ("steps", "rounds", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def _in_process(args):
    import keras

    s = benchmark.Setting(**json.loads(args.setting_json))
    variants = args.variants.split(",")
    if args.profile:
        return [profile(s, variants[0], args.workdir)]
    return summary(keras.backend.backend(), s, *paired(s, variants, args.rounds))


def main(argv=None):
    args = parse_args(argv)
    prepare_process()
    if args.in_process:
        results = _in_process(args)
        print(json.dumps(results))
        return results
    s = dataclasses.replace(
        benchmark.CPU_SETTING,
        dtype_policy=args.dtype_policy,
        steps=args.steps,
        warmup=args.warmup,
    )
    if args.all_backends:
        backends = benchmark.BACKENDS
    else:
        import keras

        backends = (keras.backend.backend(),)
    variants = args.variants.split(",")
    setting = json.dumps(dataclasses.asdict(s))
    results = []
    for backend in backends:
        print(f"... {backend}", file=sys.stderr, flush=True)
        if args.profile:
            results += [profile_isolated(backend, v, s) for v in variants]
        else:
            rounds = ["--rounds", str(args.rounds), "--setting-json", setting]
            results += _run(backend, ["--variants", args.variants] + rounds)
    if args.json == "-":
        print(json.dumps(results))
        return results
    print(f"{os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d %H:%M')}; {s}")
    print(profile_table(results) if args.profile else speed_table(results))
    if args.json:
        from keras_transformer.trainer.checkpoints import write_json_atomic

        write_json_atomic(
            args.json, {"setting": dataclasses.asdict(s), "runs": results}
        )
    return results


if __name__ == "__main__":
    main()
