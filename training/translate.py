"""From a clone, ``python -m training.translate`` runs the
``kt-translate`` command: ``keras_transformer/commands/translate.py``,
which ``pip install`` installs as ``kt-translate``.
"""

from keras_transformer.commands.translate import command

if __name__ == "__main__":
    command()
