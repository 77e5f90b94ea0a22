"""``kt-serve`` over real HTTP: the server in a subprocess on a free port of
127.0.0.1, requests over sockets, on each backend's run for the ``.keras``
path and once for the CTranslate2 export.

Checked: answers equal ``Translator.translate`` on the same texts (and
requests sent together were batched); each kind of bad input gets a 4xx
naming the problem while the server goes on; a full queue answers 503 with
Retry-After; a client that disconnects is dropped from the queue (its
sentence is never searched); a search that crashes answers its batch 500
and the server goes on; SIGTERM with requests in flight answers them all,
stops accepting and exits 0. The server is ``tests/serve_harness.py``: the
real command around a translator that also sleeps or raises on given texts.
"""

import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from keras_transformer.translate.evaluation import load_translator
from tests import subprocess_coverage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "v0_2_0", "translator.keras")
SENTENCES = [
    "three hundred forty-two",
    "twenty-one thousand five",
    "zero",
    "nine hundred ninety-nine thousand nine hundred ninety-nine",
    "seven",
    "one thousand",
    "eighty",
    "four hundred thousand twelve",
]
READY = re.compile(r"kt-serve: ready on (http://\S+)")


class Server:
    """A server subprocess: ``python -m MODULE ARGS --port 0``."""

    def __init__(self, module, *args):
        command = [sys.executable, "-m", module, *args, "--port", "0"]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=subprocess_coverage.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        line = self.process.stdout.readline()  # the ready line, or EOF
        match = READY.search(line)
        if not match:
            self.process.kill()
            self.stop()
            pytest.fail(f"no ready line: {line!r}; stderr: {''.join(self.stderr)}")
        parsed = urllib.parse.urlsplit(match.group(1))
        self.host, self.port = parsed.hostname, parsed.port

    def _read_stderr(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """``(status, headers, body)``; a JSON body decoded."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            data = response.read()
            if response.getheader("content-type", "").startswith("application/json"):
                data = json.loads(data)
            return response.status, dict(response.getheaders()), data
        finally:
            connection.close()

    def translate(self, texts, **options):
        return self.request("POST", "/translate", {"texts": texts, **options})

    def metric(self, name, labels=""):
        _, _, text = self.request("GET", "/metrics")
        pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "")
        found = re.search(rf"^{pattern} (\S+)$", text.decode(), re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def stop(self):
        """SIGTERM; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self):
        """The exit status, once the process has ended by itself."""
        status = self.process.wait(timeout=120)
        self._reader.join(timeout=10)
        self.process.stdout.close()
        self.process.stderr.close()
        return status


def concurrently(calls):
    """The results of ``calls`` (functions), run at once from threads."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


@pytest.fixture(scope="module")
def translator():
    return load_translator(FIXTURE)


@pytest.fixture(scope="module")
def server():
    """One server for the module's tests (the SIGTERM test, last, stops it):
    the real command around a translator that also sleeps and crashes on
    demand (tests/serve_harness.py); a queue of 16 sentences."""
    running = Server(
        "tests.serve_harness", "--model", FIXTURE, "--max-queue", "16",
        "--max-wait-ms", "50",
    )  # fmt: skip
    yield running
    running.stop()


def test_answers_equal_the_translators_and_arrive_batched(server, translator):
    status, _, health = server.request("GET", "/health")
    assert status == 200 and health["status"] == "ready", health
    calls = [lambda text=text: server.translate([text]) for text in SENTENCES]
    calls.append(lambda: server.translate(SENTENCES[:3]))
    answers = concurrently(calls)
    assert all(status == 200 for status, _, _ in answers), answers
    got = [body["translations"] for _, _, body in answers]
    expected = translator.translate(SENTENCES)
    assert got[:-1] == [[text] for text in expected]
    assert got[-1] == expected[:3]
    assert {(body["model"], len(body["version"])) for _, _, body in answers} == {
        ("translator", 12)
    }
    # Nine requests sent together (the warm-up is not counted): fewer search
    # calls than requests.
    calls = server.metric("kt_serve_batch_sentences_count")
    assert 1 <= calls < len(answers)
    greedy = server.translate(SENTENCES, beam_size=1, length_penalty=0.0)
    assert greedy[2]["translations"] == translator.translate(SENTENCES, beam_size=1)


BAD = [
    (b"{not json", 400, "not JSON"),
    (b'{"texts": ["\xff\xfe"]}', 400, "not valid UTF-8"),
    (b"[]", 400, "JSON object"),
    (b"[" * 50_000 + b"]" * 50_000, 400, "nested too deeply"),
    (b'{"sentences": ["zero"]}', 400, "unknown option(s) ['sentences']"),
    (b'{"beam_size": 2}', 400, 'no "texts"'),
    (b'{"texts": "zero"}', 400, "texts must be a list of strings, not a string"),
    (b'{"texts": []}', 400, "texts is empty"),
    (b'{"texts": ["zero", 3]}', 400, "texts[1] must be a string, not a number"),
    (b'{"texts": ["\\ud800"]}', 400, "texts[0] is not valid Unicode"),
    (b'{"texts": ["zero"], "beam_size": 0}', 400, "beam_size must be >= 1"),
    (b'{"texts": ["zero"], "beam_size": "4"}', 400, "beam_size must be an int"),
    (b'{"texts": ["zero"], "beam_size": 17}', 400, "server's maximum 16"),
    (b'{"texts": ["zero"], "length_penalty": -1}', 400, "length_penalty must be >= 0"),
    (b'{"texts": ["zero"], "length_penalty": NaN}', 400, "length_penalty must be"),
    (json.dumps({"texts": ["zero"] * 65}).encode(), 413, "at most 64"),
    (json.dumps({"texts": ["one " * 300]}).encode(), 413, "texts[0] is"),
]


def test_bad_input_gets_a_4xx_naming_it_and_the_server_goes_on(server, translator):
    for body, status, words in BAD:
        got, _, answer = server.request("POST", "/translate", body)
        assert (got, words in answer["error"]) == (status, True), (body, answer)
    for method, path, status in [("GET", "/translate", 405), ("POST", "/nope", 404)]:
        got, _, answer = server.request(method, path, b"{}")
        assert got == status and "error" in answer
    assert server.metric("kt_serve_errors_total", 'kind="bad_request"') == len(BAD)
    assert server.metric("kt_serve_requests_total", 'code="404",path="other"') == 1
    _, _, answer = server.translate(["zero"])
    assert answer["translations"] == translator.translate(["zero"])


def test_a_full_queue_answers_503_with_retry_after(server):
    """The batch of "sleep:1.5" runs; 16 sentences fill the queue
    (--max-queue 16); a 17th is refused; the 16 are answered."""
    slow = threading.Thread(target=server.translate, args=(["sleep:1.5"],))
    slow.start()
    time.sleep(0.5)  # its batch has started: the queue is empty again
    queued = [
        lambda: server.translate(SENTENCES),
        lambda: server.translate(SENTENCES[::-1]),
    ]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(call) for call in queued]
        time.sleep(0.3)
        status, headers, answer = server.translate(["seven"])
        answers = [future.result() for future in futures]
    slow.join()
    assert status == 503 and headers["retry-after"] == "1", answer
    assert "the queue holds 16 sentences" in answer["error"]
    assert [s for s, _, _ in answers] == [200, 200]
    assert server.metric("kt_serve_errors_total", 'kind="queue_full"') == 1


def test_a_client_that_disconnects_is_dropped_from_the_queue(server):
    before = server.metric("kt_serve_batch_sentences_sum")
    slow = threading.Thread(target=server.translate, args=(["sleep:1.5"],))
    slow.start()
    time.sleep(0.5)
    body = json.dumps({"texts": ["one", "two"]}).encode()
    with socket.create_connection((server.host, server.port)) as gone:
        gone.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.3)  # queued behind the slow batch, then hangs up
    status, _, _ = server.translate(["zero"])
    slow.join()
    assert status == 200
    # The slow batch's sentence and "zero": the two dropped ones never ran.
    assert server.metric("kt_serve_batch_sentences_sum") - before == 2
    assert server.metric("kt_serve_errors_total", 'kind="disconnected"') == 1


def test_a_crashed_search_answers_its_batch_500_and_the_server_goes_on(
    server, translator
):
    status, _, answer = server.translate(["zero", "crash"])
    assert status == 500
    assert "RuntimeError: the search crashed (injected)" in answer["error"]
    status, _, answer = server.translate(["zero"])
    assert (status, answer["translations"]) == (200, translator.translate(["zero"]))


def test_sigterm_answers_the_requests_in_flight_then_exits_0(server, translator):
    """Runs last on the module's server: it stops it."""
    calls = [lambda: server.translate(["sleep:1.5"])]
    calls += [lambda text=text: server.translate([text]) for text in SENTENCES[:2]]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        time.sleep(0.7)  # the slow batch runs, the other two wait
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((server.host, server.port), timeout=5).close()
        answers = [future.result() for future in futures]
    assert [status for status, _, _ in answers] == [200] * 3
    assert [body["translations"] for _, _, body in answers[1:]] == [
        [text] for text in translator.translate(SENTENCES[:2])
    ]
    # Not a second SIGTERM: the first one's exit may take a while.
    assert server.wait() == 0, "".join(server.stderr)


@pytest.mark.once
def test_the_ctranslate2_export_is_served_and_answers_as_it_translates(
    translator, tmp_path
):
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.translate.ctranslate2_translator import load_ctranslate2

    path = export_ctranslate2(translator, tmp_path / "numbers")
    running = Server("keras_transformer.cli.serve", "--model", str(path))
    try:
        answers = concurrently(
            [lambda text=text: running.translate([text]) for text in SENTENCES]
        )
        _, _, health = running.request("GET", "/health")
    finally:
        status = running.stop()
    expected = load_ctranslate2(path).translate(SENTENCES)
    assert [body["translations"] for _, _, body in answers] == [[t] for t in expected]
    assert health["engine"].startswith("ctranslate2")
    assert status == 0, "".join(running.stderr)


@pytest.mark.once
def test_a_port_in_use_a_missing_and_a_damaged_model_exit_2_with_one_line(tmp_path):
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(b"PK\x03\x04 not a zip archive")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [
            (["--model", FIXTURE, "--port", str(port)], "cannot listen on"),
            (["--model", str(tmp_path / "none.keras")], "none.keras: no such model"),
            (["--model", str(damaged), "--port", "0"], "damaged.keras"),
        ]
        command = [sys.executable, "-m", "keras_transformer.cli.serve"]
        runs = [
            subprocess.Popen(
                command + args,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for args, _ in cases
        ]
        done = [run.communicate(timeout=300) + (run.returncode,) for run in runs]
    for (out, err, status), (_, words) in zip(done, cases, strict=True):
        errors = [line for line in err.splitlines() if "kt-serve: error" in line]
        assert status == 2 and out == "", (status, out, err)
        assert len(errors) == 1 and words in errors[0], err
