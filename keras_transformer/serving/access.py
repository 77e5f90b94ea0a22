"""Who may translate, and how often: API keys and rate limits.

A server reachable from a network serves whoever connects; LibreTranslate
answers that with API keys, a request limit per key and per client address,
and a character limit per request, and ``kt-serve`` takes its option names
(``--api-keys``, ``--req-limit``, ``--req-limit-storage``, ``--char-limit``).

The key file is UTF-8 (a byte-order mark at its start is allowed), a key a
line, each key one token: in the clear, or as ``sha256:<64 hex digits>``
(the digest of the key's UTF-8 bytes; ``SHA256:`` and upper-case digits
too), so that the file need not hold the secrets. Blank lines are skipped,
and so are comments, which are whole lines starting with ``#``; whitespace
around a key is not part of it, and a line with whitespace inside (an inline
comment, ``key # note``) is refused rather than read as a key with a space.
The same key twice is refused. Only the digests are kept in memory, and a
key offered is compared by its digest in constant time. A key is named in
logs and metrics by its line in the file (``key3``), never by its value or
digest.

Rate limits are the ``limits`` package's moving window: at most
``per_minute`` requests in any 60 seconds per bucket (a key, or a client
address), counted in the server's memory or in Redis, where several servers
with the same ``prefix`` (replicas of one model) share each bucket's
allowance. Redis is reached with the asyncio client and short timeouts: a
slow or dead Redis costs a request well under a second and never blocks the
event loop; the operator chooses whether the requests it could not count
are let through (``on_storage_error="open"``) or refused (``"closed"``).
"""

import asyncio
import hashlib
import hmac
import logging
import math
import re
import time
import urllib.parse

import limits
import limits.aio.strategies
import limits.errors
import limits.storage
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})", re.IGNORECASE)
_HASHED = "sha256:"


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file and line."""


def digest(key):
    """The SHA-256 hex digest of ``key``'s UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """The API keys a server accepts: ``{digest: name}``.

    Args:
        digests: ``{hex digest: name}``; ``KeyRing.read`` makes it from a
            key file.
    """

    def __init__(self, digests):
        if not digests:
            raise KeyFileError("no API keys: the server would refuse everyone")
        self._digests = {bytes.fromhex(d): name for d, name in digests.items()}

    @classmethod
    def read(cls, path):
        """The keys of a file (UTF-8, a byte-order mark allowed): a key a
        line, one token, in the clear or as ``sha256:<64 hex digits>`` (any
        case); blank lines and lines starting with ``#`` are skipped;
        whitespace around a key is not part of it. ``KeyFileError`` names
        the file and line of a key with whitespace inside, a malformed
        hashed key, or a key given twice."""
        try:
            # utf-8-sig: editors on Windows start a UTF-8 file with a BOM,
            # which would otherwise be part of the first key.
            with open(path, encoding="utf-8-sig") as file:
                lines = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"{path}: cannot read the API keys: {error}") from None
        digests = {}
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if any(character.isspace() for character in line):
                raise KeyFileError(
                    f"{path}, line {number}: a key is one token, without "
                    "whitespace inside (a comment is a line of its own "
                    "starting with #)"
                )
            found = _DIGEST.fullmatch(line)
            if line[: len(_HASHED)].lower() == _HASHED and not found:
                raise KeyFileError(
                    f"{path}, line {number}: a hashed key is sha256: and 64 hex digits"
                )
            value = found.group(1).lower() if found else digest(line)
            if value in digests:
                raise KeyFileError(
                    f"{path}, line {number}: the same key as {digests[value]}"
                )
            digests[value] = f"key{number}"
        if not digests:
            raise KeyFileError(f"{path}: no API keys in the file")
        return cls(digests)

    def __len__(self):
        return len(self._digests)

    def name_of(self, key):
        """The name of ``key`` (a str), or None if it is not one of ours."""
        if not isinstance(key, str) or not key:
            return None
        offered = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found = None
        for known, name in self._digests.items():
            # Every digest compared, in constant time each: how long the
            # check takes says nothing about which keys exist.
            if hmac.compare_digest(known, offered):
                found = name
        return found


logger = logging.getLogger("kt_serve")

# Seconds a connection to Redis may take to open, and a reply to arrive. A
# Redis beside the servers answers in about a millisecond; one that takes
# longer than this is treated as unreachable, so that it cannot hold up the
# requests it should count.
CONNECT_TIMEOUT = 0.25
READ_TIMEOUT = 0.25
# Seconds one limiter call may take in all, whatever the storage does: a new
# connection and two commands, or a script loaded again after Redis restarted.
STORAGE_DEADLINE = 1.0
STORAGE_SCHEMES = (
    "memory://",
    "redis://HOST:PORT[/DB]",
    "rediss://HOST:PORT[/DB]",
    "redis+unix:///PATH",
)
ON_STORAGE_ERROR = ("open", "closed")
# The storages found unreachable and not yet answering again, shared by the
# limiters of a process (a server has one for requests and one for failed
# authentications): one warning an outage, not one a limiter.
_FAILING = set()


class LimitStorageError(Exception):
    """The rate-limit storage could not be asked (with
    ``on_storage_error="closed"``); the message names it, without a
    password."""


class RateLimiter:
    """At most ``per_minute`` requests in any minute per bucket (a key, or
    a client address), bursts included: the ``limits`` package's moving
    window, in this process's memory or in Redis.

    Args:
        per_minute: requests a minute per bucket (int >= 1).
        storage: ``"memory://"``, or a Redis server's URI:
            ``redis://HOST:PORT[/DB]``, ``rediss://`` (TLS) or
            ``redis+unix:///PATH`` (a password as ``redis://:PASSWORD@...``).
            Servers that share a Redis and a ``prefix`` share each bucket's
            allowance.
        on_storage_error: what a request whose hit cannot be counted (Redis
            down, or slower than ``READ_TIMEOUT``) meets: ``"open"``, let
            through; ``"closed"``, ``LimitStorageError``. Either way one
            warning is logged per outage (logger ``kt_serve``).
        prefix: the start of the limiter's keys in Redis.
        window: the window's seconds (tests shorten it); ``per_minute``
            requests are allowed in any ``window`` seconds.
    """

    def __init__(
        self,
        per_minute,
        storage="memory://",
        on_storage_error="open",
        prefix="kt-serve",
        *,
        window=60,
    ):
        for name, value in (("per_minute", per_minute), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int. Received: {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1. Received: {value}")
        if on_storage_error not in ON_STORAGE_ERROR:
            raise ValueError(
                f"on_storage_error must be 'open' or 'closed'. Received: "
                f"{on_storage_error!r}"
            )
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str. Received: {prefix!r}")
        self.per_minute = per_minute
        self.on_storage_error = on_storage_error
        self.storage = _shown(storage)
        self._item = limits.RateLimitItemPerSecond(per_minute, window)
        self._store, self._pool = _open(storage, prefix)
        # The moving window rather than the sliding-window counter: it never
        # lets more than per_minute through in any minute, and it knows when
        # the oldest request of a full window leaves it, which is an exact
        # Retry-After; it keeps a time per request, per_minute at most a
        # bucket.
        self._strategy = limits.aio.strategies.MovingWindowRateLimiter(self._store)

    async def take(self, bucket):
        """0 if ``bucket`` may make a request now (it is counted), else the
        whole seconds (>= 1) until it may, for ``Retry-After``."""

        async def take():
            if await self._strategy.hit(self._item, bucket):
                return 0
            return await self._wait(bucket)

        return await self._ask(take, 0)

    async def blocked(self, bucket):
        """As ``take``, counting nothing: 0 if ``bucket`` has room for a
        request, else the whole seconds (>= 1) until it has."""
        return await self._ask(lambda: self._wait(bucket), 0)

    async def count(self, bucket):
        """Counts one request of ``bucket`` without asking (a failed
        authentication); a full bucket stays full, and counts nothing more."""
        await self._ask(lambda: self._strategy.hit(self._item, bucket), None)

    async def close(self):
        """Closes the connections to Redis (nothing to do in memory)."""
        if self._pool is not None:
            await self._pool.aclose()

    async def _wait(self, bucket):
        reset, remaining = await self._strategy.get_window_stats(self._item, bucket)
        if remaining > 0:
            return 0
        # The storages stamp requests with time.time(), Redis's too (the
        # client's clock, not Redis's).
        return max(1, math.ceil(reset - time.time()))

    async def _ask(self, call, when_open):
        try:
            answer = await asyncio.wait_for(call(), STORAGE_DEADLINE)
        except (limits.errors.StorageError, OSError) as error:  # OSError: timeouts
            reason = _reason(error)
            if self.storage not in _FAILING:
                _FAILING.add(self.storage)
                logger.warning(
                    "the rate-limit storage %s is unreachable (%s): requests are "
                    "%s until it answers",
                    self.storage,
                    reason,
                    "let through unlimited"
                    if self.on_storage_error == "open"
                    else "refused",
                )
            if self.on_storage_error == "closed":
                raise LimitStorageError(
                    f"the rate-limit storage {self.storage} is unreachable ({reason})"
                ) from None
            return when_open
        if self.storage in _FAILING:
            _FAILING.discard(self.storage)
            logger.info("the rate-limit storage %s answers again", self.storage)
        return answer


def _shown(uri):
    """``uri`` as logs and messages may show it: no user name, password or
    query string (which may hold a password)."""
    try:
        parts = urllib.parse.urlsplit(uri)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if parts.port is not None:
            host += f":{parts.port}"
        return f"{parts.scheme}://{host}{parts.path}"
    except (TypeError, ValueError, AttributeError):
        return repr(type(uri).__name__)


def _open(uri, prefix):
    """``(limits' async storage, the redis-py connection pool or None)``
    for the URI an operator gave; ``ValueError`` for any other."""
    if not isinstance(uri, str):
        raise TypeError(f"storage must be a str URI. Received: {uri!r}")
    refused = ValueError(
        f"not a rate-limit storage: {_shown(uri)!r} (give "
        f"{', '.join(STORAGE_SCHEMES[:-1])} or {STORAGE_SCHEMES[-1]})"
    )
    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError:
        raise refused from None
    scheme = parts.scheme.lower()
    uri = scheme + uri[len(parts.scheme) :]
    if scheme == "memory":
        if uri != "memory://":
            raise refused
        return limits.storage.storage_from_string("async+memory://"), None
    if scheme in ("redis", "rediss"):
        if (
            not parts.hostname
            or port is None
            or not re.fullmatch(r"(/\d*)?", parts.path)
        ):
            raise refused
        client_uri = uri
    elif scheme == "redis+unix":
        if parts.netloc or not parts.path:
            raise refused
        client_uri = "unix" + uri[len(scheme) :]
    else:
        raise refused
    try:
        # The pool is ours, so that close() can close it; no retries: redis-
        # py's default (three, backing off for seconds) would hold a request
        # for that long each time Redis is down.
        pool = redis.asyncio.ConnectionPool.from_url(
            client_uri,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=READ_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        store = limits.storage.storage_from_string(
            f"async+{uri}",
            implementation="redispy",
            connection_pool=pool,
            key_prefix=prefix,
            wrap_exceptions=True,
        )
    except (limits.errors.ConfigurationError, ValueError) as error:
        raise ValueError(f"{refused} ({error})") from None
    return store, pool


def _reason(error):
    """What went wrong, in words: the storage's own error rather than
    limits' wrapper of it."""
    error = getattr(error, "storage_error", error)
    if isinstance(error, TimeoutError) and not str(error):
        return f"no answer within {STORAGE_DEADLINE:g} s"
    return str(error) or type(error).__name__
