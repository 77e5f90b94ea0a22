"""Other libraries' private names, each touched here and nowhere else.

Keras, argparse and threading keep private some of what the package needs:
the JAX and PyTorch trainers' hooks and state (the fault guards), Keras'
note of whether TensorFlow imports (the commands on JAX and PyTorch),
argparse's lists of a parser's options (``docs/commands_reference.py``),
and the class of a thread that Python did not start (the checks' deferred
errors). A private name may go, or change meaning, in any release, and an
override of a renamed hook is never called again, silently. So each use
here first checks that its names are there and that the library is a
release the test suite ran (``TESTED_KERAS``; argparse and threading come
with Python: ``TESTED_PYTHON``). Where either fails it warns once, with a
``RuntimeWarning`` that says what is lost, and takes the public path that
its docstring names.

``tests/test_private_api.py`` scans the package and fails on a private name
of another library touched anywhere else. A Keras method that a class
elsewhere overrides (it must be defined there) is listed in
``TRAINER_HOOKS``, and ``fault_guards`` checks that Keras still has it.

Importing this module imports nothing heavy: Keras is imported by the
functions that need it, so a command that runs no Keras may use the rest.
"""

import contextlib
import platform
import sys
import threading
import warnings

# The releases (major.minor) whose private names below the package was
# written against and its test suite ran with.
TESTED_KERAS = ("3.15",)
TESTED_PYTHON = ("3.11",)

# Keras trainer methods that ``GuardedModel`` overrides or calls, by the
# backend whose trainer defines them (Keras picks the trainer for its
# backend at import). A backend's fault guards rely on its hooks, and stand
# aside where one is missing: an override of a method Keras no longer calls
# would leave the guard switched off without a word.
TRAINER_HOOKS = {
    "jax": ("_purge_model_variables", "_make_function"),
    "torch": ("_should_torch_compile",),
}

# The topics warned about, each once per process; two threads' first calls
# may ask at once.
_said = set()
_said_lock = threading.Lock()


def _release(version):
    return ".".join(str(version).split(".")[:2])


def _warn_once(topic, message):
    with _said_lock:
        if topic in _said:
            return
        _said.add(topic)
    warnings.warn(message, RuntimeWarning, stacklevel=5)


def _usable(library, version, tested, topic, names, missing, effect):
    """Whether ``library`` ``version`` is a tested release with every name
    of ``names`` (``missing``: those found absent); else warns once about
    ``topic`` with ``effect``, the public path taken instead."""
    if _release(version) not in tested:
        _warn_once(
            topic,
            f"keras_transformer was tested with {library} "
            f"{' and '.join(tested)}; {library} {version} is installed. "
            f"{effect}: {topic} relies on {library}'s private "
            f"{', '.join(names)}.",
        )
        return False
    if missing:
        _warn_once(
            topic,
            f"{library} {version} has no {', '.join(missing)} (private; "
            f"keras_transformer was tested with {library} "
            f"{' and '.join(tested)}). {effect}: {topic} relies on it.",
        )
        return False
    return True


def _keras_usable(topic, names, missing, effect):
    import keras

    return _usable(
        "Keras", keras.__version__, TESTED_KERAS, topic, names, missing, effect
    )


def _python_usable(topic, names, missing, effect):
    version = platform.python_version()
    return _usable("Python", version, TESTED_PYTHON, topic, names, missing, effect)


# -- the fault guards: Keras' trainers below their public API -----------------

_FAULT_GUARDS = (
    "Its fault guards stand aside: a fit, evaluate or predict that fails on "
    "JAX may leave the model without weights (reload it from a checkpoint); "
    "inputs are still checked"
)


def fault_guards(model=None):
    """Whether the fault guards (``_guards.fault_safe``) run: on a tested
    Keras whose trainer for this backend has every ``TRAINER_HOOKS`` method,
    and, given a JAX ``model``, the trainer state and the variables' value
    slot that the guards read and reset. Otherwise False, with one warning:
    the model then trains as a plain ``keras.Model`` does."""
    import keras

    backend = keras.backend.backend()
    names = [f"Model.{name}" for name in TRAINER_HOOKS.get(backend, ())]
    missing = [
        f"Model.{name}"
        for name in TRAINER_HOOKS.get(backend, ())
        if not hasattr(keras.Model, name)
    ]
    if backend == "jax":
        names += ["Model._jax_state", "Model._jax_state_synced", "Variable._value"]
    if model is not None and backend == "jax":
        if not hasattr(model, "_jax_state_synced"):
            missing.append("Model._jax_state_synced")
        variables = model.variables
        if variables and not hasattr(variables[0], "_value"):
            missing.append("Variable._value")
    return _keras_usable("fault safety", names, missing, _FAULT_GUARDS)


def attached_value(variable):
    """The value attached to a Keras variable: None, or a deleted JAX array,
    where the JAX trainer detached it (``Variable.value`` would make up an
    initial value instead). Called where ``fault_guards`` holds."""
    return variable._value


def forget_jax_state(model):
    """Drop the JAX trainer's copy of the state of a failed loop: Keras would
    otherwise attach it to the variables again at its next sync, over the
    values the guard restored. Called where ``fault_guards`` holds."""
    model._jax_state = None
    model._jax_state_synced = True


def should_torch_compile(model):
    """Whether Keras' PyTorch trainer compiles ``model``'s steps (it turns
    ``jit_compile`` off on an old PyTorch). Called where ``fault_guards``
    holds; False without the hook, and the steps are left as Keras made
    them."""
    decide = getattr(model, "_should_torch_compile", None)
    return bool(decide()) if decide is not None else False


def no_tf_distribution(model):
    """Whether ``model`` trains on TensorFlow with no ``tf.distribute``
    strategy, as Keras' TensorFlow trainer notes it. False where that note
    cannot be read (with one warning): the caller then leaves the optimizer
    to be built in the first step, as Keras does."""
    name = "Model._distribute_strategy"
    missing = [] if hasattr(model, "_distribute_strategy") else [name]
    usable = _keras_usable(
        "building the optimizer early",
        [name],
        missing,
        "The optimizer is built inside the first traced step, as Keras does",
    )
    return usable and model._distribute_strategy is None


# -- Keras' note of whether TensorFlow imports ----------------------------------


@contextlib.contextmanager
def keras_without_tensorflow():
    """Keras, in the block, as if TensorFlow were not installed, where
    another backend runs it and nothing has imported TensorFlow.

    Keras notes whether TensorFlow imports on a private lazy module
    (``keras.src.utils.module_utils.tensorflow``); the note is set to "not
    installed" for the block only, so that a later use of TensorFlow in the
    process still imports it. The public path, on an untested Keras or one
    without the note: nothing is set, and Keras imports TensorFlow where it
    is installed, as it always does.
    """
    import keras

    if keras.backend.backend() == "tensorflow":
        yield
        return
    try:
        from keras.src.utils import module_utils
    except ImportError:
        module_utils = None
    lazy = getattr(module_utils, "tensorflow", None)
    where = "keras.src.utils.module_utils.tensorflow"
    attributes = ("name", "module", "_available")
    missing = [f"{where}.{name}" for name in attributes if not hasattr(lazy, name)]
    if not missing and lazy.name in sys.modules:
        yield  # imported already: nothing left to keep out
        return
    hide = (
        _keras_usable(
            "keeping TensorFlow out",
            [f"{where}.{name}" for name in attributes],
            missing,
            "Keras imports TensorFlow where it is installed, whatever the backend",
        )
        and lazy._available is None
    )
    if hide:
        lazy._available = False
    try:
        yield
    finally:
        if hide and lazy.module is None:
            lazy._available = None


# -- argparse: a parser's options, for docs/commands_reference.py ------------------

_PARSER_LISTS = ("_actions", "_action_groups", "_mutually_exclusive_groups")
_FORMATTER_METHODS = ("_format_action_invocation", "_expand_help")


def argparse_readable(parser, formatter_class):
    """Whether ``parser``'s options can be listed (argparse has no public
    way): its lists of actions and groups, and ``formatter_class``'s
    spelling of an option and of its help. Otherwise False, with one
    warning: the reference then shows each command's ``--help`` as it is."""
    names = [f"ArgumentParser.{name}" for name in _PARSER_LISTS]
    names += [f"HelpFormatter.{name}" for name in _FORMATTER_METHODS]
    names.append("_ArgumentGroup._group_actions")
    missing = [f"ArgumentParser.{n}" for n in _PARSER_LISTS if not hasattr(parser, n)]
    missing += [
        f"HelpFormatter.{name}"
        for name in _FORMATTER_METHODS
        if not hasattr(formatter_class, name)
    ]
    if not missing:
        groups = [*parser._action_groups, *parser._mutually_exclusive_groups]
        if not all(hasattr(group, "_group_actions") for group in groups):
            missing.append("_ArgumentGroup._group_actions")
    return _python_usable(
        "tabulating a parser's options",
        names,
        missing,
        "Each command's section shows its --help text instead of tables",
    )


def parser_actions(parser):
    """Every action of ``parser``, in the order they were added."""
    return list(parser._actions)


def argument_groups(parser):
    """(title, description, actions) of each group that the parser's own
    ``add_argument_group`` made: argparse makes the first two itself, for
    positional arguments and for options."""
    return [
        (group.title, group.description, list(group._group_actions))
        for group in parser._action_groups[2:]
    ]


def exclusive_groups(parser):
    """(required, actions) of each of ``parser``'s mutually exclusive groups."""
    return [
        (group.required, list(group._group_actions))
        for group in parser._mutually_exclusive_groups
    ]


def action_invocation(formatter, action):
    """``action`` as ``--help`` spells it: its flags and metavar."""
    return formatter._format_action_invocation(action)


def expanded_help(formatter, action):
    """``action``'s help with its ``%(default)s``-style fields filled in."""
    return formatter._expand_help(action)


# -- threading: a thread that Python did not start -----------------------------------


def started_outside_python():
    """Whether this thread was started outside Python: a C library's thread
    (JAX's runtime, running a host callback) that runs Python code, which
    ``threading`` sees as a dummy thread. False, the public path, where that
    cannot be told (with one warning): an error such a thread finds is then
    raised on it, not handed to the block that waits for it."""
    name = "threading._DummyThread"
    missing = [] if hasattr(threading, "_DummyThread") else [name]
    usable = _python_usable(
        "handing a runtime thread's errors to the waiting call",
        [name],
        missing,
        "An error that a check finds on a JAX runtime thread is raised there, "
        "not by the call that waits for it",
    )
    return usable and isinstance(threading.current_thread(), threading._DummyThread)
