"""From a clone, ``python -m training.launch`` runs the
``kt-launch`` command: ``keras_transformer/commands/launch.py``,
which ``pip install`` installs as ``kt-launch``.
"""

from keras_transformer.commands.launch import command

if __name__ == "__main__":
    command()
