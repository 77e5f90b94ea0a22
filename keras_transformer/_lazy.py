"""Packages whose names are imported when first used (PEP 562).

A package that re-exports its modules' names would otherwise import all of
them, and with them Keras and a backend, for a caller that needs one module
that has neither (the CTranslate2 engine, a tokenizer, the search options).
"""

import importlib


def attributes(package, public):
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``), whose
    names are ``public``: name -> the module that defines it. Submodules not
    imported yet are found too (``package.module``)."""

    def __getattr__(name):
        module = public.get(name)
        if module is not None:
            return getattr(importlib.import_module(module), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        namespace = vars(importlib.import_module(package))
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__


def gather(api):
    """One table of public names from several packages' own: ``api`` maps a
    package (its dotted name) to ``"*"`` (all of its ``_PUBLIC`` names) or
    to the names it lends. Importing a package runs only its table."""
    public = {}
    for package, names in api.items():
        table = importlib.import_module(package)._PUBLIC
        for name in table if names == "*" else names:
            public[name] = table[name]
    return public
