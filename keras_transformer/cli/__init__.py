"""The commands ``pip install`` puts on the PATH.

- ``kt-train``: train a translator (the built-in number task or a parallel
  corpus) and save ``translator.keras`` (``keras_transformer.trainer``);
- ``kt-evaluate``: BLEU and chrF of a saved translator on a test set;
- ``kt-translate``: translate sentences (arguments or standard input);
- ``kt-attention``: draw a translator's attention maps;
- ``kt-launch``: ``kt-train --data-parallel`` as several JAX processes.

Each module's ``main(argv)`` parses its arguments, makes the process-wide
settings (``_process.prepare_process``: quiet framework logs, freed memory
kept), calls the library and returns what it did; ``command()`` is the
installed entry point. From a clone, ``python -m keras_transformer.cli.<name>``
runs the same command. Nothing here runs on import.
"""
