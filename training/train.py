"""From a clone, ``python -m training.train`` runs the
``kt-train`` command: ``keras_transformer/commands/train.py``,
which ``pip install`` installs as ``kt-train``.
"""

from keras_transformer.commands.train import command

if __name__ == "__main__":
    command()
