"""uvicorn's h11 protocol with the time limits a server open to clients it
does not trust needs.

uvicorn's ``H11Protocol`` (read at uvicorn 0.55) times out only a keep-alive
connection that stays silent after a response. A client that opens a
connection and sends nothing, or a request head a byte at a time, holds its
connection forever (slowloris: enough of them exhaust the process's file
descriptors); one that sends half of its declared body holds its request
forever, and a graceful shutdown waits for it. And an answer given before
the body's end (a 413 for a body over the limit) leaves the connection open
while uvicorn reads the rest of the body, however long, to throw it away;
closing it at once instead resets it (the kernel answers the body still
arriving with a reset), and a client still sending often never reads the
answer.

``protocol(header_timeout, body_timeout)`` is the class to give
``uvicorn.Config(http=...)``. Its connections:

* are closed when a request head is not complete ``header_timeout`` seconds
  after the connection opened or after the previous response ended (a
  keep-alive connection that stays silent is closed sooner, after uvicorn's
  ``timeout_keep_alive``);
* answer ``408`` (JSON, ``Connection: close``) when the body is not complete
  ``body_timeout`` seconds after its head, while the app waits for it; the app
  is then told the client went away (``http.disconnect``);
* close after any answer given while the body is still arriving
  (``Connection: close`` is added to it), once the body has arrived: the
  rest is read and thrown away (``drain_bytes`` at most, and only until the
  body timeout's end; then the connection is closed as it is), so that the
  client, still sending, can read the answer, as nginx's lingering close
  does. A client that waits for ``100 Continue`` sends no body: its
  connection closes at once;
* answer a request that is not valid HTTP (a ``Content-Length: abc``) with
  a JSON 400 and close, calling ``on_invalid()`` so that the app counts it.

It subclasses a class whose hooks are uvicorn's internals, not its API: the
import checks that they are there and fails with the version it needs.
"""

import asyncio
import json

import h11
import uvicorn
from uvicorn.protocols.http import h11_impl

CLOSE = (b"connection", b"close")
# Bytes of a body answered before its end that are read on and thrown away,
# and seconds they have to arrive when the body has no timeout.
DRAIN_BYTES = 16 << 20
DRAIN_SECONDS = 30.0
# Set in a request's ASGI scope when its body did not arrive in time and
# this module answered 408: the app counts that answer, not a disconnection.
BODY_TIMED_OUT = "kt_serve.body_timed_out"
# What this module overrides or calls of uvicorn's H11Protocol.
_HOOKS = (
    "send_400_response",
    "connection_made",
    "connection_lost",
    "data_received",
    "handle_events",
    "on_response_complete",
    "shutdown",
)
# What H11Protocol.__init__ (and connection_made) sets that this module reads.
_ATTRIBUTES = ("app", "conn", "loop", "transport")

_missing = [name for name in _HOOKS if not hasattr(h11_impl.H11Protocol, name)]
if _missing:
    raise ImportError(
        "keras_transformer.serving.connections needs uvicorn's H11Protocol "
        f"hooks {', '.join(_missing)}, which uvicorn {uvicorn.__version__} "
        "lacks (written against uvicorn 0.55)"
    )


class _LingeringTransport:
    """A connection's transport whose ``close`` lets the body of a request
    answered before its end arrive first (``GuardedH11Protocol._linger``);
    the rest is the transport's own."""

    def __init__(self, transport, protocol):
        self.raw = transport
        self._protocol = protocol

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def close(self):
        if not self._protocol._linger():
            self.raw.close()

    def is_closing(self):
        return self._protocol._drained is not None or self.raw.is_closing()


class GuardedH11Protocol(h11_impl.H11Protocol):
    """``H11Protocol`` with a header timeout, a body timeout, and a body
    answered before its end read on only to let the client read the answer.
    ``protocol`` makes one with the timeouts set."""

    header_timeout = 10.0  # seconds, or None: no limit
    body_timeout = 30.0
    drain_bytes = DRAIN_BYTES
    on_invalid = None  # on_invalid(): a request that is not HTTP was refused

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        missing = [name for name in _ATTRIBUTES if not hasattr(self, name)]
        if missing:
            raise RuntimeError(
                f"uvicorn {uvicorn.__version__}'s H11Protocol has no "
                f"{', '.join(missing)} (this module was written against 0.55)"
            )
        self._header_timer = None
        # Set when this side gave up on the request in progress (its body
        # timed out, or the server stops at once): what the app raises then
        # is the disconnection it was told of, not an error to log.
        self._given_up = False
        # The request's body deadline (loop time), or None.
        self._body_deadline = None
        # Whether closing after the answer now being sent waits for the
        # body's end: it was answered before it, and is coming.
        self._answered_early = False
        # Bytes thrown away since the connection began draining, or None.
        self._drained = None
        self._drain_timer = None
        self._lost = self._stopping = False
        app = self.app
        self.app = lambda scope, receive, send: self._guard(app, scope, receive, send)

    # -- the request head -------------------------------------------------------

    def connection_made(self, transport):
        super().connection_made(_LingeringTransport(transport, self))
        self._arm_header_timer()

    def data_received(self, data):
        if self._drained is None:
            super().data_received(data)
        else:
            self._drain(data)

    def handle_events(self):
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a head came (or an error)
            self._cancel_header_timer()

    def on_response_complete(self):
        super().on_response_complete()
        # uvicorn has started the next cycle (or parsed a pipelined head).
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()

    def connection_lost(self, exc):
        self._lost = True
        self._cancel_header_timer()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        super().connection_lost(exc)

    def shutdown(self):
        # A stopping server waits for its connections: none drains now.
        self._stopping = True
        super().shutdown()

    def _arm_header_timer(self):
        self._cancel_header_timer()
        if self.header_timeout is not None:
            self._header_timer = self.loop.call_later(
                self.header_timeout, self._header_timed_out
            )

    def _cancel_header_timer(self):
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self):
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg):
        # uvicorn's answer is plain text, and no app hears of it.
        body = json.dumps(
            {"error": f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})"}
        ).encode()
        head = h11.Response(
            status_code=400,
            headers=[
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                CLOSE,
            ],
        )
        for event in (head, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
        if self.on_invalid is not None:
            self.on_invalid()

    # -- the body and the answer ------------------------------------------------

    def drop(self):
        """Closes the connection at once, whatever it is doing (a server
        that stops now); the app's request is told the client went away."""
        self._given_up = True
        self.transport.abort()

    def _linger(self):
        """Called for the transport's ``close``: True if the connection
        drains the body instead, False to close it now."""
        if (
            self._drained is not None
            or not self._answered_early
            or self._given_up
            or self._lost
            or self._stopping
            or self.conn.their_state is not h11.SEND_BODY
        ):
            return False
        self._drained = 0
        if self.transport.raw.can_write_eof():
            self.transport.raw.write_eof()  # the answer is all there is
        deadline = self._body_deadline
        if deadline is None:
            deadline = self.loop.time() + DRAIN_SECONDS
        self._drain_timer = self.loop.call_at(deadline, self.transport.close)
        self.flow.resume_reading()
        self._drain(b"")  # what uvicorn read and h11 holds
        return True

    def _drain(self, data):
        """Throws ``data`` away; closes once the body has ended, or past
        ``drain_bytes``."""
        self._drained += len(data)
        if self._drained > self.drain_bytes:
            self.transport.close()
            return
        if data:
            self.conn.receive_data(data)
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                event = h11.ConnectionClosed()
            if event is h11.NEED_DATA:
                return
            if not isinstance(event, h11.Data):  # the body's end, or an error
                self.transport.close()
                return

    async def _guard(self, app, scope, receive, send):
        deadline = None
        if self.body_timeout is not None:
            deadline = self.loop.time() + self.body_timeout
        self._body_deadline = deadline
        self._answered_early = False
        started = False

        async def send_closing_early(message):
            nonlocal started
            if message["type"] == "http.response.start":
                if started:  # the app's own answer after a 408 of ours
                    return
                started = True
                if self.conn.their_state is h11.SEND_BODY:
                    headers = [*message.get("headers", ()), CLOSE]
                    message = {**message, "headers": headers}
                    # A client that waits for 100 Continue sends no body.
                    self._answered_early = (
                        not self.conn.they_are_waiting_for_100_continue
                    )
            elif self._given_up:
                return
            await send(message)

        async def receive_in_time():
            if deadline is None or self.conn.their_state is not h11.SEND_BODY:
                return await receive()
            try:
                return await asyncio.wait_for(receive(), deadline - self.loop.time())
            except TimeoutError:
                pass
            self._given_up = True
            scope[BODY_TIMED_OUT] = True
            if started:
                self.transport.close()
            else:
                head, body = _timed_out(self.body_timeout)
                await send_closing_early(head)  # adds Connection: close
                await send(body)
            return {"type": "http.disconnect"}

        try:
            await app(scope, receive_in_time, send_closing_early)
        except Exception:
            if not self._given_up:
                raise


def _timed_out(seconds):
    """The ASGI messages of a 408 answer."""
    body = json.dumps(
        {"error": f"the request body did not arrive within {seconds:g} s"}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return (
        {"type": "http.response.start", "status": 408, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


def protocol(header_timeout, body_timeout, on_invalid=None, drain_bytes=DRAIN_BYTES):
    """A ``GuardedH11Protocol`` class with these timeouts (seconds, or None
    for no limit), ``on_invalid`` hook and ``drain_bytes``, for
    ``uvicorn.Config(http=...)``."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "drain_bytes": drain_bytes,
            # A plain function as a class attribute would become a method.
            "on_invalid": staticmethod(on_invalid) if on_invalid else None,
        },
    )
