"""Running a ``Service`` under uvicorn: the socket, the ready line, the
clients it does not trust, and stopping.

Stopping. On SIGTERM (or Ctrl+C) uvicorn stops accepting connections, waits
for the requests it holds to be answered, then runs the app's shutdown
(which waits for the running batch); the process exits 0. A second SIGTERM
or SIGINT, or ``shutdown_deadline`` seconds after the first, stops it at
once: the batcher's ``abort`` answers every request it holds (queued or in
the running search) 503 ``{"error": "the server is stopping"}``, connections
still open a second later are dropped, and the process exits 130 (a second
SIGINT), 143 (a second SIGTERM) or 1 (the deadline). uvicorn's own force
quit (a second SIGINT) cancels the requests it holds, which answers them 500,
and its ``timeout_graceful_shutdown`` does the same; neither is used.

Why ``os._exit`` after a stop at once (and a stop while the model loads):
the search thread (a ``ThreadPoolExecutor`` worker, which the interpreter
joins at exit) may be in a search that nothing can interrupt, or loading the
model; a normal exit would wait for it, however long. The answers are
written and stdout and stderr flushed first; ``atexit`` handlers do not run.

Clients: ``connections.protocol`` closes connections that send no complete
request head in time (slowloris), answers 408 to a body that does not arrive
in time, and closes a connection rather than read a body it has answered
before its end (a 413). ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are
believed only from the proxies the operator names; uvicorn's default would
believe any process on the same host.

Logs: uvicorn's (errors, and each request with ``access_log``) and
kt-serve's own (logger ``kt_serve``) go to stderr; stdout holds only the
ready line, for whoever waits for it. No log line shows an API key: the
value of an ``api_key`` query parameter (its name in any case, any of its
characters percent-encoded, its ``=`` too, and whatever lies between the
name and the ``=``) is written ``[redacted]``, in the access log's request
line and in any other message or traceback.
"""

import asyncio
import ipaddress
import logging
import os
import re
import socket
import sys

import uvicorn

from keras_transformer.serving import connections
from keras_transformer.serving.batcher import Aborted

READY = "kt-serve: ready on http://{host}:{port}"
STOPPING = "the server is stopping"
# Exit statuses of a stop at once: 128 + the signal's number, as a shell
# reports a process ended by that signal; 1 when the deadline ended it.
DEADLINE_PASSED = 1
# Seconds the answers of a stop at once have to be written before the
# connections still open are dropped.
ANSWER_SECONDS = 1.0


def listen(host, port):
    """A listening TCP socket on ``host:port`` (port 0: a free one); bound
    before the model loads, so that a port in use fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock):
    host, port = sock.getsockname()[:2]
    return READY.format(host=f"[{host}]" if ":" in host else host, port=port)


def parse_proxies(text):
    """The proxies of a comma-separated list of IP addresses and networks
    (``"10.0.0.1,192.168.0.0/16"``), checked (``check_proxies``)."""
    return check_proxies(part.strip() for part in text.split(",") if part.strip())


def check_proxies(proxies):
    """``proxies`` (IP addresses and networks, str; or one comma-separated
    str) as a list; ``ValueError`` names one that is neither (uvicorn would
    take it for a host name, which no client address equals: a typo would
    trust no one, silently)."""
    if isinstance(proxies, str):
        return parse_proxies(proxies)
    proxies = list(proxies)
    for proxy in proxies:
        try:
            ipaddress.ip_network(proxy)
        except ValueError:
            raise ValueError(
                f"not an IP address or network: {proxy!r} (a network's host "
                "bits are zero: 10.0.0.0/8)"
            ) from None
    return proxies


# A character as a query string may spell it: itself, or percent-encoded
# (once, or again: %255F), its hex digits in either case.
_ENCODED = "%(?:25)*{:02x}"
# The name api_key so spelled, its letters in either case (%41 and %61 are
# both "a").
_KEY_NAME = "".join(
    "(?:"
    + "|".join(
        [
            re.escape(c),
            *(_ENCODED.format(ord(x)) for x in sorted({c.lower(), c.upper()})),
        ]
    )
    + ")"
    for c in "api_key"
)
_EQUALS = f"(?:=|{_ENCODED.format(ord('='))})"
# The name, then whatever comes before its first "=" (api_key[]=,
# api_key+=), kept; the "=", written or encoded (a client that encoded the
# whole pair: api_key%3D...); then the value, which goes. The value runs to
# the next parameter; '"' ends it too, as uvicorn writes one in a request
# line as %22 and a message may quote the URL.
_KEY_PARAMETER = re.compile(
    rf"({_KEY_NAME}(?:[^&=%\s\"]|%(?!(?:25)*3d))*)({_EQUALS})[^&\s\"]*",
    re.IGNORECASE,
)
REDACTED = "[redacted]"


def redact(text):
    """``text`` with the value of every ``api_key`` parameter, however
    spelled, replaced by ``[redacted]``."""
    return _KEY_PARAMETER.sub(rf"\1\2{REDACTED}", text)


class RedactKeys(logging.Filter):
    """Takes API keys out of every record a handler writes: the request
    line of uvicorn's access records (their third argument, which its
    ``AccessFormatter`` reads), and the message and traceback of the rest."""

    def filter(self, record):
        args = record.args
        if (
            record.name == "uvicorn.access"
            and isinstance(args, tuple)
            and len(args) == 5
        ):
            record.args = (*args[:2], redact(str(args[2])), *args[3:])
        else:
            message = record.getMessage()
            redacted = redact(message)
            if redacted != message:
                record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            # What a formatter would write, formatted once here so that it
            # can be redacted; formatters reuse exc_text.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def log_config():
    """uvicorn's logging setup with every handler on stderr (uvicorn's own
    puts the access log on stdout)."""
    formatter = "uvicorn.logging.{}Formatter"
    colors = sys.stderr.isatty()  # uvicorn would ask stdout
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"keys": {"()": RedactKeys}},
        "formatters": {
            "default": {
                "()": formatter.format("Default"),
                "fmt": "%(levelprefix)s %(message)s",
                "use_colors": colors,
            },
            "access": {
                "()": formatter.format("Access"),
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" '
                "%(status_code)s",
                "use_colors": colors,
            },
        },
        "handlers": {
            name: {
                "formatter": name,
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "filters": ["keys"],
            }
            for name in ("default", "access")
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            # Without access_log, uvicorn.Config removes its handler.
            "uvicorn.access": {
                "handlers": ["access"],
                "level": "INFO",
                "propagate": False,
            },
            # kt-serve's own warnings (a rate-limit storage that does not
            # answer), written as uvicorn's are.
            "kt_serve": {"handlers": ["default"], "level": "INFO", "propagate": False},
        },
    }


class _Server(uvicorn.Server):
    """uvicorn's server, stopped at once by a second signal or the
    deadline, with its held requests answered 503 (see the module's
    docstring). ``exit_status`` is then set."""

    def __init__(self, config, abort, shutdown_deadline):
        super().__init__(config)
        self._abort = abort
        self._deadline = shutdown_deadline
        self._loop = None
        self._stopping = None  # the task of a stop at once
        self.exit_status = None

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig, frame):
        # A signal handler: it runs between two bytecodes of the event loop's
        # thread, so it only hands work to the loop. Unlike uvicorn's, it
        # records no signal to raise again after serving: run() says how the
        # process exits.
        if self.should_exit:
            self._loop.call_soon_threadsafe(self._stop_now, 128 + sig)
        else:
            self.should_exit = True
            if self._deadline is not None:
                self._loop.call_soon_threadsafe(
                    self._loop.call_later,
                    self._deadline,
                    self._stop_now,
                    DEADLINE_PASSED,
                )

    def _stop_now(self, status):
        if self._stopping is None:
            self.should_exit = True
            self.exit_status = status
            self._stopping = self._loop.create_task(self._answer_and_drop())

    async def _answer_and_drop(self):
        self._abort(Aborted(STOPPING))
        await self._settle()  # the held requests answer 503
        # Those left wait for a body or a head (or will not read their
        # answer): nothing more is to be done for them.
        for connection in list(self.server_state.connections):
            connection.drop()
        await self._settle()
        # uvicorn, finding no connection left, runs the app's shutdown (the
        # batcher's stop returns at once); a request that is still running
        # is not waited for.
        if self.server_state.tasks:
            self.force_exit = True

    async def _settle(self):
        tasks = set(self.server_state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=ANSWER_SECONDS)


def run(service, sock, log_level="info"):
    """Serves ``service.app()`` on ``sock`` until SIGTERM/SIGINT, with its
    ``Settings``' waits, proxies and access log.

    Prints ``READY`` (with the address) on stdout once the translator is
    warm; every log goes to stderr. The settings it reads:
    ``header_timeout`` (seconds a connection has to send a complete request
    head, from its opening or the previous response's end; then it is
    closed), ``body_timeout`` (seconds a request's body has to arrive, from
    its head; then 408 and the connection closed), ``idle_timeout`` (a
    silent keep-alive connection's, uvicorn's ``timeout_keep_alive``),
    ``shutdown_deadline`` (seconds the requests held at the first SIGTERM or
    SIGINT have to be answered; those still held then are answered 503 and
    the process ends, as on a second signal), ``trusted_proxies`` (the
    proxies whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are
    believed; None: nobody's) and ``access_log``.

    Returns the exit status: 0 after a clean stop, 2 if the model could not
    be loaded (the error on stderr). After a stop at once, or a stop while
    the model loads, it does not return: the process exits 130, 143 or 1
    (0 while loading; the module's docstring says why).
    """
    settings = service.settings
    shutdown_deadline = settings.shutdown_deadline
    failed = []
    ready_line = url_of(sock)
    proxies = parse_proxies(settings.trusted_proxies or "")
    config = uvicorn.Config(
        service.app(),
        http=connections.protocol(
            settings.header_timeout, settings.body_timeout, service.invalid_request
        ),
        ws="none",  # no WebSocket endpoint: an upgrade is not for us
        lifespan="on",
        access_log=settings.access_log,
        log_config=log_config(),
        log_level=log_level,
        timeout_keep_alive=settings.idle_timeout,
        timeout_graceful_shutdown=None,  # our deadline, not uvicorn's 500s
        proxy_headers=bool(proxies),
        forwarded_allow_ips=",".join(proxies) or None,
    )

    def abort(error):
        if service.batcher is not None:
            service.batcher.abort(error)

    server = _Server(config, abort, shutdown_deadline)

    def on_ready():
        print(ready_line, flush=True)

    def on_failure(error):
        failed.append(error)
        print(f"kt-serve: error: {error}", file=sys.stderr, flush=True)
        server.should_exit = True

    service.on_ready, service.on_failure = on_ready, on_failure
    server.run(sockets=[sock])
    if server.exit_status is not None:
        _exit_now(server.exit_status)
    if service.state == "loading":  # stopped before it was ready
        _exit_now(0)  # rather than wait for the load, in the search thread
    return 2 if failed else 0


def _exit_now(status):
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
