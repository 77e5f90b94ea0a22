"""0.3.0's module paths that moved in 0.4.0 stay importable for one
release, until 0.5.0 (``tests/test_moved.py`` fails from 0.5 on while one
is left): a small module at each old path (``keras_transformer/translator.py``,
...) imports the module at its new path and binds itself to it with
``alias``, so old code and new code share one module object (one class
``Translator``, one registration with Keras).

``keras_transformer.attention_maps`` is not among them: it names a public
function now, which a module bound there would hide once imported.
"""

import sys
import warnings

REMOVED_IN = "0.5.0"


def alias(old, new):
    """Bind the module path ``old`` (the ``__name__`` of the module being
    imported there) to the module ``new``, with a ``DeprecationWarning``
    that names ``new``'s path.

    The import system returns what ``sys.modules`` holds for ``old`` once
    that module has run, so ``import old`` gives ``new`` itself.
    """
    warnings.warn(
        f"{old} moved to {new.__name__}; the old path goes away in {REMOVED_IN}.",
        DeprecationWarning,
        # This function, the module at the old path, then the importer (the
        # import system's own frames are skipped).
        stacklevel=3,
    )
    sys.modules[old] = new
