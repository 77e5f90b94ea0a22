"""Exports of a trained ``Translator`` to the tools that deploy translation
models: a CTranslate2 model directory (``ctranslate2``) and a TensorFlow
SavedModel with a string-to-string ``translate`` signature
(``saved_model``). Neither is imported here: each needs its own optional
dependency.
"""
