"""The one error a training run stops with when its input is unusable."""

import re

_SETTING = re.compile(r"`([a-z][a-z0-9_]*)`")


class _Message(Exception):
    """An error whose message names settings as `field` (``TrainConfig``'s
    field names); ``text(spell)`` spells them another way: ``kt-train`` shows
    its options (`batch_tokens` becomes ``--batch-tokens``)."""

    def text(self, spell=None):
        message = str(self.args[0]) if self.args else ""
        if spell is None:
            return message
        return _SETTING.sub(lambda match: spell(match.group(1)), message)


class UsageError(_Message):
    """Settings, data or a run folder that a training run cannot use.

    Raised before anything is written for it (a refused run folder is left as
    it was).
    """


class ConfigError(UsageError, ValueError):
    """A ``TrainConfig`` whose settings do not go together."""


class RunStopped(_Message):
    """A run that stopped before its end, with what it had saved kept.

    ``exit_status`` is what ``kt-train`` exits with; the message says what
    happened and what to do next.
    """

    exit_status = 1


class Diverged(RunStopped):
    """The loss or the weights stopped being finite; nothing non-finite was
    saved."""


class DiskFull(RunStopped):
    """No room left to write; partial files removed, earlier ones intact."""


class Preempted(RunStopped):
    """Stopped by a signal (SIGTERM, SIGINT) after writing a checkpoint;
    exit status ``128 + signal``, as a shell reports a process the signal
    ended."""

    def __init__(self, message, signal_number):
        super().__init__(message)
        self.exit_status = 128 + signal_number
