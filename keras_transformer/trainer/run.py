"""``train(config)``: a training run from its settings to ``translator.keras``.

The steps, each a layer down: the task's data; the devices; the run folder's
verdict (new, resumed, or only the report left to write); the tokenizer and
the batches; the model, resumed from its last checkpoint; ``model.fit``; the
mean of the last checkpoints; the translator, saved; its report. Everything
that can fail on bad input or settings comes before the first write, so that
the corrected command starts from a clean folder. A run interrupted at any
point (``kill -9`` included) continues where it was when run again.

What a real run meets ends in an error that says what was kept
(``errors.py``): another run on the same folder (the folder's lock), a loss
or weights that stop being finite (the last finite checkpoints make the
translator, if any), a full disk (partial files removed), a scheduler's
SIGTERM (a checkpoint at the end of the batch).
"""

import contextlib
import os
import signal

import keras

import keras_transformer as kt
from keras_transformer.atomic import DiskFullError
from keras_transformer.distribute import cluster
from keras_transformer.trainer import checkpoints, fitting, inputs
from keras_transformer.trainer.errors import (
    DiskFull,
    Diverged,
    Preempted,
    UsageError,
)
from keras_transformer.trainer.parallel import agreed, log, set_up
from keras_transformer.trainer.report import report
from keras_transformer.trainer.run_folder import RESULTS_FILE, RunFolder
from keras_transformer.trainer.tasks import make_task, task_languages
from keras_transformer.translate.keras_translator import Translator, inference_copy


def train(config):
    """Train, save and report as ``config`` (a ``TrainConfig``) says.

    ``config`` is checked here unless ``config.checked()`` made it.

    Returns:
        The report's results (also in ``results.json``); None on a process
        other than 0 of a multi-process run.

    Raises:
        UsageError: settings, data or a run folder that cannot be used (or
            that another run holds), before anything is written for them.
        RunStopped: the run stopped early, what it saved kept: ``Diverged``,
            ``DiskFull``, ``Preempted``.
    """
    if not config.is_checked:  # kt-train checks it while parsing, for usage
        config = config.checked()
    task = make_task(config)
    data = task.load()
    setup, replicas, shard = set_up(config)
    folder = RunFolder(config.out)
    try:
        try:
            trained = _train(config, task, data, folder, setup, replicas, shard)
        finally:
            if setup is not None:  # put back the global distribution
                setup.close()
        if trained is None:
            return None  # the rest is process 0's alone
        return report(config, task, data, folder, trained)
    except DiskFullError as error:
        raise DiskFull(_disk_full(error, folder)) from None
    finally:
        folder.release()


def _train(config, task, data, folder, setup, replicas, shard):
    """The seconds trained (process 0), after saving the translator."""
    chief = cluster.is_chief()

    def verdict():  # process 0 holds the folder for the whole run
        folder.acquire()
        return folder.check(config.settings(), config.overwrite)

    previous = agreed(verdict)
    if previous is not None and previous["status"] != "running":
        log(
            f"{folder.path} holds a trained model without its report "
            f"({RESULTS_FILE}): writing the report, no training"
        )
        folder.run = previous
        return previous.get("trained_seconds", 0.0) if chief else None
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(config.mixed_precision or "float32")
    start_from, tokenizer, proto, model_config = _starting_point(
        config, task, folder, data, resuming=previous is not None
    )
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
            config,
            model_config,
            tokenizer.vocabulary_size(),
            start_from and start_from.transformer,
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
    state = fitting.resume_state(model, folder) if previous is not None else None
    outcome = fitting.fit(config, folder, model, dataset, val_dataset, state)
    if outcome.signal:
        raise _preempted(outcome, folder)
    if not chief:
        if outcome.diverged:
            raise Diverged(f"training diverged ({outcome.diverged['reason']})")
        return None
    if cluster.process_count() > 1:
        setup.close()  # what follows runs on this process's devices
        model = fitting.single_process_copy(config, model_config, model)
    if outcome.diverged:
        raise _diverged(config, outcome, model, tokenizer, folder, start_from)
    if config.average_last > 1:
        fitting.average(config, model, folder)
    if not checkpoints.weights_are_finite(model):
        folder.mark_stopped("diverged", "the final weights are not finite")
        raise Diverged(
            f"the final weights are not finite: no {folder.translator} written"
        )
    translator = _translator(config, tokenizer, model, start_from)
    folder.save_translator(translator, outcome.seconds)
    log(f"saved {folder.translator}")
    return outcome.seconds


def _starting_point(config, task, folder, data, resuming):
    """``(start_from, tokenizer, proto, model_config)``: a pretrained
    translator (``init_from``, read again when resuming) with its tokenizer
    and architecture, or none, the run's own tokenizer (``proto``: a new
    one's, to be written) and the config's architecture."""
    if config.init_from is None:
        tokenizer, proto = inputs.tokenizer(
            config, task, folder, data["train"], resuming
        )
        return None, tokenizer, proto, config.model_config()
    start_from = inputs.pretrained(config)
    return start_from, start_from.tokenizer, None, start_from.transformer.config


def _preempted(outcome, folder):
    name = signal.Signals(outcome.signal).name
    where = outcome.checkpoint or "no checkpoint (this process does not write)"
    if cluster.is_chief():
        folder.note_stop(f"{name}: checkpoint {where}")
    return Preempted(
        f"stopped by {name}; the checkpoint {where} holds the training so far: "
        "run the same command again to resume from it",
        outcome.signal,
    )


def _translator(config, tokenizer, model, start_from):
    """The trained translator, with the language codes of its task; one
    fine-tuned from a pretrained one searches as that one did (an imported
    model: as its generation config says)."""
    languages = task_languages(config)
    if start_from is None:
        return Translator(tokenizer, inference_copy(model), languages=languages)
    return Translator(
        tokenizer,
        inference_copy(model),
        max_output_length=start_from.max_output_length,
        search=start_from.default_search,
        languages=languages or start_from.languages,
    )


def _diverged(config, outcome, model, tokenizer, folder, start_from):
    """Save the mean of the last finite checkpoints (all are: none is written
    once the run diverges), or nothing; record why; the error to raise."""
    where = outcome.diverged
    what = (
        f"training diverged at step {where['iterations']} (epoch "
        f"{where['epoch'] + 1}, batch {where['batch']}): {where['reason']}"
    )
    log(what)
    up_to = where["iterations"]
    kept = checkpoints.list_checkpoints(folder.checkpoints, up_to=up_to)
    try:
        used = fitting.average(config, model, folder) if kept else []
    except UsageError:  # none of them loads
        used = []
    if used and checkpoints.weights_are_finite(model):
        translator = _translator(config, tokenizer, model, start_from)
        folder.save_translator(translator, outcome.seconds)
        last = os.path.basename(used[-1])
        if len(used) == 1:
            saved = f"{folder.translator} holds the last finite checkpoint, {last}"
        else:
            saved = (
                f"{folder.translator} holds the mean of the last {len(used)} "
                f"finite checkpoints, to {last}"
            )
    else:
        saved = f"no finite checkpoint: no {folder.translator} written"
    folder.mark_stopped("diverged", what)
    return Diverged(f"{what}; {saved}. Lower `lr_scale` or raise `warmup_steps`")


def _disk_full(error, folder):
    """The message for a full disk: what, where, the room left, and the last
    checkpoint that is intact."""
    intact = checkpoints.list_checkpoints(folder.checkpoints)
    kept = f"the checkpoint {intact[-1]} is intact" if intact else "no checkpoint yet"
    return f"{error}; {kept}. Free some space and run the same command again to resume"


def _log_weights_per_device(model):
    held = kt.distribute.weight_bytes_per_device(model).values()
    total = kt.distribute.weight_bytes(model)
    log(
        f"weights per device: {max(held) / 2**20:,.1f} MiB of "
        f"{total / 2**20:,.1f} MiB ({max(held) / total:.0%})"
    )
