"""Where the rate limits count: this process's memory, or a Redis that the
replicas of a model share; and what a Redis that does not answer costs.

Both keep a moving window per bucket (a key, a client address): at most
``limit`` requests in any ``window`` seconds, each stamped with
``time.time()`` (the replica's clock, not Redis's: replicas keep theirs in
step). In memory the window is the ``limits`` package's. In Redis it is a
sorted set per bucket, its requests named uniquely and scored by their
time, read and written by one script (``WINDOW``): one round trip a
request.

A Redis that does not answer. A connection has ``CONNECT_TIMEOUT``
seconds to open, a reply ``READ_TIMEOUT``, a call ``STORAGE_DEADLINE`` in
all; then the call raises ``StorageDown``. And:

* A circuit breaker: after a failure the storage is taken for down, and
  calls raise ``StorageDown`` at once, sending nothing; a PING probes it
  every ``DOWN_SECONDS`` in the background, and only a probe's answer
  brings it back (a request that was already waiting when it failed
  changes nothing: an outage starts once and ends once). A warning when an
  outage starts, a line when it ends.
* A request that was not counted in time is never counted later. A Redis
  that is frozen (SIGSTOP, a stalled host) still holds the command in its
  socket and runs it when it wakes, and closing the connection does not
  take it back (over a Unix socket, not even a reset does). So the
  connection is kept, not reused, and read on: if the late reply says the
  request was counted, it is taken out of its window (ZREM of its name) on
  that connection, which Redis serves in order; and the probe that finds
  the storage answering again waits for those to be settled (for at most
  ``STORAGE_DEADLINE``) before the storage is back, so that no request
  meets a window that holds them. Once the request's time has left every
  window the connection is closed, answered or not (a count that runs
  later still is of a time no window holds). At most ``MAX_UNSETTLED``
  connections wait so; beyond, they are closed at once.

``limits``' own Redis storage is not used for this: it stamps a request
with a time of its own and hides the connection a command went on, so a
request it gave up on could be neither found nor taken back.
"""

import asyncio
import logging
import math
import os
import re
import time
import urllib.parse

import limits
import limits.aio.strategies
import limits.storage
import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

logger = logging.getLogger("kt_serve")

# A Redis beside the servers answers in about a millisecond; one slower than
# this is taken for unreachable, so that it cannot hold up the requests it
# should count.
CONNECT_TIMEOUT = 0.25
READ_TIMEOUT = 0.25
STORAGE_DEADLINE = 0.5
# Seconds between the probes of a storage that failed.
DOWN_SECONDS = 1.0
MAX_UNSETTLED = 64
SCHEMES = (
    "memory://",
    "redis://HOST:PORT[/DB]",
    "rediss://HOST:PORT[/DB]",
    "redis+unix:///PATH",
)
# KEYS[1]: a bucket's window, a sorted set of its requests scored by their
# time. ARGV: now, the window's seconds, the limit, and the request's name
# ("" counts nothing). Returns 0 when the bucket has room (the named request
# is then counted), else the time of the request whose leaving makes room.
WINDOW = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local held = redis.call('ZCARD', KEYS[1])
if held < limit then
  if ARGV[4] ~= '' then
    redis.call('ZADD', KEYS[1], now, ARGV[4])
    redis.call('EXPIRE', KEYS[1], window)
  end
  return 0
end
return redis.call('ZRANGE', KEYS[1], held - limit, held - limit, 'WITHSCORES')[2]
"""


class StorageDown(Exception):
    """The storage could not be asked; the message names it (without a
    password) and why."""


def shown(uri):
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


def open_storage(uri, on_down="open"):
    """The storage of a URI an operator gave (``SCHEMES``); ``ValueError``
    for any other. Nothing connects until asked. ``on_down`` ("open" or
    "closed") is what the outage warning says requests meet."""
    if not isinstance(uri, str):
        raise TypeError(f"storage must be a str URI. Received: {uri!r}")
    refused = ValueError(
        f"not a rate-limit storage: {shown(uri)!r} (give "
        f"{', '.join(SCHEMES[:-1])} or {SCHEMES[-1]})"
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
        return MemoryWindows()
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
        options = parse_url(client_uri)
    except ValueError as error:
        raise ValueError(f"{refused} ({error})") from None
    return RedisWindows(shown(uri), options, on_down)


class MemoryWindows:
    """The windows in this process's memory: the ``limits`` package's
    moving window."""

    shown = "memory://"

    def __init__(self):
        store = limits.storage.storage_from_string("async+memory://")
        self._strategy = limits.aio.strategies.MovingWindowRateLimiter(store)

    async def take(self, key, limit, window, settle=True):
        """0 if ``key`` has room (its request is counted), else the whole
        seconds (>= 1) until it has."""
        if await self._strategy.hit(limits.RateLimitItemPerSecond(limit, window), key):
            return 0
        return await self.wait(key, limit, window)

    async def count(self, key, limit, window):
        """Counts a request of ``key`` if it has room, without asking."""
        await self._strategy.hit(limits.RateLimitItemPerSecond(limit, window), key)

    async def wait(self, key, limit, window):
        """As ``take``, counting nothing."""
        item = limits.RateLimitItemPerSecond(limit, window)
        reset, remaining = await self._strategy.get_window_stats(item, key)
        if remaining > 0:
            return 0
        return max(1, math.ceil(reset - time.time()))

    async def close(self):
        pass


class RedisWindows:
    """The windows in a Redis (the module's docstring says how an outage
    is met). ``open_storage`` makes one from a URI.

    Args:
        shown: the URI as messages show it.
        options: redis-py's connection options of the URI (``parse_url``).
        on_down: "open" or "closed", for the outage warning's words.
    """

    def __init__(self, shown, options, on_down="open"):
        options = dict(options)
        self._connection_class = options.pop(
            "connection_class", redis.asyncio.Connection
        )
        # No retries: redis-py's own (backing off for seconds) would hold a
        # request that long each time Redis is down.
        self._options = dict(
            options,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=READ_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        self.shown = shown
        self._meets = "let through uncounted" if on_down == "open" else "refused"
        self._down = False
        self._reason = ""
        self._idle = []  # connections that answered all they were sent
        self._tasks = set()  # the prober, and the waits for late replies
        self._settling = set()  # the waits for late replies

    # -- the window --------------------------------------------------------------

    async def take(self, key, limit, window, settle=True):
        """0 if ``key`` has room (its request is counted), else the whole
        seconds (>= 1) until it has. ``settle``: a request counted after
        its call gave up is taken back (not for what happened anyway, such
        as a failed authentication)."""
        now, name = time.time(), os.urandom(9).hex()
        late = (key, name, window) if settle else None
        reply = await self._ask(
            ("EVAL", WINDOW, 1, key, now, window, limit, name), late
        )
        return _wait(reply, now, window)

    async def count(self, key, limit, window):
        """Counts a request of ``key`` if it has room, without asking. A
        count that arrives late stands: what it counts happened."""
        await self.take(key, limit, window, settle=False)

    async def wait(self, key, limit, window):
        """As ``take``, counting nothing."""
        now = time.time()
        reply = await self._ask(("EVAL", WINDOW, 1, key, now, window, limit, ""))
        return _wait(reply, now, window)

    async def close(self):
        """Stops the prober and the waits for late replies, and closes every
        connection."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for connection in self._idle:
            await connection.disconnect(nowait=True)
        self._idle.clear()

    # -- asking, and what an outage costs ----------------------------------------

    async def _ask(self, command, late=None, probe=False):
        """The reply to ``command``, or ``StorageDown``. ``late``: ``(key,
        name, window)`` of a request that the command counts, to take back
        if it is counted after the call gave up on it. ``probe``: sent even
        while the storage is taken for down."""
        if self._down and not probe:
            raise StorageDown(self._unreachable())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STORAGE_DEADLINE
        try:
            connection = await asyncio.wait_for(self._connection(), STORAGE_DEADLINE)
        except (TimeoutError, RedisError, OSError) as error:
            raise self._failed(error) from None
        try:
            await connection.send_command(*command)
            left = min(READ_TIMEOUT, deadline - loop.time())
            reply = await connection.read_response(timeout=max(left, 0.001))
        except ResponseError as error:  # an error reply: the connection is ready
            self._idle.append(connection)
            raise self._failed(error) from None
        except BaseException as error:
            await connection.disconnect(nowait=True)
            if isinstance(error, (RedisError, OSError, asyncio.TimeoutError)):
                raise self._failed(error) from None
            raise
        if reply is None:  # no reply in time: the command may still run
            if late is not None and len(self._settling) < MAX_UNSETTLED:
                self._settling.add(self._spawn(self._settle(connection, *late)))
            else:
                await connection.disconnect(nowait=True)
            raise self._failed(TimeoutError(f"no answer within {READ_TIMEOUT:g} s"))
        self._idle.append(connection)
        return reply

    async def _connection(self):
        """An idle connection that is still open, or a new one."""
        while self._idle:
            connection = self._idle.pop()
            try:
                # Data or an end of file on an idle connection: Redis has
                # closed it (a restart), or it is out of step.
                if (
                    connection.is_connected
                    and not await connection.can_read_destructive()
                ):
                    return connection
            except (RedisError, OSError):
                pass
            except BaseException:
                await connection.disconnect(nowait=True)
                raise
            await connection.disconnect(nowait=True)
        connection = self._connection_class(**self._options)
        try:
            await connection.connect()
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        return connection

    async def _settle(self, connection, key, name, window):
        """Reads the late reply of a request's count, for ``window``
        seconds at most, and takes the request back if it was counted."""
        try:
            if await connection.read_response(timeout=window) == 0:
                await connection.send_command("ZREM", key, name)
                await connection.read_response(timeout=READ_TIMEOUT)
        except (TimeoutError, RedisError, OSError):
            pass  # the connection is lost: what it sent ran, or never will
        finally:
            await connection.disconnect(nowait=True)

    async def _recover(self):
        """Probes the storage until it answers; then it is back, once what
        it was late for is settled."""
        while True:
            await asyncio.sleep(DOWN_SECONDS)
            try:
                await self._ask(("PING",), probe=True)
                break
            except StorageDown:
                pass
        if self._settling:
            await asyncio.wait(set(self._settling), timeout=STORAGE_DEADLINE)
        self._down = False
        logger.info("the rate-limit storage %s answers again", self.shown)

    def _failed(self, error):
        self._reason = _reason(error)
        if not self._down:
            self._down = True
            self._spawn(self._recover())
            logger.warning(
                "the rate-limit storage %s is unreachable (%s): requests are %s "
                "until it answers",
                self.shown,
                self._reason,
                self._meets,
            )
        return StorageDown(self._unreachable())

    def _unreachable(self):
        return f"the rate-limit storage {self.shown} is unreachable ({self._reason})"

    def _spawn(self, coroutine):
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._settling.discard)
        return task


STORAGES = (MemoryWindows, RedisWindows)


def _wait(reply, now, window):
    """The seconds ``WINDOW``'s reply makes a request wait."""
    if reply == 0:
        return 0
    return max(1, math.ceil(float(reply) + window - now))


def _reason(error):
    """What went wrong, in words."""
    if isinstance(error, asyncio.TimeoutError) and not str(error):
        return f"no answer within {STORAGE_DEADLINE:g} s"
    return str(error) or type(error).__name__
