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
``--max-wait-ms``, ``--max-queue``, ``--beam-sizes`` passed on; or ``--url``
for one already running) whose resident memory is sampled every second;
``/metrics`` is read at the end, then SIGTERM must end it with 0. With
``--api-keys``, ``--req-limit`` and ``--api-key`` the clients send a key to a
server that needs one (``--auth-fail-limit``, ``--req-limit-storage`` and
``--req-limit-storage-down`` passed on too); ``--flood-clients N --flood-key
K`` adds N clients with another key, over its limit, summarized apart
(``flood_*``). Unless ``--no-check``, the distinct sentences answered are
then translated here with ``load_translator(--model)`` and the answers that
differ counted (``mismatches``).

``--replicas N`` starts N servers with the same options, as behind a load
balancer: every client thread keeps one keep-alive connection to each and
sends its requests to them in turn (closed loop: client i's k-th request to
replica ``(i + k) % N``; open loop: the k-th request of the schedule to
replica ``k % N``). ``--redis`` starts a ``redis-server`` on a free port of
127.0.0.1 for the run, saving nothing, and gives every replica
``--req-limit-storage redis://127.0.0.1:PORT``, so that they share each
key's allowance. Each replica's memory is sampled, its ``/metrics`` read and
its exit code checked; the report shows totals, each replica's in
parentheses. The counters read from ``/metrics`` (``metric_*``):
compilations after warm-up, errors by kind and requests by caller and status
code.
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
import shutil
import signal
import socket
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


def as_list(urls):
    """``urls``: one URL, or a list of them (the replicas)."""
    return [urls] if isinstance(urls, str) else list(urls)


class Balancer:
    """One client's keep-alive connections, one to each replica (opened at
    its first request); ``send(turn, ...)`` goes to replica ``turn % N``,
    round robin as a load balancer would."""

    def __init__(self, urls, timeout):
        self.connections = [connect(url, timeout) for url in as_list(urls)]

    def send(self, turn, sentence, options, scheduled, origin):
        replica = turn % len(self.connections)
        record = translate(
            self.connections[replica], sentence, options, scheduled, origin
        )
        record["replica"] = replica
        return record

    def close(self):
        for connection in self.connections:
            connection.close()


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


def closed_loop(urls, sentences, clients, seconds, options, timeout=60):
    """Each client asks, waits, asks again until ``seconds`` are over, from
    its own offset in ``sentences``; with several ``urls`` (replicas), client
    i's n-th request goes to replica ``(i + n) % N``. The records."""
    records, origin = [], time.perf_counter()

    def client(i):
        with contextlib.closing(Balancer(urls, timeout)) as balancer:
            first = i * len(sentences) // clients
            for n, k in enumerate(itertools.count(first), i):
                start = time.perf_counter()
                if start - origin >= seconds:
                    return
                sentence = sentences[k % len(sentences)]
                records.append(balancer.send(n, sentence, options, start, origin))

    _in_threads(client, clients)
    return records


def open_loop(urls, sentences, rate, seconds, options, workers, timeout=60):
    """``rate * seconds`` requests, the k-th due at ``k / rate`` s (to
    replica ``k % N`` of several ``urls``); a free worker takes the next one
    due, so no answer holds up a send unless all ``workers`` wait. The
    records, with ``delay``: sent after due (s)."""
    records, origin = [], time.perf_counter()
    total, counter, lock = int(rate * seconds), itertools.count(), threading.Lock()

    def worker(_):
        with contextlib.closing(Balancer(urls, timeout)) as balancer:
            while True:
                with lock:
                    k = next(counter)
                if k >= total:
                    return
                due = origin + k / rate
                time.sleep(max(0.0, due - time.perf_counter()))
                delay = time.perf_counter() - due
                sentence = sentences[k % len(sentences)]
                record = balancer.send(k, sentence, options, due, origin)
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
    replicas = 1 + max((r.get("replica", 0) for r in records), default=0)
    if replicas > 1:
        for name, chosen in (("requests", records), ("answered", ok)):
            counts = collections.Counter(r["replica"] for r in chosen)
            summary[f"{name}_by_replica"] = [counts[i] for i in range(replicas)]
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


def total_memory(replicas):
    """The replicas' ``memory_growth``s summed: each RSS the sum of theirs
    (None if one lacks it), the growth that of the sums."""
    replicas = [memory for memory in replicas if memory]
    if not replicas:
        return {}
    total = {}
    for name in ("rss_start_bytes", "rss_60s_bytes", "rss_end_bytes"):
        values = [memory[name] for memory in replicas]
        total[name] = None if None in values else sum(values)
    at_minute, end = total["rss_60s_bytes"], total["rss_end_bytes"]
    growth = (end - at_minute) / at_minute * 100 if at_minute else None
    total["rss_growth_after_60s_pct"] = None if growth is None else round(growth, 2)
    return total


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


METRIC = re.compile(
    r"^kt_serve_(compilations_after_warm_up|errors_total|caller_requests_total)"
    r"(?:\{([^}]*)\})? (\S+)$",
    re.MULTILINE,
)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_counts(text):
    """The counters of a ``/metrics`` text worth a report:
    ``compilations_after_warm_up``, ``errors_KIND`` and
    ``caller_CALLER_CODE`` (requests by caller and status), as ints."""
    counts = {}
    for name, labels, value in METRIC.findall(text):
        labels = dict(LABEL.findall(labels))
        if name == "errors_total":
            name = f"errors_{labels.get('kind')}"
        elif name == "caller_requests_total":
            name = f"caller_{labels.get('caller')}_{labels.get('code')}"
        with contextlib.suppress(ValueError):
            counts[name] = counts.get(name, 0) + int(float(value))
    return dict(sorted(counts.items()))


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


SERVER_OPTIONS = (
    "max_batch_size", "search_batch_size", "max_wait_ms", "max_queue",
    "beam_sizes", "api_keys", "req_limit", "auth_fail_limit",
    "req_limit_storage", "req_limit_storage_down",
)  # fmt: skip


def server_command(args, storage=None):
    """``kt-serve``'s command line; ``storage``: the run's Redis, for
    ``--req-limit-storage``."""
    command = ["--model", args.model, "--host", "127.0.0.1", "--port", "0"]
    values = dict(vars(args), req_limit_storage=storage or args.req_limit_storage)
    for name in SERVER_OPTIONS:
        if values[name] is not None:
            command += [f"--{name.replace('_', '-')}", str(values[name])]
    return python_module("keras_transformer.cli.serve", *command)


def start_redis(binary="redis-server", timeout=10):
    """A ``redis-server`` on a free port of 127.0.0.1, saving nothing, in a
    temporary folder: ``(process, url, folder)`` once it answers PING."""
    if shutil.which(binary) is None:
        raise RuntimeError(f"no {binary}: install Debian's redis-server")
    folder = tempfile.mkdtemp(prefix="kt-redis-")
    for _ in range(3):  # the port may be taken between its choice and use
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", folder],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if redis_answers(port):
                return process, f"redis://127.0.0.1:{port}", folder
            time.sleep(0.02)
        stop_redis(process, None)
    shutil.rmtree(folder, ignore_errors=True)
    raise RuntimeError(f"{binary} did not answer on 127.0.0.1")


def redis_answers(port):
    with contextlib.suppress(OSError):
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    return False


def stop_redis(process, folder):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def offline_translations(model, sentences, options):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras_transformer.translate.evaluation import load_translator

    outputs = load_translator(model).translate(sentences, **options)
    return dict(zip(sentences, outputs, strict=True))


def report(result):
    """The result as a table, one quantity per row; with several replicas,
    each one's value in parentheses after the total."""
    memory = result.get("replica_memory")
    counters = result.get("replica_counters")
    rows = {"mode": (result["mode"], None)}
    rows.update((name, (value, None)) for name, value in result["summary"].items())
    for name, value in result["memory"].items():
        rows[name] = (value, memory and [each.get(name) for each in memory])
    for name, value in result.get("flood", {}).items():
        rows[f"flood_{name}"] = (value, None)
    for name, value in result.get("counters", {}).items():
        rows[f"metric_{name}"] = (
            value,
            counters and [c.get(name, 0) for c in counters],
        )
    if "mismatches" in result:
        rows["mismatches"] = (result["mismatches"], None)
    if "server_exit_code" in result:
        rows["server_exit_code"] = (
            result["server_exit_code"],
            result.get("server_exit_codes"),
        )
    for name, (value, each) in rows.items():
        shown = [_shown(name, v) for v in [value, *(each or [])]]
        line = shown[0] + (f" ({', '.join(shown[1:])})" if each else "")
        print(f"{name:26s} {line}", flush=True)


def _shown(name, value):
    if name.endswith("_bytes") and value is not None:
        return f"{value / 2**30:.3f} GiB"
    return str(value)


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
    parser.add_argument("--beam-sizes", help="the server's --beam-sizes")
    parser.add_argument("--api-keys", help="the server's key file (--api-keys)")
    parser.add_argument("--req-limit", type=int, help="the server's --req-limit")
    parser.add_argument("--auth-fail-limit", type=int)
    parser.add_argument("--req-limit-storage", help="the servers' limits' storage")
    parser.add_argument("--req-limit-storage-down", choices=("open", "closed"))
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="servers started, the requests spread over them round robin",
    )  # fmt: skip
    parser.add_argument(
        "--redis", action="store_true",
        help="start a redis-server for the run, the replicas' --req-limit-storage",
    )  # fmt: skip
    parser.add_argument("--api-key", help="the key the clients send")
    parser.add_argument(
        "--flood-clients", type=int, default=0,
        help="more clients, closed loop, with --flood-key: over their limit",
    )  # fmt: skip
    parser.add_argument("--flood-key", help="the key the flooding clients send")
    parser.add_argument(
        "--url", help="running servers (URL[,URL...]) instead of starting them"
    )
    parser.add_argument("--pid", help="with --url: sample their memory (PID[,PID])")
    parser.add_argument("--timeout", type=float, default=60, help="a request's, s")
    parser.add_argument("--ready-timeout", type=float, default=300)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not args.model and not (args.url and args.no_check):
        parser.error("--model is needed unless --url and --no-check")
    if args.replicas < 1:
        parser.error("--replicas must be >= 1")
    if args.url and (args.replicas > 1 or args.redis):
        parser.error("--replicas and --redis start servers: not with --url")
    if args.redis and args.req_limit_storage:
        parser.error("--redis is the replicas' --req-limit-storage: give one")
    return args


def run_load(args, urls, options):
    """The clients' records and the flooding clients' (``--flood-clients``,
    sent at the same time; ``[]`` without), over the replicas' ``urls``."""
    sentences = read_sentences(args.source)
    fields = dict(options, api_key=args.api_key) if args.api_key else options
    flood, flooded = None, []
    if args.flood_clients:
        flood_fields = dict(options, api_key=args.flood_key)
        flood = threading.Thread(
            target=lambda: flooded.extend(
                closed_loop(
                    urls,
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
                urls, sentences, args.rate, args.seconds, fields, args.clients,
                args.timeout,
            ), flooded  # fmt: skip
        return closed_loop(
            urls, sentences, args.clients, args.seconds, fields, args.timeout
        ), flooded
    finally:
        if flood is not None:
            flood.join()


def start_servers(command, replicas, timeout):
    """``replicas`` servers of ``command``, started at once: their
    processes, URLs and log files; none left running if one fails."""
    logs = [
        tempfile.NamedTemporaryFile("w", prefix=f"kt-serve-{i}-", delete=False)
        for i in range(replicas)
    ]
    with concurrent.futures.ThreadPoolExecutor(replicas) as pool:
        started = [pool.submit(start_server, command, log, timeout) for log in logs]
        concurrent.futures.wait(started)
    for log in logs:
        log.close()
    failed = [f.exception() for f in started if f.exception() is not None]
    if failed:
        stop_servers([f.result()[0] for f in started if f.exception() is None])
        raise failed[0]
    processes, urls = zip(*(f.result() for f in started), strict=True)
    return list(processes), list(urls), [log.name for log in logs]


def stop_servers(processes):
    """SIGTERM to each, at once; their exit codes."""
    if not processes:
        return []
    with concurrent.futures.ThreadPoolExecutor(len(processes)) as pool:
        return list(pool.map(stop_server, processes))


def summarize_run(result, records, flooded, texts, codes, samples, pids):
    """Adds to ``result`` the summaries of the clients' records, each
    replica's counters, exit status and memory, and their totals."""
    result["metrics"] = texts[0] if len(texts) == 1 else texts
    counters = [metric_counts(text) for text in texts]
    total = collections.Counter()
    for each in counters:
        total.update(each)
    result["counters"] = dict(sorted(total.items()))
    if codes:
        result["server_exit_code"] = next((c for c in codes if c != 0), 0)
    result["summary"] = summarize(records)
    if flooded:
        result["flood"] = summarize(flooded)
    memory = [memory_growth(sampled) for sampled in samples]
    result["memory"] = total_memory(memory)
    if len(texts) > 1:
        result["replica_counters"] = counters
        if codes:
            result["server_exit_codes"] = codes
        if pids:
            result["replica_memory"] = memory


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
    urls = args.url.split(",") if args.url else []
    pids = [int(pid) for pid in args.pid.split(",")] if args.pid else []
    processes, redis, codes = [], None, []
    stop, samplers, samples = threading.Event(), [], []
    try:
        if not urls:
            if args.redis:
                redis = start_redis()
                result["redis"] = redis[1]
            processes, urls, logs = start_servers(
                server_command(args, redis and redis[1]),
                args.replicas,
                args.ready_timeout,
            )
            result["server_log" if len(logs) == 1 else "server_logs"] = (
                logs[0] if len(logs) == 1 else logs
            )
            pids = [process.pid for process in processes]
        result["urls"] = urls
        samples = [[] for _ in pids]
        for pid, sampled in zip(pids, samples, strict=True):
            samplers.append(
                threading.Thread(target=sample_memory, args=(pid, stop, sampled))
            )
            samplers[-1].start()
        records, flooded = run_load(args, urls, options)
        texts = [read_metrics(url, key=args.api_key) for url in urls]
    finally:
        stop.set()
        for sampler in samplers:
            sampler.join()
        codes = stop_servers(processes)
        if redis is not None:
            stop_redis(redis[0], redis[2])
    summarize_run(result, records, flooded, texts, codes, samples, pids)
    if not args.no_check:
        # After the load and the servers' exit: the CPU is the servers' while
        # they are measured.
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
