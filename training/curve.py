"""From a clone, ``python -m training.curve`` runs the
``kt-curve`` command: ``keras_transformer/commands/curve.py``,
which ``pip install`` installs as ``kt-curve``.
"""

from keras_transformer.commands.curve import command

if __name__ == "__main__":
    command()
