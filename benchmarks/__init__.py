"""Measurement tools: speed, memory and quality, ours against our peers.

Not part of the installed package: run them from a clone's root, e.g.
``python -m benchmarks.step_speed``. Their figures are in
``docs/results.md``; their tests in ``benchmarks/tests`` run with the suite.

- ``training_speed``: a training step of ours, keras-hub's layers and
  ``torch.nn.Transformer``, each in its own process, and decoding;
- ``step_speed``: ours against keras-hub's layers in one process, in turns,
  and the step's floors (``matmul_floor``);
- ``decoding_speed``: greedy and beam search per backend;
- ``constrained_decoding``: terminology: constraints drawn from references
  (coverage, BLEU, time against plain beam search) and a glossary on the
  numbers task;
- ``data_speed``: a made-up corpus larger than memory, memory and batch rate;
- ``keras_hub_recipe``: the same model trained the way keras-hub's guides do;
- ``bleu_curve``: validation BLEU of a run's checkpoints against minutes;
- ``timing``: the timer they share.
"""

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def python_module(module, *args):
    """The command line that runs ``module`` (``benchmarks.x`` or a
    package module) in a fresh Python process."""
    return [sys.executable, "-m", module, *args]


def child_env(**changes):
    """This process's environment with ``changes``, and this clone on the
    child's path (``benchmarks`` is not installed)."""
    env = dict(os.environ, **changes)
    paths = [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
