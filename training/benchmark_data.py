"""From a clone, ``python -m training.benchmark_data`` runs the
``kt-benchmark-data`` command: ``keras_transformer/commands/benchmark_data.py``,
which ``pip install`` installs as ``kt-benchmark-data``.
"""

from keras_transformer.commands.benchmark_data import command

if __name__ == "__main__":
    command()
