"""From a clone, ``python -m training.attention`` runs the
``kt-attention`` command: ``keras_transformer/commands/attention.py``,
which ``pip install`` installs as ``kt-attention``.
"""

from keras_transformer.commands.attention import command

if __name__ == "__main__":
    command()
