"""Progress lines: ``keras_transformer.progress`` and the training callback."""

import io

import pytest

from keras_transformer.progress import Progress, duration
from keras_transformer.trainer.callbacks import ProgressLog, TimeBudget

pytestmark = pytest.mark.once


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_duration():
    assert duration(0) == "0:00"
    assert duration(59.6) == "1:00"
    assert duration(3 * 3600 + 62) == "3:01:02"
    assert duration(-5) == "0:00"


def test_lines_every_n_seconds_and_at_the_end_in_a_log():
    clock, out = Clock(), io.StringIO()
    progress = Progress(100, stream=out, every=10.0, clock=clock)
    clock.now += 4
    progress.update(20)  # 4 s: too soon for a line
    assert out.getvalue() == ""
    clock.now += 6
    progress.update(40)  # 10 s: 4/s, 60 left -> 15 s
    assert out.getvalue() == "40/100 sentences, 4.0 sentences/s, 0:15 left\n"
    clock.now += 5
    progress.update(60)
    assert out.getvalue().count("\n") == 1
    clock.now += 10
    progress.update(100)  # the end always gets its line
    assert out.getvalue().splitlines()[-1] == (
        "100/100 sentences, 4.0 sentences/s, 0:25 in all"
    )


def test_one_line_rewritten_on_a_terminal():
    clock, out = Clock(), Terminal()
    progress = Progress(10, unit="pairs", stream=out, clock=clock)
    clock.now += 1
    progress.update(5)
    clock.now += 1
    progress.update(10)
    assert out.getvalue() == (
        "\r5/10 pairs, 5.0 pairs/s, 0:01 left\r10/10 pairs, 5.0 pairs/s, 0:02 in all\n"
    )


class _Optimizer:
    learning_rate = 0.0007


class _Model:
    optimizer = _Optimizer()
    stop_training = False


def test_training_lines_name_step_loss_tokens_rate_and_budget():
    clock, out = Clock(), io.StringIO()
    budget = TimeBudget(max_seconds=600, elapsed=100)
    log = ProgressLog(
        every=30, budget=budget, tokens=lambda batch: 50 * (batch + 1), stream=out,
        clock=clock,
    )  # fmt: skip
    log.set_model(_Model())
    log.set_params({"steps": 40, "epochs": 1})
    log.on_train_begin()
    for batch in range(3):
        clock.now += 10
        log.on_train_batch_end(batch, {"loss": 2.5 - batch})
    # 30 s: one line; 50 + 100 + 150 target tokens in 30 s.
    (line,) = out.getvalue().splitlines()
    assert line.startswith("step 3/40, loss 0.5000, 10 target tokens/s, ")
    assert "learning rate 0.0007" in line
    # The budget's clock has not started: 100 s of 600 spent.
    assert line.endswith(", 8:20 of the time budget left")
    clock.now += 10
    log.on_train_batch_end(3, {"loss": 0.4})
    assert out.getvalue().count("\n") == 1  # 10 s later: no new line
