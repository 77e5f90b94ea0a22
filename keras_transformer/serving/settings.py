"""Every setting of a server, written once: ``Settings``' fields are
``kt-serve``'s options (``max_batch_size`` is ``--max-batch-size``), with
their defaults, help and checks, as ``TrainConfig``'s fields are
``kt-train``'s.

Each field's ``metadata`` holds its ``help``, and ``parse`` (text to
value, ``ValueError`` naming what is wrong for text that is no value),
``metavar`` or ``choices`` where the option has them. Only
what says where and what to serve (``--model``, ``--host``, ``--port``,
``--verbose``) is the command's own. A program that serves a translator of
its own builds a ``Settings`` directly.
"""

import dataclasses


def _int_at_least(low, name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"not an integer: {text!r}") from None
        if value < low:
            raise ValueError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = name  # argparse names the type on errors
    parse.__doc__ = f"An int >= {low}."
    return parse


positive_int = _int_at_least(1, "positive_int")
non_negative_int = _int_at_least(0, "non_negative_int")


def _number_in(low, high, low_included):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a number: {text!r}") from None
        above = value >= low if low_included else value > low
        if not (above and value <= high):
            bracket = "[" if low_included else "("
            raise ValueError(f"must be in {bracket}{low:g}, {high:g}], got {text}")
        return value

    return parse


# Milliseconds a request may wait for others; seconds of the server's waits.
milliseconds = _number_in(0, 60_000, low_included=True)
seconds = _number_in(0, 3600, low_included=False)
milliseconds.__name__, seconds.__name__ = "milliseconds", "seconds"


def beam_sizes(text):
    """Comma-separated beam sizes in [1, 64]."""
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise ValueError(f"not a comma-separated list of integers: {text!r}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > 64:
        raise ValueError(f"beam sizes must be in [1, 64], got {text}")
    return sizes


def language_code(text):
    """A language code (``de``, ``pt_br``)."""
    from keras_transformer.data.languages import check_code

    return check_code(text)


def _setting(default, help, **option):
    """A field with its help; ``option`` may add ``parse``, ``metavar`` and
    ``choices`` (see the module's docstring)."""
    return dataclasses.field(default=default, metadata={"help": help, **option})


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a server batches, what it accepts, from whom, and how it waits.

    The fields are ``kt-serve``'s options; ``docs/serving.md`` describes
    them.
    """

    # -- batching ----------------------------------------------------------------
    max_batch_size: int = _setting(
        64, "most sentences per search call", parse=positive_int
    )
    # 8: the fastest on two CPU cores for random Multi30k sentences, with the
    # Keras translator and CTranslate2; larger groups pad more short
    # sentences to long ones.
    search_batch_size: int = _setting(
        8, "sentences searched together within a batch, sorted by length",
        parse=positive_int,
    )  # fmt: skip
    max_wait_ms: float = _setting(
        5.0, "milliseconds a request waits for others to batch with while the "
        "translator is idle", parse=milliseconds, metavar="MS",
    )  # fmt: skip
    max_queue: int = _setting(
        1024, "most sentences waiting; beyond, 503 with Retry-After",
        parse=positive_int,
    )  # fmt: skip
    # -- what one request may ask -------------------------------------------------
    max_texts: int = _setting(64, "most texts per request", parse=positive_int)
    beam_sizes: tuple = _setting(
        (1, 4), "the beam sizes a request may ask, each compiled at start-up; "
        "others are refused (the model's default beam size is always served)",
        parse=beam_sizes, metavar="LIST",
    )  # fmt: skip
    max_request_cost: int = _setting(
        16384, "most source tokens x beam size per request", parse=positive_int
    )
    max_body_bytes: int = _setting(
        1 << 20, "largest request body, in bytes; beyond, 413", parse=positive_int
    )
    char_limit: int | None = _setting(
        None, "characters of text per request; beyond, 413 (default: no limit)",
        parse=positive_int,
    )  # fmt: skip
    # -- glossaries (the "glossary" field) -----------------------------------------
    # Off unless asked: each constraint width up to it (8, 16, ...) is
    # compiled at start-up for every beam size, each taking about as long
    # again as the searches without constraints.
    glossary_max_tokens: int = _setting(
        0, "most target tokens the glossary terms found in one text may "
        "bring (its translation's constraints), e.g. 16; beyond, 413. Their "
        "searches are compiled at start-up; 0 (default) takes no glossaries",
        parse=non_negative_int, metavar="N",
    )  # fmt: skip
    glossary_max_entries: int = _setting(
        1000, "most entries of a request's glossary; beyond, 413",
        parse=positive_int, metavar="N",
    )  # fmt: skip
    # A term, not a sentence: the glossary's matching regex grows with the
    # terms' length, and it is built for each request on the parse thread.
    glossary_max_term_chars: int = _setting(
        100, "most characters of a glossary term; beyond, 413",
        parse=positive_int, metavar="N",
    )  # fmt: skip
    # -- who may translate, and how often (LibreTranslate's option names) ---------
    api_keys: str | None = _setting(
        None, "file of API keys, one a line, in the clear or as sha256:<hex>; a "
        "request without one of them is refused (403)", metavar="FILE",
    )  # fmt: skip
    req_limit: int | None = _setting(
        None, "requests a minute per API key (per client address without "
        "keys); beyond, 429 with Retry-After (default: no limit)",
        parse=positive_int,
    )  # fmt: skip
    auth_fail_limit: int = _setting(
        10, "failed authentications a minute per client address; beyond, "
        "429 with Retry-After, whatever the key", parse=positive_int,
    )  # fmt: skip
    req_limit_storage: str = _setting(
        "memory://", "where the limits count: memory:// (this process) or "
        "redis://HOST:PORT[/DB] (shared by the replicas that name it)",
        metavar="URI",
    )  # fmt: skip
    req_limit_storage_down: str = _setting(
        "open", "while the limits' storage cannot be reached: open (translate "
        "uncounted) or closed (refuse translations, 503); keys are checked, "
        "and failed authentications throttled, either way",
        choices=("open", "closed"),
    )  # fmt: skip
    allow_anonymous: bool = _setting(
        False, "serve a non-loopback --host without --api-keys"
    )
    # -- the language pair ---------------------------------------------------------
    source_lang: str | None = _setting(
        None, "the source language code, for a model that records none",
        parse=language_code,
    )  # fmt: skip
    target_lang: str | None = _setting(
        None, "the target language code, for a model that records none",
        parse=language_code,
    )  # fmt: skip
    # -- waits and clients -----------------------------------------------------------
    header_timeout: float = _setting(
        10.0, "seconds to wait for a connection's request head", parse=seconds,
        metavar="S",
    )  # fmt: skip
    body_timeout: float = _setting(
        30.0, "seconds to wait for a request's body (then 408)", parse=seconds,
        metavar="S",
    )  # fmt: skip
    idle_timeout: float = _setting(
        5.0, "seconds before an idle keep-alive connection is closed",
        parse=seconds, metavar="S",
    )  # fmt: skip
    shutdown_deadline: float = _setting(
        30.0, "seconds after SIGTERM before what is held is answered 503",
        parse=seconds, metavar="S",
    )  # fmt: skip
    trusted_proxies: str | None = _setting(
        None, "addresses or networks (comma-separated) whose X-Forwarded-For "
        "is believed (default: none)", metavar="LIST",
    )  # fmt: skip
    access_log: bool = _setting(
        False, "log each request on stderr (API keys in the query redacted)"
    )

    @property
    def languages(self):
        """``(source, target)`` codes for a translator that records none,
        or None."""
        pair = (self.source_lang, self.target_lang)
        return pair if all(pair) else None


def option(name):
    """The option of a field (``--max-batch-size``)."""
    return "--" + name.replace("_", "-")
