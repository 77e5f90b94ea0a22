"""``kt-serve`` over real HTTP: the server in a subprocess on a free port of
127.0.0.1, requests over sockets, for the ``.keras`` path and the CTranslate2
export. Once: what is checked here is the server's, whatever the backend;
each backend's engine behind the server is test_serve_backends.py's.

Checked: answers equal ``Translator.translate`` on the same texts (and
requests sent together were batched); each kind of bad input gets a 4xx
naming the problem while the server goes on; a full queue answers 503 with
Retry-After; a client that disconnects is dropped from the queue (its
sentence is never searched); a search that crashes answers its batch 500
and the server goes on; SIGTERM with requests in flight answers them all,
stops accepting and exits 0. The server is ``tests/serve_harness.py``: the
real command around a translator that also sleeps or raises on given texts.
One server runs in this process instead, to watch its translator: each text
of a request is tokenized once and each batch sorted once.
"""

import concurrent.futures
import contextlib
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

import numpy as np
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
# Requests a minute per client address for the module's server: more than
# its tests make from 127.0.0.1; one test exhausts 127.0.0.2's.
ANONYMOUS_LIMIT = 120

pytestmark = pytest.mark.once


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

    def request(self, method, path, body=None, headers=None, timeout=120, source=None):
        """``(status, headers, body)``; a JSON body decoded. ``source``: the
        client's address (another loopback address is another client)."""
        connection = http.client.HTTPConnection(
            self.host, self.port, timeout=timeout,
            source_address=(source, 0) if source else None,
        )  # fmt: skip
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

    def translate(self, texts, source=None, **options):
        return self.request(
            "POST", "/translate", {"texts": texts, **options}, source=source
        )

    def metric(self, name, labels="", key=None):
        headers = {"Authorization": f"Bearer {key}"} if key else None
        _, _, text = self.request("GET", "/metrics", headers=headers)
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
        "--max-wait-ms", "50", "--source-lang", "en", "--target-lang", "de",
        "--req-limit", str(ANONYMOUS_LIMIT),
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
    (b'{"texts": ["zero"], "beam_size": 17}', 400, "beam_size in [1, 4]"),
    (b'{"texts": ["zero"], "length_penalty": -1}', 400, "length_penalty must be >= 0"),
    (b'{"texts": ["zero"], "length_penalty": NaN}', 400, "length_penalty must be"),
    (b'{"texts": ["zero"], "length_penalty": 1e308}', 400, "finite in float32"),
    (b'{"texts": ["zero"], "beam_size": 1' + b"0" * 5000 + b"}", 400, "out of range"),
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


def test_a_client_that_leaves_during_its_search_has_its_other_groups_skipped(server):
    """16 texts (the module server's whole queue) are two groups of 8,
    searched in turn; each text sleeps 0.2 s. The client hangs up while the
    first group runs: the second is never searched."""
    before = server.metric("kt_serve_dropped_sentences_total")
    body = json.dumps({"texts": ["sleep:0.2"] * 16}).encode()
    with socket.create_connection((server.host, server.port)) as gone:
        gone.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)
    status, _, _ = server.translate(["zero"])  # after the first group
    assert status == 200
    assert server.metric("kt_serve_dropped_sentences_total") - before == 8


def test_a_crashed_search_answers_its_batch_500_and_the_server_goes_on(
    server, translator
):
    status, _, answer = server.translate(["zero", "crash"])
    assert status == 500
    assert "RuntimeError: the search crashed (injected)" in answer["error"]
    status, _, answer = server.translate(["zero"])
    assert (status, answer["translations"]) == (200, translator.translate(["zero"]))


def libretranslate(server, key=None):
    from libretranslatepy import LibreTranslateAPI

    return LibreTranslateAPI(f"http://{server.host}:{server.port}", api_key=key)


def test_a_libretranslate_client_translates_as_offline(server, translator):
    """libretranslatepy sends a form body; its api_key is ignored without
    --api-keys, as LibreTranslate does."""
    client = libretranslate(server, key="any-key")
    assert [client.translate(t, "en", "de") for t in SENTENCES[:3]] == (
        translator.translate(SENTENCES[:3])
    )
    assert (
        client.translate(SENTENCES[3], "auto", "de")
        == translator.translate(SENTENCES[3:4])[0]
    )
    assert client.languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_libretranslate_fields_in_json_form_or_query_alternatives_and_html(
    server, translator
):
    pair = {"source": "en", "target": "de"}
    _, _, listed = server.request("POST", "/translate", {"q": SENTENCES[:3], **pair})
    assert listed == {"translatedText": translator.translate(SENTENCES[:3])}
    query = urllib.parse.urlencode({"q": "seven", **pair})
    _, _, queried = server.request("POST", f"/translate?{query}")
    assert queried == {"translatedText": translator.translate(["seven"])[0]}
    best = translator.n_best(["seven", "eighty"], n=3)
    _, _, one = server.request(
        "POST", "/translate", {"q": "seven", "alternatives": 2, **pair}
    )
    assert one == {
        "translatedText": best[0][0][0],
        "alternatives": [text for text, _ in best[0][1:]],
    }
    form = urllib.parse.urlencode({"q": "eighty", "alternatives": "2", **pair})
    _, _, formed = server.request(
        "POST", "/translate", form,
        {"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert formed["alternatives"] == [text for text, _ in best[1][1:]]
    markup = '<p class="n">seven <b>eighty</b></p>\n<script>zero < 1</script>'
    seven, eighty = translator.translate(["seven", "eighty"])
    _, _, html = server.request(
        "POST", "/translate", {"q": markup, "format": "html", **pair}
    )
    assert html == {
        "translatedText": f'<p class="n">{seven} <b>{eighty}</b></p>\n'
        "<script>zero < 1</script>"
    }


LIBRETRANSLATE_BAD = [
    ({"q": "seven", "source": "fr", "target": "de"}, 400, "it translates en → de"),
    ({"q": "seven", "source": "en"}, 400, "missing target"),
    ({"q": "seven", "source": "en", "target": "de", "format": "xml"}, 400, "format"),
    ({"q": "seven", "source": "en", "target": "de", "alternatives": 9}, 400, "[0, 3]"),
    ({"q": [], "source": "en", "target": "de"}, 400, "q is empty"),
    ({"q": ["a", 1], "source": "en", "target": "de"}, 400, "q[1] must be a string"),
    ({"q": "seven", "source": "en", "target": "de", "x" * 900_000: 1}, 400, "…'"),
]


def test_libretranslate_errors_are_its_shape_and_name_the_problem(server):
    for body, status, words in LIBRETRANSLATE_BAD:
        got, _, answer = server.request("POST", "/translate", body)
        assert (got, words in answer["error"]) == (status, True), answer
        assert len(answer["error"]) < 1000
    for path in ("/detect", "/translate_file", "/suggest"):
        got, _, answer = server.request("POST", path, {"q": "seven"})
        assert got == 501 and "not offered" in answer["error"]
    # No redirect built from the Host header: a path with a slash is unknown.
    got, headers, _ = server.request("POST", "/translate/", {"texts": ["seven"]})
    assert got == 404 and "location" not in headers


def test_an_error_outside_the_search_is_a_counted_json_500(server):
    before = server.metric("kt_serve_errors_total", 'kind="internal"')
    status, _, answer = server.request("POST", "/explain", {"text": "crash"})
    assert status == 500 and answer == {"error": "internal error (RuntimeError)"}
    assert server.metric("kt_serve_errors_total", 'kind="internal"') == before + 1
    assert server.metric("kt_serve_requests_total", 'code="500",path="/explain"') >= 1
    status, _, _ = server.translate(["seven"])
    assert status == 200


def test_an_anonymous_client_over_its_rate_gets_429_others_do_not(server):
    """127.0.0.2 is another client of the same server: its bucket empties
    (cheap 400s, answered after the rate is checked); 127.0.0.1's does not."""
    bad = {"q": "seven", "source": "fr", "target": "de"}
    flood = [
        server.request("POST", "/translate", bad, source="127.0.0.2")[0]
        for _ in range(ANONYMOUS_LIMIT + 10)
    ]
    # One token comes back every 0.5 s: a second of flooding may earn two.
    assert ANONYMOUS_LIMIT <= flood.count(400) <= ANONYMOUS_LIMIT + 4, flood
    assert flood[-1] == 429
    assert server.translate(["seven"])[0] == 200


def test_the_page_translates_with_the_n_best_and_the_attention(
    server, translator, tmp_path
):
    """In headless chromium: the page's translation equals the API's, its
    n-best list the translator's, and its heat map, for a chosen translation,
    layer and head, equals kt.attention_maps'."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    import keras_transformer as kt
    from tests import browser

    text = SENTENCES[0]
    _, _, api = server.translate([text])
    n_best = translator.n_best([text])[0]
    driver = browser.chromium()
    try:
        url = f"http://{server.host}:{server.port}/"
        translation, error = browser.translate_on_page(driver, url, text)
        assert (translation, error) == (api["translations"][0], "")
        listed = driver.find_elements(By.CSS_SELECTOR, "#n-best li .text")
        scores = driver.find_elements(By.CSS_SELECTOR, "#n-best li .score")
        assert [item.text for item in listed] == [t for t, _ in n_best]
        np.testing.assert_allclose(
            [float(s.text) for s in scores], [s for _, s in n_best], atol=1e-4
        )
        driver.find_elements(By.CSS_SELECTOR, "#n-best li")[1].click()
        Select(driver.find_element(By.ID, "layer")).select_by_visible_text("1")
        Select(driver.find_element(By.ID, "head")).select_by_visible_text("2")
        rows, columns, row_labels, column_labels = browser.heat_map_shape(driver)
        weights = browser.cell_weights(driver)
        shown = driver.find_element(By.ID, "translation").text
        browser.screenshot(driver, tmp_path, "page")
    finally:
        driver.quit()
    assert shown == n_best[1][0]
    maps = kt.attention_maps(translator, text, shown)
    assert (row_labels, column_labels) == (maps.target_tokens, maps.source_tokens)
    assert (rows, columns) == (
        len(maps.target_tokens),
        [len(maps.source_tokens)] * rows,
    )
    np.testing.assert_allclose(weights, maps.cross_attention[0, 1], atol=1e-5)
    assert os.path.getsize(tmp_path / "page.png") > 1000


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


def test_the_ctranslate2_export_is_served_and_answers_as_it_translates(
    translator, tmp_path
):
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.translate.ctranslate2_translator import load_ctranslate2
    from tests import browser

    path = export_ctranslate2(translator, tmp_path / "numbers")
    running = Server("keras_transformer.cli.serve", "--model", str(path))
    driver = browser.chromium()
    try:
        answers = concurrently(
            [lambda text=text: running.translate([text]) for text in SENTENCES]
        )
        _, _, health = running.request("GET", "/health")
        url = f"http://{running.host}:{running.port}/"
        on_page = browser.translate_on_page(driver, url, SENTENCES[0])
        note = driver.find_element("id", "attention-note").text
        rows = browser.heat_map_shape(driver)[0]
        browser.screenshot(driver, tmp_path, "page-ctranslate2")
    finally:
        driver.quit()
        status = running.stop()
    expected = load_ctranslate2(path).translate(SENTENCES)
    assert [body["translations"] for _, _, body in answers] == [[t] for t in expected]
    assert health["engine"].startswith("ctranslate2") and not health["attention"]
    # The page translates and says why there is no heat map.
    assert on_page == (expected[0], "")
    assert "computes no attention weights" in note and rows == 0
    assert status == 0, "".join(running.stderr)


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


@contextlib.contextmanager
def watched(target, name, wrap):
    """``target.name`` is ``wrap(target.name)`` within the block (an instance
    attribute set past Keras' tracking, deleted after)."""
    object.__setattr__(target, name, wrap(getattr(target, name)))
    try:
        yield
    finally:
        object.__delattr__(target, name)


def test_a_request_is_encoded_once_and_its_batch_sorted_once(translator):
    """The server around the module's translator in this process, so that
    its tokenizer and its search can be watched, over HTTP on 127.0.0.1:
    each text is tokenized once (where it is admitted), the engine searches
    the batch of two requests sorted by length, and nothing sorts it again
    (``TranslatorBase._decode``, the translator's sort, is never called)."""
    import uvicorn

    from keras_transformer.serving.app import Service, Settings
    from keras_transformer.serving.server import listen

    expected = translator.translate(SENTENCES)
    best = translator.n_best(SENTENCES[:2], n=2)
    settings = Settings(
        beam_sizes=(4,), max_wait_ms=500, source_lang="en", target_lang="de"
    )
    service = Service(lambda: translator, "translator", "0", settings)
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(service.app(), lifespan="on", log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]})
    thread.start()

    def post(body):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            connection.request("POST", "/translate", body=json.dumps(body))
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    libre = {"q": SENTENCES[:2], "source": "en", "target": "de", "alternatives": 1}
    tokenized, searched, sorted_again = [], [], []

    def counting(tokenize):
        def tokenize_counted(texts):
            tokenized.extend(texts)
            return tokenize(texts)

        return tokenize_counted

    def recording(search_sorted):
        def search_recorded(sources, limits, *args):
            searched.append([len(row) for row in sources])
            return search_sorted(sources, limits, *args)

        return search_recorded

    def refusing(decode):
        def decode_refused(*args, **kwargs):
            sorted_again.append(args)
            return decode(*args, **kwargs)

        return decode_refused

    try:
        deadline = time.monotonic() + 300
        while service.state == "loading" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert service.state == "ready", service.error
        with (
            watched(translator.tokenizer, "tokenize", counting),
            watched(translator, "_search_sorted", recording),
            watched(translator, "_decode", refusing),
        ):
            answers = concurrently(
                [
                    lambda: post({"texts": SENTENCES[:5]}),
                    lambda: post({"texts": SENTENCES[5:]}),
                    lambda: post(libre),
                ]
            )
    finally:
        running.should_exit = True
        thread.join(60)
        sock.close()
    assert [status for status, _ in answers] == [200] * 3, answers
    assert answers[0][1]["translations"] + answers[1][1]["translations"] == expected
    assert answers[2][1] == {
        "translatedText": [row[0][0] for row in best],
        "alternatives": [[row[1][0]] for row in best],
    }
    assert sorted(tokenized) == sorted(SENTENCES + SENTENCES[:2])
    # The two /translate requests share a batch; the n-best one has its own.
    assert sorted(map(len, searched)) == [2, len(SENTENCES)], searched
    assert all(lengths == sorted(lengths) for lengths in searched), searched
    assert sorted_again == []
