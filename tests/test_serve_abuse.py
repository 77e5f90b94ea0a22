"""``kt-serve`` against clients that misbehave and operators that stop it,
over real sockets on 127.0.0.1.

Checked: connections that send no request head, or part of one, are closed
within the header timeout (also between keep-alive requests) while a normal
client is answered; a body over the limit is answered 413, read on to its
end so that a client still sending reads the answer (each of many clients
sending at once), and its connection closed; a body far over it is not
read to its end; a half-sent body is answered
408 within the body timeout, so that it does not hold up SIGTERM; the
shutdown deadline and a second SIGINT answer every held request 503 and end
the process (1 and 130); logs go to stderr, stdout holds only the ready
line; X-Forwarded-For is believed only from a trusted proxy.

Two servers (loading the model is most of these tests' cost): the first,
``tests/serve_harness.py`` with short time limits, serves every test
but the second SIGINT's, and its deadline test, last, stops it. The server's
behaviour does not depend on the Keras backend: one backend's run does.
"""

import contextlib
import http.client
import json
import re
import selectors
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.test_serve import FIXTURE, Server

pytestmark = pytest.mark.once

# One beam size: half the warm-up's compilations.
OPTIONS = (
    "--model", FIXTURE, "--beam-sizes", "4", "--source-lang", "en",
    "--target-lang", "de",
)  # fmt: skip
# Time limits cut to what a test can wait for, and 127.0.0.2 a trusted proxy.
LIMITS = dict(
    header_timeout=1.5,
    body_timeout=2.0,
    idle_timeout=0.5,
    shutdown_deadline=5.0,
)
LIMIT_OPTIONS = (
    *(f"--{name.replace('_', '-')}={value}" for name, value in LIMITS.items()),
    "--trusted-proxies=127.0.0.2",
)
HEAD = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = b'{"texts": ["zero"]}'
REQUEST = HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
STOPPING = "the server is stopping"


@pytest.fixture(scope="module")
def server():
    running = Server("tests.serve_harness", *OPTIONS, *LIMIT_OPTIONS, "--access-log")
    yield running
    running.stop()


def connect(server, source="127.0.0.1"):
    sock = socket.create_connection(
        (server.host, server.port), source_address=(source, 0)
    )
    sock.settimeout(0.1)
    return sock


def closed_after(sock, start, trickle=b"", limit=10.0):
    """Seconds from ``start`` until the server closes ``sock`` (None: not
    within ``limit``), sending ``trickle`` a byte per 0.1 s meanwhile; then
    closes it."""
    sent = 0
    with sock:
        while time.monotonic() - start < limit:
            try:
                if not sock.recv(65536):
                    return time.monotonic() - start
            except TimeoutError:
                if sent < len(trickle):
                    sock.sendall(trickle[sent : sent + 1])
                    sent += 1
            except ConnectionResetError:
                return time.monotonic() - start
    return None


def read_to_the_end(sock):
    """What ``sock`` receives until the server closes it (or resets it: a
    connection closed with a body unread); then closes it."""
    received = b""
    with sock:
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass
    return received


def closing_times(socks, start, limit=10.0):
    """Seconds from ``start`` until the server closed each of ``socks``
    (None: not within ``limit``)."""
    times = [None] * len(socks)
    with selectors.DefaultSelector() as selector:
        for i, sock in enumerate(socks):
            selector.register(sock, selectors.EVENT_READ, i)
        while selector.get_map() and (left := start + limit - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                try:
                    data = key.fileobj.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    times[key.data] = time.monotonic() - start
                    selector.unregister(key.fileobj)
    return times


def answer_of(data):
    """``(status, headers, body)`` of one raw HTTP/1.1 answer."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_connections_without_a_request_head_are_closed_in_time(server):
    """25 silent connections, 25 that stop halfway through a head, one that
    sends a head a byte at a time, and two keep-alive connections after a
    response (one silent, one trickling its next head)."""
    header_timeout = LIMITS["header_timeout"]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(3) as pool:
        start = time.monotonic()
        idle = [stack.enter_context(connect(server)) for _ in range(50)]
        for sock in idle[::2]:
            sock.sendall(HEAD)
        closed = pool.submit(closing_times, idle, start)
        slow = stack.enter_context(connect(server))
        slow = pool.submit(closed_after, slow, time.monotonic(), REQUEST)
        status, _, answer = server.translate(["zero"])
        assert status == 200, answer  # a normal client is served meanwhile
        after = []
        for trickle in (b"", REQUEST):
            sock = stack.enter_context(connect(server))
            sock.settimeout(30)
            sock.sendall(REQUEST)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200"), trickle
            sock.settimeout(0.1)
            after.append(pool.submit(closed_after, sock, time.monotonic(), trickle))
        closed, slow = closed.result(), slow.result()
        silent, trickling = [future.result() for future in after]
    assert all(t is not None and t < header_timeout + 1 for t in closed), closed
    assert slow is not None and header_timeout - 0.3 < slow < header_timeout + 1, slow
    assert silent is not None and silent < header_timeout - 0.5  # idle_timeout
    assert trickling is not None and trickling < header_timeout + 1, trickling


def test_a_body_over_the_limit_is_a_413_that_the_client_reads(server):
    """Clients sending 6 MB bodies (the limit is 1 MiB) 8 at a time, each
    writing its whole body before it reads, as http.client does: each
    reads its 413 and ``Connection: close``. Closing at once, the server
    made the kernel answer the body still arriving with a reset, which
    usually came before the answer (every time, with bodies this size)."""
    body = json.dumps({"texts": ["zero " * ((6 << 20) // 5)]}).encode()

    def post(framing):
        connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
        try:
            if framing == "chunked":  # no length: refused once 1 MiB is read
                chunks = (body[i : i + 0x10000] for i in range(0, len(body), 0x10000))
                connection.request(
                    "POST", "/translate", chunks, encode_chunked=True,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
            else:  # refused from its Content-Length
                connection.request("POST", "/translate", body)
            response = connection.getresponse()
            return (
                response.status,
                response.getheader("connection"),
                json.loads(response.read())["error"],
            )
        except OSError as error:  # a reset, a broken pipe
            return type(error).__name__
        finally:
            connection.close()

    framings = ["length"] * 32 + ["chunked"] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, framings))
    assert all(isinstance(answer, tuple) for answer in answers), answers
    assert {answer[:2] for answer in answers} == {(413, "close")}, answers
    assert {answer[2].split(";")[0] for answer in answers[:32]} == {
        f"the body is {len(body)} bytes"
    }  # fmt: skip
    assert server.request("GET", "/health")[0] == 200


def test_a_body_far_over_the_limit_is_not_read_to_its_end(server):
    """40 MB sent chunked: the app refuses it after 1 MiB, and the server
    reads on only as far as it drains (16 MiB), then closes; read to its
    end, all 40 MB would go through."""
    with connect(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sock.settimeout(10)
        sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
        sent = 0
        try:
            while sent < 40 << 20:
                sock.sendall(chunk)
                sent += 0x10000
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = read_to_the_end(sock)
    assert sent < 40 << 20, "the whole body was read"
    # The answer, unless the reset (of a connection closed with a body
    # unread) came first.
    assert received == b"" or received.startswith(b"HTTP/1.1 413 "), received
    if b"\r\n\r\n" in received:
        assert answer_of(received)[1]["connection"] == "close", received


def test_access_logs_go_to_stderr_and_x_forwarded_for_needs_a_trusted_proxy(
    server,
):
    forwarded = {"X-Forwarded-For": "203.0.113.7"}
    for source, probe in [("127.0.0.1", "untrusted"), ("127.0.0.2", "trusted")]:
        connection = http.client.HTTPConnection(
            server.host, server.port, timeout=10, source_address=(source, 0)
        )
        connection.request("GET", f"/health?{probe}", headers=forwarded)
        assert connection.getresponse().status == 200
        connection.close()
    lines = {}
    for _ in range(50):  # the reader thread may be behind
        log = "".join(server.stderr)
        lines = dict(re.findall(r"(\S+) - \"GET /health\?(\w+) HTTP", log))
        if len(lines) == 2:
            break
        time.sleep(0.1)
    assert {probe: address.rsplit(":", 1)[0] for address, probe in lines.items()} == {
        "untrusted": "127.0.0.1",
        "trusted": "203.0.113.7",
    }, lines


def test_markup_that_was_quadratic_is_answered_at_once_and_health_waits_not(
    server,
):
    """HTML that the standard library's parser took 6 to 98 s to read
    (100,000 characters each): each is answered within seconds, and
    ``/health``, asked every 20 ms meanwhile, within a second each time."""
    documents = [
        "<a\n" * 33_000,
        "<![[>\n" * 16_600,
        "<!--" + "a<" * 49_000,
        "<a b='\"' c=\"'\" " * 6_000,
    ]
    health, done = [], []

    def probe():
        while not done:
            started = time.monotonic()
            status, _, _ = server.request("GET", "/health", timeout=30)
            health.append((status, time.monotonic() - started))
            time.sleep(0.02)

    with ThreadPoolExecutor(1) as pool:
        probing = pool.submit(probe)
        try:
            for document in documents:
                started = time.monotonic()
                status, _, body = server.request(
                    "POST", "/translate",
                    {"q": document, "source": "en", "target": "de", "format": "html"},
                )  # fmt: skip
                took = time.monotonic() - started
                assert status == 200 and took < 5, (status, took, str(body)[:200])
                # No text runs: the markup comes back as it was.
                assert body["translatedText"] == document
        finally:
            done.append(True)
            probing.result()
    assert health and all(status == 200 for status, _ in health)
    assert max(seconds for _, seconds in health) < 1.0, health


def test_what_the_connection_refuses_is_json_and_counted(server):
    """A request that is not HTTP (``Content-Length: abc``) is a JSON 400,
    uvicorn's plain text before; a body late by the body timeout is a 408
    counted as such, not as a client that went away."""
    before = {
        kind: server.metric("kt_serve_errors_total", f'kind="{kind}"')
        for kind in ("bad_http", "body_timeout", "disconnected")
    }
    with connect(server) as sock:
        sock.settimeout(10)
        sock.sendall(HEAD + b"Content-Length: abc\r\n\r\n")
        code, headers, body = answer_of(read_to_the_end(sock))
    assert (code, headers["content-type"]) == (400, "application/json"), headers
    assert "not valid HTTP" in json.loads(body)["error"]
    with connect(server) as half:
        half.sendall(HEAD + b"Content-Length: 100\r\n\r\n{")
        half.settimeout(LIMITS["body_timeout"] + 3)
        assert answer_of(read_to_the_end(half))[0] == 408
    after = {
        kind: server.metric("kt_serve_errors_total", f'kind="{kind}"')
        for kind in before
    }
    assert after["bad_http"] == before["bad_http"] + 1, after
    assert after["body_timeout"] == before["body_timeout"] + 1, after
    assert after["disconnected"] == before["disconnected"], after
    assert server.metric("kt_serve_requests_total", 'code="408",path="/translate"') >= 1


def test_sigterm_408s_a_half_sent_body_and_the_deadline_503s_what_is_held(server):
    """Runs last on the module's server: it stops it. A body of 10 bytes of
    1000 (answered 408 within the body timeout, not held until the
    deadline); a batch that ends before the deadline (200); one that would
    end long after it (503 for both of its requests), then exit status 1."""
    with connect(server) as half, ThreadPoolExecutor(3) as pool:
        half.sendall(HEAD + b"Content-Length: 1000\r\n\r\n0123456789")
        started = time.monotonic()
        held = [pool.submit(server.translate, ["sleep:1"])]
        time.sleep(0.3)  # its batch runs; the others make the next one
        held += [pool.submit(server.translate, [text]) for text in ("sleep:60", "zero")]
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        half.settimeout(LIMITS["body_timeout"] + 1)
        received = read_to_the_end(half)
        answered = time.monotonic() - started
        answers = [future.result() for future in held]
    status = server.process.wait(timeout=LIMITS["shutdown_deadline"] + 10)
    ended = time.monotonic() - stopped
    rest = server.process.stdout.read()
    server.wait()
    stderr = "".join(server.stderr)
    assert answered < LIMITS["body_timeout"] + 1.5 < LIMITS["shutdown_deadline"]
    code, headers, body = answer_of(received)
    assert (code, headers["connection"]) == (408, "close"), received
    assert "did not arrive within 2 s" in json.loads(body)["error"]
    assert [code for code, _, _ in answers] == [200, 503, 503], answers
    for _, headers, answer in answers[1:]:
        assert answer["error"] == STOPPING and headers["retry-after"] == "1"
    assert LIMITS["shutdown_deadline"] - 0.2 < ended < LIMITS["shutdown_deadline"] + 3
    assert status == 1, stderr
    assert rest == "", rest  # the access log is on stderr
    assert '"POST /translate HTTP/1.1" 408' in stderr


def test_a_second_sigint_answers_every_held_request_503_and_exits_130():
    """uvicorn's force quit answered them 500 and hung on the search
    thread. One request's search runs, 30 wait in the queue."""
    running = Server("tests.serve_harness", *OPTIONS)
    try:
        with ThreadPoolExecutor(31) as pool:
            held = [pool.submit(running.translate, ["sleep:60"])]
            time.sleep(0.3)
            held += [pool.submit(running.translate, ["zero"]) for _ in range(30)]
            time.sleep(0.5)
            running.process.send_signal(signal.SIGINT)
            time.sleep(0.5)
            assert not any(future.done() for future in held)
            running.process.send_signal(signal.SIGINT)
            forced = time.monotonic()
            answers = [future.result(timeout=10) for future in held]
        status = running.process.wait(timeout=10)
        ended = time.monotonic() - forced
    finally:
        if running.process.poll() is None:
            running.process.kill()
        running.wait()
    assert {(code, body["error"]) for code, _, body in answers} == {(503, STOPPING)}
    assert all(headers["retry-after"] == "1" for _, headers, _ in answers)
    assert (status, ended < 3) == (130, True), "".join(running.stderr)
