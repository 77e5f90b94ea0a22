"""kt-serve's app driven over ASGI with what a hostile client sends: every
field of both request shapes with values of every JSON type, as a JSON
body, a form body or a query string, and odd headers.

Whatever comes in, the answer is JSON, is no 5xx, and quotes at most the
promised prefix (``requests.SHOWN`` characters) of anything the client
sent. The app is driven directly through its ASGI interface (the
lifespan, then one ``http`` scope per request) in this process, with an
engine of the translator interface written here (its "search" copies the
source), so the checks are about the server, not about a model; the real
server is test_serve.py's.
"""

import asyncio
import json
import os
import threading
import urllib.parse
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_transformer.data.sentencepiece import SentencePiece
from keras_transformer.translate.base import TranslatorBase

pytestmark = pytest.mark.once

SHOWN = 40
FIXTURE = os.path.join(
    os.path.dirname(__file__), "fixtures", "v0_2_0", "translator.keras"
)


class EchoEngine(TranslatorBase):
    """Translates a sentence into itself; the n best are its prefixes."""

    def __init__(self, proto):
        self.tokenizer = SentencePiece(proto)
        self.source_max_length = self.target_max_length = 32
        self.max_output_length = None
        self.source_vocabulary_size = self.tokenizer.vocabulary_size()

    engine = "echo"
    default_batch_size = 4
    languages = ("en", "de")
    # A glossary goes all the way to the search, which holds none of it.
    takes_constraints = True

    def _search_sorted(self, sources, limits, search, top_n, report, constraints=None):
        results = []
        for source, limit in zip(sources, limits, strict=True):
            body = source[:-1][: max(limit - 1, 0)] + [self.end_id]
            results.append(
                [
                    (body[: len(body) - k] or body, -float(k))
                    for k in range(search.beam_size)
                ]
            )
        report(len(results))
        return results


def _proto():
    with zipfile.ZipFile(FIXTURE) as saved:
        name = next(n for n in saved.namelist() if n.endswith("vocabulary.spm"))
        return saved.read(name)


class Client:
    """The app's lifespan on an event loop of its own thread, and requests
    to it, each an ASGI ``http`` scope."""

    def __init__(self, app):
        self.app = app
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.run(self._start())

    def run(self, coroutine, timeout=30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self):
        self._events = asyncio.Queue()
        self._replies = asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.ensure_future(
            self.app(scope, self._events.get, self._replies.put)
        )
        await self._events.put({"type": "lifespan.startup"})
        reply = await self._replies.get()
        assert reply["type"] == "lifespan.startup.complete", reply

    def stop(self):
        async def stop():
            await self._events.put({"type": "lifespan.shutdown"})
            await self._replies.get()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)

    def request(self, method, path, query="", headers=(), body=b""):
        return self.run(self._request(method, path, query, headers, body))

    async def _request(self, method, path, query, headers, body):
        answered = asyncio.Event()
        incoming = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if incoming:
                return incoming.pop()
            await answered.wait()  # the client stays until its answer
            return {"type": "http.disconnect"}

        start, chunks = {}, []

        async def send(message):
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    answered.set()

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": query.encode("latin-1"),
            "root_path": "", "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers],
        }  # fmt: skip
        await self.app(scope, receive, send)
        head = {k.decode(): v.decode("latin-1") for k, v in start["headers"]}
        return start["status"], head, b"".join(chunks)


@pytest.fixture(scope="module")
def client():
    from keras_transformer.serving.app import Service
    from keras_transformer.serving.settings import Settings

    engine = EchoEngine(_proto())
    service = Service(
        lambda: engine,
        "echo",
        "0",
        Settings(max_wait_ms=0, beam_sizes=(1, 2, 4), max_texts=8, char_limit=400),
    )
    client = Client(service.app())
    deadline = 100
    while service.state == "loading" and deadline:
        client.run(asyncio.sleep(0.05))
        deadline -= 1
    assert service.state == "ready", service.searcher.error
    yield client
    client.stop()


FIELDS = (
    "texts", "text", "beam_size", "length_penalty", "api_key", "q", "source",
    "target", "format", "alternatives", "glossary",
)  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**60), max_value=10**60)
    | st.sampled_from([10**4000, -(10**300), 2**63])
    | st.floats(allow_nan=False)
    | st.text(max_size=60)
    | st.sampled_from(["²", "9" * 5000, "en", "de", "auto", "html", "text", "3"])
    | st.text(alphabet="<>a/!-[]&;\n\"'", max_size=80)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
names = st.sampled_from(FIELDS) | st.text(min_size=1, max_size=50)
field_sets = st.dictionaries(names, values, max_size=6)


def _as_text(value):
    return value if isinstance(value, str) else json.dumps(value)


def _quoted_too_much(message, sent):
    """Whether ``message`` holds more than ``SHOWN`` characters in a row of
    a string the client sent."""
    for text in sent:
        for start in range(0, max(len(text) - SHOWN, 0)):
            if text[start : start + SHOWN + 1] in message:
                return True
    return False


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif value is not None and not isinstance(value, bool):
        yield json.dumps(value)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    fields=field_sets,
    shape=st.sampled_from(["json", "form", "query", "json-as-form"]),
    path=st.sampled_from(["/translate", "/explain"]),
)
def test_no_request_gets_a_5xx_or_an_answer_that_is_not_json(
    client, fields, shape, path
):
    headers, query, body = [], "", b""
    flat = {name: _as_text(value) for name, value in fields.items()}
    if shape == "json":
        headers.append(("Content-Type", "application/json"))
        body = json.dumps(fields).encode()
    elif shape == "json-as-form":  # curl -d
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))
        body = json.dumps(fields).encode()
    elif shape == "form":
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))
        body = urllib.parse.urlencode(flat).encode()
    else:
        query = urllib.parse.urlencode(flat)
    status, head, answer = client.request("POST", path, query, headers, body)
    assert status < 500, (status, answer[:300])
    assert head.get("content-type", "").startswith("application/json"), head
    decoded = json.loads(answer)
    if status >= 400:
        message = decoded["error"]
        assert isinstance(message, str) and message
        assert not _quoted_too_much(message, list(_strings(fields))), message


@pytest.mark.parametrize(
    "fields, status, words",
    [
        # A superscript two is a digit to str.isdigit and not to int.
        ({"q": "x", "source": "en", "target": "de", "alternatives": "²"}, 400,
         "alternatives must be an integer"),
        ({"q": "x", "source": "en", "target": "de", "alternatives": "9" * 5000},
         400, "alternatives must be an integer"),
        ({"texts": ["x"], "beam_size": 10**4000}, 400, "is not served here"),
        ({"q": "<b>a</b>" * 10, "source": "en", "target": "de", "format": "html"},
         413, "text runs"),
    ],
)  # fmt: skip
def test_the_cases_that_were_5xx_or_long_are_short_4xx(client, fields, status, words):
    answer = client.request(
        "POST", "/translate", "", [("Content-Type", "application/json")],
        json.dumps(fields).encode(),
    )  # fmt: skip
    assert answer[0] == status, answer
    message = json.loads(answer[2])["error"]
    assert words in message and len(message) < 200, message
