"""kt-launch: ``kt-train --data-parallel`` as several processes on this host.

    kt-launch --processes 2 --devices-per-process 2 -- \\
        --task numbers --out runs/numbers-2x2

starts ``--processes`` copies of ``kt-train`` with the arguments after
``--`` (``--data-parallel`` added if missing) on the JAX backend, joined
through a coordinator on ``127.0.0.1`` at a free port (``--port`` to choose
one): Keras' own variables ``KERAS_DISTRIBUTION_JOB_ADDRESSES``,
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID``
tell each process its place. They train one model over all their devices;
process 0 writes ``--out`` and prints the log, the others print only
warnings and errors. ``--devices-per-process K`` gives each process K
virtual CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=K``),
for trying it on a CPU.

The exit status is 0 when every process exits 0; otherwise the first
failure's, after the other processes are stopped (a process whose partner
died would wait for it). SIGTERM or Ctrl-C (SIGINT) stops them together at
the end of a batch, process 0 writing a checkpoint that the same command
resumes from; a second one stops them at once. The launcher passes a signal
on as SIGUSR1, a stop request that a process also hit by the signal itself
(a terminal's Ctrl-C reaches the whole process group) does not count twice.
On several hosts, run ``kt-train --data-parallel`` once on each with those
three variables set by hand (see the README).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

# Seconds the other processes get to exit after one failed, before SIGKILL.
GRACE_SECONDS = 10


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-launch",
        description="Run kt-train --data-parallel as several processes on this "
        "host (JAX), process 0 writing --out.",
        epilog="Example: kt-launch --processes 2 --devices-per-process 2 -- "
        "--task numbers --out runs/numbers-2x2",
    )
    parser.add_argument("--processes", type=int, default=2, metavar="N")
    parser.add_argument(
        "--devices-per-process",
        type=int,
        metavar="K",
        help="virtual CPU devices per process (XLA_FLAGS); default: XLA's own",
    )
    parser.add_argument("--port", type=int, help="coordinator port (default: free)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    return parser


def parse_args(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        parser.error("--devices-per-process must be >= 1")
    backend = os.environ.get("KERAS_BACKEND", "jax")
    if backend != "jax":
        parser.error(
            f"KERAS_BACKEND={backend}: multi-process data parallel runs on JAX "
            "only (keras.distribution); unset it or set it to jax"
        )
    if "--data-parallel" not in args.train_args:
        args.train_args.append("--data-parallel")
    return args


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(index, count, port, devices):
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND="jax",
        KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
        KERAS_DISTRIBUTION_NUM_PROCESSES=str(count),
        KERAS_DISTRIBUTION_PROCESS_ID=str(index),
        # Quiet TensorFlow's start-up lines (it is imported for tokenizers).
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    )
    if devices is not None:
        flags = [
            f
            for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={devices}")
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def main(argv=None):
    """Start the processes, wait for them; return the exit status."""
    args = parse_args(argv)
    port = args.port or free_port()
    command = [sys.executable, "-m", "keras_transformer.cli.train"]
    processes = [
        subprocess.Popen(
            command + args.train_args,
            env=environment(i, args.processes, port, args.devices_per_process),
        )
        for i in range(args.processes)
    ]
    received = []

    def forward(number, frame):
        received.append(number)
        for process in processes:
            if process.poll() is None:
                if len(received) == 1:
                    process.send_signal(signal.SIGUSR1)  # stop after the batch
                else:
                    process.kill()

    previous = {n: signal.signal(n, forward) for n in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _wait(processes, received)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _stop(processes, signal.SIGTERM)


def _wait(processes, received=()):
    while True:
        if received:  # passed on: each process stops after its checkpoint
            for process in processes:
                process.wait()
            return 128 + received[0]
        codes = [p.poll() for p in processes]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            index, code = failed[0]
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            print(
                f"kt-launch: process {index} {how}; stopping the others",
                file=sys.stderr,
            )
            return 128 - code if code < 0 else code  # as a shell reports it
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop(processes, sig):
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.send_signal(sig)
    deadline = time.monotonic() + GRACE_SECONDS
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def command():
    """The installed ``kt-launch`` command."""
    raise SystemExit(main())


if __name__ == "__main__":
    command()
