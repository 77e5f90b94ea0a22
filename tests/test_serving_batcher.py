"""The ``Batcher`` on its own, in one event loop: which jobs share a search
call, what a full queue and a cancelled job do, that ``stop`` waits for
what it holds and ``abort`` for nothing. The translator is a recording
stand-in (the batching does not depend on the model; tests/test_serve.py
runs the real one over HTTP)."""

import asyncio
import concurrent.futures
import threading
import time

import pytest

from keras_transformer.serving.batcher import (
    Aborted,
    Batcher,
    QueueFull,
    SearchFailed,
)

pytestmark = pytest.mark.once


class Recorder:
    """``translate`` that records each call, upper-cases, and can be held."""

    def __init__(self):
        self.calls = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, texts, options, wanted):
        self.wanted = wanted
        self.release.wait(10)
        self.calls.append((list(texts), *options))
        if "boom" in texts:
            raise ValueError("boom")
        return [text.upper() for text in texts]


def run(scenario, max_batch_size=8, max_wait=0.05, max_queue=100):
    recorder = Recorder()

    async def main():
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            batcher = Batcher(recorder, executor, max_batch_size, max_wait, max_queue)
            batcher.start()
            try:
                return await scenario(batcher, recorder)
            finally:
                await batcher.stop()

    return asyncio.run(main()), recorder.calls


def test_jobs_within_the_wait_share_one_call_and_get_their_own_answers():
    async def scenario(batcher, _):
        return await asyncio.gather(
            batcher.submit(["a", "b"], (4, 0.6)),
            batcher.submit(["c"], (4, 0.6)),
            batcher.submit(["d"], (1, 0.6)),  # other options: a call of its own
            batcher.submit(["e", "f"], (4, 0.6)),
        )

    answers, calls = run(scenario)
    assert answers == [["A", "B"], ["C"], ["D"], ["E", "F"]]
    assert calls == [(["a", "b", "c", "e", "f"], 4, 0.6), (["d"], 1, 0.6)]


def test_a_batch_stops_at_max_batch_size_and_a_big_job_goes_alone():
    async def scenario(batcher, _):
        return await asyncio.gather(
            batcher.submit(["a", "b"], (4, 0.6)),
            batcher.submit(["c", "d"], (4, 0.6)),
            batcher.submit(list("efghi"), (4, 0.6)),
        )

    answers, calls = run(scenario, max_batch_size=4)
    assert answers == [["A", "B"], ["C", "D"], list("EFGHI")]
    assert [texts for texts, _, _ in calls] == [list("abcd"), list("efghi")]


def test_a_full_queue_refuses_and_a_cancelled_job_is_never_searched():
    async def scenario(batcher, recorder):
        recorder.release.clear()  # the first call holds the search thread
        first = asyncio.ensure_future(batcher.submit(["a"], (4, 0.6)))
        await asyncio.sleep(0.2)
        assert batcher.queued == 0  # taken into the held call
        gone = asyncio.ensure_future(batcher.submit(["b", "c"], (4, 0.6)))
        kept = asyncio.ensure_future(batcher.submit(["d"], (4, 0.6)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="the queue holds 3 sentences"):
            await batcher.submit(["e"], (4, 0.6))
        gone.cancel()
        recorder.release.set()
        return await first, await kept, gone.cancelled()

    answers, calls = run(scenario, max_queue=3)
    assert answers == (["A"], ["D"], True)
    assert [texts for texts, _, _ in calls] == [["a"], ["d"]]


def test_a_failed_call_fails_its_own_jobs_only():
    async def scenario(batcher, _):
        return await asyncio.gather(
            batcher.submit(["boom"], (4, 0.6)),
            batcher.submit(["x"], (4, 0.6)),
            batcher.submit(["y"], (1, 0.6)),
            return_exceptions=True,
        )

    (failed, same_batch, other), _ = run(scenario)
    assert isinstance(failed, SearchFailed) and str(failed) == "ValueError: boom"
    assert isinstance(same_batch, SearchFailed)
    assert other == ["Y"]


def test_stop_answers_every_job_it_holds():
    async def scenario(batcher, recorder):
        recorder.release.clear()
        jobs = [asyncio.ensure_future(batcher.submit([t], (4, 0.6))) for t in "abc"]
        await asyncio.sleep(0.1)
        recorder.release.set()
        await batcher.stop()
        return [job.result() for job in jobs]

    answers, _ = run(scenario)
    assert answers == [["A"], ["B"], ["C"]]


def test_abort_fails_the_running_and_the_queued_jobs_and_waits_for_no_search():
    """The search of "a" is held in its thread when abort comes: its job and
    the queued ones fail at once, later ones too, ``stop`` returns without
    the search, and the queued jobs are never searched."""

    async def scenario(batcher, recorder):
        recorder.release.clear()
        running = asyncio.ensure_future(batcher.submit(["a"], (4, 0.6)))
        await asyncio.sleep(0.2)  # taken into the held call
        queued = [
            asyncio.ensure_future(batcher.submit(texts, options))
            for texts, options in [(["b"], (4, 0.6)), (["c", "d"], (1, 0.6))]
        ]
        await asyncio.sleep(0)
        assert batcher.queued == 3
        batcher.abort(Aborted("stopping"))
        results = await asyncio.gather(running, *queued, return_exceptions=True)
        with pytest.raises(Aborted, match="stopping"):
            await batcher.submit(["e"], (4, 0.6))
        start = time.monotonic()
        await batcher.stop()
        stopped = time.monotonic() - start
        left = batcher.queued
        recorder.release.set()  # the thread's search ends, its result unused
        return results, stopped, left

    (results, stopped, left), calls = run(scenario)
    assert [str(result) for result in results] == ["stopping"] * 3
    assert all(isinstance(result, Aborted) for result in results)
    assert stopped < 1 and left == 0
    assert [texts for texts, _, _ in calls] == [["a"]]


def test_abort_from_another_thread_through_the_loop():
    """A signal handler's way: ``call_soon_threadsafe``."""

    async def scenario(batcher, recorder):
        recorder.release.clear()
        job = asyncio.ensure_future(batcher.submit(["a"], (4, 0.6)))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=loop.call_soon_threadsafe, args=(batcher.abort, Aborted("now"))
        )
        thread.start()
        with pytest.raises(Aborted, match="now"):
            await asyncio.wait_for(job, 5)
        thread.join()
        recorder.release.set()
        await batcher.drain()
        return True

    assert run(scenario)[0]


def test_a_search_call_can_tell_which_jobs_are_still_wanted():
    """A job whose caller is cancelled while its batch runs reads as not
    wanted from the search thread; the others' answers are unchanged."""

    async def scenario(batcher, recorder):
        recorder.release.clear()
        kept = asyncio.ensure_future(batcher.submit(["a", "b"], (4, 0.6)))
        left = asyncio.ensure_future(batcher.submit(["c"], (4, 0.6)))
        await asyncio.sleep(0.2)  # both in one running call, held
        before = recorder.wanted()
        left.cancel()
        await asyncio.sleep(0)
        after = recorder.wanted()
        recorder.release.set()
        return before, after, await kept

    (before, after, kept), calls = run(scenario)
    assert before == [True, True, True] and after == [True, True, False]
    assert kept == ["A", "B"] and calls == [(["a", "b", "c"], 4, 0.6)]
