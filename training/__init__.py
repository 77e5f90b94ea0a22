"""Training and evaluation scripts (run as ``python -m training.<name>``)."""
