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
  ``event_log.py``: TensorBoard's event files, written without TensorFlow;
- ``run.py``: ``train``, those steps in order; ``report.py``: its report;
- ``parallel.py``: several devices or processes.

For a short script of one's own, ``training/`` in the repository shows the
same steps with the public API alone.
"""

from keras_transformer import _lazy

# Names imported when first used: the commands import the allocator (and a
# program may import the checkpoints) before Keras starts.
_PUBLIC = {
    "TrainConfig": "keras_transformer.trainer.config",
    "ConfigError": "keras_transformer.trainer.errors",
    "DiskFull": "keras_transformer.trainer.errors",
    "Diverged": "keras_transformer.trainer.errors",
    "Preempted": "keras_transformer.trainer.errors",
    "RunStopped": "keras_transformer.trainer.errors",
    "UsageError": "keras_transformer.trainer.errors",
    "train": "keras_transformer.trainer.run",
    "RunFolder": "keras_transformer.trainer.run_folder",
    "NumbersSettings": "keras_transformer.trainer.tasks",
    "NumbersTask": "keras_transformer.trainer.tasks",
    "ParallelCorpusTask": "keras_transformer.trainer.tasks",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
