"""Short training scripts to read and copy, written with the public API.

``python -m training.numbers`` (the built-in task) and
``python -m training.parallel_corpus`` (a folder of parallel text such as
Multi30k). ``kt-train`` is the full-featured command over the same library.
"""
