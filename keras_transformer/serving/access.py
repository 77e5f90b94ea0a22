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

Rate limits are a moving window: at most ``per_minute`` requests in any
60 seconds per bucket (a key, or a client address), counted in the
server's memory or in Redis (``limit_storage``), where several servers with
the same ``prefix`` (replicas of one model) share each bucket's allowance.
A slow or dead Redis costs a request at most half a second, and then,
while it stays so, nothing (a circuit breaker); the operator chooses
whether the requests it could not count are let through uncounted
(``on_storage_error="open"``) or refused (``"closed"``), and a request let
through or refused so is never counted later.
"""

import hashlib
import hmac
import re

from keras_transformer.serving.limit_storage import (
    STORAGES,
    StorageDown,
    open_storage,
)

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


ON_STORAGE_ERROR = ("open", "closed")


class LimitStorageError(Exception):
    """The rate-limit storage could not be asked (with
    ``on_storage_error="closed"``); the message names it, without a
    password."""


class RateLimiter:
    """At most ``per_minute`` requests in any minute per bucket (a key, or
    a client address), bursts included: a moving window, in this process's
    memory or in Redis (``limit_storage``).

    Args:
        per_minute: requests a minute per bucket (int >= 1).
        storage: ``"memory://"``, or a Redis server's URI:
            ``redis://HOST:PORT[/DB]``, ``rediss://`` (TLS) or
            ``redis+unix:///PATH`` (a password as ``redis://:PASSWORD@...``);
            or a storage of ``limit_storage.open_storage``, which limiters
            may share (and which the caller closes). Servers that share a
            Redis and a ``prefix`` share each bucket's allowance.
        on_storage_error: what a request whose hit cannot be counted (Redis
            down, or slower than ``limit_storage.READ_TIMEOUT``) meets:
            ``"open"``, let through uncounted; ``"closed"``,
            ``LimitStorageError``. Either way a request ``take`` gave up on
            is not counted later (a ``count`` that arrives late stands: a
            failed authentication happened), and one warning is logged per
            outage (logger ``kt_serve``).
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
        self._window = window
        # The limit is part of the key: replicas given other limits count
        # apart rather than read each other's windows wrongly.
        self._prefix = f"{prefix}:{per_minute}/{window}s:"
        self._owned = not isinstance(storage, STORAGES)
        self._store = (
            open_storage(storage, on_storage_error) if self._owned else storage
        )
        self.storage = self._store.shown

    async def take(self, bucket):
        """0 if ``bucket`` may make a request now (it is counted), else the
        whole seconds (>= 1) until it may, for ``Retry-After``."""
        call = self._store.take(self._prefix + bucket, self.per_minute, self._window)
        return await self._ask(call, 0)

    async def blocked(self, bucket):
        """As ``take``, counting nothing: 0 if ``bucket`` has room for a
        request, else the whole seconds (>= 1) until it has."""
        call = self._store.wait(self._prefix + bucket, self.per_minute, self._window)
        return await self._ask(call, 0)

    async def count(self, bucket):
        """Counts one request of ``bucket`` without asking (a failed
        authentication); a full bucket stays full, and counts nothing more."""
        call = self._store.count(self._prefix + bucket, self.per_minute, self._window)
        await self._ask(call, None)

    async def close(self):
        """Closes the connections to Redis of a storage the limiter opened
        (nothing to do in memory)."""
        if self._owned:
            await self._store.close()

    async def _ask(self, call, when_open):
        try:
            return await call
        except StorageDown as error:
            if self.on_storage_error == "closed":
                raise LimitStorageError(str(error)) from None
            return when_open
