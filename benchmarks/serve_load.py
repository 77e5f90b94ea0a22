"""Load on ``kt-serve``: throughput, latency, errors, memory and answers.

    python -m benchmarks.serve_load --model runs/multi30k/translator.keras \\
        --source ../shared/data/multi30k/val.de.gz --clients 64 --seconds 60

Closed loop by default: each of ``--clients`` threads, on its own keep-alive
connection, sends one sentence and the next once answered. Open loop with
``--rate R`` (a soak: half the peak rate, ``--seconds 600``): R requests a
second on a fixed schedule, sent by ``--clients`` threads (too few show as
``max_send_delay_ms``), latency counted from the scheduled time. For
overload, start the server with a tiny ``--max-queue``. The server runs in a
child process (``--max-batch-size``, ``--search-batch-size``,
``--max-wait-ms``, ``--max-queue`` passed on; or ``--url`` for one already
running) whose resident memory is sampled every second; ``/metrics`` is
read at the end, then SIGTERM must end it with 0. With ``--api-keys``,
``--req-limit`` and ``--api-key`` the clients send a key to a server that
needs one; ``--flood-clients N --flood-key K`` adds N clients with another
key, over its limit, summarized apart (``flood_*``). Unless ``--no-check``,
the distinct sentences answered are then translated here with
``load_translator(--model)`` and the answers that differ counted
(``mismatches``).
"""

import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import gzip
import http.client
import itertools
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from benchmarks import REPO, child_env, python_module

READY = re.compile(r"kt-serve: ready on (http://\S+)")
# A kept-alive connection that the server closed while idle fails on its next
# use before the request reached the server; only then is a request resent.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def read_sentences(path):
    """The non-empty lines of a text file, gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        return [line.strip() for line in file if line.strip()]


def percentile(values, q):
    """The ``q``-th percentile, interpolated between the nearest ranks."""
    if not values:
        return None
    values = sorted(values)
    rank = (len(values) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return values[low] + (values[high] - values[low]) * (rank - low)


def connect(url, timeout):
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def _post(connection, body):
    try:
        connection.request(
            "POST", "/translate", body, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, response.read(), response.getheader("Retry-After")
    except BaseException:
        connection.close()
        raise


def translate(connection, sentence, options, scheduled, origin):
    """The record of one request: status (None: lost), answer, latency from
    ``scheduled`` and end from ``origin`` (s)."""
    record = {"sentence": sentence, "status": None, "answer": None, "retried": False}
    body = json.dumps({"texts": [sentence], **options}).encode()
    try:
        reused = connection.sock is not None
        try:
            answer = _post(connection, body)
        except STALE:
            if not reused:
                raise
            record["retried"] = True
            answer = _post(connection, body)
        record["status"], data, record["retry_after"] = answer
        if record["status"] == 200:
            record["answer"] = json.loads(data)["translations"][0]
    except (OSError, http.client.HTTPException, ValueError, LookupError) as e:
        record["error"] = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    record["latency"], record["end"] = end - scheduled, end - origin
    return record


def _in_threads(function, count):
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        list(pool.map(function, range(count)))


def closed_loop(url, sentences, clients, seconds, options, timeout=60):
    """Each client asks, waits, asks again until ``seconds`` are over, from
    its own offset in ``sentences``. The records."""
    records, origin = [], time.perf_counter()

    def client(i):
        with contextlib.closing(connect(url, timeout)) as connection:
            for k in itertools.count(i * len(sentences) // clients):
                start = time.perf_counter()
                if start - origin >= seconds:
                    return
                sentence = sentences[k % len(sentences)]
                records.append(translate(connection, sentence, options, start, origin))

    _in_threads(client, clients)
    return records


def open_loop(url, sentences, rate, seconds, options, workers, timeout=60):
    """``rate * seconds`` requests, the k-th due at ``k / rate`` s; a free
    worker takes the next one due, so no answer holds up a send unless all
    ``workers`` wait. The records, with ``delay``: sent after due (s)."""
    records, origin = [], time.perf_counter()
    total, counter, lock = int(rate * seconds), itertools.count(), threading.Lock()

    def worker(_):
        with contextlib.closing(connect(url, timeout)) as connection:
            while True:
                with lock:
                    k = next(counter)
                if k >= total:
                    return
                due = origin + k / rate
                time.sleep(max(0.0, due - time.perf_counter()))
                delay = time.perf_counter() - due
                sentence = sentences[k % len(sentences)]
                record = translate(connection, sentence, options, due, origin)
                records.append(dict(record, delay=delay))

    _in_threads(worker, workers)
    return records


def answered(record):
    """Whether the server answered with translations (200, readable)."""
    return record["status"] == 200 and "error" not in record


def summarize(records):
    """Counts, sentences per second up to the last answer, and latency
    percentiles (ms) of the requests answered (200, readable)."""
    ok = [r for r in records if answered(r)]
    statuses = collections.Counter(r["status"] for r in records)
    window = max((r["end"] for r in records), default=0.0)
    errors = len(records) - len(ok)
    summary = {
        "requests": len(records),
        "answered": len(ok),
        "seconds": round(window, 2),
        "sentences_per_second": round(len(ok) / window, 2) if window else 0.0,
        "errors": errors,
        "status_503": statuses[503],
        "status_500": statuses[500],
        "status_429": statuses[429],
        "lost": statuses[None],
        "other_errors": errors
        - statuses[503]
        - statuses[500]
        - statuses[429]
        - statuses[None],
        "503_without_retry_after": sum(
            r["status"] == 503 and not r.get("retry_after") for r in records
        ),
        "resent_on_stale_connection": sum(r["retried"] for r in records),
    }
    latencies = [r["latency"] * 1000 for r in ok]
    for q in (50, 95, 99):
        value = percentile(latencies, q)
        summary[f"p{q}_ms"] = None if value is None else round(value, 1)
    delays = [r["delay"] for r in records if "delay" in r]
    if delays:
        summary["max_send_delay_ms"] = round(max(delays) * 1000, 1)
    return summary


def count_mismatches(records, offline):
    """Answers that differ from ``offline[sentence]``, and five."""
    wrong = [
        {
            "sentence": r["sentence"],
            "served": r["answer"],
            "offline": offline[r["sentence"]],
        }
        for r in records
        if answered(r) and r["answer"] != offline[r["sentence"]]
    ]
    return len(wrong), wrong[:5]


def rss_bytes(pid):
    """The process's resident memory (Linux ``VmRSS``), None once gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def sample_memory(pid, stop, samples, every=1.0):
    """Append ``(seconds, rss)`` every ``every`` s until ``stop`` is set."""
    origin = time.perf_counter()
    while True:
        if (rss := rss_bytes(pid)) is not None:
            samples.append((time.perf_counter() - origin, rss))
        if stop.wait(every):
            return


def memory_growth(samples, minute=60.0):
    """RSS at the first sample from ``minute`` s on, at the end, and the
    growth in between (%); before a minute has passed, no growth."""
    if not samples:
        return {}
    end = samples[-1][1]
    at_minute = next((rss for t, rss in samples if t >= minute), None)
    growth = (end - at_minute) / at_minute * 100 if at_minute else None
    return {
        "rss_start_bytes": samples[0][1],
        "rss_60s_bytes": at_minute,
        "rss_end_bytes": end,
        "rss_growth_after_60s_pct": None if growth is None else round(growth, 2),
    }


def start_server(command, log, timeout):
    """Start ``command``; the process and its URL once it prints the ready
    line."""
    process = subprocess.Popen(
        command, env=child_env(), stdout=subprocess.PIPE, stderr=log, text=True
    )
    lines = queue.Queue()

    def read_stdout():
        # To the end, so that the server never blocks on a full pipe.
        with process.stdout:
            for line in process.stdout:
                lines.put(line)
        lines.put(None)

    process.reader = threading.Thread(target=read_stdout, daemon=True)
    process.reader.start()
    deadline = time.monotonic() + timeout
    try:
        while (
            line := lines.get(timeout=max(0, deadline - time.monotonic()))
        ) is not None:
            if match := READY.search(line):
                return process, match.group(1)
        error = RuntimeError(f"server exited with {process.wait()} before ready")
    except queue.Empty:
        error = TimeoutError(f"server not ready after {timeout} s")
    process.kill()
    stop_server(process)
    raise error


def stop_server(process, timeout=120):
    """SIGTERM, then the exit code (None if it had to be killed)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = None
    process.reader.join(10)
    return code


def read_metrics(url, timeout=10, key=None):
    """``GET /metrics``'s text, or the error met."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with contextlib.closing(connect(url, timeout)) as connection:
        try:
            connection.request("GET", "/metrics", headers=headers)
            return connection.getresponse().read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            return f"error: {type(e).__name__}: {e}"


def machine():
    """CPU count and model, for the record."""
    with open("/proc/cpuinfo") as cpuinfo:
        names = [line.split(":")[1].strip() for line in cpuinfo if "model name" in line]
    return {"cpus": os.cpu_count(), "cpu": (names or [platform.processor()])[0]}


def git_commit():
    command = ["git", "rev-parse", "--short", "HEAD"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() or None
    return None


def server_command(args):
    command = ["--model", args.model, "--host", "127.0.0.1", "--port", "0"]
    for name in (
        "max_batch_size", "search_batch_size", "max_wait_ms", "max_queue",
        "api_keys", "req_limit",
    ):  # fmt: skip
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return python_module("keras_transformer.cli.serve", *command)


def offline_translations(model, sentences, options):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras_transformer.translate.evaluation import load_translator

    outputs = load_translator(model).translate(sentences, **options)
    return dict(zip(sentences, outputs, strict=True))


def report(result):
    """The result as a table, one quantity per row."""
    rows = {"mode": result["mode"], **result["summary"], **result["memory"]}
    rows.update(
        (f"flood_{name}", value) for name, value in result.get("flood", {}).items()
    )
    for key in ("mismatches", "server_exit_code"):
        if key in result:
            rows[key] = result[key]
    for name, value in rows.items():
        if name.endswith("_bytes") and value is not None:
            value = f"{value / 2**30:.3f} GiB"
        print(f"{name:26s} {value}", flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="needed unless --url and --no-check")
    parser.add_argument("--source", required=True, help="text file, gzipped or not")
    parser.add_argument(
        "--clients", type=int, default=64, help="threads, also in open loop"
    )
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=float, help="open loop: requests a second")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--max-batch-size", type=int)
    parser.add_argument("--search-batch-size", type=int)
    parser.add_argument("--max-wait-ms", type=float)
    parser.add_argument("--max-queue", type=int)
    parser.add_argument("--api-keys", help="the server's key file (--api-keys)")
    parser.add_argument("--req-limit", type=int, help="the server's --req-limit")
    parser.add_argument("--api-key", help="the key the clients send")
    parser.add_argument(
        "--flood-clients", type=int, default=0,
        help="more clients, closed loop, with --flood-key: over their limit",
    )  # fmt: skip
    parser.add_argument("--flood-key", help="the key the flooding clients send")
    parser.add_argument("--url", help="a running server instead of starting one")
    parser.add_argument("--pid", type=int, help="with --url: sample its memory")
    parser.add_argument("--timeout", type=float, default=60, help="a request's, s")
    parser.add_argument("--ready-timeout", type=float, default=300)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not args.model and not (args.url and args.no_check):
        parser.error("--model is needed unless --url and --no-check")
    return args


def run_load(args, url, options):
    """The clients' records and the flooding clients' (``--flood-clients``,
    sent at the same time; ``[]`` without)."""
    sentences = read_sentences(args.source)
    fields = dict(options, api_key=args.api_key) if args.api_key else options
    flood, flooded = None, []
    if args.flood_clients:
        flood_fields = dict(options, api_key=args.flood_key)
        flood = threading.Thread(
            target=lambda: flooded.extend(
                closed_loop(
                    url,
                    sentences,
                    args.flood_clients,
                    args.seconds,
                    flood_fields,
                    args.timeout,
                )  # fmt: skip
            )
        )
        flood.start()
    try:
        if args.rate:
            return open_loop(
                url, sentences, args.rate, args.seconds, fields, args.clients,
                args.timeout,
            ), flooded  # fmt: skip
        return closed_loop(
            url, sentences, args.clients, args.seconds, fields, args.timeout
        ), flooded
    finally:
        if flood is not None:
            flood.join()


def main(argv=None):
    args = parse_args(argv)
    mode = f"open, {args.rate:g}/s" if args.rate else f"closed, {args.clients} clients"
    result = {
        "command": python_module(
            "benchmarks.serve_load", *(sys.argv[1:] if argv is None else argv)
        ),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "commit": git_commit(),
        "options": vars(args),
        "mode": f"{mode}, {args.seconds:g} s",
    }
    options = {"beam_size": args.beam_size, "length_penalty": args.length_penalty}
    process, url, pid = None, args.url, args.pid
    if not url:
        log = tempfile.NamedTemporaryFile("w", prefix="kt-serve-", delete=False)
        result["server_log"] = log.name
        with log:
            process, url = start_server(server_command(args), log, args.ready_timeout)
        pid = process.pid
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=sample_memory, args=(pid, stop, samples))
    if pid:
        sampler.start()
    try:
        records, flooded = run_load(args, url, options)
        result["metrics"] = read_metrics(url, key=args.api_key)
    finally:
        stop.set()
        if pid:
            sampler.join()
        if process is not None:
            result["server_exit_code"] = stop_server(process)
    result["summary"] = summarize(records)
    if flooded:
        result["flood"] = summarize(flooded)
    result["memory"] = memory_growth(samples)
    if not args.no_check:
        # After the load and the server's exit: the CPU is the server's while
        # it is measured.
        every = records + flooded
        sent = sorted({r["sentence"] for r in every if answered(r)})
        offline = offline_translations(args.model, sent, options)
        result["mismatches"], result["mismatch_examples"] = count_mismatches(
            every, offline
        )
    report(result)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1, ensure_ascii=False)
    return 0 if result.get("server_exit_code", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
