"""Two ``kt-serve`` replicas sharing a real Redis (tests/redis_server.py),
over real HTTP on 127.0.0.1, while Redis is frozen (SIGSTOP: connections
open, nothing answers) and after it wakes (SIGCONT). One replica fails open
(``--req-limit-storage-down open``), the other closed. They serve
``Copying`` (tests/serve_harness.py), which gives each text back: what is
checked is the server's, around any translator, and they start in seconds.
Once: nothing here depends on the Keras backend.

Checked, over one stall: requests the open replica served during it are
not counted once it wakes, so that the key has between both replicas the
allowance it had before; no request pays the storage's timeouts but those
in flight when it froze; one warning an outage and one line at its end.
(A request's count in flight when Redis froze, and taken back when it
wakes, is test_serve_access.py's: from outside, the moment between a
request's two commands cannot be aimed at.) Authentication does not depend on the
storage: a wrong key is a 403 on either replica, a right one reaches
``/metrics`` on the closed replica (whose translations are refused 503),
and an address guessing keys is throttled by each replica's own count.
"""

import time

import pytest

from tests.redis_server import RedisServer
from tests.serve_harness import COPYING
from tests.test_serve import Server, concurrently

KEYS = {"one": "delta-94c1aa", "two": "echo-27fd03"}
REQ_LIMIT = 12
AUTH_FAIL_LIMIT = 4
# A replica's outage lines (uvicorn's format, logger kt_serve).
DOWN, BACK = "is unreachable", "answers again"

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def redis():
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(redis, tmp_path_factory):
    folder = tmp_path_factory.mktemp("outage")
    keys = folder / "keys.txt"
    keys.write_text("".join(f"{key}\n" for key in KEYS.values()))
    model = folder / "copying"  # a folder: no Keras to load
    model.mkdir()

    def start(down):
        return Server(
            "tests.serve_harness", COPYING, "--model", str(model),
            "--source-lang", "en", "--target-lang", "de", "--api-keys", str(keys),
            "--req-limit", str(REQ_LIMIT), "--auth-fail-limit", str(AUTH_FAIL_LIMIT),
            "--req-limit-storage", redis.url, "--req-limit-storage-down", down,
        )  # fmt: skip

    modes = ("open", "closed")
    running = dict(
        zip(modes, concurrently([lambda m=m: start(m) for m in modes]), strict=True)
    )
    yield running
    for server in running.values():
        assert server.stop() == 0, "".join(server.stderr)


def timed(call):
    """``(status, seconds)`` of a request."""
    started = time.monotonic()
    status = call()[0]
    return status, time.monotonic() - started


def lines(server, words):
    return [line for line in server.stderr if words in line]


def test_a_frozen_redis_costs_one_timeout_and_what_it_missed_is_never_counted(
    redis, replicas
):
    opened, closed = replicas["open"], replicas["closed"]
    key, other = KEYS["one"], KEYS["two"]

    def translate(server, api_key=key, source=None):
        return lambda: server.translate(["seven"], api_key=api_key, source=source)

    before = [translate(opened)()[0], translate(closed)()[0], translate(opened)()[0]]
    redis.pause()
    try:
        # In flight as it froze: each waits for its own reply, in vain.
        burst = concurrently([lambda: timed(translate(opened))] * 6)
        # Then the replica takes the storage for down: nobody waits.
        served = [timed(translate(opened)) for _ in range(20)]
        refused = [closed.translate(["seven"], api_key=key) for _ in range(3)]
        scrape = closed.request(
            "GET", "/metrics", headers={"Authorization": f"Bearer {key}"}
        )
        wrong = [
            server.translate(["seven"], api_key="nope")[0]
            for server in (opened, closed)
        ]
        guesser = "127.0.0.9"
        guesses = [
            translate(opened, f"guess-{i}", guesser)()
            for i in range(AUTH_FAIL_LIMIT + 1)
        ]
        guesses.append(translate(opened, other, guesser)())
        elsewhere = translate(closed, "guess", guesser)()[0]
    finally:
        redis.resume()
    for _ in range(100):  # each replica's probe finds Redis again
        if all(lines(server, BACK) for server in replicas.values()):
            break
        time.sleep(0.1)
    after = [translate((opened, closed)[i % 2])()[0] for i in range(REQ_LIMIT)]

    assert before == [200] * 3
    assert [status for status, _ in burst + served] == [200] * 26
    # Each waited for Redis's two timeouts (0.5 s) before the breaker.
    assert sorted(seconds for _, seconds in served)[10] < 0.2, served
    for status, headers, body in refused:
        assert (status, headers["retry-after"]) == (503, "1"), body
        assert "cannot count requests" in body["error"] and "redis" not in body["error"]
    assert scrape[0] == 200 and b"kt_serve_requests_total" in scrape[2]
    assert wrong == [403, 403]
    statuses = [status for status, _, _ in guesses]
    assert statuses == [403] * AUTH_FAIL_LIMIT + [429] * 2, statuses
    _, headers, body = guesses[-1]
    assert "failed authentications" in body["error"]
    assert 50 <= int(headers["retry-after"]) <= 60, headers
    assert elsewhere == 403  # the other replica counts its own
    # The allowance before the stall, less the 3 counted then.
    assert after == [200] * (REQ_LIMIT - 3) + [429] * 3, after
    for server in replicas.values():
        assert len(lines(server, DOWN)) == 1 and len(lines(server, BACK)) == 1, "".join(
            server.stderr
        )
    assert "let through uncounted" in lines(opened, DOWN)[0]
    assert "refused" in lines(closed, DOWN)[0]
