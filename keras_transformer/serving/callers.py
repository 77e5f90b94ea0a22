"""Who is asking, and whether they may: the one place a request's API key
is read, checked and limited, for every endpoint that needs one.

The key. A request may give its key as LibreTranslate's ``api_key`` field
(in the query string, a form body or a JSON body) or as an
``Authorization: Bearer <key>`` header; given both, the ``api_key`` field is
the one read, on ``/translate``, ``/explain`` and ``/metrics`` alike.

Failed authentications. A missing or wrong key is a 403 and counts against
the client's address; past ``--auth-fail-limit`` failures a minute the
address gets 429 with Retry-After, whatever key it sends, so that keys
cannot be guessed at the speed of the network.

The request limit. ``--req-limit`` requests a minute per key (per client
address without keys) for the translating endpoints; ``/metrics`` (a
scrape, not a translation) needs a key but is not counted against it.

Both limits count in ``--req-limit-storage``: this process's memory, or a
Redis server that the replicas of a model share, so that two replicas give
a key one allowance between them. While Redis cannot be asked:

* the request limit does what ``--req-limit-storage-down`` says: requests
  are let through uncounted (``open``) or refused 503 (``closed``);
* authentication goes on as ever: a key is checked against the key file,
  never against the storage, so a wrong key is a 403 and a right one
  reaches ``/metrics`` in either mode;
* failed authentications stay throttled, in either mode: each process also
  counts them in its own memory, and that count throttles an address while
  the shared one cannot be read. Letting guesses through unthrottled during
  an outage would make an outage (which a client may cause or wait for) the
  moment to guess keys; with N replicas an address gets at most N times
  ``--auth-fail-limit`` guesses a minute.
"""

from keras_transformer.serving.access import KeyRing, LimitStorageError, RateLimiter
from keras_transformer.serving.limit_storage import MemoryWindows, open_storage
from keras_transformer.serving.requests import KEY_FIELD, RequestError

ANONYMOUS = "anonymous"


def bearer(request):
    """The credentials of an ``Authorization: Bearer`` header, or None."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


class Callers:
    """The keys, the request limit and the failed-authentication limit of
    a server (``Settings``' ``api_keys``, ``req_limit``, ``auth_fail_limit``
    and ``req_limit_storage``).

    Raises ``access.KeyFileError`` for a key file that cannot be used and
    ``ValueError`` for a storage it does not know.
    """

    def __init__(self, settings):
        self.keys = KeyRing.read(settings.api_keys) if settings.api_keys else None
        down = settings.req_limit_storage_down
        # One storage for both limits: one breaker, one warning an outage.
        self.storage = open_storage(settings.req_limit_storage, down)
        self.limiter = None
        if settings.req_limit:
            self.limiter = RateLimiter(
                settings.req_limit, self.storage, down, prefix="kt-serve:requests"
            )
        self.failures = self.local_failures = None
        if self.keys is not None:
            # "closed": identify learns of an outage, and throttles on the
            # process's own count meanwhile.
            self.failures = RateLimiter(
                settings.auth_fail_limit, self.storage, "closed", prefix="kt-serve:auth"
            )
            if not isinstance(self.storage, MemoryWindows):
                self.local_failures = RateLimiter(settings.auth_fail_limit)

    @property
    def need_keys(self):
        return self.keys is not None

    async def identify(self, request, fields):
        """The caller's name in the metrics: a key's line in the key file
        (``key3``), or ``anonymous`` without keys. ``fields`` loses its
        ``api_key``. ``RequestError`` 403 for a missing or wrong key, 429
        for an address past its failed authentications."""
        offered = fields.pop(KEY_FIELD, None) or bearer(request)
        if self.keys is None:
            # LibreTranslate without keys accepts and ignores an api_key.
            return ANONYMOUS
        address = _address(request)
        wait = await self._failures_wait(address)
        if wait:
            raise RequestError(
                429,
                f"Too many failed authentications from {address}; retry in {wait} s",
                kind="auth_throttled",
                retry_after=wait,
            )
        name = self.keys.name_of(offered)
        if name is None:
            if self.local_failures is not None:
                await self.local_failures.count(address)
            try:
                await self.failures.count(address)
            except LimitStorageError:
                pass  # counted in this process's memory
            raise RequestError(
                403,
                "Invalid API key" if offered else "Missing API key: give api_key",
                kind="forbidden",
            )
        return name

    async def limit(self, request, name):
        """One request of the caller ``name`` (``identify``'s) counted
        against its limit: its key, or its address without keys. 429 past
        it."""
        if self.limiter is None:
            return
        bucket = name if self.keys is not None else f"address {_address(request)}"
        wait = await self._ask(self.limiter.take, bucket)
        if wait:
            raise RequestError(
                429,
                f"Too many requests: at most {self.limiter.per_minute} a minute; "
                f"retry in {wait} s",
                kind="rate_limited",
                retry_after=wait,
            )

    async def _failures_wait(self, address):
        """The seconds ``address`` must wait for its failed authentications:
        by this process's count of them, else by the shared count (nothing
        while that one cannot be read)."""
        if self.local_failures is not None:
            wait = await self.local_failures.blocked(address)
            if wait:
                return wait
        try:
            return await self.failures.blocked(address)
        except LimitStorageError:
            return 0

    @staticmethod
    async def _ask(call, bucket):
        try:
            return await call(bucket)
        except LimitStorageError:
            # The storage's address and error are the operator's (logged
            # once an outage by limit_storage), not the client's.
            raise RequestError(
                503,
                "the server cannot count requests now; retry shortly",
                kind="limits_down",
                retry_after=1,
            ) from None

    async def close(self):
        await self.storage.close()


def _address(request):
    # uvicorn has put the X-Forwarded-For address here if, and only if, the
    # connection came from a proxy the operator trusts.
    return request.client.host if request.client else "unknown"
