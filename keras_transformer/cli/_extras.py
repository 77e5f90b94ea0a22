"""The optional packages behind a command's work, imported before the work
starts, and the one line a missing one stops the command with.

A missing package is a setup problem with one fix, so the command prints that
fix (the extra to install, as ``pip install "keras-transformer-aiayn[...]"``)
and exits with status 2, without a traceback.
"""

import contextlib
import importlib
import os
import sys

DISTRIBUTION = "keras-transformer-aiayn"

# What each kind of work needs: (its name in the message, {top-level module:
# the extra that installs it}), imported in that order.
NEEDS = {
    "ctranslate2": (
        "a CTranslate2 export",
        {"ctranslate2": "ctranslate2", "sentencepiece": "ctranslate2"},
    ),
    "keras": (
        "a .keras translator",
        {"keras": None, "sentencepiece": "text"},
    ),
    "serve": (
        "kt-serve",
        {
            "starlette": "serve",
            "uvicorn": "serve",
            "prometheus_client": "serve",
            "limits": "serve",
            "redis": "serve",
        },
    ),
    "plot": ("kt-attention", {"matplotlib": "plot"}),
    "pretrained": (
        "kt-import",
        {"safetensors": "pretrained", "sentencepiece": "pretrained"},
    ),
    "score": ("kt-evaluate", {"sacrebleu": "text"}),
    # Keras' backend, the tokenizer's package, and BLEU for a corpus run's
    # report (the text extra installs both).
    "train": (
        "kt-train",
        {"keras": None, "sentencepiece": "text", "sacrebleu": "text"},
    ),
}

# Keras imports its backend's package: a missing one is named by its extra.
BACKEND_EXTRAS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


class MissingPackage(ImportError):
    """A package a command needs failed to import.

    Attributes:
        package: the module the command imported (``"sentencepiece"``).
        missing: the module that was not found, if another (a dependency of
            ``package``), else ``package``.
        extra: the extra that installs it.
        purpose: what needs it, in words (``"a CTranslate2 export"``).
    """

    def __init__(self, package, missing, extra, purpose):
        self.package, self.missing = package, missing
        self.extra, self.purpose = extra, purpose
        super().__init__(self.line())

    def line(self):
        what = f"the {self.package} package"
        if self.missing and self.missing != self.package:
            what += f" (which needs {self.missing}, not installed)"
        return (
            f'{self.purpose} needs {what}: pip install "{DISTRIBUTION}[{self.extra}]"'
        )


def _backend_extra(name):
    """The extra of a missing backend package named ``name``, if it is the
    backend Keras was asked for."""
    top = (name or "").split(".")[0]
    top = "jax" if top == "jaxlib" else top
    backend = os.environ.get("KERAS_BACKEND")
    if top in BACKEND_EXTRAS and backend in (None, top):
        return BACKEND_EXTRAS[top]
    return None


def require(need):
    """Import the packages of ``NEEDS[need]``.

    Raises:
        MissingPackage: one of them, or a package it imports, is missing.
    """
    purpose, packages = NEEDS[need]
    for package, extra in packages.items():
        try:
            importlib.import_module(package)
        except ImportError as error:
            missing = _missing_module(error) or package
            if extra is None:  # keras: a core dependency, so its backend
                extra = _backend_extra(missing)
                if extra is None:
                    raise
                package = missing.split(".")[0]
            raise MissingPackage(package, missing, extra, purpose) from error


def _missing_module(error):
    """The name of the module that was not found, from ``error`` or an
    error it was raised from (a library may wrap the ImportError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name
        error = error.__cause__ or error.__context__
    return None


def missing_line(error, need):
    """The one-line message for ``error``, an ImportError met while doing
    ``need``'s work, or None if it is not a missing package of that work."""
    if isinstance(error, MissingPackage):
        return error.line()
    name = _missing_module(error)
    if name is None:
        return None
    purpose, packages = NEEDS[need]
    top = name.split(".")[0]
    extra = packages.get(top) or _backend_extra(top)
    if extra is None:
        return None
    return MissingPackage(top, name, extra, purpose).line()


@contextlib.contextmanager
def exit_if_missing(prog, need):
    """Run the block; a package missing for ``need`` stops the command
    with ``prog: error: <the line>`` and exit status 2. Any other error
    goes on as it was."""
    try:
        yield
    except ImportError as error:
        line = missing_line(error, need)
        if line is None:
            raise
        sys.stderr.write(f"{prog}: error: {line}\n")
        raise SystemExit(2) from None
