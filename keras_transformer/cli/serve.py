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
/languages``), either with a ``glossary`` ``{"source term": "target
term"}`` that the translations follow (``--glossary-max-tokens``, compiled
at start-up; 0 for none); ``POST /explain`` gives the page the n best and
their cross-attention; ``GET /health`` is 200 once the model is loaded and warm
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
import dataclasses
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
from keras_transformer.serving import settings as serving_settings


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
    """kt-serve's options: where and what to serve, then ``Settings``'
    fields (``serving/settings.py``, where their defaults are)."""
    parser = argparse.ArgumentParser(
        prog="kt-serve", description=__doc__.splitlines()[0]
    )
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=8000, help="default 8000; 0 picks a free port"
    )
    add_settings_options(parser)
    parser.add_argument(
        "--max-beam-size", type=positive_int, default=None,
        help=argparse.SUPPRESS,  # replaced by --beam-sizes
    )  # fmt: skip
    add_verbose_argument(parser)
    return parser


def is_loopback(host):
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def add_settings_options(parser):
    """``serving.Settings``' fields as options of ``parser``, each with its
    default in its help."""
    for field in dataclasses.fields(serving_settings.Settings):
        meta = field.metadata
        help = meta["help"]
        if field.default not in (None, False) and "(default" not in help:
            shown = field.default
            if isinstance(shown, tuple):
                shown = ",".join(str(value) for value in shown)
            help = f"{help} (default {shown})"
        options = {"dest": field.name, "default": field.default, "help": help}
        if field.type is bool:
            options["action"] = "store_true"
        else:
            options.update(
                {key: meta[key] for key in ("metavar", "choices") if key in meta}
            )
            if "parse" in meta:
                options["type"] = _argument_type(meta["parse"])
        parser.add_argument(serving_settings.option(field.name), **options)


def _argument_type(parse):
    """argparse type: ``parse``, its ``ValueError`` as argparse's error."""

    def convert(text):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__  # argparse names the type on errors
    return convert


def settings(args):
    """The ``serving.Settings`` of parsed arguments."""
    sizes = args.beam_sizes
    if args.max_beam_size is not None:
        print(
            "kt-serve: --max-beam-size is replaced by --beam-sizes; serving "
            f"beam sizes up to {args.max_beam_size} of {list(sizes)}",
            file=sys.stderr,
        )
        sizes = tuple(size for size in sizes if size <= args.max_beam_size) or (1,)
    values = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(serving_settings.Settings)
    }
    return serving_settings.Settings(**{**values, "beam_sizes": sizes})


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
    _check_access(arguments, args)
    if load is None:
        from keras_transformer.translate.evaluation import load_translator as load
    try:
        service = Service(
            lambda: load(args.model),
            model_name(args.model),
            model_version(args.model),
            settings(args),
        )
    except ValueError as error:  # the key file's KeyFileError among them
        arguments.exit(2, f"{prog}: error: {error}\n")
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
    return run(service, sock)


def _check_access(arguments, args):
    """Exits 2 with one line where the options disagree: one language
    without the other, a reachable host without keys, proxies that are no
    addresses."""
    from keras_transformer.serving.server import parse_proxies

    prog = arguments.prog
    if (args.source_lang is None) != (args.target_lang is None):
        arguments.exit(2, f"{prog}: error: give both --source-lang and --target-lang\n")
    if args.api_keys is None and not (is_loopback(args.host) or args.allow_anonymous):
        arguments.exit(
            2,
            f"{prog}: error: --host {args.host} may be reached from other "
            "machines: give --api-keys FILE, or --allow-anonymous to serve "
            "anyone who connects\n",
        )
    try:
        parse_proxies(args.trusted_proxies or "")
    except ValueError as error:
        arguments.exit(2, f"{prog}: error: --trusted-proxies: {error}\n")


def command():
    """The installed ``kt-serve`` command (``[project.scripts]``)."""
    sys.exit(main())


if __name__ == "__main__":
    command()
