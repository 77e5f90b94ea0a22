"""Training speed side by side: this package, keras-hub's layers, PyTorch.

    KERAS_BACKEND=jax python -m benchmarks.training_speed  # one backend
    python -m benchmarks.training_speed --all-backends      # all three
    python -m benchmarks.training_speed --gpu   # base config, ~25k tokens

The same model is built three ways, on the current backend:

- ``ours``: ``keras_transformer.build_model``, trained with ``model.fit``;
- ``keras_hub``: keras-hub's ``TokenAndPositionEmbedding``,
  ``TransformerEncoder``, ``TransformerDecoder`` and a ``Dense`` output,
  trained with ``model.fit``;
- ``torch``: PyTorch's ``nn.Transformer`` with embeddings, sinusoidal
  positions and a linear output, in a plain PyTorch training loop (under the
  torch backend only).

Same vocabulary, layers, d_model, heads, d_ff, dropout, batch and lengths,
the same batches, Adam and cross-entropy over the non-padding targets. Each
variant runs in a fresh process, so that its peak memory is its own. The
throughput is target tokens (non-padding) per second: the median over the
steps after the warm-up (which holds the compilation). On the CPU the peak
memory is the growth of the process' peak resident set from just before the
model is built; on a GPU it is the device's peak allocation.

Two differences are in the libraries, not the benchmark: keras-hub's blocks
use their one ``dropout`` on the attention weights as well as on the
sub-layer outputs (the paper has no attention dropout, and it rules out the
fused attention kernels), and keras-hub's positions are learned. The
``ours_attention_dropout`` variant (``--variants``) shows ours with the same
attention dropout as keras-hub, for a like-for-like regularisation.
``ours_own_loss`` is ours trained with the loss this package recommends,
``LabelSmoothedCrossEntropy`` (ε = 0.1, §5.4): a gather and a sum over the
vocabulary instead of Keras' sparse cross-entropy, which builds a one-hot
array the size of the logits on JAX and PyTorch.

Our model is also timed decoding (greedy and beam 4, cached).

``--gpu`` runs the ``base`` config (Table 3) at the paper's batch size,
about 25,000 target tokens (§5.1), under ``mixed_bfloat16``, and adds the
model FLOPs utilisation: the FLOPs of the model's matrix products (forward
and backward, 3x the forward) per second over the device's peak, which is
looked up for known GPUs or given with ``--peak-tflops``.
"""

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks import child_env, python_module
from keras_transformer.cli._process import prepare_process

BACKENDS = ("tensorflow", "jax", "torch")
VARIANTS = ("ours", "keras_hub", "torch")
START_ID, END_ID = 1, 2  # as in keras_transformer.search.decoding; 0 is padding

# Dense bfloat16 peak of known GPUs, TFLOP/s (NVIDIA data sheets), matched
# against the device name in this order; --peak-tflops for any other.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """The model and batch every variant is built and fed with."""

    vocab_size: int = 8000
    num_layers: int = 3
    d_model: int = 256
    num_heads: int = 8
    d_ff: int = 1024
    dropout: float = 0.1
    batch_size: int = 32
    source_length: int = 32
    target_length: int = 32
    dtype_policy: str = "float32"
    steps: int = 20
    warmup: int = 5
    seed: int = 0


CPU_SETTING = Setting()
# §5.1: "each training batch contained ... approximately 25000 target tokens";
# Table 3's base model; a shared 37,000-token vocabulary (§5.1, En-De).
# Target lengths are drawn from 32 to 64 (48 on average): 520 rows hold
# about 520 x 48 = 24,960 real target tokens.
GPU_SETTING = Setting(
    vocab_size=37000,
    num_layers=6,
    d_model=512,
    num_heads=8,
    d_ff=2048,
    batch_size=520,
    source_length=64,
    target_length=64,
    dtype_policy="mixed_bfloat16",
    steps=30,
    warmup=10,
)


# -- data ---------------------------------------------------------------------


def make_batches(s):
    """``s.steps + s.warmup`` batches of random ids with padded tails.

    Lengths are drawn between half and the full width, so every variant pays
    for its padding masks. Returns numpy arrays with ``num_batches * batch``
    rows: encoder inputs, decoder inputs (``START`` + target) and labels
    (target + ``END``), 0 = padding.
    """
    import numpy as np

    rng = np.random.default_rng(s.seed)
    rows = (s.steps + s.warmup) * s.batch_size

    def ids(width, lengths):
        out = rng.integers(3, s.vocab_size, (rows, width)).astype("int32")
        out[np.arange(width)[None, :] >= lengths[:, None]] = 0
        return out

    src_len = rng.integers(s.source_length // 2, s.source_length + 1, rows)
    tgt_len = rng.integers(s.target_length // 2, s.target_length + 1, rows)
    source = ids(s.source_length, src_len)
    target = ids(s.target_length - 1, tgt_len - 1)
    decoder_inputs = np.concatenate([np.full((rows, 1), START_ID, "int32"), target], 1)
    labels = np.concatenate([target, np.zeros((rows, 1), "int32")], 1)
    labels[np.arange(rows), tgt_len - 1] = END_ID
    return source, decoder_inputs, labels


# -- model FLOPs --------------------------------------------------------------


def training_flops(s):
    """FLOPs of one training step's matrix products (2 per multiply-add).

    Counts the projections, the attention products (QKᵀ and AV over the full
    padded widths: padding costs as much as tokens) and the output
    projection, for a batch of ``s.batch_size``; the backward pass is taken as
    twice the forward, the usual estimate. Embedding look-ups, softmax,
    normalisation and the optimizer are left out.
    """
    d, f, n, v = s.d_model, s.d_ff, s.num_layers, s.vocab_size
    S, T = s.source_length, s.target_length
    rows = s.batch_size
    encoder = n * (rows * S * (4 * d * d + 2 * d * f) + rows * 2 * S * S * d)
    decoder = n * (
        rows * T * (4 * d * d + 2 * d * d + 2 * d * f)  # self, cross Q/O, FFN
        + rows * S * 2 * d * d  # cross K/V on the encoder output
        + rows * 2 * T * T * d  # self-attention products
        + rows * 2 * T * S * d  # cross-attention products
    )
    output = rows * T * d * v
    return 3 * 2 * (encoder + decoder + output)


# -- memory -------------------------------------------------------------------


def _rss_mib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Memory:
    """Peak memory of the training that follows ``Memory()``, in MiB."""

    def __init__(self):
        self.device = _accelerator()
        self.start_rss = _rss_mib()

    def peak_mib(self):
        import keras

        backend = keras.backend.backend()
        if self.device is None:
            return _peak_rss_mib() - self.start_rss
        if backend == "torch":
            import torch

            return torch.cuda.max_memory_allocated() / 2**20
        if backend == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            return stats.get("peak_bytes_in_use", float("nan")) / 2**20
        import tensorflow as tf

        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def _accelerator():
    """The GPU's name, or None on the CPU."""
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return None if device.platform == "cpu" else device.device_kind
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    return details.get("device_name", "GPU")


# -- the Keras variants -------------------------------------------------------


def build_ours(s, attention_dropout=0.0):
    import keras_transformer as kt

    # Separate source and target vocabularies, as the other two variants
    # have; the target embedding is the output projection (§3.4), where the
    # others have a Dense/Linear of their own: the same matrix products.
    return kt.build_model(
        None,
        src_vocab_size=s.vocab_size,
        tgt_vocab_size=s.vocab_size,
        share_embeddings=False,
        num_layers=s.num_layers,
        d_model=s.d_model,
        num_heads=s.num_heads,
        d_ff=s.d_ff,
        dropout=s.dropout,
        attention_dropout=attention_dropout,
        max_length=max(s.source_length, s.target_length),
    )


def build_keras_hub(s):
    import keras
    import keras_hub

    def embed(ids, name):
        x = keras_hub.layers.TokenAndPositionEmbedding(
            s.vocab_size,
            max(s.source_length, s.target_length),
            s.d_model,
            mask_zero=True,
            name=f"{name}_embedding",
        )(ids)
        return keras.layers.Dropout(s.dropout, name=f"{name}_dropout")(x)

    encoder_inputs = keras.Input((None,), dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input((None,), dtype="int32", name="decoder_inputs")
    x = embed(encoder_inputs, "encoder")
    for i in range(s.num_layers):
        x = keras_hub.layers.TransformerEncoder(
            s.d_ff, s.num_heads, dropout=s.dropout, name=f"encoder_{i}"
        )(x)
    y = embed(decoder_inputs, "decoder")
    for i in range(s.num_layers):
        y = keras_hub.layers.TransformerDecoder(
            s.d_ff, s.num_heads, dropout=s.dropout, name=f"decoder_{i}"
        )(y, x)
    # In the dtype policy, like our tied projection, with float32 logits out.
    logits = keras.layers.Dense(s.vocab_size, name="logits")(y)
    logits = keras.layers.Activation("linear", dtype="float32", name="float32")(logits)
    return keras.Model(
        {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs}, logits
    )


def _step_timer():
    """A Keras callback recording the wall time of every training step.

    Reading the loss waits for the step to finish (JAX and TensorFlow
    dispatch asynchronously), so each interval is one whole step.
    """
    import keras

    class StepTimes(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []
            self.last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    return StepTimes()


def compiled_keras_model(s, variant):
    """``variant``'s model, compiled with Adam and its loss (Keras' sparse
    cross-entropy, or this package's for ``ours_own_loss``)."""
    import keras

    keras.utils.set_random_seed(s.seed)
    if variant == "keras_hub":
        model = build_keras_hub(s)
    elif variant == "ours_attention_dropout":
        model = build_ours(s, attention_dropout=s.dropout)
    else:
        model = build_ours(s)
    if variant == "ours_own_loss":
        from keras_transformer.model.losses import LabelSmoothedCrossEntropy

        loss = LabelSmoothedCrossEntropy()
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss)
    return model


def fit_step_times(model, batches, batch_size):
    """Seconds of each step of one ``model.fit`` epoch over ``batches``
    (encoder inputs, decoder inputs, labels), in order."""
    source, decoder_inputs, labels = batches
    timer = _step_timer()
    model.fit(
        {"encoder_inputs": source, "decoder_inputs": decoder_inputs},
        labels,
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[timer],
    )
    return timer.times


def target_tokens_per_step(labels, batch_size):
    """Real (non-padding) target tokens in an average batch."""
    return int((labels != 0).sum()) / (len(labels) // batch_size)


def train_keras(s, variant):
    """Train ``variant`` for ``s.warmup + s.steps`` steps; step times and memory."""
    import keras

    keras.config.set_dtype_policy(s.dtype_policy)
    batches = make_batches(s)
    memory = Memory()
    model = compiled_keras_model(s, variant)
    return {
        "step_seconds": fit_step_times(model, batches, s.batch_size),
        "peak_memory_mib": memory.peak_mib(),
        "parameters": model.count_params(),
        "labels": batches[2],
    }


# -- native PyTorch -----------------------------------------------------------


def _torch_seq2seq(s):
    """``nn.Transformer`` with embeddings, sinusoidal positions and an output
    layer: the benchmark's model in plain PyTorch."""
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            width = max(s.source_length, s.target_length)
            self.source_embedding = nn.Embedding(s.vocab_size, s.d_model)
            self.target_embedding = nn.Embedding(s.vocab_size, s.d_model)
            position = torch.arange(width)[:, None]
            rate = torch.exp(
                torch.arange(0, s.d_model, 2) * (-math.log(1e4) / s.d_model)
            )
            table = torch.zeros(width, s.d_model)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate)
            self.register_buffer("positions", table)
            self.dropout = nn.Dropout(s.dropout)
            self.transformer = nn.Transformer(
                d_model=s.d_model,
                nhead=s.num_heads,
                num_encoder_layers=s.num_layers,
                num_decoder_layers=s.num_layers,
                dim_feedforward=s.d_ff,
                dropout=s.dropout,
                batch_first=True,
            )
            self.output = nn.Linear(s.d_model, s.vocab_size)

        def embed(self, embedding, ids):
            x = embedding(ids) * math.sqrt(s.d_model)
            return self.dropout(x + self.positions[: ids.shape[1]])

        def forward(self, src, tgt):
            # Boolean like the padding masks, True = may NOT attend (PyTorch).
            causal = torch.ones(
                tgt.shape[1], tgt.shape[1], dtype=torch.bool, device=tgt.device
            ).triu(1)
            src_pad, tgt_pad = src == 0, tgt == 0  # True = padding in PyTorch
            y = self.transformer(
                self.embed(self.source_embedding, src),
                self.embed(self.target_embedding, tgt),
                tgt_mask=causal,
                src_key_padding_mask=src_pad,
                tgt_key_padding_mask=tgt_pad,
                memory_key_padding_mask=src_pad,
                tgt_is_causal=True,
            )
            return self.output(y)

    return Seq2Seq()


def train_torch(s):
    """``nn.Transformer`` in a plain PyTorch loop, on the same batches."""
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(s.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    source, decoder_inputs, labels = make_batches(s)
    memory = Memory()

    model = _torch_seq2seq(s).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    autocast = s.dtype_policy == "mixed_bfloat16"
    times = []
    for i in range(s.steps + s.warmup):
        rows = slice(i * s.batch_size, (i + 1) * s.batch_size)
        src, tgt, lab = (
            torch.from_numpy(np.ascontiguousarray(a[rows])).long().to(device)
            for a in (source, decoder_inputs, labels)
        )
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(src, tgt)
        loss = loss_fn(logits.float().reshape(-1, s.vocab_size), lab.reshape(-1))
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the step
        times.append(time.perf_counter() - start)
    return {
        "step_seconds": times,
        "peak_memory_mib": memory.peak_mib(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "labels": labels,
    }


# -- decoding -----------------------------------------------------------------


def decode_ours(s, repeats=3):
    """Greedy and beam-4 decoding tokens/s of our (untrained) model, cached.

    Every row generates ``s.target_length`` tokens (no end token), from
    ``s.batch_size`` sources.
    """
    import keras

    from benchmarks.timing import time_call
    from keras_transformer.search import decoding

    keras.config.set_dtype_policy(s.dtype_policy)
    keras.utils.set_random_seed(s.seed)
    model = build_ours(s)
    source = make_batches(dataclasses.replace(s, steps=1, warmup=0))[0]
    source[source == 0] = 3  # full-width sources; padding is not the point here
    steps = s.target_length
    results = {}
    for name, search in (
        ("greedy", lambda: decoding.greedy_search(model, source, steps, end_id=None)),
        (
            "beam 4",
            lambda: decoding.beam_search(model, source, steps, 4, end_id=None),
        ),
    ):
        _, seconds = time_call(search, repeats)
        results[name] = s.batch_size * steps / seconds
    return results


# -- one measurement, in this process -----------------------------------------


def measure(s, variant, decode=False):
    """Train (and maybe decode with) ``variant`` on the current backend."""
    import keras

    backend = keras.backend.backend()
    if variant == "torch":
        if backend != "torch":
            raise ValueError(
                "The native PyTorch variant runs under KERAS_BACKEND=torch only "
                f"(so that its numbers sit beside the torch backend's). "
                f"Received: KERAS_BACKEND={backend}"
            )
        run = train_torch(s)
    else:
        run = train_keras(s, variant)
    labels = run.pop("labels")
    times = run.pop("step_seconds")
    if len(times) <= s.warmup:
        raise RuntimeError(f"Only {len(times)} steps ran; warm-up is {s.warmup}.")
    measured = times[s.warmup :]
    step = statistics.median(measured)
    tokens = target_tokens_per_step(labels, s.batch_size)
    result = {
        "backend": backend,
        "variant": variant,
        "device": _accelerator() or "cpu",
        "median_step_seconds": step,
        "first_step_seconds": times[0],
        "target_tokens_per_step": tokens,
        "target_tokens_per_second": tokens / step,
        "model_tflops_per_second": training_flops(s) / step / 1e12,
        **run,
    }
    if decode and variant == "ours":
        result["decoding_tokens_per_second"] = decode_ours(s)
    return result


# -- running variants in fresh processes, the table ---------------------------


def run_isolated(backend, variant, s, decode):
    """``measure`` in a fresh Python process with ``KERAS_BACKEND=backend``."""
    env = child_env(KERAS_BACKEND=backend)
    command = [
        *python_module("benchmarks.training_speed"),
        "--in-process",
        "--variants",
        variant,
        "--setting-json",
        json.dumps(dataclasses.asdict(s)),
        "--json",
        "-",
    ]
    if decode:
        command.append("--decode")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"{variant} on {backend} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])[0]


def table(results, peak_tflops=None):
    """Markdown table; ratios are ours over each other variant, same backend,
    and every variant over native PyTorch."""
    by_key = {(r["backend"], r["variant"]): r for r in results}
    torch_native = by_key.get(("torch", "torch"))
    header = (
        "| backend | variant | target tok/s | step (ms) | peak memory (MiB) "
        "| parameters | ours / this | this / torch nn.Transformer |"
    )
    if peak_tflops:
        header += " MFU |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in results:
        ours = by_key.get((r["backend"], "ours"))
        speed = r["target_tokens_per_second"]
        # "–" where there is nothing to compare with (no torch run, say).
        vs_ours = f"{ours['target_tokens_per_second'] / speed:.2f}x" if ours else "–"
        vs_torch = "–"
        if torch_native:
            vs_torch = f"{speed / torch_native['target_tokens_per_second']:.2f}x"
        line = (
            f"| {r['backend']} | {r['variant']} | {speed:,.0f} "
            f"| {1000 * r['median_step_seconds']:.0f} "
            f"| {r['peak_memory_mib']:,.0f} | {r['parameters']:,} "
            f"| {vs_ours} | {vs_torch} |"
        )
        if peak_tflops:
            line += f" {100 * r['model_tflops_per_second'] / peak_tflops:.1f} % |"
        lines.append(line)
    lines += [""] + ratios(results)
    decoding = [r for r in results if "decoding_tokens_per_second" in r]
    if decoding:
        lines += [
            "",
            "| backend | ours: greedy, cached (tok/s) | ours: beam 4, cached (tok/s) |",
            "|---|---:|---:|",
        ]
        for r in decoding:
            d = r["decoding_tokens_per_second"]
            lines.append(
                f"| {r['backend']} | {d['greedy']:,.0f} | {d['beam 4']:,.0f} |"
            )
    return "\n".join(lines)


def ratios(results):
    """The comparisons, as sentences: ours over keras-hub per backend, and
    ours on its fastest backend over PyTorch's nn.Transformer."""
    speed = {
        (r["backend"], r["variant"]): r["target_tokens_per_second"] for r in results
    }
    lines = []
    for backend in dict.fromkeys(r["backend"] for r in results):
        hub = speed.get((backend, "keras_hub"))
        if not hub or (backend, "ours") not in speed:
            continue
        parts = [f"ours / keras_hub = {speed[(backend, 'ours')] / hub:.2f}x"]
        for variant, words in (
            ("ours_own_loss", "with its own loss"),
            ("ours_attention_dropout", "with the same attention dropout"),
        ):
            if (backend, variant) in speed:
                parts.append(f"{words} {speed[(backend, variant)] / hub:.2f}x")
        lines.append(f"- {backend}: " + ", ".join(parts))
    ours = {b: v for (b, variant), v in speed.items() if variant == "ours"}
    if ("torch", "torch") in speed and ours:
        fastest = max(ours, key=ours.get)
        ratio = ours[fastest] / speed[("torch", "torch")]
        lines.append(
            f"- ours on its fastest backend here ({fastest}) / torch "
            f"nn.Transformer = {ratio:.2f}x"
        )
    return lines


def peak_tflops_of(device_names):
    for name in device_names:
        for key, value in PEAK_BF16_TFLOPS:
            if key in str(name):
                return value
    return None


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.training_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--all-backends", action="store_true")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the base config at ~25,000 target tokens per batch, mixed_bfloat16, "
        "with model FLOPs utilisation",
    )
    parser.add_argument(
        "--variants",
        help="comma-separated, from ours, ours_own_loss, ours_attention_dropout, "
        "keras_hub, torch (default: all but torch, and torch under the torch "
        "backend)",
    )
    parser.add_argument(
        "--dtype-policy",
        choices=("float32", "mixed_bfloat16"),
        help="every variant's Keras dtype policy (torch: bfloat16 autocast); "
        "default float32, --gpu mixed_bfloat16",
    )
    parser.add_argument("--steps", type=int, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, help="steps left out (compilation)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--config", help="override the model size: tiny/small/base")
    parser.add_argument("--no-decode", action="store_true", help="skip decoding")
    parser.add_argument("--peak-tflops", type=float, help="device peak for MFU")
    parser.add_argument("--json", help="also write the results here ('-': stdout)")
    # internal: one variant in this process
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting-json", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def setting_from_args(args):
    if args.setting_json:
        return Setting(**json.loads(args.setting_json))
    s = GPU_SETTING if args.gpu else CPU_SETTING
    if args.config:
        from keras_transformer.model.config import transformer_config

        c = transformer_config(args.config)
        s = dataclasses.replace(
            s,
            num_layers=c.num_layers,
            d_model=c.d_model,
            num_heads=c.num_heads,
            d_ff=c.d_ff,
        )
    changes = {
        k: v
        for k, v in (
            ("steps", args.steps),
            ("warmup", args.warmup),
            ("batch_size", args.batch_size),
            ("dtype_policy", args.dtype_policy),
        )
        if v is not None
    }
    return dataclasses.replace(s, **changes)


def main(argv=None):
    args = parse_args(argv)
    prepare_process()
    s = setting_from_args(args)
    if args.in_process:
        variants = args.variants.split(",")
        results = [measure(s, v, decode=args.decode) for v in variants]
    else:
        backends = BACKENDS if args.all_backends else (None,)
        results = []
        for backend in backends:
            if backend is None:
                import keras

                backend = keras.backend.backend()
            if args.variants:
                variants = args.variants.split(",")
            else:
                variants = ["ours", "ours_own_loss", "ours_attention_dropout"]
                variants += ["keras_hub"]
                variants += ["torch"] if backend == "torch" else []
            for variant in variants:
                decode = variant == "ours" and not args.no_decode
                print(f"... {backend}: {variant}", file=sys.stderr, flush=True)
                results.append(run_isolated(backend, variant, s, decode))
    if args.json == "-":
        print(json.dumps(results))
        return results
    peak = args.peak_tflops or peak_tflops_of(r["device"] for r in results)
    print(f"{platform.machine()}, {os.cpu_count()} CPU cores; {dataclasses.asdict(s)}")
    print(table(results, peak))
    if args.json:
        from keras_transformer.trainer.checkpoints import write_json_atomic

        write_json_atomic(
            args.json, {"setting": dataclasses.asdict(s), "runs": results}
        )
    return results


if __name__ == "__main__":
    main()
