"""``kt-serve`` with API keys, a request limit and a character limit, over
real HTTP on 127.0.0.1, once (keys and limits are the server's, whatever the
backend): a real LibreTranslate client (``libretranslatepy``) and a real
browser (headless chromium) as callers.

Checked: a key in the clear and a hashed one are accepted and translate as
offline; a missing or wrong key is a 403 in LibreTranslate's error shape,
for the API, the metrics and the page; a caller over its rate gets 429 with
Retry-After while another key's answers are unchanged; a request over the
character limit is a 413 naming it; the metrics count by key without
showing it; the page works with a key typed once; a non-loopback host
without keys, and a bad key file, stop the command before the model loads;
the access log shows no key, however the query string spells it.

Without a server: the key file's rules; the rate limiter (a moving window)
in memory and in a real Redis (``redis-server``, tests/redis_server.py)
that two limiters share, stopped and frozen under them: one timeout an
outage, counts sent as Redis froze taken back when it wakes (over TCP and
a Unix socket), keys checked and guesses throttled meanwhile; the filter
that takes keys out of the logs. Two replicas over HTTP through an outage:
test_serve_outage.py.
"""

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error

import numpy as np
import pytest

from keras_transformer.translate.base import TranslatorBase
from keras_transformer.translate.evaluation import load_translator
from tests import browser
from tests.redis_server import RedisServer, free_port
from tests.test_serve import FIXTURE, ROOT, SENTENCES, Server, libretranslate

KEYS = {"clear": "alpha-7f3c9e", "hashed": "bravo-51d2aa", "flood": "charlie-0b8e4d"}
REQ_LIMIT = 20
CHAR_LIMIT = 120
# Failed authentications a minute per address: 127.0.0.1's tests fail fewer.
AUTH_FAIL_LIMIT = 12

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def translator():
    return load_translator(FIXTURE)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    digest = hashlib.sha256(KEYS["hashed"].encode()).hexdigest()
    path = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    path.write_text(
        f"# kt-serve's keys\n{KEYS['clear']}\n\nsha256:{digest}\n  {KEYS['flood']}  \n"
    )
    return path


@pytest.fixture(scope="module")
def server(key_file):
    running = Server(
        "tests.serve_harness", "--model", FIXTURE, "--source-lang", "en",
        "--target-lang", "de", "--api-keys", str(key_file),
        "--req-limit", str(REQ_LIMIT), "--char-limit", str(CHAR_LIMIT),
        "--auth-fail-limit", str(AUTH_FAIL_LIMIT),
        "--beam-sizes", "4",  # the one these tests use: a shorter warm-up
        "--access-log",  # which must show no key
    )  # fmt: skip
    yield running
    assert running.stop() == 0, "".join(running.stderr)


def refusal(call):
    """``(status, error body)`` of a client call that must be refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        call()
    return refused.value.code, json.loads(refused.value.read())


def test_keys_in_the_clear_and_hashed_translate_as_offline(server, translator):
    expected = translator.translate(SENTENCES[:4])
    for key in (KEYS["clear"], KEYS["hashed"]):
        got = [
            libretranslate(server, key).translate(text, "en", "de")
            for text in SENTENCES[:4]
        ]
        assert got == expected
    assert libretranslate(server, KEYS["clear"]).languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_a_missing_or_wrong_key_is_403_everywhere(server):
    for key in (None, "alpha", KEYS["clear"] + "x", f"sha256:{'0' * 64}"):
        status, body = refusal(
            lambda key=key: libretranslate(server, key).translate("seven", "en", "de")
        )
        assert status == 403 and "API key" in body["error"], body
    status, _, body = server.request("POST", "/explain", {"text": "seven"})
    assert status == 403 and "API key" in body["error"]
    status, _, body = server.request("GET", "/metrics")
    assert status == 403 and "API key" in body["error"]
    # The hashed line of the file is its digest: the digest itself is no key.
    digest = hashlib.sha256(KEYS["hashed"].encode()).hexdigest()
    status, _, _ = server.translate(["seven"], api_key=digest)
    assert status == 403


def test_metrics_count_by_key_without_showing_it(server):
    status, _, _ = server.translate(["seven"], api_key=KEYS["hashed"])
    assert status == 200
    status, _, text = server.request(
        "GET", "/metrics", headers={"Authorization": f"Bearer {KEYS['clear']}"}
    )
    text = text.decode()
    assert status == 200
    # The hashed key is the file's fourth line.
    assert 'kt_serve_caller_requests_total{caller="key4",code="200"}' in text
    assert 'caller="anonymous",code="403"' in text
    for key in KEYS.values():
        assert key not in text
        assert hashlib.sha256(key.encode()).hexdigest()[:16] not in text


def test_one_key_reader_for_every_endpoint(server):
    """The api_key field wins over a Bearer header on /translate, /explain
    and /metrics alike, and a scrape is counted under its caller."""
    wrong, right = "not-a-key", KEYS["clear"]
    metrics = "/metrics?api_key={}"
    for field, header, expected in ((wrong, right, 403), (right, wrong, 200)):
        bearer = {"Authorization": f"Bearer {header}"}
        calls = [
            ("POST", "/translate", {"texts": ["seven"], "api_key": field}),
            ("POST", "/explain", {"text": "seven", "api_key": field}),
            ("GET", metrics.format(field), None),
        ]
        for method, path, body in calls:
            status, _, _ = server.request(method, path, body, headers=bearer)
            assert status == expected, (path, field, header, status)
    _, _, text = server.request(
        "GET", metrics.format(right), headers={"Authorization": f"Bearer {wrong}"}
    )
    # The clear key is the file's second line; its scrapes are counted.
    assert 'kt_serve_caller_requests_total{caller="key2",code="200"}' in text.decode()


def test_failed_authentications_are_throttled_per_address(server):
    """Past AUTH_FAIL_LIMIT missing or wrong keys a minute, an address gets
    429 with Retry-After whatever key it sends; other addresses do not."""
    guesser = "127.0.0.7"
    statuses = [
        server.translate(["seven"], api_key=f"guess-{i}", source=guesser)[0]
        if i % 2
        else server.request(
            "GET", "/metrics", headers={"Authorization": f"Bearer guess-{i}"},
            source=guesser,
        )[0]
        for i in range(AUTH_FAIL_LIMIT + 3)
    ]  # fmt: skip
    assert statuses == [403] * AUTH_FAIL_LIMIT + [429] * 3, statuses
    status, headers, body = server.translate(
        ["seven"], api_key=KEYS["clear"], source=guesser
    )
    assert status == 429 and "failed authentications" in body["error"], body
    assert 50 <= int(headers["retry-after"]) <= 60, headers
    assert server.translate(["seven"], api_key=KEYS["hashed"])[0] == 200
    throttled = server.metric(
        "kt_serve_errors_total", 'kind="auth_throttled"', key=KEYS["clear"]
    )
    assert throttled >= 4


def test_the_character_limit_is_a_413_naming_it(server):
    text = "one " * 40  # 160 characters
    status, body = refusal(
        lambda: libretranslate(server, KEYS["clear"]).translate(text, "en", "de")
    )
    assert status == 413 and f"at most {CHAR_LIMIT} (--char-limit)" in body["error"]


def test_a_caller_over_its_rate_gets_429_and_the_others_are_answered(
    server, translator
):
    """The flooding key's requests ask for a pair the model cannot serve
    (a 400, answered after the rate is checked, and at once): the first
    REQ_LIMIT get it, the rest 429; meanwhile another key translates."""
    flood = [
        lambda: server.request(
            "POST",
            "/translate",
            {"q": "seven", "source": "en", "target": "fr", "api_key": KEYS["flood"]},
        )  # fmt: skip
        for _ in range(REQ_LIMIT + 10)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        other = [
            pool.submit(server.translate, [text], api_key=KEYS["clear"])
            for text in SENTENCES[:4]
        ]
        flooded = [call() for call in flood]
        answers = [future.result() for future in other]
    statuses = [status for status, _, _ in flooded]
    # A moving window: REQ_LIMIT in any minute, then none until the first
    # of them is a minute old.
    assert statuses.count(400) == REQ_LIMIT, statuses
    assert statuses.count(429) == len(flood) - REQ_LIMIT
    _, headers, body = flooded[-1]
    assert 50 <= int(headers["retry-after"]) <= 60, headers
    assert "Too many requests" in body["error"]
    assert [status for status, _, _ in answers] == [200] * 4
    assert [body["translations"][0] for _, _, body in answers] == translator.translate(
        SENTENCES[:4]
    )


def test_the_access_log_shows_no_key(server):
    """Keys in query strings, however spelled (the name in any case and
    percent-encoded, its "=" encoded as a client that encoded the whole
    pair does, twice, brackets after the name), and in a request that is not
    valid HTTP: the log has each request line with the key's value
    ``[redacted]``, and no key anywhere."""
    clear, hashed, flood = KEYS["clear"], KEYS["hashed"], KEYS["flood"]
    paths = [
        f"/metrics?api_key={clear}",
        f"/health?probe=1&API_Key={hashed}",
        f"/health?probe=2&%61pi%5Fkey={flood}&after=x",
        f"/health?probe=3&API_KEY%3d{clear}&api_key={hashed}",
        f"/health?probe=4&api_key%5B%5D={flood}&%2541pi%255Fkey%253D{clear}",
    ]
    for path in paths:
        status, _, _ = server.request("GET", path)
        assert status == 200, path
    # The key the server does not read (its name is "api_key=..."): a 403,
    # from an address of its own (the module's tests count 127.0.0.1's).
    status, _, _ = server.request(
        "POST", f"/translate?api_key%3D{hashed}", {"texts": ["seven"]},
        source="127.0.0.3",
    )  # fmt: skip
    assert status == 403
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(
            f"GET /health?api_key={clear} HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: abc\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")
    expected = [
        '"GET /metrics?api_key=[redacted] HTTP/1.1" 200',
        '"GET /health?probe=1&API_Key=[redacted] HTTP/1.1" 200',
        '"GET /health?probe=2&%61pi%5Fkey=[redacted]&after=x HTTP/1.1" 200',
        '"GET /health?probe=3&API_KEY%3d[redacted]&api_key=[redacted] HTTP/1.1" 200',
        '"GET /health?probe=4&api_key%5B%5D=[redacted]&%2541pi%255Fkey%253D[redacted] '
        'HTTP/1.1" 200',
        '"POST /translate?api_key%3D[redacted] HTTP/1.1" 403',
        "Invalid HTTP request received.",
    ]
    for _ in range(50):  # the reader thread may be behind
        log = "".join(server.stderr)
        if all(line in log for line in expected):
            break
        time.sleep(0.1)
    assert all(line in log for line in expected), log[-3000:]
    for key in KEYS.values():
        assert key not in log


def test_keys_are_redacted_from_every_log_record():
    """The filter of every handler of kt-serve's logging, on records made as
    uvicorn makes them: an access record (its request line is its third
    argument), an error's message and its traceback."""
    import uvicorn.logging

    from keras_transformer.serving import server as kt_server

    config = kt_server.log_config()
    assert all(h["filters"] == ["keys"] for h in config["handlers"].values())
    keys = config["filters"]["keys"]["()"]()
    access = uvicorn.logging.AccessFormatter(
        fmt=config["formatters"]["access"]["fmt"], use_colors=False
    )
    default = uvicorn.logging.DefaultFormatter(
        fmt=config["formatters"]["default"]["fmt"], use_colors=False
    )
    key = "alpha-key-0001"
    for query, shown in [
        (f"api_key={key}", "api_key=[redacted]"),
        (f"q=1&API_KEY={key}&source=en", "q=1&API_KEY=[redacted]&source=en"),
        (f"api%5Fkey={key}", "api%5Fkey=[redacted]"),
        (f"%41PI%5fkey={key}%26more", "%41PI%5fkey=[redacted]"),
        (f"api_key={key}&api_key={key}", "api_key=[redacted]&api_key=[redacted]"),
        (f"api_key%3D{key}", "api_key%3D[redacted]"),
        (f"q=1&Api%5fKey%3d{key}&x=2", "q=1&Api%5fKey%3d[redacted]&x=2"),
        (f"%2561pi_key%253D{key}", "%2561pi_key%253D[redacted]"),
        (f"api_key%5B%5D={key}", "api_key%5B%5D=[redacted]"),
        (f"api_key+={key}", "api_key+=[redacted]"),
        (f"api_key={key}={key}", "api_key=[redacted]"),
        ("q=api_keys&source=en", "q=api_keys&source=en"),
        ("q=api_key&source=en", "q=api_key&source=en"),
    ]:
        record = logging.LogRecord(
            "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
            ("127.0.0.1:5000", "POST", f"/translate?{query}", "1.1", 200), None,
        )  # fmt: skip
        assert keys.filter(record)
        assert access.format(record) == (
            f'INFO:     127.0.0.1:5000 - "POST /translate?{shown} HTTP/1.1" 200 OK'
        )
    try:
        raise ValueError(f"cannot read http://h/translate?api_key={key}")
    except ValueError as error:
        failed = (type(error), error, error.__traceback__)
    for args, exc_info in [((f"/x?api_key={key}",), None), ((), failed)]:
        record = logging.LogRecord(
            "uvicorn.error", logging.ERROR, __file__, 1,
            "failed: %s" if args else "Exception in ASGI application", args, exc_info,
        )  # fmt: skip
        assert keys.filter(record)
        line = default.format(record)
        assert key not in line and "api_key=[redacted]" in line, line


def test_the_page_works_with_a_key(server, translator, tmp_path):
    """Wrong key: the page says why in words; the right key, typed once and
    kept for the tab: the translation equals the API's, and the heat map is
    the attention of kt.attention_maps (last layer, mean of the heads)."""
    import keras_transformer as kt

    url = f"http://{server.host}:{server.port}/"
    text = SENTENCES[0]
    _, _, api = server.translate([text], api_key=KEYS["clear"])
    driver = browser.chromium()
    try:
        translation, error = browser.translate_on_page(driver, url, text, key="nope")
        assert translation == "" and "403" in error and "Invalid API key" in error
        translation, error = browser.translate_on_page(
            driver, url, text, key=KEYS["clear"]
        )
        assert (translation, error) == (api["translations"][0], "")
        rows, columns, row_labels, column_labels = browser.heat_map_shape(driver)
        weights = browser.cell_weights(driver)
        browser.screenshot(driver, tmp_path, "page-with-key")
        driver.refresh()  # the key stays in the tab's session storage
        kept = browser.wait_for(
            driver, "return document.getElementById('api-key').value"
        )
    finally:
        driver.quit()
    maps = kt.attention_maps(translator, text, translation)
    assert (row_labels, column_labels) == (maps.target_tokens, maps.source_tokens)
    assert rows == len(maps.target_tokens)
    assert columns == [len(maps.source_tokens)] * rows
    np.testing.assert_allclose(weights, maps.cross_attention[-1].mean(0), atol=1e-5)
    assert kept == KEYS["clear"]
    assert os.path.getsize(tmp_path / "page-with-key.png") > 1000


def test_a_public_host_without_keys_and_a_bad_key_file_stop_before_loading(
    tmp_path,
):
    bad = tmp_path / "keys.txt"
    bad.write_text("good-key\nsha256:12ab\n")
    cases = [
        (["--host", "0.0.0.0"], "give --api-keys FILE, or --allow-anonymous"),
        (["--api-keys", str(bad)], "keys.txt, line 2: a hashed key is sha256:"),
        (["--api-keys", str(tmp_path / "none.txt")], "none.txt: cannot read"),
        (["--source-lang", "en"], "give both --source-lang and --target-lang"),
    ]
    command = [sys.executable, "-m", "keras_transformer.cli.serve", "--model", FIXTURE]
    for args, words in cases:
        done = subprocess.run(
            command + args + ["--port", "0"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and done.stdout == "", (args, done)
        assert words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_key_file_is_read_and_its_mistakes_named(tmp_path):
    from keras_transformer.serving.access import KeyFileError, KeyRing

    path = tmp_path / "keys.txt"
    digest = hashlib.sha256(b"zwei").hexdigest()
    path.write_text(f"# keys\neins\n\nsha256:{digest.upper()}\n")
    ring = KeyRing.read(path)
    assert len(ring) == 2
    assert [ring.name_of(k) for k in ("eins", "zwei", "drei", "", None, 7)] == [
        "key2", "key4", None, None, None, None,
    ]  # fmt: skip
    assert ring.name_of(f"sha256:{digest}") is None
    # A byte-order mark (Windows editors write one) is not part of a line;
    # SHA256: in capitals is a hashed key too.
    for text, names in [
        ("\ufeff# keys\neins\n", [None, "key2"]),  # the comment is no key
        (f"\ufeffsha256:{digest}\neins\n", ["key1", "key2"]),
        (f"\ufeffSHA256:{digest.upper()}\n", ["key1", None]),
    ]:
        path.write_text(text, encoding="utf-8")
        ring = KeyRing.read(path)
        assert [ring.name_of(k) for k in ("zwei", "eins")] == names, text
        assert len(ring) == len([name for name in names if name])
    for text, words in [
        ("eins\neins\n", "line 2: the same key as key1"),
        (f"eins\nsha256:{digest}\nzwei\n", "line 3: the same key as key2"),
        ("sha256:xyz\n", "line 1: a hashed key is sha256: and 64 hex digits"),
        ("SHA256:xyz\n", "line 1: a hashed key is sha256: and 64 hex digits"),
        ("# only a comment\n\n", "no API keys in the file"),
        ("eins\nzwei # the second\n", "line 2: a key is one token, without whitespace"),
        ("ein\ts\n", "line 1: a key is one token"),
        (f"sha256:{digest} # zwei\n", "line 1: a key is one token"),
    ]:
        path.write_text(text)
        with pytest.raises(KeyFileError, match=words) as refused:
            KeyRing.read(path)
        assert "keys.txt" in str(refused.value)


def test_the_rate_limiter_counts_each_bucket_in_any_window():
    """In memory. A one-second window shows the refill without waiting a
    minute; the minute's Retry-After is read, not waited for."""
    from keras_transformer.serving.access import RateLimiter

    async def run():
        limiter = RateLimiter(3, window=1)
        started = time.monotonic()
        takes = [await limiter.take("a") for _ in range(4)]
        others = [await limiter.take("b"), await limiter.blocked("b")]
        # blocked counts nothing: "b" has two requests left, then none.
        others += [await limiter.take("b") for _ in range(3)]
        full = [await limiter.blocked("a"), await limiter.blocked("a")]
        for _ in range(3):  # failed authentications, say
            await limiter.count("c")
        await limiter.count("c")  # a full bucket stays full
        counted = [await limiter.blocked("c"), await limiter.take("c")]
        await asyncio.sleep(max(0.0, started + 1.05 - time.monotonic()))
        refilled = [await limiter.take(bucket) for bucket in "abc"]
        minute = RateLimiter(2)  # a minute's window by default
        waits = [await minute.take("a") for _ in range(3)]
        await limiter.close()
        return takes, others, full, counted, refilled, waits

    takes, others, full, counted, refilled, waits = asyncio.run(run())
    assert takes == [0, 0, 0, 1]
    assert others == [0, 0, 0, 0, 1]
    assert full == [1, 1] and counted == [1, 1]
    assert refilled == [0, 0, 0]
    assert waits[:2] == [0, 0] and 59 <= waits[2] <= 60
    for bad, error in ((0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error):
            RateLimiter(bad)
        with pytest.raises(error):
            RateLimiter(3, window=bad)
    with pytest.raises(ValueError, match="'open' or 'closed'"):
        RateLimiter(3, on_storage_error="fail")


def test_rate_limit_storages_are_checked():
    from keras_transformer.serving.access import RateLimiter

    for uri in (
        "memcached://127.0.0.1:11211",
        "async+redis://127.0.0.1:6379",
        "redis://127.0.0.1",  # no port
        "redis://127.0.0.1:port",
        "redis://127.0.0.1:6379/zero",
        "redis+unix://",
        "memory://elsewhere",
        "http://:s3cret@127.0.0.1:6379",
        "",
    ):
        with pytest.raises(ValueError, match="give memory://, redis://") as refused:
            RateLimiter(3, uri)
        assert "redis+unix:///PATH" in str(refused.value), uri
        assert "s3cret" not in str(refused.value)
    with pytest.raises(TypeError):
        RateLimiter(3, None)
    for uri in (
        "MEMORY://",
        "redis://127.0.0.1:1/2",
        "rediss://h:6380",
        "redis+unix:///r.sock",
    ):
        assert RateLimiter(3, uri).per_minute == 3  # connects only when asked


@pytest.fixture
def redis():
    with RedisServer() as server:
        yield server


def test_limiters_on_one_redis_share_each_bucket(redis):
    """Two servers' limiters (one on the Unix socket) with one prefix: one
    allowance per bucket between them; another prefix, another allowance."""
    from keras_transformer.serving.access import RateLimiter

    async def run():
        one = RateLimiter(5, redis.url, prefix="kt-serve:test")
        two = RateLimiter(5, redis.unix_url, prefix="kt-serve:test")
        other = RateLimiter(5, redis.url, prefix="kt-serve:elsewhere")
        shared = await asyncio.gather(
            *(limiter.take("key1") for _ in range(5) for limiter in (one, two))
        )
        apart = [await one.take("key2"), await other.take("key1")]
        blocked = [await two.blocked("key1"), await two.blocked("key2")]
        for _ in range(4):
            await two.count("key2")
        counted = await one.take("key2")
        short = RateLimiter(2, redis.url, prefix="kt-serve:short", window=1)
        started = time.monotonic()
        burst = [await short.take("a") for _ in range(3)]
        await asyncio.sleep(max(0.0, started + 1.05 - time.monotonic()))
        burst.append(await short.take("a"))
        for limiter in (one, two, other, short):
            await limiter.close()
        return shared, apart, blocked, counted, burst

    shared, apart, blocked, counted, burst = asyncio.run(run())
    assert shared.count(0) == 5, shared
    assert all(59 <= wait <= 60 for wait in shared if wait), shared
    assert apart == [0, 0]
    assert 59 <= blocked[0] <= 60 and blocked[1] == 0
    assert 59 <= counted <= 60  # key2: one take and four counts
    assert burst == [0, 0, 1, 0]


async def timed(call):
    """``(answer or LimitStorageError, seconds)`` of a limiter's call."""
    from keras_transformer.serving.access import LimitStorageError

    started = time.monotonic()
    try:
        answer = await call
    except LimitStorageError as error:
        answer = error
    return answer, time.monotonic() - started


async def answering(limiter, limit=5.0):
    """Waits until ``limiter`` (one that fails closed) finds its storage
    answering again: a probe's doing, at most a second apart."""
    from keras_transformer.serving.access import LimitStorageError

    deadline = time.monotonic() + limit
    while True:
        try:
            return await limiter.blocked("probe")
        except LimitStorageError:
            assert time.monotonic() < deadline, "the storage never came back"
            await asyncio.sleep(0.05)


def test_a_redis_outage_costs_one_timeout_then_nothing(redis, caplog):
    """Redis stopped (connections refused), then frozen (SIGSTOP:
    connections open, nothing answers), under two limiters sharing one
    storage as a server's do: "open" lets each request through, "closed"
    refuses it. The first call of an outage waits for Redis, within the
    time limits; then the storage is taken for down and every call answers
    at once, until a probe finds it again and requests are limited again.
    One warning an outage, one line at its end; a password is in no
    message."""
    from keras_transformer.serving.access import LimitStorageError, RateLimiter
    from keras_transformer.serving.limit_storage import open_storage

    async def run():
        storage = open_storage(redis.url)
        opened = RateLimiter(2, storage)
        closed = RateLimiter(2, storage, "closed")
        seen = {"up": [await opened.take("k"), await closed.blocked("k")]}
        redis.stop()
        seen["stopped"] = [await timed(opened.take("k")) for _ in range(5)]
        seen["stopped"] += [
            await timed(closed.take("k")),
            await timed(closed.count("k")),
        ]
        redis.start()  # on the same port, empty
        await answering(closed)
        seen["back"] = [await opened.take("k") for _ in range(3)]
        redis.pause()
        seen["frozen"] = [await timed(opened.take("k")) for _ in range(5)]
        seen["frozen"].append(await timed(closed.blocked("k")))
        redis.resume()
        await answering(closed)
        seen["thawed"] = [await closed.take("j") for _ in range(3)]
        secret = RateLimiter(
            2, f"redis://:s3cret@127.0.0.1:{free_port()}", on_storage_error="closed"
        )
        seen["secret"] = await timed(secret.take("k"))
        await secret.close()
        await storage.close()
        return seen

    with caplog.at_level(logging.INFO, logger="kt_serve"):
        seen = asyncio.run(run())
    assert seen["up"] == [0, 0]
    for outage in ("stopped", "frozen"):
        answers = [answer for answer, _ in seen[outage]]
        assert answers[:5] == [0] * 5, answers
        for error in answers[5:]:
            assert isinstance(error, LimitStorageError), error
            assert f"the rate-limit storage {redis.url} is unreachable" in str(error)
        took = [seconds for _, seconds in seen[outage]]
        # The first waits (a refused connection at once, a frozen Redis for
        # a read's timeout); the storage is then down and nobody waits.
        assert took[0] < 1.0 and sum(took[1:]) < 0.5, (outage, took)
    assert seen["back"][:2] == [0, 0] and seen["back"][2] >= 59
    assert seen["thawed"][:2] == [0, 0] and seen["thawed"][2] >= 59
    error, took = seen["secret"]
    assert isinstance(error, LimitStorageError) and took < 2.0
    assert "s3cret" not in str(error) and "redis://127.0.0.1:" in str(error)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert not any("s3cret" in line for _, line in lines), lines
    ours = [line for _, line in lines if redis.url in line]
    assert [line.split(" (")[0] for line in ours] == [
        f"the rate-limit storage {redis.url} is unreachable",  # stopped
        f"the rate-limit storage {redis.url} answers again",
        f"the rate-limit storage {redis.url} is unreachable",  # frozen
        f"the rate-limit storage {redis.url} answers again",
    ], ours
    assert ours[0].endswith("requests are let through uncounted until it answers")
    assert [level for level, line in lines if redis.url in line] == [
        logging.WARNING, logging.INFO, logging.WARNING, logging.INFO,
    ]  # fmt: skip


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_counts_sent_as_redis_froze_are_taken_back_when_it_wakes(redis, transport):
    """Requests whose counts were on their way as Redis froze: "open" lets
    them through, "closed" refuses them, and neither is counted later,
    though Redis runs every count it held when it wakes: the buckets have
    the allowance they had before. Over TCP, and over the Unix socket,
    where not even a reset takes back a command sent."""
    from keras_transformer.serving.access import LimitStorageError, RateLimiter
    from keras_transformer.serving.limit_storage import open_storage

    url = redis.url if transport == "tcp" else redis.unix_url

    async def run():
        storage = open_storage(url)
        opened = RateLimiter(4, storage, prefix="kt-serve:open")
        closed = RateLimiter(4, storage, "closed", prefix="kt-serve:closed")
        # Connections open beforehand, as a busy server's are: the counts
        # go out at once, rather than wait for a connection's handshake.
        await asyncio.gather(*(closed.blocked("warm") for _ in range(12)))
        before = [await opened.take("k"), await closed.take("k")]
        redis.pause()
        frozen = await asyncio.gather(
            *(timed(limiter.take("k")) for limiter in [opened] * 6 + [closed] * 6)
        )
        redis.resume()
        await answering(closed)
        after = [await limiter.take("k") for limiter in [opened] * 4 + [closed] * 4]
        await storage.close()
        return before, frozen, after

    before, frozen, after = asyncio.run(run())
    assert before == [0, 0]
    answers = [answer for answer, _ in frozen]
    assert answers[:6] == [0] * 6, answers
    assert all(isinstance(error, LimitStorageError) for error in answers[6:]), answers
    assert max(seconds for _, seconds in frozen) < 1.0, frozen
    # 4 a minute, 1 counted before: 3 left in each bucket.
    assert after[:3] == [0] * 3 and after[3] >= 59, after
    assert after[4:7] == [0] * 3 and after[7] >= 59, after


class Asking:
    """What ``Callers`` reads of a request: its headers and address."""

    def __init__(self, address="127.0.0.1"):
        self.headers = {}
        self.client = type("Client", (), {"host": address})()


def test_while_redis_is_down_keys_are_checked_and_guesses_throttled(redis, key_file):
    """The server's side of an outage (Redis stopped), in either mode: a
    right key is identified (what /metrics needs) and its request served
    uncounted ("open") or refused 503 ("closed") in the API's error shape,
    naming neither Redis nor its error; a wrong key is a 403; an address
    past --auth-fail-limit failures gets 429 whatever its key, by the
    process's own count."""
    from keras_transformer.serving.callers import Callers
    from keras_transformer.serving.requests import RequestError
    from keras_transformer.serving.settings import Settings

    def callers(down):
        return Callers(
            Settings(
                api_keys=str(key_file), req_limit=5, auth_fail_limit=2,
                req_limit_storage=redis.url, req_limit_storage_down=down,
            )
        )  # fmt: skip

    async def ask(gate, key, address="127.0.0.1", limit=True):
        fields = {"api_key": key}
        try:
            name = await gate.identify(Asking(address), fields)
            if limit:
                await gate.limit(Asking(address), name)
            return name
        except RequestError as error:
            return error.status, error.kind, error.retry_after, error.message

    async def run():
        gates = {"open": callers("open"), "closed": callers("closed")}
        seen = {down: [await ask(gate, KEYS["clear"])] for down, gate in gates.items()}
        redis.stop()
        for down, gate in gates.items():
            seen[down] += [
                await ask(gate, KEYS["clear"]),
                await ask(gate, KEYS["clear"], limit=False),
                *[await ask(gate, "wrong", "127.0.0.5") for _ in range(3)],
                await ask(gate, KEYS["hashed"], "127.0.0.5"),
            ]
        redis.start()
        for gate in gates.values():
            await gate.close()
        return seen

    seen = asyncio.run(run())
    refused = (
        503,
        "limits_down",
        1,
        "the server cannot count requests now; retry shortly",
    )
    forbidden = (403, "forbidden", None, "Invalid API key")
    for down, answer in (("open", "key2"), ("closed", refused)):
        up, limited, identified, *wrong, throttled = seen[down]
        assert (up, limited, identified) == ("key2", answer, "key2"), seen[down]
        assert wrong[:2] == [forbidden] * 2, wrong
        for status, kind, retry_after, message in (wrong[2], throttled):
            assert (status, kind) == (429, "auth_throttled"), seen[down]
            assert 59 <= retry_after <= 60 and "127.0.0.5" in message


class LengthTokenizer:
    """Each text's "ids": its length and the end id; the target languages
    Spanish and French."""

    target_languages = ("es", "fr")

    def encode(self, texts):
        return [[len(text), 2] for text in texts]


class SeveralTargets(TranslatorBase):
    tokenizer = LengthTokenizer()


def test_a_model_into_several_languages_serves_each_of_its_targets():
    from keras_transformer.serving.libretranslate import (
        languages_answer,
        parse_libretranslate,
    )
    from keras_transformer.serving.requests import Limits, RequestError
    from keras_transformer.serving.searcher import Searcher
    from keras_transformer.serving.settings import Settings

    def encode(texts, target_language):
        # The target-language token's id, a piece's, the end id.
        return [[target_language, 4, 2] for _ in texts]

    limits = Limits(max_texts=4, max_tokens=20)
    request = parse_libretranslate(
        {"q": ["eins", "zwei"], "source": "de", "target": "fr"},
        limits, encode, ("de", "mul"), ("es", "fr"),
    )  # fmt: skip
    assert (request.texts, request.target_language, request.n) == (
        ["eins", "zwei"], "fr", None,
    )  # fmt: skip
    assert request.sources == [["fr", 4, 2]] * 2
    assert request.answer(["un", "deux"]) == {"translatedText": ["un", "deux"]}
    with pytest.raises(RequestError, match="de → es, de → fr"):
        parse_libretranslate(
            {"q": "eins", "source": "de", "target": "mul"},
            limits, encode, ("de", "mul"), ("es", "fr"),
        )  # fmt: skip
    with pytest.raises(RequestError, match="parses at most 100000") as refused:
        parse_libretranslate(
            {"q": ["<p>eins</p>" * 6000] * 2, "source": "de", "target": "es",
             "format": "html"},
            limits, encode, ("de", "mul"), ("es", "fr"),
        )  # fmt: skip
    assert refused.value.status == 413
    # The server's encoder leads each text with its target-language token,
    # and refuses, as the client's error, a request that names none.
    searcher = Searcher(lambda: None, Settings(), metrics=None)
    searcher.translator = SeveralTargets()
    assert searcher.encode(["eins"], "fr") == [[len(">>fr<< eins"), 2]]
    with pytest.raises(RequestError, match="give target_language") as refused:
        searcher.encode(["eins"])
    assert refused.value.status == 400
    assert languages_answer(("de", "mul"), ("es", "fr")) == [
        {"code": "de", "name": "German", "targets": ["es", "fr"]},
        {"code": "es", "name": "Spanish", "targets": []},
        {"code": "fr", "name": "French", "targets": []},
    ]


def test_the_serving_options_become_settings(capsys):
    from keras_transformer.cli import serve as kt_serve

    parse = kt_serve.parser().parse_args
    args = parse(["--model", "m", "--beam-sizes", "8,2,2", "--source-lang", "de",
                  "--target-lang", "en", "--char-limit", "500"])  # fmt: skip
    settings = kt_serve.settings(args)
    assert (settings.beam_sizes, settings.languages, settings.char_limit) == (
        (2, 8), ("de", "en"), 500,
    )  # fmt: skip
    # --max-beam-size, replaced by --beam-sizes, still bounds them.
    settings = kt_serve.settings(parse(["--model", "m", "--max-beam-size", "3"]))
    assert settings.beam_sizes == (1,)
    assert "--max-beam-size is replaced by --beam-sizes" in capsys.readouterr().err
    for bad in (["--beam-sizes", "0,4"], ["--beam-sizes", "four"],
                ["--source-lang", "Deutsch"], ["--header-timeout", "0"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(["--model", "m", *bad])
    assert [kt_serve.is_loopback(h) for h in ("127.0.0.1", "::1", "localhost")] == [
        True, True, True,
    ]  # fmt: skip
    assert not any(kt_serve.is_loopback(h) for h in ("0.0.0.0", "10.1.2.3", "my.host"))
