"""Who may translate, and how often: API keys and rate limits.

A server reachable from a network serves whoever connects; LibreTranslate
answers that with API keys, a request limit per key and per client address,
and a character limit per request, and ``kt-serve`` takes its option names
(``--api-keys``, ``--req-limit``, ``--char-limit``).

Keys are read from a file, one a line, in the clear or as ``sha256:<hex>``
(the digest of the key's UTF-8 bytes), so that the file need not hold the
secrets. Only the digests are kept in memory, and a key offered is compared
by its digest in constant time. A key is named in logs and metrics by its
line in the file (``key3``), never by its value or digest.
"""

import dataclasses
import hashlib
import hmac
import math
import re
import time

_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")


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
        """The keys of a file: a key a line, in the clear or as
        ``sha256:<64 hex digits>``; blank lines and lines starting with
        ``#`` are skipped; surrounding whitespace is not part of a key."""
        try:
            with open(path, encoding="utf-8") as file:
                lines = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"{path}: cannot read the API keys: {error}") from None
        digests = {}
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            found = _DIGEST.fullmatch(line)
            if line.startswith("sha256:") and not found:
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


@dataclasses.dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per caller: ``per_minute`` requests a minute, in
    bursts of up to ``per_minute``.

    A bucket refills at ``per_minute / 60`` tokens a second; each request
    takes one. Full buckets are forgotten, so memory grows with the callers
    of the last minute, not with every address ever seen.

    Args:
        per_minute: requests a minute per caller (int >= 1).
        clock: ``clock()`` → seconds (tests pass their own).
    """

    # Buckets kept before the full ones are swept out.
    SWEEP_AT = 10_000

    def __init__(self, per_minute, clock=time.monotonic):
        if isinstance(per_minute, bool) or not isinstance(per_minute, int):
            raise TypeError(f"per_minute must be an int. Received: {per_minute!r}")
        if per_minute < 1:
            raise ValueError(f"per_minute must be >= 1. Received: {per_minute}")
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._clock = clock
        self._buckets = {}

    def take(self, caller):
        """0 if ``caller`` may make a request now (one token is taken), else
        the whole seconds until it may (for ``Retry-After``)."""
        now = self._clock()
        bucket = self._buckets.get(caller)
        if bucket is None:
            if len(self._buckets) >= self.SWEEP_AT:
                self._sweep(now)
            bucket = self._buckets[caller] = _Bucket(self.per_minute, now)
        bucket.tokens = min(
            self.per_minute, bucket.tokens + (now - bucket.updated) * self._rate
        )
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0
        return max(1, math.ceil((1 - bucket.tokens) / self._rate))

    def _sweep(self, now):
        self._buckets = {
            caller: bucket
            for caller, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.updated) * self._rate < self.per_minute
        }
