"""Training as a library: ``train(TrainConfig(...))`` is what ``kt-train`` runs.

    from keras_transformer.trainer import TrainConfig, train
    results = train(TrainConfig(task="numbers", out="runs/numbers", max_minutes=3))

- ``config.py``: ``TrainConfig``, every setting of a run in one value;
- ``tasks.py``: what a run learns (the built-in task, a parallel corpus),
  each with its data, defaults and report, and ``NumbersSettings``, the
  built-in task's own settings (``TrainConfig.numbers``);
- ``run_folder.py``: ``RunFolder``, the output folder (new, resumed,
  finished; never clobbered; every write atomic);
- ``inputs.py``: the tokenizer and the batches by length;
- ``fitting.py``: the compiled model, resuming, ``model.fit``, averaging;
- ``run.py``: ``train``, those steps in order; ``report.py``: its report;
- ``parallel.py``: several devices or processes.

For a short script of one's own, ``training/`` in the repository shows the
same steps with the public API alone.
"""

from keras_transformer.trainer.config import TrainConfig
from keras_transformer.trainer.errors import (
    ConfigError,
    DiskFull,
    Diverged,
    Preempted,
    RunStopped,
    UsageError,
)
from keras_transformer.trainer.run import train
from keras_transformer.trainer.run_folder import RunFolder
from keras_transformer.trainer.tasks import (
    NumbersSettings,
    NumbersTask,
    ParallelCorpusTask,
)

__all__ = [
    "ConfigError",
    "DiskFull",
    "Diverged",
    "Preempted",
    "RunStopped",
    "NumbersSettings",
    "NumbersTask",
    "ParallelCorpusTask",
    "RunFolder",
    "TrainConfig",
    "UsageError",
    "train",
]
