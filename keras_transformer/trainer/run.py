"""``train(config)``: a training run from its settings to ``translator.keras``.

The steps, each a layer down: the task's data; the devices; the run folder's
verdict (new, resumed, or only the report left to write); the tokenizer and
the batches; the model, resumed from its last checkpoint; ``model.fit``; the
mean of the last checkpoints; the translator, saved; its report. Everything
that can fail on bad input or settings comes before the first write, so that
the corrected command starts from a clean folder. A run interrupted at any
point (``kill -9`` included) continues where it was when run again.
"""

import contextlib

import keras

import keras_transformer as kt
from keras_transformer import cluster
from keras_transformer.trainer import fitting, inputs
from keras_transformer.trainer.parallel import agreed, log, set_up
from keras_transformer.trainer.report import report
from keras_transformer.trainer.run_folder import RESULTS_FILE, RunFolder
from keras_transformer.trainer.tasks import make_task
from keras_transformer.translator import Translator, inference_copy


def train(config):
    """Train, save and report as ``config`` (a ``TrainConfig``) says.

    Returns:
        The report's results (also in ``results.json``); None on a process
        other than 0 of a multi-process run.

    Raises:
        UsageError: settings, data or a run folder that cannot be used,
            before anything is written for them.
    """
    config = config.checked()
    task = make_task(config)
    data = task.load()
    setup, replicas, shard = set_up(config)
    try:
        folder = RunFolder(config.out)
        trained = _train(config, task, data, folder, setup, replicas, shard)
    finally:
        if setup is not None:  # put back the global distribution
            setup.close()
    if trained is None:
        return None  # the rest is process 0's alone
    return report(config, task, data, folder, trained)


def _train(config, task, data, folder, setup, replicas, shard):
    """The seconds trained (process 0), after saving the translator."""
    chief = cluster.is_chief()
    previous = agreed(lambda: folder.check(config.settings(), config.overwrite))
    if previous is not None and previous["status"] != "running":
        log(
            f"{folder.path} holds a trained model without its report "
            f"({RESULTS_FILE}): writing the report, no training"
        )
        folder.run = previous
        return previous.get("trained_seconds", 0.0) if chief else None
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(config.mixed_precision or "float32")
    resuming = previous is not None
    tokenizer, proto = inputs.tokenizer(config, task, folder, data["train"], resuming)
    model_config = config.model_config()
    streamed = isinstance(data["train"], kt.data.CorpusFiles)

    def start():  # the first writes: run.json, then a new tokenizer
        folder.start(
            config.settings(), keras.backend.backend(), previous, config.overwrite
        )
        if proto is not None:
            folder.write_tokenizer(proto)

    if chief and streamed:  # the id store is written into the folder
        start()
    dataset, val_dataset, boundaries = inputs.datasets(
        config, tokenizer, data, model_config, replicas, shard, folder
    )
    if chief and not streamed:
        start()

    with setup.scope() if setup is not None else contextlib.nullcontext():
        model = fitting.compiled_model(
            config, model_config, tokenizer.vocabulary_size()
        )
    per_update = f", one update per {config.accumulate}" if config.accumulate else ""
    log(
        f"{fitting.describe(config, model_config, model)}; "
        f"{len(dataset)} batches of <= {config.batch_tokens} tokens per epoch"
        f"{per_update}, buckets {boundaries}"
    )
    if config.model_parallel:
        _log_weights_per_device(model)
    # Every process loads the checkpoint (from the folder they share): a
    # variable's value is set on all processes' devices at once.
    state = fitting.resume_state(model, folder) if resuming else None
    trained = fitting.fit(config, folder, model, dataset, val_dataset, state)
    if not chief:
        return None
    if cluster.process_count() > 1:
        setup.close()  # what follows runs on this process's devices
        model = fitting.single_process_copy(config, model_config, model)
    if config.average_last > 1:
        fitting.average(config, model, folder)
    translator = Translator(tokenizer, inference_copy(model))
    folder.save_translator(translator, trained)
    log(f"saved {folder.translator}")
    return trained


def _log_weights_per_device(model):
    held = kt.distribute.weight_bytes_per_device(model).values()
    total = kt.distribute.weight_bytes(model)
    log(
        f"weights per device: {max(held) / 2**20:,.1f} MiB of "
        f"{total / 2**20:,.1f} MiB ({max(held) / total:.0%})"
    )
