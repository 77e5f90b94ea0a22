"""Signs of life for long jobs: how much is done, how fast, how long is left.

On a terminal the line is rewritten in place; in a log file, a pipe or CI a
new line comes at most every ``every`` seconds (and at the end), so that a
long run shows progress without flooding its log.
"""

import sys
import time


def duration(seconds):
    """``"1:02:03"`` or ``"2:03"``."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{minutes}:{seconds:02d}"


def is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """``"120/1000 sentences, 35.2 sentences/s, 0:25 left"``.

    Args:
        total: int, units of the whole job.
        unit: str, what is counted.
        stream: where the lines go (default ``sys.stderr``, so that a
            command's output on stdout stays clean).
        every: float, seconds between lines when ``stream`` is not a
            terminal.
        clock: callable returning seconds (for tests).
    """

    def __init__(self, total, unit="sentences", stream=None, every=10.0, clock=None):
        self.total = total
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.every = every
        self.clock = time.monotonic if clock is None else clock
        self.terminal = is_terminal(self.stream)
        self.start = self.clock()
        self.last_line = self.start
        self.done = 0

    def line(self):
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        text = f"{self.done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s"
        if self.done >= self.total:
            return f"{text}, {duration(elapsed)} in all"
        if rate > 0:
            return f"{text}, {duration((self.total - self.done) / rate)} left"
        return text

    def update(self, done):
        """Record ``done`` units finished; write a line if it is time."""
        self.done = done
        now = self.clock()
        final = done >= self.total
        if self.terminal:
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
        elif final or now - self.last_line >= self.every:
            self.stream.write(self.line() + "\n")
            self.last_line = now
        else:
            return
        self.stream.flush()
