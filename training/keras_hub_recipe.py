"""From a clone, ``python -m training.keras_hub_recipe`` runs the
``kt-keras-hub-recipe`` command: ``keras_transformer/commands/keras_hub_recipe.py``,
which ``pip install`` installs as ``kt-keras-hub-recipe``.
"""

from keras_transformer.commands.keras_hub_recipe import command

if __name__ == "__main__":
    command()
