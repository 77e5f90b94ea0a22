"""Threads: a server searches on a worker thread beside its event loop, and a
program may translate from several threads at once.

Translations made at once give the serial answers; the guards' scopes
(checks left out, failed checks deferred, weights recorded) belong to the
thread that opened them.
"""

import threading

import keras
import pytest

from keras_transformer import build_model
from keras_transformer._guards import checks as _checks
from keras_transformer._guards import fault_safe as _fault_safe
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german
from keras_transformer.translate.keras_translator import Translator

THREADS = 4
NUMBERS = list(range(0, 1000, 7))
SMALL = dict(num_layers=1, d_model=32, num_heads=4, d_ff=64)
# A join that waits longer than this means a thread is stuck (a deadlock).
JOIN_TIMEOUT = 300


def run_threads(target, count=THREADS):
    """Run ``target(i)`` on ``count`` threads at once; their results in order,
    re-raising the first error a thread met."""
    results, errors = [None] * count, []

    def run(i):
        try:
            results[i] = target(i)
        except BaseException as error:  # handed to the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def proto():
    texts = [english(n) for n in NUMBERS] + [german(n) for n in NUMBERS]
    return tk.train_tokenizer(texts, 60)


def make_translator(proto, weights=None):
    """A small untrained translator; its own model, so its own compiled
    searches."""
    keras.utils.set_random_seed(7)
    tokenizer = tk.make_tokenizer(proto)
    model = build_model("tiny", src_vocab_size=tokenizer.vocabulary_size(), **SMALL)
    if weights is not None:
        model.set_weights(weights)
    return Translator(tokenizer, model, max_output_length=10)


# Each thread's share: sentences of several lengths (several compiled
# shapes), greedy and beam search.
JOBS = [
    ([english(n) for n in NUMBERS[i::THREADS][:6]], dict(beam_size=1 + i % 2))
    for i in range(THREADS)
]


def test_translations_made_at_once_give_the_serial_answers(proto):
    serial_translator = make_translator(proto)
    expected = [serial_translator.translate(text, **opts) for text, opts in JOBS]
    outputs = [text for job in expected for text in job]
    assert len(set(outputs)) > 1 and any(outputs)  # something to compare

    # A second translator with the same weights: its searches are compiled
    # by the threads, at the same time.
    translator = make_translator(proto, serial_translator.transformer.get_weights())
    start = threading.Barrier(THREADS)

    def translate(i):
        texts, options = JOBS[i]
        start.wait()
        return [translator.translate(texts, **options) for _ in range(3)]

    for i, runs in enumerate(run_threads(translate)):
        for output in runs:
            assert output == expected[i]

    # Every thread on the same shapes, now compiled: the same again.
    def same(i):
        texts, options = JOBS[0]
        start.wait()
        return translator.translate(texts, **options)

    assert run_threads(same) == [expected[0]] * THREADS


@pytest.mark.once
def test_checks_left_out_on_one_thread_still_run_on_another():
    """``inputs_checked`` on one thread (a step on inputs checked already)
    leaves out that thread's checks only."""
    inside, done = threading.Event(), threading.Event()

    def trusted():
        with _checks.inputs_checked():
            inside.set()
            assert done.wait(JOIN_TIMEOUT)
            assert _checks.inputs_were_checked()

    thread = threading.Thread(target=trusted)
    thread.start()
    try:
        assert inside.wait(JOIN_TIMEOUT)
        with pytest.raises(ValueError, match="ids from 5 to 5"):
            _checks.check_range(
                keras.ops.convert_to_tensor([5]), 0, 5, "ids from {lo} to {hi}"
            )
        assert not _checks.inputs_were_checked()
    finally:
        done.set()
        thread.join(JOIN_TIMEOUT)
    assert not _checks.inputs_were_checked()


@pytest.mark.once
def test_a_failed_check_deferred_on_one_thread_is_raised_there_only():
    """Two threads in ``deferred_value_errors`` at once, interleaved: each
    raises its own failures, and none is left open when they end."""
    steps = [threading.Event() for _ in range(4)]
    raised = {}

    def first():  # opens first, fails nothing, closes while the other is open
        try:
            with _checks.deferred_value_errors():
                steps[0].set()
                assert steps[1].wait(JOIN_TIMEOUT)
            raised["first"] = None
        except ValueError as error:
            raised["first"] = str(error)
        steps[2].set()

    def second():  # opens inside the first's block, fails, closes last
        assert steps[0].wait(JOIN_TIMEOUT)
        try:
            with _checks.deferred_value_errors():
                _checks._fail("the second thread's ids")
                steps[1].set()
                assert steps[2].wait(JOIN_TIMEOUT)
            raised["second"] = None
        except ValueError as error:
            raised["second"] = str(error)

    run_threads(lambda i: (first, second)[i](), count=2)
    assert raised == {"first": None, "second": "the second thread's ids"}
    # Outside any block a failure raises at once: no block was left open.
    with pytest.raises(ValueError, match="on no thread's block"):
        _checks._fail("on no thread's block")


@pytest.mark.once
def test_a_deferred_block_collects_only_its_own_threads_failures():
    """A failure on a thread with no block raises there, even while another
    thread's block is open (on the CPU, JAX runs host callbacks on the
    thread that launched the computation)."""
    inside, done = threading.Event(), threading.Event()
    raised = []

    def deferring():
        try:
            with _checks.deferred_value_errors():
                inside.set()
                assert done.wait(JOIN_TIMEOUT)
        except ValueError as error:
            raised.append(str(error))

    thread = threading.Thread(target=deferring)
    thread.start()
    try:
        assert inside.wait(JOIN_TIMEOUT)
        with pytest.raises(ValueError, match="this thread's ids"):
            _checks._fail("this thread's ids")
    finally:
        done.set()
        thread.join(JOIN_TIMEOUT)
    assert raised == []


@pytest.mark.once
def test_a_failure_on_a_runtime_thread_goes_to_the_one_open_block():
    """A host callback run by a thread Python did not start (JAX on a GPU)
    has no block of its own: the one open block collects its failure."""
    import _thread

    outcome = {}

    def callback():  # what a runtime thread looks like to Python
        _thread.start_new_thread(runtime, ())

    def runtime():
        try:
            _checks._fail("from the runtime")
            outcome["raised"] = False
        except ValueError:
            outcome["raised"] = True
        finished.set()

    finished = threading.Event()
    with pytest.raises(ValueError, match="from the runtime"):
        with _checks.deferred_value_errors():
            callback()
            assert finished.wait(JOIN_TIMEOUT)
    assert outcome == {"raised": False}


@pytest.mark.backends("jax")  # the guard records weights on JAX only
def test_a_guard_on_one_thread_is_not_nested_in_another_threads():
    """Each thread's call of a model records its own weights: the same model
    guarded on two threads at once, each guard its own."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    inside, done = threading.Event(), threading.Event()

    def other():
        with _fault_safe.guard(model):
            inside.set()
            assert done.wait(JOIN_TIMEOUT)
            assert _fault_safe.guarding(model)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert inside.wait(JOIN_TIMEOUT)
        assert not _fault_safe.guarding(model)
        with _fault_safe.guard(model):
            assert _fault_safe.guarding(model)
    finally:
        done.set()
        thread.join(JOIN_TIMEOUT)
    assert not _fault_safe.guarding(model)
