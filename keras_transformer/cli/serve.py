"""Serve a saved translator over HTTP, with dynamic batching.

    kt-serve --model runs/multi30k/translator.keras --port 8000
    curl -s localhost:8000/translate -d '{"texts": ["Ein Hund läuft."]}'

``--model`` is a ``translator.keras`` (any backend) or a CTranslate2 export's
directory (``kt-export --format ctranslate2``). Endpoints: ``POST
/translate`` (``{"texts": [...], "beam_size": 4, "length_penalty": 0.6}``,
the last two optional) answers ``{"translations": [...], "model": ...,
"version": ...}``; ``GET /health`` is 200 once the model is loaded and warm
(503 before); ``GET /metrics`` is in the Prometheus text format. Requests
that arrive within ``--max-wait-ms`` of each other are translated together,
up to ``--max-batch-size`` sentences (sorted by length and searched in
groups of ``--search-batch-size``); beyond ``--max-queue`` waiting
sentences a request gets 503 with Retry-After. On SIGTERM the server stops
accepting, answers what it holds, and exits 0. When ready it prints
``kt-serve: ready on http://HOST:PORT`` on stdout (``--port 0``: a free
port). A missing model, a port in use or a missing optional package (the
serve extra; ctranslate2 for an export; keras-hub for a ``.keras`` file)
stops it with exit status 2 and one line. Given an export, the server
imports neither Keras nor a backend nor TensorFlow.
"""

import argparse
import hashlib
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
        "--max-beam-size", type=positive_int, default=16,
        help="largest beam_size a request may ask (default 16)",
    )  # fmt: skip
    parser.add_argument(
        "--access-log", action="store_true", help="log each request on stderr"
    )
    add_verbose_argument(parser)
    return parser


def settings(args):
    """The ``serving.Settings`` of parsed arguments."""
    from keras_transformer.serving.app import Settings

    return Settings(
        max_batch_size=args.max_batch_size,
        search_batch_size=args.search_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_texts=args.max_texts,
        max_beam_size=args.max_beam_size,
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
        from keras_transformer.serving.server import listen, run
    if not os.path.exists(args.model):
        arguments.exit(2, f"{prog}: error: {args.model}: no such model\n")
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

    if load is None:
        from keras_transformer.translate.evaluation import load_translator as load

    service = Service(
        lambda: load(args.model),
        model_name(args.model),
        model_version(args.model),
        settings(args),
    )
    return run(service, sock, access_log=args.access_log)


def command():
    """The installed ``kt-serve`` command (``[project.scripts]``)."""
    sys.exit(main())


if __name__ == "__main__":
    command()
