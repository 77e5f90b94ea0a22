"""From a clone, ``python -m training.benchmark`` runs the
``kt-benchmark`` command: ``keras_transformer/commands/benchmark.py``,
which ``pip install`` installs as ``kt-benchmark``.
"""

from keras_transformer.commands.benchmark import command

if __name__ == "__main__":
    command()
