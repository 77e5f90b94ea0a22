"""From a clone, ``python -m training.evaluate`` runs the
``kt-evaluate`` command: ``keras_transformer/commands/evaluate.py``,
which ``pip install`` installs as ``kt-evaluate``.
"""

from keras_transformer.commands.evaluate import command

if __name__ == "__main__":
    command()
