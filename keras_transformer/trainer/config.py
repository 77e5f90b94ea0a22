"""One value for every setting of a training run: ``TrainConfig``.

Each field carries its help text (``metadata["help"]``, settings named as
`field`) and its default: ``kt-train`` builds its options from these fields
(``--batch-tokens`` is ``batch_tokens``) and parses them into a
``TrainConfig``, which it hands to ``train``; below that point nothing sees
the command line. A setting left at ``None`` takes the task's default
(``tasks.py``), filled in by ``TrainConfig.checked()``, which also refuses
settings that cannot work; a run checks its config once. The numbers task's
own settings are a ``NumbersSettings`` (``tasks.py``) in ``numbers``.
"""

import dataclasses

from keras_transformer import backend
from keras_transformer.data import UNK_ID
from keras_transformer.model.config import CONFIGS, transformer_config
from keras_transformer.search.options import SearchOptions
from keras_transformer.trainer.errors import ConfigError
from keras_transformer.trainer.tasks import NumbersSettings, NumbersTask, task_class

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

# The final report's search (§6.1); its settings are checked by the search's
# own rules.
SEARCH_SETTINGS = ("beam_size", "length_penalty")


def _setting(default, help, **choices):
    """A field with its help text; ``choices`` may add ``choices`` (the
    values allowed), ``metavar`` (the value's name in help) and ``const``
    (the value of the option given without one)."""
    return dataclasses.field(default=default, metadata={"help": help, **choices})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run; ``None`` means the task's default.

    The fields are ``kt-train``'s options (``--batch-tokens`` is
    ``batch_tokens``), each with its help text in ``metadata["help"]``;
    ``docs/training.md`` describes them.
    """

    out: str = _setting(dataclasses.MISSING, "output folder (the run folder)")
    # What to learn: the built-in task, or a folder of parallel text.
    task: str | None = _setting(
        None, "built-in task (no download)", choices=(NumbersTask.name,)
    )
    data: str | None = _setting(
        None, "folder with train.SRC/TGT and val.SRC/TGT (plain or .gz)"
    )
    source: str | None = _setting(None, "source language suffix (with `data`)")
    target: str | None = _setting(None, "target language suffix (with `data`)")
    # The numbers task's own settings (its splits); None: its defaults. A
    # dataclass of its own, with help texts as here.
    numbers: NumbersSettings | None = None
    overwrite: bool = _setting(
        False, "replace a finished run (only what runs wrote in `out`)"
    )
    # The model: a named config (Table 3), with some fields replaced.
    config: str | None = _setting(
        None, f"named model config: {', '.join(sorted(CONFIGS))}"
    )
    num_layers: int | None = _setting(
        None, "layers of the encoder and of the decoder, N (replaces the config's)"
    )
    d_model: int | None = _setting(None, "model width (replaces the config's)")
    num_heads: int | None = _setting(None, "attention heads, h (replaces the config's)")
    d_ff: int | None = _setting(
        None, "inner width of the feed-forward layers (replaces the config's)"
    )
    max_length: int | None = _setting(
        None, "longest sequence in tokens (replaces the config's)"
    )
    dropout: float | None = _setting(
        None, "dropout rate, P_drop (§5.4; replaces the config's)"
    )
    # How long, and on what batches.
    epochs: int | None = _setting(None, "passes over the training split")
    max_minutes: float | None = _setting(None, "stop cleanly after this much training")
    batch_tokens: int | None = _setting(None, "tokens per input per batch (§5.1)")
    bucket_lengths: tuple[int, ...] | None = _setting(
        None, "padded lengths, e.g. 16,32 (default: steps of 4 to 32, then ×1.2)"
    )
    # The vocabulary (§5.1: one joint vocabulary).
    vocab_size: int | None = _setting(None, "pieces of the joint vocabulary (§5.1)")
    tokenizer: str | None = _setting(
        None, "the SentencePiece model", choices=("unigram", "bpe")
    )
    # The optimizer and the loss (§5.3, §5.4).
    warmup_steps: int | None = _setting(None, "updates of learning-rate warm-up (§5.3)")
    lr_scale: float | None = _setting(None, "times the paper's learning rate (§5.3)")
    label_smoothing: float = _setting(0.1, "ε_ls of label smoothing (§5.4)")
    mixed_precision: str | None = _setting(
        "auto",
        "dtype policy; auto: mixed_bfloat16 with TensorFlow on a CPU with BF16 "
        "instructions, else float32; the flag alone: mixed_bfloat16",
        choices=("auto", "float32", "mixed_bfloat16", "mixed_float16"),
        const="mixed_bfloat16",
    )
    # Checkpoints, and the mean of the last ones (§6.1).
    average_last: int | None = _setting(
        None,
        "average the last K checkpoints into the final model (§6.1)",
        metavar="K",
    )
    keep_checkpoints: int | None = _setting(
        None,
        "keep the last N checkpoints (default: K of `average_last`, at least "
        "2); 0 keeps them all (to score each)",
        metavar="N",
    )
    checkpoint_steps: int = _setting(
        200, "save a checkpoint every N steps, and at every epoch end", metavar="N"
    )
    init_from: str | None = _setting(
        None,
        "start from a pretrained translator instead of random weights: a "
        "Marian checkpoint folder, hf://owner/name, or a translator.keras; "
        "its tokenizer and architecture replace `vocab_size`, `tokenizer` "
        "and the model's settings",
        metavar="SOURCE",
    )
    # More data, larger batches, more devices.
    tokenizer_sample: int | None = _setting(
        None,
        "`data` larger than memory: train the tokenizer on N pairs drawn from "
        "the training split, tokenise it once into ids/ in `out` "
        "(memory-mapped) and train from there, never holding the text",
        metavar="N",
    )
    accumulate: int | None = _setting(
        None,
        "one update per N batches, with their mean gradient (e.g. "
        "`batch_tokens` 3072 `accumulate` 8: about the paper's 25,000 tokens)",
        metavar="N",
    )
    data_parallel: bool = _setting(
        False, "a copy of the model on each local device, the batch split over them"
    )
    model_parallel: int | None = _setting(
        None,
        "JAX: split the attention and feed-forward weights and the embedding "
        "over K devices (Megatron-style), the batch over the rest",
        metavar="K",
    )
    seed: int = _setting(
        0, "random seed: the weights, dropout, the batches' order, the numbers drawn"
    )
    max_lines: int | None = _setting(
        None, "with `data`: read the first N lines of each file", metavar="N"
    )
    # Output, and the final report's search (§6.1): the search's defaults,
    # the paper's.
    verbose: str = _setting(
        "auto",
        "Keras' progress: 1 a bar, 2 a line per epoch (and kt-train's lines "
        "within it); auto: 1 on a terminal, else 2. Given at all, it also "
        "shows TensorFlow's, CUDA's and absl's start-up logs",
        choices=("0", "1", "2", "auto"),
    )
    progress_seconds: float = _setting(
        30.0,
        "with `verbose` 2: a progress line within an epoch every N seconds",
        metavar="N",
    )
    beam_size: int = _setting(
        SearchOptions.beam_size,
        "hypotheses kept per sentence in the final report (1: greedy)",
    )
    length_penalty: float = _setting(
        SearchOptions.length_penalty,
        "α of the length penalty ((5 + |Y|) / 6) ** α in the final report",
    )

    def checked(self):
        """This config with the task's defaults filled in; ``ConfigError``
        (naming the settings) for settings that cannot work. ``train``
        checks a config unless ``checked()`` made it (``is_checked``)."""
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
        filled["numbers"] = task.checked_settings(self.numbers)
        config = dataclasses.replace(self, **filled)
        if config.bucket_lengths is not None:
            config = dataclasses.replace(
                config, bucket_lengths=tuple(config.bucket_lengths)
            )
        config._check_sizes(task)
        config._check_search()
        config = config._resolved_options()
        try:
            config.model_config()
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
        # Not a field: a copy with fields replaced (``dataclasses.replace``)
        # is not marked, and is checked again.
        object.__setattr__(config, "_checked", True)
        return config

    @property
    def is_checked(self):
        """Whether ``checked()`` returned this config."""
        return self.__dict__.get("_checked", False)

    def _check_sizes(self, task):
        for name in ("epochs", "batch_tokens", "vocab_size", "warmup_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be >= 1")
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
        if self.init_from is not None:
            given = [
                name
                for name in ("tokenizer_sample", *MODEL_OVERRIDES)
                if getattr(self, name) is not None
            ]
            if given:
                named = ", ".join(f"`{name}`" for name in given)
                raise ConfigError(
                    f"`init_from` with {named}: a pretrained model brings its "
                    "own architecture and tokenizer, and its corpus is read into "
                    "memory"
                )
        if self.model_parallel is not None and self.model_parallel < 1:
            raise ConfigError("`model_parallel` must be >= 1")
        if self.accumulate is not None and self.accumulate < 1:
            raise ConfigError("`accumulate` must be >= 1")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ConfigError("`max_minutes` must be > 0")
        if not self.lr_scale > 0:
            raise ConfigError("`lr_scale` must be > 0")
        if not self.progress_seconds >= 0:
            raise ConfigError("`progress_seconds` must be >= 0")

    def _check_search(self):
        """The final report's search settings, by the search's own rules,
        before training rather than after it."""
        try:
            SearchOptions(beam_size=self.beam_size, length_penalty=self.length_penalty)
        except (TypeError, ValueError) as error:
            message = str(error)
            for name in SEARCH_SETTINGS:  # named as settings are
                if message.startswith(name):
                    message = f"`{name}`{message[len(name) :]}"
            raise ConfigError(message) from None

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
        them (JSON values, in one flat dict)."""
        values = dataclasses.asdict(self)
        del values["numbers"]
        # run.json has always kept the numbers task's settings among the
        # others, for every task (a corpus run with their defaults): kept
        # so, the run folders written before still resume.
        values.update(dataclasses.asdict(self.numbers or NumbersSettings()))
        if values["bucket_lengths"] is not None:
            values["bucket_lengths"] = list(values["bucket_lengths"])
        if values["init_from"] is None:
            del values["init_from"]  # as the run folders before it have it
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
