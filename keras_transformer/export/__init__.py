"""Exports of a trained ``Translator`` to the tools that deploy translation
models: a CTranslate2 model directory (``ctranslate2``), a TensorFlow
SavedModel with a string-to-string ``translate`` signature
(``saved_model``) and a Marian checkpoint folder in Hugging Face's layout
(``marian``). None is imported here: each needs its own optional
dependency.
"""
