"""Running a ``Service`` under uvicorn: the socket, the ready line, SIGTERM.

On SIGTERM (or Ctrl+C) uvicorn stops accepting connections, waits for the
requests it holds to be answered, then runs the app's shutdown (which waits
for the running batch). uvicorn then raises the signal again so that the
process dies of it; a server told to stop that has finished its work should
exit 0, so the handler it raises it to here does nothing.
"""

import signal
import socket
import sys

import uvicorn

READY = "kt-serve: ready on http://{host}:{port}"


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


def run(service, sock, access_log=False, log_level="info"):
    """Serves ``service.app()`` on ``sock`` until SIGTERM/SIGINT.

    Prints ``READY`` (with the address) on stdout once the translator is
    warm. Returns the exit status: 0 after a clean stop, 2 if the model could
    not be loaded (the error on stderr).
    """
    failed = []
    ready_line = url_of(sock)
    config = uvicorn.Config(
        service.app(),
        lifespan="on",
        access_log=access_log,
        log_level=log_level,
        timeout_graceful_shutdown=None,  # held requests are answered, however long
    )
    server = uvicorn.Server(config)

    def on_ready():
        print(ready_line, flush=True)

    def on_failure(error):
        failed.append(error)
        print(f"kt-serve: error: {error}", file=sys.stderr, flush=True)
        server.should_exit = True

    service.on_ready, service.on_failure = on_ready, on_failure
    previous = {
        sig: signal.signal(sig, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 2 if failed else 0
