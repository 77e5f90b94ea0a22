"""What a run learns: each task owns its data, its defaults and its report.

- ``NumbersTask`` (``task="numbers"``): the built-in English → German number
  words, generated (``keras_transformer.data.numbers``) as its
  ``NumbersSettings`` say; reported as exact match on the test split, on
  numbers drawn uniformly and on edge numbers.
- ``ParallelCorpusTask`` (``data=folder``): ``train.SRC/TGT`` and
  ``val.SRC/TGT`` files, plain or gzip, one sentence per line; reported as
  validation BLEU and chrF (sacreBLEU).
"""

import dataclasses
import numbers
import time

import numpy as np

from keras_transformer import data as ktd
from keras_transformer.data.languages import check_languages
from keras_transformer.search.options import SearchOptions
from keras_transformer.trainer.errors import ConfigError, UsageError
from keras_transformer.trainer.parallel import log
from keras_transformer.translate.evaluation import score


def _setting(default, help):
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class NumbersSettings:
    """The numbers task's own settings: its splits (``data.make_splits``).

    ``TrainConfig.numbers``; ``kt-train`` builds its options from these
    fields as from ``TrainConfig``'s (``--train-size`` is ``train_size``).
    """

    train_size: int = _setting(50_000, "training pairs")
    val_size: int = _setting(1000, "validation pairs")
    test_size: int = _setting(1000, "test pairs, scored by the report")
    uniform_size: int = _setting(
        2000, "numbers drawn uniformly for the report (not trained on)"
    )
    short_repeats: int = _setting(
        ktd.SHORT_REPEATS, "extra rounds of 0-101 in the training split"
    )

    def check(self):
        """``ConfigError`` naming a size that cannot work."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ConfigError(f"`{field.name}` must be an int")
        for name in ("train_size", "val_size", "test_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be >= 1")
        for name in ("uniform_size", "short_repeats"):
            if getattr(self, name) < 0:
                raise ConfigError(f"`{name}` must be >= 0")


class NumbersTask:
    """The built-in task: English number words to German, 0-999,999."""

    name = "numbers"
    DEFAULTS = {
        "config": "tiny",
        "vocab_size": 200,
        "tokenizer": "unigram",
        "batch_tokens": 2048,
        "warmup_steps": 400,
        # Half the paper's rate (§5.3): short runs at the paper's rate make
        # more errors on uniformly drawn numbers (docs/results.md).
        "lr_scale": 0.5,
        "epochs": 20,
        "average_last": 1,
    }
    # Rare whole words the tokenizer would otherwise spell piece by piece.
    tokenizer_symbols = ktd.WHOLE_WORDS
    EXAMPLES = (
        "three hundred forty-two",
        "twenty-one thousand five",
        "one hundred one",
        "nine hundred ninety-nine thousand nine hundred ninety-nine",
    )

    def __init__(self, config):
        self.config = config

    @staticmethod
    def checked_settings(settings):
        """The task's own settings, ``TrainConfig.numbers``: ``settings``
        checked, or the defaults for None."""
        if settings is None:
            return NumbersSettings()
        if not isinstance(settings, NumbersSettings):
            raise ConfigError(
                f"`numbers` must be a NumbersSettings. Received: {settings!r}"
            )
        settings.check()
        return settings

    def load(self):
        """``{"train", "validation", "test", "uniform"}``: (sources, targets)."""
        n = self.config.numbers
        return ktd.make_splits(
            self.config.seed, n.train_size, n.val_size, n.test_size,
            n.uniform_size, n.short_repeats,
        )  # fmt: skip

    def report(self, translator, data, search):
        """``(results, examples)``: exact match on the test split with the
        configured search and greedy, then ``uniform_and_edge_numbers``."""
        sources, _ = data["test"]
        results = {}
        runs = [("", search)]
        if search.beam_size > 1:
            runs.append(("_greedy", SearchOptions.of(search, beam_size=1)))
        for name, options in runs:
            start = time.monotonic()
            results[f"exact_match{name}"] = exact_match(
                translator, data["test"], options
            )
            results[f"decode_seconds{name}"] = round(time.monotonic() - start, 1)
            log(
                f"exact match on the test split ({len(sources)} numbers), "
                f"beam size {options.beam_size}: "
                f"{results[f'exact_match{name}']:.1%}"
            )
        results.update(split="test", sentences=len(sources))
        results.update(uniform_and_edge_numbers(translator, data["uniform"], search))
        return results, list(self.EXAMPLES)


class ParallelCorpusTask:
    """A parallel corpus in a folder: ``{train,val}.{source,target}[.gz]``."""

    name = "data"
    DEFAULTS = {
        "config": "small",
        "vocab_size": 8000,
        "tokenizer": "bpe",
        "batch_tokens": 3072,
        "warmup_steps": 1000,
        "lr_scale": 1.0,
        "epochs": 20,
        # §6.1; it gains BLEU on Multi30k too (docs/results.md).
        "average_last": 5,
    }
    tokenizer_symbols = ()

    def __init__(self, config):
        self.config = config

    @staticmethod
    def checked_settings(settings):
        """None: a corpus has no settings of its own beyond ``TrainConfig``'s;
        ``ConfigError`` names the numbers task's settings given."""
        if settings is None:
            return None
        defaults = NumbersSettings()
        changed = [
            field.name
            for field in dataclasses.fields(NumbersSettings)
            if getattr(settings, field.name, None) != getattr(defaults, field.name)
        ]
        named = ", ".join(f"`{name}`" for name in changed) or "`numbers`"
        raise ConfigError(f"{named}: for `task` numbers, not `data` corpora")

    def load(self):
        """``{"train", "validation"}``: (sources, targets), read and checked;
        with ``tokenizer_sample`` the training split stays on disk
        (``CorpusFiles``). ``UsageError`` names a bad file and line."""
        c = self.config
        try:
            splits = {}
            for split, name in (("train", "train"), ("val", "validation")):
                if name == "train" and c.tokenizer_sample:
                    splits[name] = ktd.CorpusFiles(
                        ktd.split_path(c.data, split, c.source),
                        ktd.split_path(c.data, split, c.target),
                        c.max_lines,
                    )
                    continue
                splits[name] = ktd.read_split(
                    c.data, split, c.source, c.target, c.max_lines
                )
        except ktd.CorpusError as error:
            raise UsageError(str(error)) from None
        return splits

    def report(self, translator, data, search):
        """``(results, examples)``: BLEU and chrF on the validation split."""
        sources, references = data["validation"]
        start = time.monotonic()
        hypotheses = translator.translate(sources, search, batch_size=128, verbose=1)
        results = {
            "split": "validation",
            "sentences": len(sources),
            "decode_seconds": round(time.monotonic() - start, 1),
        }
        try:
            scores = score(hypotheses, references)
        except ImportError:
            log("sacrebleu is not installed: no BLEU")
        else:
            results.update(scores)
            log(
                f"validation BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} "
                f"({scores['bleu_signature']})"
            )
        return results, sources[:4]


TASKS = {task.name: task for task in (NumbersTask, ParallelCorpusTask)}


def task_class(config):
    """The task class a config names: ``task="numbers"`` or ``data=folder``."""
    if config.task is not None and config.data is not None:
        raise ConfigError("give one of `task` and `data`, not both")
    if config.task is not None:
        if config.task not in ("numbers",):
            raise ConfigError(f"`task` must be 'numbers'. Received: {config.task!r}")
        return NumbersTask
    if config.data is None:
        raise ConfigError("give `task` (the built-in task) or `data` (a folder)")
    return ParallelCorpusTask


def make_task(config):
    return task_class(config)(config)


def exact_match(translator, pairs, search):
    """Share of ``pairs``' sources that ``translator`` translates exactly
    with ``search`` (a ``SearchOptions``)."""
    sources, references = pairs
    hypotheses = translator.translate(sources, search, batch_size=256, verbose=1)
    return float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)]))


def uniform_and_edge_numbers(translator, uniform, search):
    """Exact match on numbers drawn uniformly (nine in ten have six digits,
    where the test split has a third), and the edge numbers one by one."""
    results = {}
    if uniform[0]:
        results.update(
            exact_match_uniform=exact_match(translator, uniform, search),
            uniform_sentences=len(uniform[0]),
        )
        log(
            f"exact match on {len(uniform[0])} numbers drawn uniformly from "
            f"0-{ktd.LIMIT - 1:,}, beam size {search.beam_size}: "
            f"{results['exact_match_uniform']:.1%}"
        )
    edges = list(ktd.EDGE_NUMBERS)
    outputs = translator.translate([ktd.english(n) for n in edges], search)
    wrong = {
        n: out for n, out in zip(edges, outputs, strict=True) if out != ktd.german(n)
    }
    # A count, so that results.json stays flat; the log names the wrong ones.
    results.update(edge_numbers=len(edges), edge_numbers_right=len(edges) - len(wrong))
    names = ", ".join(f"{n:,}" for n in edges)
    if wrong:
        shown = "; ".join(f"{n:,} -> {out!r}" for n, out in wrong.items())
        log(f"edge numbers ({names}): {len(wrong)} wrong: {shown}")
    else:
        log(f"edge numbers ({names}): all right")
    return results


def task_languages(config):
    """The ``(source, target)`` codes a translator trained on ``config``'s
    task records: the numbers task's English to German; a corpus's
    ``source`` and ``target`` file suffixes where they are language codes
    (``de``, ``en``), else None."""
    if task_class(config) is NumbersTask:
        return ("en", "de")
    try:
        return check_languages((config.source, config.target))
    except ValueError:
        return None
