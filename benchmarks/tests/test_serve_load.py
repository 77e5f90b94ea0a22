"""benchmarks/serve_load.py: its percentiles, summary, memory growth and
counters against values worked out by hand here; its clients (round robin
over replicas), the server's start and stop, and a whole run against
stand-ins on real sockets; and one short run of two real ``kt-serve``
replicas of the test's numbers model sharing a real Redis, which give a key
one allowance between them."""

import collections
import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from benchmarks import serve_load

pytestmark = pytest.mark.once
OPTIONS = {"beam_size": 3, "length_penalty": 1.0}


class StandIn(http.server.BaseHTTPRequestHandler):
    """``/translate`` upper-cases; ``busy`` is refused (503), ``drop`` gets
    no answer, ``slow`` waits 0.3 s, ``hangup`` is answered and then its
    connection closed without a word. ``/metrics`` has one line."""

    protocol_version = "HTTP/1.1"  # keep-alive
    # Headers and body leave in two writes: with Nagle's algorithm the body
    # would wait for the client's delayed ACK.
    disable_nagle_algorithm = True

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append((self.client_address, body))
        text = body["texts"][0]
        if text == "drop":
            self.close_connection = True
            return
        if text == "busy":
            return self._answer(503, {"error": "queue full"}, {"Retry-After": "1"})
        time.sleep(0.3 if text == "slow" else 0)
        texts = [t.upper() for t in body["texts"]]
        self._answer(200, {"translations": texts, "model": "m", "version": "0"})
        self.close_connection = text == "hangup"

    def do_GET(self):
        self._answer(200, "kt_requests 7\n" if self.path == "/metrics" else "")

    def _answer(self, status, payload, headers=()):
        data = (
            payload.encode()
            if isinstance(payload, str)
            else json.dumps(payload).encode()
        )
        self.send_response(status)
        for name, value in dict(headers).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def stand_in():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.daemon_threads, server.bodies = True, []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,))
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def record(status, latency, end, **fields):
    fields.setdefault("answer", "A" if status == 200 else None)
    fields.setdefault("retried", False)
    return dict(sentence="a", status=status, latency=latency, end=end, **fields)


def test_percentile_interpolates_between_the_nearest_ranks():
    values = [40, 10, 30, 20]
    assert serve_load.percentile(values, 0) == 10
    assert serve_load.percentile(values, 50) == 25
    assert serve_load.percentile(values, 95) == pytest.approx(38.5)
    assert serve_load.percentile(values, 99) == pytest.approx(39.7)
    assert serve_load.percentile(values, 100) == 40
    assert serve_load.percentile([7], 99) == 7
    assert serve_load.percentile([], 50) is None


def test_summary_splits_errors_and_counts_answers_over_the_window():
    records = [
        record(200, 0.1, 1.0),
        record(200, 0.4, 4.0),
        record(200, 0.3, 2.0, retried=True),
        record(200, 0.2, 3.0),
        record(503, 0.001, 1.5, retry_after="1"),
        record(503, 0.001, 1.6, retry_after=None),
        record(500, 0.05, 2.5, retry_after=None),
        record(None, 3.0, 3.9, error="RemoteDisconnected: closed"),
        record(400, 0.01, 0.2, retry_after=None),
        # A 200 whose body is not the contract's is an error, not an answer.
        record(200, 0.9, 3.5, answer=None, error="KeyError: 'translations'"),
    ]
    assert serve_load.summarize(records) == {
        "requests": 10,
        "answered": 4,
        "seconds": 4.0,
        "sentences_per_second": 1.0,
        "errors": 6,
        "status_503": 2,
        "status_500": 1,
        "status_429": 0,
        "lost": 1,
        "other_errors": 2,
        "503_without_retry_after": 1,
        "resent_on_stale_connection": 1,
        "p50_ms": 250.0,
        "p95_ms": 385.0,
        "p99_ms": 397.0,
    }
    delayed = [
        dict(r, delay=d) for r, d in zip(records[:3], (0, 0.25, 0.0125), strict=True)
    ]
    assert serve_load.summarize(delayed)["max_send_delay_ms"] == 250.0
    assert serve_load.summarize([])["sentences_per_second"] == 0.0


def test_mismatches_count_answers_unlike_the_offline_translation():
    records = [
        dict(record(200, 0.1, 1), sentence="ein Hund", answer="a dog"),
        dict(record(200, 0.1, 1), sentence="ein Hund", answer="one dog"),
        dict(record(200, 0.1, 1), sentence="zwei", answer="two"),
        dict(record(503, 0.1, 1), sentence="zwei"),
        dict(record(None, 0.1, 1, error="timeout"), sentence="drei"),
    ]
    offline = {"ein Hund": "a dog", "zwei": "two", "drei": "three"}
    count, examples = serve_load.count_mismatches(records, offline)
    assert count == 1
    assert examples == [
        {"sentence": "ein Hund", "served": "one dog", "offline": "a dog"}
    ]


def test_memory_growth_is_from_the_first_sample_after_a_minute_to_the_end():
    mib = 2**20
    samples = [(0.0, 100 * mib), (59.9, 150 * mib), (60.4, 200 * mib), (600, 250 * mib)]
    assert serve_load.memory_growth(samples) == {
        "rss_start_bytes": 100 * mib,
        "rss_60s_bytes": 200 * mib,
        "rss_end_bytes": 250 * mib,
        "rss_growth_after_60s_pct": 25.0,
    }
    short = serve_load.memory_growth([(0.0, 100), (5.0, 150)])
    assert short["rss_end_bytes"] == 150
    assert short["rss_60s_bytes"] is short["rss_growth_after_60s_pct"] is None
    assert serve_load.memory_growth([]) == {}


def test_closed_loop_clients_ask_in_turn_from_their_own_offsets():
    sentences = ["one", "two", "busy", "four"]
    with stand_in() as (server, url):
        start = time.perf_counter()
        records = serve_load.closed_loop(url, sentences, 2, 1.0, OPTIONS)
        elapsed = time.perf_counter() - start
    assert 1.0 <= elapsed < 1.5
    assert len(records) == len(server.bodies) > 20
    assert all(
        body == {"texts": [body["texts"][0]], **OPTIONS} for _, body in server.bodies
    )
    # Two keep-alive connections, the second client's starting at "busy".
    first = {}
    for address, body in server.bodies:
        first.setdefault(address, body["texts"][0])
    assert sorted(first.values()) == ["busy", "one"]
    for r in records:
        busy = r["sentence"] == "busy"
        assert r["status"] == (503 if busy else 200)
        assert r["answer"] == (None if busy else r["sentence"].upper())
        assert r["retry_after"] == ("1" if busy else None)
    summary = serve_load.summarize(records)
    counts = collections.Counter(r["sentence"] for r in records)
    assert summary["status_503"] == counts["busy"] and summary["lost"] == 0
    assert max(counts.values()) - min(counts.values()) <= 2


def test_flooding_clients_send_their_own_key_beside_the_others(tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("one\ntwo\n")
    args = serve_load.parse_args(
        ["--url", "http://x", "--no-check", "--source", str(source), "--clients",
         "1", "--seconds", "0.5", "--api-key", "mine", "--flood-clients", "2",
         "--flood-key", "theirs"]
    )  # fmt: skip
    with stand_in() as (server, url):
        records, flooded = serve_load.run_load(args, url, OPTIONS)
    keys = collections.Counter(body["api_key"] for _, body in server.bodies)
    assert keys == {"mine": len(records), "theirs": len(flooded)}
    assert len(records) > 5 and len(flooded) > 5
    assert all(r["status"] == 200 for r in records + flooded)


def test_a_request_on_a_connection_the_server_closed_is_sent_again():
    with stand_in() as (_, url):
        records = serve_load.closed_loop(url, ["hangup", "one"], 1, 0.3, OPTIONS)
    assert len(records) >= 4
    assert all(r["status"] == 200 for r in records)
    assert [r["retried"] for r in records] == [r["sentence"] == "one" for r in records]


def test_open_loop_sends_on_schedule_whatever_the_answers():
    sentences = ["one", "slow", "busy", "drop"]
    with stand_in() as (server, url):
        start = time.perf_counter()
        records = serve_load.open_loop(url, sentences, 20, 1.0, OPTIONS, workers=8)
        elapsed = time.perf_counter() - start
    assert elapsed < 1.6  # the last one is due at 0.95 s, answered 0.3 s later
    assert len(records) == 20
    statuses = collections.Counter(r["status"] for r in records)
    assert statuses == {200: 10, 503: 5, None: 5}
    assert {r["sentence"] for r in records if r["status"] is None} == {"drop"}
    assert max(r["delay"] for r in records) < 0.1
    assert min(r["latency"] for r in records if r["sentence"] == "slow") >= 0.3
    summary = serve_load.summarize(records)
    assert (summary["lost"], summary["status_503"], summary["answered"]) == (5, 5, 10)


def test_open_loop_latency_counts_from_the_scheduled_time():
    # One worker and answers slower than the schedule: each request leaves
    # 0.2 s later than the one before was due to, and that wait is counted.
    with stand_in() as (_, url):
        records = serve_load.open_loop(url, ["slow"], 10, 0.3, OPTIONS, workers=1)
    latencies = sorted(r["latency"] for r in records)
    for latency, expected in zip(latencies, (0.3, 0.5, 0.7), strict=True):
        assert expected - 0.01 <= latency < expected + 0.15


FAKE_SERVER = """
import http.server, signal, sys, threading

class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "21")
        self.end_headers()
        self.wfile.write(b"kt_requests_total 7\\n\\n")

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
stop = lambda *_: threading.Thread(target=server.shutdown).start()
signal.signal(signal.SIGTERM, stop)
print("loading", flush=True)
print(f"kt-serve: ready on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
server.server_close()
"""


def test_the_server_is_started_until_ready_sampled_and_stopped_with_sigterm():
    command = [sys.executable, "-c", FAKE_SERVER]
    process, url = serve_load.start_server(command, subprocess.DEVNULL, 30)
    assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0
    assert serve_load.read_metrics(url) == "kt_requests_total 7\n\n"
    stop, samples = threading.Event(), []
    sampler = threading.Thread(
        target=serve_load.sample_memory, args=(process.pid, stop, samples, 0.05)
    )
    sampler.start()
    time.sleep(0.3)
    stop.set()
    sampler.join()
    assert len(samples) >= 3 and all(rss > 2**20 for _, rss in samples)
    assert serve_load.stop_server(process) == 0
    assert serve_load.rss_bytes(process.pid) is None


def test_a_server_that_dies_or_never_gets_ready_is_reported():
    with pytest.raises(RuntimeError, match="exited with 3"):
        serve_load.start_server(
            [sys.executable, "-c", "exit(3)"], subprocess.DEVNULL, 30
        )
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="not ready after 0.5 s"):
        serve_load.start_server(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            subprocess.DEVNULL,
            0.5,
        )
    assert time.perf_counter() - start < 5


def test_a_run_against_a_running_server_writes_its_report(
    tmp_path, monkeypatch, capsys
):
    source = tmp_path / "source.txt"
    source.write_text("one\n\ntwo\nbusy\n", encoding="utf-8")
    # The offline translator agrees with the stand-in except on "two".
    monkeypatch.setattr(
        serve_load,
        "offline_translations",
        lambda model, sentences, options: {
            s: "2" if s == "two" else s.upper() for s in sentences
        },
    )
    out = tmp_path / "result.json"
    with stand_in() as (server, url):
        code = serve_load.main(
            ["--url", url, "--model", "m.keras", "--source", str(source)]
            + ["--clients", "3", "--seconds", "0.5", "--json", str(out)]
        )
    assert code == 0
    result = json.loads(out.read_text())
    sent = collections.Counter(body["texts"][0] for _, body in server.bodies)
    assert set(sent) == {"one", "two", "busy"}
    assert result["summary"]["requests"] == sent.total()
    assert result["summary"]["status_503"] == sent["busy"]
    assert result["mismatches"] == sent["two"]
    assert result["mismatch_examples"][0] == {
        "sentence": "two",
        "served": "TWO",
        "offline": "2",
    }
    assert {body["beam_size"] for _, body in server.bodies} == {4}
    assert {body["length_penalty"] for _, body in server.bodies} == {0.6}
    assert result["machine"]["cpus"] == os.cpu_count()
    assert result["memory"] == {} and "server_exit_code" not in result
    assert result["metrics"] == "kt_requests 7\n"
    assert f"mismatches                 {sent['two']}" in capsys.readouterr().out


def test_clients_send_to_the_replicas_in_turn_on_a_connection_each():
    with stand_in() as (one, first), stand_in() as (two, second):
        closed = serve_load.closed_loop([first, second], ["a", "b"], 3, 0.5, OPTIONS)
        opened = serve_load.open_loop(
            [first, second], ["a"], 40, 0.5, OPTIONS, workers=3
        )
    # Closed loop: client i's n-th request to replica (i + n) % 2, over one
    # keep-alive connection per replica (3 clients: 3 connections each, one
    # more per replica for the open loop's 3 workers).
    for server in (one, two):
        assert len({address for address, _ in server.bodies}) == 3 + 3
    sent = collections.Counter(r["replica"] for r in closed)
    assert abs(sent[0] - sent[1]) <= 3 and sent[0] > 5
    assert len(one.bodies) + len(two.bodies) == len(closed) + len(opened)
    # Open loop: the k-th request of the schedule to replica k % 2.
    assert collections.Counter(r["replica"] for r in opened) == {0: 10, 1: 10}
    summary = serve_load.summarize(closed)
    assert summary["requests_by_replica"] == [sent[0], sent[1]]
    assert summary["answered_by_replica"] == [sent[0], sent[1]]
    assert "requests_by_replica" not in serve_load.summarize(closed[:0])


METRICS = """# HELP kt_serve_errors_total Requests not translated, by why.
kt_serve_errors_total{kind="rate_limited"} 17.0
kt_serve_errors_created{kind="rate_limited"} 1.7e+09
kt_serve_caller_requests_total{caller="key2",code="429"} 17.0
kt_serve_caller_requests_total{caller="key1",code="200"} 30.0
kt_serve_compilations_after_warm_up 0.0
kt_serve_requests_total{path="/translate",code="200"} 30.0
"""


def test_the_counters_of_each_replica_are_read_and_summed(capsys):
    assert serve_load.metric_counts(METRICS) == {
        "caller_key1_200": 30,
        "caller_key2_429": 17,
        "compilations_after_warm_up": 0,
        "errors_rate_limited": 17,
    }
    assert serve_load.metric_counts("error: ConnectionRefusedError") == {}
    gib = 2**30
    replicas = [
        {"rss_start_bytes": gib, "rss_60s_bytes": 2 * gib, "rss_end_bytes": 2 * gib},
        {"rss_start_bytes": gib, "rss_60s_bytes": 2 * gib, "rss_end_bytes": 3 * gib},
    ]
    total = serve_load.total_memory(replicas)
    assert total == {
        "rss_start_bytes": 2 * gib,
        "rss_60s_bytes": 4 * gib,
        "rss_end_bytes": 5 * gib,
        "rss_growth_after_60s_pct": 25.0,
    }
    short = serve_load.total_memory([dict(replicas[0], rss_60s_bytes=None)] * 2)
    assert short["rss_60s_bytes"] is short["rss_growth_after_60s_pct"] is None
    assert serve_load.total_memory([{}, {}]) == {}
    serve_load.report(
        {"mode": "m", "summary": {"requests": 3}, "memory": total,
         "replica_memory": replicas, "counters": {"errors_rate_limited": 17},
         "replica_counters": [{"errors_rate_limited": 17}, {}],
         "server_exit_code": 0, "server_exit_codes": [0, 0]}
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert f"{'rss_end_bytes':26s} 5.000 GiB (2.000 GiB, 3.000 GiB)" in lines
    assert f"{'metric_errors_rate_limited':26s} 17 (17, 0)" in lines
    assert f"{'server_exit_code':26s} 0 (0, 0)" in lines
    assert f"{'requests':26s} 3" in lines


def test_replicas_and_redis_are_for_servers_started_here(tmp_path):
    source = ["--source", str(tmp_path / "s.txt"), "--model", "m"]
    for wrong in (
        ["--url", "http://x", "--replicas", "2"],
        ["--url", "http://x", "--redis"],
        ["--redis", "--req-limit-storage", "redis://127.0.0.1:1"],
        ["--replicas", "0"],
    ):
        with pytest.raises(SystemExit):
            serve_load.parse_args(source + wrong)
    args = serve_load.parse_args(
        source + ["--req-limit", "5", "--auth-fail-limit", "3"]
    )
    command = serve_load.server_command(args, "redis://127.0.0.1:7")
    assert command[command.index("--req-limit-storage") + 1] == "redis://127.0.0.1:7"
    assert command[command.index("--auth-fail-limit") + 1] == "3"
    assert "--beam-sizes" not in command and "--max-queue" not in command


# The numbers model of the other serving tests (tests/test_serve.py).
FIXTURE = serve_load.REPO / "tests" / "fixtures" / "v0_2_0" / "translator.keras"
LIMIT = 10


def test_two_replicas_on_one_redis_give_a_key_one_allowance(tmp_path, monkeypatch):
    # Two real kt-serve processes and a real redis-server, started by the
    # benchmark: a key's LIMIT requests a minute are shared, not doubled.
    # PyTorch's servers start soonest (nothing to compile); the limits are
    # the server's, whatever the backend. Eight clients take the allowance
    # in a batch or two, then are refused in milliseconds.
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    keys, source, out = tmp_path / "keys.txt", tmp_path / "s.txt", tmp_path / "r.json"
    keys.write_text("key-one-7f3c9e\nkey-two-51d2aa\n")
    source.write_text("three hundred forty-two\nzero\ntwenty-one thousand five\n")
    code = serve_load.main(
        ["--model", str(FIXTURE), "--source", str(source), "--replicas", "2",
         "--redis", "--api-keys", str(keys), "--api-key", "key-one-7f3c9e",
         "--req-limit", str(LIMIT), "--clients", "8", "--seconds", "3",
         "--beam-size", "1", "--beam-sizes", "1", "--no-check", "--json",
         str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert code == 0 and result["server_exit_codes"] == [0, 0]
    summary = result["summary"]
    # More requests than two allowances; LIMIT answered between the two.
    assert summary["requests"] > 2 * LIMIT
    assert summary["answered"] == LIMIT
    assert summary["status_429"] == summary["requests"] - LIMIT
    assert all(count > 0 for count in summary["answered_by_replica"])
    sent = summary["requests_by_replica"]
    assert abs(sent[0] - sent[1]) <= 8
    counters = result["replica_counters"]
    assert [c["compilations_after_warm_up"] for c in counters] == [0, 0]
    assert [c["errors_rate_limited"] for c in counters] == [
        s - a for s, a in zip(sent, summary["answered_by_replica"], strict=True)
    ]
    assert result["redis"].startswith("redis://127.0.0.1:")
    assert all(m["rss_end_bytes"] > 2**20 for m in result["replica_memory"])
