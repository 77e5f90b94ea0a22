"""One value for every setting of a training run: ``TrainConfig``.

``kt-train`` parses its options into a ``TrainConfig`` (the same names) and
hands it to ``train``; below that point nothing sees the command line. A
setting left at ``None`` takes the task's default (``tasks.py``), filled in
by ``TrainConfig.checked()``, which also refuses settings that cannot work.
"""

import dataclasses

from keras_transformer import backend
from keras_transformer.model.config import transformer_config
from keras_transformer.data import SHORT_REPEATS, UNK_ID
from keras_transformer.trainer.errors import ConfigError
from keras_transformer.trainer.tasks import task_class

# Settings that may change when a run is resumed: they do not change what a
# step computes (the search settings only affect the final report).
RESUMABLE = frozenset(
    {
        "out",
        "overwrite",
        "epochs",
        "max_minutes",
        "verbose",
        "progress_seconds",
        "beam_size",
        "length_penalty",
        "keep_checkpoints",
    }
)

# The architecture's settings that override the named config.
MODEL_OVERRIDES = (
    "num_layers",
    "d_model",
    "num_heads",
    "d_ff",
    "max_length",
    "dropout",
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run; ``None`` means the task's default.

    The fields are ``kt-train``'s options (``--batch-tokens`` is
    ``batch_tokens``); ``docs/training.md`` describes each.
    """

    out: str
    # What to learn: the built-in task, or a folder of parallel text.
    task: str | None = None  # "numbers"
    data: str | None = None
    source: str | None = None
    target: str | None = None
    overwrite: bool = False
    # The model: a named config, with some fields replaced.
    config: str | None = None
    num_layers: int | None = None
    d_model: int | None = None
    num_heads: int | None = None
    d_ff: int | None = None
    max_length: int | None = None
    dropout: float | None = None
    # How long, and on what batches.
    epochs: int | None = None
    max_minutes: float | None = None
    batch_tokens: int | None = None
    bucket_lengths: tuple[int, ...] | None = None
    # The vocabulary (§5.1: one joint vocabulary).
    vocab_size: int | None = None
    tokenizer: str | None = None  # "unigram" or "bpe"
    # The optimizer and the loss (§5.3, §5.4).
    warmup_steps: int | None = None
    lr_scale: float | None = None
    label_smoothing: float = 0.1
    mixed_precision: str | None = "auto"
    # Checkpoints, and the mean of the last ones (§6.1).
    average_last: int | None = None
    keep_checkpoints: int | None = None
    checkpoint_steps: int = 200
    # More data, larger batches, more devices.
    tokenizer_sample: int | None = None
    accumulate: int | None = None
    data_parallel: bool = False
    model_parallel: int | None = None
    seed: int = 0
    # The numbers task's splits.
    train_size: int = 50_000
    val_size: int = 1000
    test_size: int = 1000
    uniform_size: int = 2000
    short_repeats: int = SHORT_REPEATS
    max_lines: int | None = None  # a corpus: its first lines only
    # Output, and the final report's search (§6.1).
    verbose: str = "auto"  # "0", "1", "2" or "auto"
    progress_seconds: float = 30.0
    beam_size: int = 4
    length_penalty: float = 0.6

    def checked(self):
        """This config with the task's defaults filled in; ``ConfigError``
        (naming the settings) for settings that cannot work."""
        task = task_class(self)
        if task.name == "data" and not (self.source and self.target):
            raise ConfigError(
                "`data` needs `source` and `target`, e.g. `source` de `target` en"
            )
        filled = {
            name: value
            for name, value in task.DEFAULTS.items()
            if getattr(self, name) is None
        }
        config = dataclasses.replace(self, **filled)
        if config.bucket_lengths is not None:
            config = dataclasses.replace(
                config, bucket_lengths=tuple(config.bucket_lengths)
            )
        config._check_sizes(task)
        config = config._resolved_options()
        try:
            config.model_config()
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
        return config

    def _check_sizes(self, task):
        for name in (
            "epochs",
            "batch_tokens",
            "vocab_size",
            "warmup_steps",
            "train_size",
            "val_size",
            "test_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be >= 1")
        for name in ("uniform_size", "short_repeats"):
            if getattr(self, name) < 0:
                raise ConfigError(f"`{name}` must be >= 0")
        if self.vocab_size <= UNK_ID + 1:
            raise ConfigError(
                f"`vocab_size` must be > {UNK_ID + 1}, the reserved ids "
                "(<pad>, <s>, </s>, <unk>)"
            )
        if self.bucket_lengths and self.batch_tokens < self.bucket_lengths[-1]:
            longest = self.bucket_lengths[-1]
            raise ConfigError(batch_tokens_error(self.batch_tokens, longest))
        if self.average_last < 1:
            raise ConfigError("`average_last` must be >= 1")
        fewest, keep = max(self.average_last, 2), self.keep_checkpoints
        if keep is not None and (keep < 0 or 0 < keep < fewest):
            raise ConfigError(f"`keep_checkpoints` must be 0 (all) or >= {fewest}")
        if self.checkpoint_steps < 1:
            raise ConfigError("`checkpoint_steps` must be >= 1")
        if self.tokenizer_sample is not None:
            if task.name != "data":
                raise ConfigError("`tokenizer_sample` is for `data` corpora")
            if self.tokenizer_sample < 1:
                raise ConfigError("`tokenizer_sample` must be >= 1")
        if self.model_parallel is not None and self.model_parallel < 1:
            raise ConfigError("`model_parallel` must be >= 1")
        if self.accumulate is not None and self.accumulate < 1:
            raise ConfigError("`accumulate` must be >= 1")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ConfigError("`max_minutes` must be > 0")
        if not self.lr_scale > 0:
            raise ConfigError("`lr_scale` must be > 0")

    def _resolved_options(self):
        """The precision chosen for this machine and no-op values as None,
        as run folders have always recorded them."""
        precision = self.mixed_precision
        if precision == "auto":
            precision = backend.fastest_policy()
        if precision == "float32":
            precision = None
        accumulate = None if self.accumulate == 1 else self.accumulate
        return dataclasses.replace(
            self, mixed_precision=precision, accumulate=accumulate
        )

    @property
    def task_name(self):
        """``"numbers"`` for the built-in task, ``"data"`` for a corpus."""
        return task_class(self).name

    def model_config(self):
        """The ``TransformerConfig``: the named config with the overrides."""
        overrides = {
            name: getattr(self, name)
            for name in MODEL_OVERRIDES
            if getattr(self, name) is not None
        }
        return transformer_config(self.config, **overrides)

    def checkpoints_kept(self):
        """How many checkpoints to keep (``None``: all): ``keep_checkpoints``,
        or those averaged, and at least one spare for resuming."""
        if self.keep_checkpoints == 0:
            return None
        return self.keep_checkpoints or max(self.average_last, 2)

    def settings(self):
        """What a resumed run must share with the run it resumes: the
        settings that change what a step computes, as ``run.json`` keeps
        them (JSON values)."""
        values = dataclasses.asdict(self)
        if values["bucket_lengths"] is not None:
            values["bucket_lengths"] = list(values["bucket_lengths"])
        return {
            key: value for key, value in sorted(values.items()) if key not in RESUMABLE
        }


def batch_tokens_error(batch_tokens, longest, replicas=1, given=True):
    """The message for a token budget too small for one row of the longest
    bucket (on each replica)."""
    need = longest * replicas
    rows = f" × {replicas} replicas" if replicas > 1 else ""
    lower = "the last `bucket_lengths`" if given else "`max_length`"
    return (
        f"`batch_tokens` {batch_tokens} leaves no room for one row of the longest "
        f"bucket ({longest} tokens{rows}); raise it to at least {need}, or lower "
        f"{lower}"
    )
