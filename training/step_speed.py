"""From a clone, ``python -m training.step_speed`` runs the
``kt-step-speed`` command: ``keras_transformer/commands/step_speed.py``,
which ``pip install`` installs as ``kt-step-speed``.
"""

from keras_transformer.commands.step_speed import command

if __name__ == "__main__":
    command()
