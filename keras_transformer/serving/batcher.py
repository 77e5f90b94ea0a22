"""Dynamic batching: the requests that arrive within a few milliseconds of
each other are translated by one search call, and each gets its own answer.

A search call costs nearly the same for one sentence as for dozens (the
steps are batched matrix products), so a server that translated each request
on its own would spend most of its time on nearly empty batches. The
``Batcher`` keeps a bounded queue of jobs (one per request, its sentences
already encoded); its loop takes the oldest job, waits up to ``max_wait``
seconds for more (unless the translator is busy, in which case the queue
fills while it works), and gives the search call the jobs with the same
search options, up to ``max_batch_size`` sentences. The batcher only counts
sentences: the search call sorts the batch by length, once. One thread runs
every search: one model in memory, used by one caller at a time.

A server told to stop at once (a second SIGINT, a shutdown deadline passed)
calls ``abort``: what the batcher holds is answered with an error rather than
searched, and the search running then (which a thread cannot be made to
leave) is no longer waited for.
"""

import asyncio
import collections
import dataclasses
import functools
import time


class QueueFull(Exception):
    """The queue holds ``max_queue`` sentences: the request is refused
    rather than the queue grown without bound."""


class Aborted(Exception):
    """The server is stopping at once: held requests are answered, not
    searched."""


class SearchFailed(Exception):
    """The search of the batch this request was in raised ``cause``."""

    def __init__(self, cause):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


@dataclasses.dataclass(eq=False)
class _Job:
    sources: list
    options: object  # the search's settings: jobs batched together share them
    future: asyncio.Future
    arrived: float


class Batcher:
    """Translates the jobs of ``submit`` in batches, with ``translate``.

    Args:
        translate: ``translate(sources, options, wanted)`` → a list, one
            result per source (the jobs' sources, in the order they were
            submitted); run in ``executor``, so it may block. ``options`` is
            what a job was submitted with; ``wanted()`` says, source by
            source, which are still waited for (a client that has gone waits
            for nothing): a long call may skip the rest of a job whose
            client left, returning anything in its place.
        executor: where searches run (a one-thread executor: one search at
            a time).
        max_batch_size: the most sentences given to one ``translate`` call
            (a single request with more is translated alone).
        max_wait: seconds a job may wait for others to join its batch while
            the translator is idle.
        max_queue: the most sentences waiting; ``submit`` raises
            ``QueueFull`` beyond.
        on_batch: optional ``on_batch(sentences, seconds)`` after each call.
    """

    def __init__(
        self, translate, executor, max_batch_size, max_wait, max_queue, on_batch=None
    ):
        self._translate = translate
        self._executor = executor
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.max_queue = max_queue
        self._on_batch = on_batch
        self._jobs = collections.deque()
        self._queued = 0  # sentences in self._jobs
        self._running = ()  # the jobs of the search in progress
        self._aborted = None  # abort's error, once called
        self._arrival = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = None

    @property
    def queued(self):
        """Sentences waiting for a search (a running batch's excluded)."""
        return self._queued

    def start(self):
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, sources, options):
        """The translations of ``sources`` (one per sentence, whatever the
        search call reads: the batcher only counts them), once their batch
        is searched with ``options`` (hashable: jobs with equal options
        share a batch).

        Raises:
            QueueFull: the queue has no room for ``sources``.
            SearchFailed: the batch's search raised.
            Exception: ``abort``'s error, once it is called (or while the
                job waits).
        A cancelled caller (a client that went away) leaves its job in the
        queue, where the loop skips it.
        """
        if self._aborted is not None:
            raise self._aborted
        if self._queued + len(sources) > self.max_queue:
            raise QueueFull(
                f"the queue holds {self._queued} sentences; at most "
                f"{self.max_queue} may wait"
            )
        job = _Job(
            sources,
            options,
            asyncio.get_running_loop().create_future(),
            time.monotonic(),
        )
        self._jobs.append(job)
        self._queued += len(sources)
        self._idle.clear()
        self._arrival.set()
        return await job.future

    async def drain(self):
        """Returns once every job submitted so far is answered (or dropped)."""
        await self._idle.wait()

    def abort(self, error):
        """Fails every job not yet answered, queued or in the running search,
        with ``error`` (an exception), and every later ``submit``; ends the
        loop without waiting for the running search, whose result is
        dropped. ``drain`` and ``stop`` then return at once. Call it from the
        event loop (from a signal handler: ``loop.call_soon_threadsafe``).
        """
        if self._aborted is not None:
            return
        self._aborted = error
        for job in (*self._running, *self._jobs):
            if not job.future.done():
                job.future.set_exception(error)
        self._jobs.clear()
        self._queued = 0
        if self._task is not None:
            self._task.cancel()
        self._idle.set()

    async def stop(self):
        """Ends the loop (after ``drain``, so that nothing held is lost)."""
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    # -- the loop --------------------------------------------------------------

    async def _run(self):
        while True:
            self._drop_cancelled()
            if not self._jobs:
                self._idle.set()
                self._arrival.clear()
                await self._arrival.wait()
                continue
            await self._gather(self._jobs[0])
            batch = self._take()
            if batch:
                await self._search(batch)

    async def _search(self, batch):
        sources = [source for job in batch for source in job.sources]
        start = time.monotonic()
        self._running = batch
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                self._translate,
                sources,
                batch[0].options,
                functools.partial(_wanted, batch),
            )
        except Exception as error:  # one batch's failure is its own
            outputs, failure = None, SearchFailed(error)
        else:
            failure = None
        finally:
            # Also when abort cancels the wait (it has failed these jobs).
            self._running = ()
        if self._on_batch is not None:
            self._on_batch(len(sources), time.monotonic() - start)
        if failure is not None:
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(failure)
        else:
            self._answer(batch, outputs)

    def _drop_cancelled(self):
        while self._jobs and self._jobs[0].future.done():
            self._queued -= len(self._jobs.popleft().sources)

    async def _gather(self, first):
        """Waits until ``first`` has waited ``max_wait`` or a full batch of
        its options is queued."""
        deadline = first.arrived + self.max_wait
        while self._sentences_like(first) < self.max_batch_size:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), left)
            except TimeoutError:
                return

    def _sentences_like(self, first):
        return sum(
            len(job.sources)
            for job in self._jobs
            if job.options == first.options and not job.future.done()
        )

    def _take(self):
        """The oldest live job and the later ones with its options, up to
        ``max_batch_size`` sentences, out of the queue."""
        self._drop_cancelled()
        if not self._jobs:
            return []
        options = self._jobs[0].options
        batch, kept, sentences = [], collections.deque(), 0
        for job in self._jobs:
            if job.future.done():
                self._queued -= len(job.sources)
            elif job.options == options and (
                not batch or sentences + len(job.sources) <= self.max_batch_size
            ):
                batch.append(job)
                sentences += len(job.sources)
                self._queued -= len(job.sources)
            else:
                kept.append(job)
        self._jobs = kept
        return batch

    @staticmethod
    def _answer(batch, outputs):
        start = 0
        for job in batch:
            end = start + len(job.sources)
            if not job.future.done():  # its client may have gone meanwhile
                job.future.set_result(list(outputs[start:end]))
            start = end


def _wanted(batch):
    """One bool per source of ``batch``: whether its job still waits for it
    (its client has not gone). Read from the search thread: a future's
    ``done()`` only reads its state."""
    return [not job.future.done() for job in batch for _ in job.sources]
