"""Serve a saved translator over HTTP: a page, two APIs, dynamic batching.

    kt-serve --model runs/numbers/translator.keras --port 8000
    # a browser: http://127.0.0.1:8000/ (translations, n-best, attention)
    curl -s localhost:8000/translate -d '{"texts": ["fifty-seven"]}'
    curl -s localhost:8000/translate -d q=fifty-seven -d source=en -d target=de

``--model`` is a ``translator.keras`` (any backend) or a CTranslate2 export's
directory (``kt-export --format ctranslate2``). ``GET /`` is a page for
people; ``POST /translate`` takes this package's ``{"texts": [...],
"beam_size": 4, "length_penalty": 0.6}`` (answering ``{"translations":
[...], "model": ..., "version": ...}``) or LibreTranslate's fields (``q``,
``source``, ``target``, ``format``, ``alternatives``, ``api_key``; ``GET
/languages``); ``POST /explain`` gives the page the n best and their
cross-attention; ``GET /health`` is 200 once the model is loaded and warm
(503 before); ``GET /metrics`` is in the Prometheus text format. Requests
that arrive within ``--max-wait-ms`` of each other are translated together,
up to ``--max-batch-size`` sentences (sorted by length and searched in
groups of ``--search-batch-size``, a gone client's groups skipped); beyond
``--max-queue`` waiting sentences a request gets 503 with Retry-After. Each
of ``--beam-sizes`` is compiled before the server says ready, and any other
is refused. ``--api-keys``, ``--req-limit`` and ``--char-limit`` are
LibreTranslate's; a ``--host`` other than loopback needs keys or
``--allow-anonymous``. On SIGTERM the server stops accepting, answers what
it holds (for at most ``--shutdown-deadline`` seconds, then 503) and exits
0; a second SIGTERM or SIGINT answers what is held 503 and exits at once.
When ready it prints ``kt-serve: ready on http://HOST:PORT`` on stdout, and
logs only on stderr (``--port 0``: a free port). A missing model, a port in
use, bad options or a missing optional package (the serve extra;
ctranslate2 for an export; sentencepiece for a ``.keras`` file) stop it with
exit status 2 and one line. Given an export, the server imports neither
Keras nor a backend nor TensorFlow. docs/serving.md has the rest.
"""

import argparse
import hashlib
import ipaddress
import os
import sys

from keras_transformer.cli._arguments import (
    add_model_argument,
    add_verbose_argument,
    model_engine,
    positive_int,
)
from keras_transformer.cli._extras import exit_if_missing, require
from keras_transformer.cli._process import prepare_process, start_engine


def non_negative_ms(text):
    """argparse type: milliseconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 60_000:
        raise argparse.ArgumentTypeError(f"must be in [0, 60000], got {text}")
    return value


def model_version(path):
    """The first 12 hex digits of the SHA-256 of the model's bytes (of each
    file of an export directory, by name): changes whenever the model does."""
    digest = hashlib.sha256()
    files = (
        [os.path.join(path, name) for name in sorted(os.listdir(path))]
        if os.path.isdir(path)
        else [path]
    )
    for name in files:
        if os.path.isfile(name):
            digest.update(os.path.basename(name).encode())
            with open(name, "rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]


def model_name(path):
    name = os.path.basename(os.path.normpath(path))
    return name[: -len(".keras")] if name.endswith(".keras") else name


def parser():
    parser = argparse.ArgumentParser(
        prog="kt-serve", description=__doc__.splitlines()[0]
    )
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=8000, help="default 8000; 0 picks a free port"
    )
    parser.add_argument(
        "--max-batch-size", type=positive_int, default=64,
        help="most sentences per search call (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--search-batch-size", type=positive_int, default=8,
        help="sentences searched together within a batch, sorted by length "
        "(default 8)",
    )  # fmt: skip
    parser.add_argument(
        "--max-wait-ms", type=non_negative_ms, default=5.0,
        help="how long a request waits for others to batch with (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--max-queue", type=positive_int, default=1024,
        help="most sentences waiting; beyond, 503 (default 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--max-texts", type=positive_int, default=64,
        help="most texts per request (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--beam-sizes", type=beam_sizes, default=(1, 4),
        help="the beam sizes a request may ask, compiled at start-up; others "
        "are refused (default 1,4; the model's default is always served)",
    )  # fmt: skip
    parser.add_argument(
        "--max-beam-size", type=positive_int, default=None,
        help=argparse.SUPPRESS,  # replaced by --beam-sizes
    )  # fmt: skip
    parser.add_argument(
        "--max-request-cost", type=positive_int, default=16384,
        help="most source tokens x beam size per request (default 16384)",
    )  # fmt: skip
    _add_access_arguments(parser)
    _add_time_arguments(parser)
    parser.add_argument(
        "--access-log", action="store_true", help="log each request on stderr"
    )
    add_verbose_argument(parser)
    return parser


def _add_time_arguments(parser):
    """How long the server waits for slow clients and for its own stop."""
    for name, default, what in (
        ("--header-timeout", 10, "for a connection's request head"),
        ("--body-timeout", 30, "for a request's body (then 408)"),
        ("--idle-timeout", 5, "before closing an idle keep-alive connection"),
        ("--shutdown-deadline", 30, "after SIGTERM before what is held gets 503"),
    ):
        parser.add_argument(
            name, type=seconds, default=default, metavar="S",
            help=f"seconds to wait {what} (default {default})",
        )  # fmt: skip
    parser.add_argument(
        "--trusted-proxies", default=None, metavar="LIST",
        help="addresses or networks (comma-separated) whose X-Forwarded-For "
        "is believed (default: none)",
    )  # fmt: skip


def seconds(text):
    """argparse type: seconds in (0, 3600]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in (0, 3600], got {text}")
    return value


def _add_access_arguments(parser):
    """Who may translate, how much, and in which languages (LibreTranslate's
    option names where it has them)."""
    parser.add_argument(
        "--api-keys", metavar="FILE",
        help="API keys, one a line, in the clear or as sha256:<hex>; a request "
        "without one of them is refused (403)",
    )  # fmt: skip
    parser.add_argument(
        "--req-limit", type=positive_int, default=None,
        help="requests a minute per API key (per client address without "
        "keys); beyond, 429 with Retry-After (default: no limit)",
    )  # fmt: skip
    parser.add_argument(
        "--char-limit", type=positive_int, default=None,
        help="characters of text per request; beyond, 413 (default: no limit)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-anonymous", action="store_true",
        help="serve a non-loopback --host without --api-keys",
    )  # fmt: skip
    parser.add_argument(
        "--source-lang", type=language_code,
        help="the source language code, for a model that records none",
    )  # fmt: skip
    parser.add_argument(
        "--target-lang", type=language_code,
        help="the target language code, for a model that records none",
    )  # fmt: skip


def beam_sizes(text):
    """argparse type: comma-separated beam sizes >= 1."""
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not sizes or sizes[0] < 1 or sizes[-1] > 64:
        raise argparse.ArgumentTypeError(f"beam sizes must be in [1, 64], got {text}")
    return sizes


def language_code(text):
    """argparse type: a language code (``de``, ``pt_br``)."""
    from keras_transformer.data.languages import check_code

    try:
        return check_code(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def is_loopback(host):
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def settings(args, api_keys=None):
    """The ``serving.Settings`` of parsed arguments."""
    from keras_transformer.serving.app import Settings

    sizes = args.beam_sizes
    if args.max_beam_size is not None:
        print(
            "kt-serve: --max-beam-size is replaced by --beam-sizes; serving "
            f"beam sizes up to {args.max_beam_size} of {list(sizes)}",
            file=sys.stderr,
        )
        sizes = tuple(size for size in sizes if size <= args.max_beam_size) or (1,)
    pair = (args.source_lang, args.target_lang)
    return Settings(
        max_batch_size=args.max_batch_size,
        search_batch_size=args.search_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_texts=args.max_texts,
        beam_sizes=sizes,
        max_request_cost=args.max_request_cost,
        char_limit=args.char_limit,
        req_limit=args.req_limit,
        api_keys=api_keys,
        languages=pair if all(pair) else None,
    )


def main(argv=None, load=None):
    """Run the server; returns its exit status.

    ``load(path)`` makes the translator (default
    ``evaluation.load_translator``): a program may serve a translator of its
    own making behind the same command line.
    """
    arguments = parser()
    args = arguments.parse_args(argv)
    prog = arguments.prog
    with exit_if_missing(prog, "serve"):
        require("serve")
        from keras_transformer.serving.app import Service
        from keras_transformer.serving.server import listen, parse_proxies, run
    if not os.path.exists(args.model):
        arguments.exit(2, f"{prog}: error: {args.model}: no such model\n")
    api_keys = _api_keys(arguments, args)
    engine = model_engine(args.model)
    with exit_if_missing(prog, engine):
        prepare_process(args.verbose, keras=engine == "keras")
    try:
        sock = listen(args.host, args.port)
    except OSError as error:
        arguments.exit(
            2, f"{prog}: error: cannot listen on {args.host}:{args.port}: "
            f"{error.strerror or error}\n",
        )  # fmt: skip
    try:
        with exit_if_missing(prog, engine):
            start_engine(engine, args.verbose)  # quietly, before the model loads
    except SystemExit:
        sock.close()
        raise

    try:
        trusted = parse_proxies(args.trusted_proxies or "")
    except ValueError as error:
        sock.close()
        arguments.exit(2, f"{prog}: error: --trusted-proxies: {error}\n")
    if load is None:
        from keras_transformer.translate.evaluation import load_translator as load

    service = Service(
        lambda: load(args.model),
        model_name(args.model),
        model_version(args.model),
        settings(args, api_keys),
    )
    return run(
        service,
        sock,
        access_log=args.access_log,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        shutdown_deadline=args.shutdown_deadline,
        trusted_proxies=trusted,
    )


def _api_keys(arguments, args):
    """The ``KeyRing`` of ``--api-keys`` (None without), once the options
    agree; exits 2 with one line where they do not."""
    from keras_transformer.serving.access import KeyFileError, KeyRing

    prog = arguments.prog
    if (args.source_lang is None) != (args.target_lang is None):
        arguments.exit(2, f"{prog}: error: give both --source-lang and --target-lang\n")
    if args.api_keys is None:
        if not (is_loopback(args.host) or args.allow_anonymous):
            arguments.exit(
                2,
                f"{prog}: error: --host {args.host} may be reached from other "
                "machines: give --api-keys FILE, or --allow-anonymous to serve "
                "anyone who connects\n",
            )
        return None
    try:
        return KeyRing.read(args.api_keys)
    except KeyFileError as error:
        arguments.exit(2, f"{prog}: error: {error}\n")


def command():
    """The installed ``kt-serve`` command (``[project.scripts]``)."""
    sys.exit(main())


if __name__ == "__main__":
    command()
