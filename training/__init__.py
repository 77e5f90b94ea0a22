"""``python -m training.<name>`` from a clone: the package's commands
(``keras_transformer/commands/``, installed as ``kt-<name>``)."""
