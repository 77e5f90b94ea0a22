"""The one error a training run stops with when its input is unusable."""

import re

_SETTING = re.compile(r"`([a-z][a-z0-9_]*)`")


class UsageError(Exception):
    """Settings, data or a run folder that a training run cannot use.

    Raised before anything is written for it (a refused run folder is left as
    it was). The message names settings as `field` (``TrainConfig``'s field
    names); ``text(spell)`` spells them another way: ``kt-train`` shows its
    options (`batch_tokens` becomes ``--batch-tokens``).
    """

    def text(self, spell=None):
        message = str(self.args[0]) if self.args else ""
        if spell is None:
            return message
        return _SETTING.sub(lambda match: spell(match.group(1)), message)


class ConfigError(UsageError, ValueError):
    """A ``TrainConfig`` whose settings do not go together."""
