"""From a clone, ``python -m training.benchmark_decoding`` runs the
``kt-benchmark-decoding`` command: ``keras_transformer/commands/benchmark_decoding.py``,
which ``pip install`` installs as ``kt-benchmark-decoding``.
"""

from keras_transformer.commands.benchmark_decoding import command

if __name__ == "__main__":
    command()
