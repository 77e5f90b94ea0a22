"""A run over several devices or processes: the set-up, who decides, who speaks.

With several processes (multi-process data parallel on JAX) every process
reads and trains; process 0 alone decides what all must agree on (the run
folder's verdict, the tokenizer, when to stop), writes and prints.
"""

import keras_transformer as kt
from keras_transformer.distribute import cluster
from keras_transformer.trainer.errors import UsageError


def log(message):
    """Print ``message`` on process 0: one process speaks for a run."""
    if cluster.is_chief():
        print(message, flush=True)


def agreed(decide):
    """``decide()`` on process 0, its value (JSON) or its ``UsageError`` on
    every process; just ``decide()`` on one process."""
    if cluster.process_count() == 1:
        return decide()
    outcome, error = None, None
    if cluster.is_chief():
        try:
            outcome = {"value": decide()}
        except UsageError as raised:
            outcome, error = {"error": str(raised)}, raised
    outcome = cluster.broadcast(outcome)
    if error is not None:
        raise error
    if "error" in outcome:
        raise UsageError(f"(process 0) {outcome['error']}")
    return outcome["value"]


def set_up(config):
    """``(setup, replicas, process_shard)`` for ``data_parallel`` or
    ``model_parallel``: a ``DataParallelSetup`` (close it when done), the
    number of replicas a batch splits over, and this process's share of the
    data; ``(None, 1, (0, 1))`` for one device."""
    if not config.data_parallel and not config.model_parallel:
        return None, 1, (0, 1)
    kind = "model" if config.model_parallel else "data"
    try:
        if config.model_parallel:
            setup = kt.model_parallel(config.model_parallel)
        else:
            setup = kt.data_parallel()
    except (ValueError, NotImplementedError) as error:
        raise UsageError(f"`{kind}_parallel`: {error}") from None
    log(f"{kind} parallel: {setup.description}")
    return setup, setup.num_replicas, (setup.process_index, setup.num_processes)
