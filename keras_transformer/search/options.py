"""How a translator searches: one value, checked once (§6.1).

The search's defaults are written here and nowhere else: the commands' flags,
the server's request defaults, the trainer's report and the exports read
them from ``SearchOptions``. Every setting has one check, made when a
``SearchOptions`` is built; the low-level searches call the same checks for
callers that use them directly.

This module imports neither Keras nor a backend: the CTranslate2 engine and
the server's request parsing use it.
"""

import dataclasses
import math
import numbers
import sys

# Paper §6.1: "beam search with a beam size of 4 and length penalty α = 0.6".
BEAM_SIZE = 4
LENGTH_PENALTY = 0.6
# The largest finite float32: the searches compute in float32.
FLOAT32_MAX = 3.4028234663852886e38
# How beam search ranks hypotheses: the GNMT penalty of the paper's search
# (§6.1), or transformers' `generate`, which imported checkpoints expect.
LENGTH_PENALTY_FORMS = ("gnmt", "transformers")
# The default output limit, the same section: "We set the maximum output
# length during inference to input length + 50".
EXTRA_OUTPUT_LENGTH = 50


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The search settings of ``translate`` and its kin, on every engine.

    Checked and normalised when made: a bad value raises ``TypeError`` or
    ``ValueError`` naming it, before any sentence is read. The translators'
    methods take one as ``search=`` and its fields as keyword arguments
    (``translator.translate(texts, beam_size=1)``).

    Attributes:
        beam_size: int >= 1, hypotheses kept per sentence; the paper's 4
            (§6.1). 1 is greedy search.
        length_penalty: finite float >= 0, α of the length penalty
            (paper: 0.6).
        length_penalty_form: ``"gnmt"`` (default): the paper's search,
            scores ``log P(Y | X) / ((5 + |Y|) / 6) ** α`` (Wu et al.,
            2016), finished hypotheses kept in the beam; or
            ``"transformers"``: the beam search of Hugging Face
            transformers' ``generate`` (``early_stopping=False``,
            ``renormalize_logits=True``, the end token forced at the output
            limit), scores ``log P(Y | X) / |Y| ** α``, so that a model
            imported from a Marian checkpoint searches as it does there.
            ``keras_transformer.search.transformers_beam`` says how they
            differ.
        max_output_length: optional int >= 1, the most tokens generated per
            sentence (the end token included); by default the translator's,
            or the source length + 50 (§6.1). Capped by the model's
            ``max_length``.
        batch_size: optional int >= 1, the most sentences searched together;
            by default the engine's own (``translator.default_batch_size``:
            64 for Keras, measured values for CTranslate2).
        use_cache: bool, decode with the key/value cache (default), or rerun
            the whole model on the prefix at each step (slower; the same
            tokens). Engines without the choice ignore it.
        verbose: 0 (silent) or 1: sentences done, sentences per second and
            time left on stderr (``keras_transformer.progress``).
        fixed_batch: bool, pad every batch to ``batch_size`` rows (padding
            rows cost compute, not results), so that a compiled search has
            one shape per source and output width whatever the number of
            sentences: what a server that batches requests wants
            (``warm_up`` then compiles them all). By default a batch is
            padded to a power of two of rows.
    """

    beam_size: int = BEAM_SIZE
    length_penalty: float = LENGTH_PENALTY
    length_penalty_form: str = "gnmt"
    max_output_length: int | None = None
    batch_size: int | None = None
    use_cache: bool = True
    verbose: int = 0
    fixed_batch: bool = False

    def __post_init__(self):
        # A truthy string such as "no" would otherwise be taken for True.
        for name in ("use_cache", "fixed_batch"):
            value = getattr(self, name)
            if not _is_bool(value):
                raise TypeError(f"{name} must be a bool. Received: {name}={value!r}")
        if isinstance(self.verbose, float) or self.verbose not in (0, 1):
            raise ValueError(
                f"verbose must be 0 or 1. Received: verbose={self.verbose!r}"
            )
        checked = {
            "beam_size": check_beam_size(self.beam_size),
            "length_penalty": check_length_penalty(self.length_penalty),
            "length_penalty_form": check_length_penalty_form(self.length_penalty_form),
            "max_output_length": check_length(
                self.max_output_length, "max_output_length"
            ),
            "batch_size": check_length(self.batch_size, "batch_size"),
            "use_cache": bool(self.use_cache),
            "verbose": int(self.verbose),
            "fixed_batch": bool(self.fixed_batch),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.fixed_batch and self.batch_size is None:
            raise ValueError("fixed_batch=True needs a batch_size.")

    @classmethod
    def of(cls, search=None, **options):
        """``search`` (a ``SearchOptions``, or None for the defaults) with
        ``options`` replacing its fields."""
        if search is None:
            return cls(**_known(cls, options))
        if not isinstance(search, cls):
            raise TypeError(
                "search must be a SearchOptions; give the search's settings "
                f"as keyword arguments (beam_size=...). Received: {search!r}"
            )
        options = _known(cls, options)
        return dataclasses.replace(search, **options) if options else search

    def penalty(self, length):
        """The length penalty of an output of ``length`` tokens (the end
        token included) in this search's form: what its log-probability is
        divided by to rank it."""
        if self.length_penalty_form == "transformers":
            return transformers_length_penalty(length, self.length_penalty)
        return length_penalty(length, self.length_penalty)

    def batch_size_or(self, default):
        """The batch size asked for, or the engine's ``default``."""
        return default if self.batch_size is None else self.batch_size


def _is_bool(value):
    # NumPy's bool counts too; without importing NumPy (an engine that needs
    # none must not load it), since a NumPy bool exists only if it is loaded.
    numpy = sys.modules.get("numpy")
    return isinstance(value, bool) or (
        numpy is not None and isinstance(value, numpy.bool_)
    )


def _known(cls, options):
    """``options``, or ``TypeError`` for a name that is not a field."""
    fields = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(
            f"Unknown search options {unknown}. Expected some of {sorted(fields)}."
        )
    return options


def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, §7),
    by which beam search ranks hypotheses: ``log P(Y | X) / lp(Y)``.

    Works on Python numbers and on tensors.
    """
    return ((5.0 + length) / 6.0) ** alpha


def check_beam_size(beam_size):
    """An int >= 1, else ``TypeError``/``ValueError``."""
    if isinstance(beam_size, bool) or not isinstance(beam_size, numbers.Integral):
        raise TypeError(f"beam_size must be an int. Received: beam_size={beam_size!r}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1. Received: beam_size={beam_size}")
    return int(beam_size)


def check_length_penalty(alpha):
    """A finite number >= 0 (α), as a float, else ``TypeError``/``ValueError``."""
    # A string such as "0.6" is a mistake to report, not a number to parse,
    # and True is not a penalty.
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(
            f"length_penalty must be a number. Received: length_penalty={alpha!r}"
        )
    try:
        alpha = float(alpha)
    except OverflowError:  # an int past float's range
        alpha = math.inf
    # The searches compute in float32: a value past its range becomes inf,
    # and α = inf makes lp(Y) infinite for every |Y| > 1, so that the scores
    # no longer rank anything.
    if not 0.0 <= alpha <= FLOAT32_MAX:  # also rejects NaN
        raise ValueError(
            "length_penalty must be >= 0 and finite in float32. Received: "
            f"length_penalty={alpha}"
        )
    return alpha


def check_length_penalty_form(form):
    """One of ``LENGTH_PENALTY_FORMS``, else ``ValueError``."""
    if form not in LENGTH_PENALTY_FORMS:
        raise ValueError(
            f"length_penalty_form must be one of {LENGTH_PENALTY_FORMS}. "
            f"Received: length_penalty_form={form!r}"
        )
    return form


def refuse_transformers_form(search, what):
    """``ValueError`` where ``search`` asks for transformers' beam search,
    which only the Keras translator's search offers."""
    if search.length_penalty_form != "gnmt":
        raise ValueError(
            f"{what} searches with the GNMT length penalty only; "
            f'length_penalty_form="{search.length_penalty_form}" is offered by '
            'the Keras translator. Give length_penalty_form="gnmt" (kt-export, '
            "kt-translate: --length-penalty-form gnmt)."
        )


def transformers_length_penalty(length, alpha):
    """transformers' length penalty ``length ** alpha``, by which its beam
    search ranks finished hypotheses: ``log P(Y | X) / length ** alpha``."""
    return length**alpha


def check_length(value, name, optional=True):
    """An int >= 1 (or None when ``optional``), else ``TypeError``/``ValueError``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {kind}. Received: {name}={value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1. Received: {name}={value}")
    return int(value)


def check_n_best(n, beam_size):
    """``n`` of ``n_best``: an int in ``[1, beam_size]``, or ``beam_size``
    for None; else ``TypeError``/``ValueError``."""
    n = beam_size if n is None else n
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int. Received: n={n!r}")
    if not 1 <= n <= beam_size:
        raise ValueError(
            f"n must be between 1 and beam_size={beam_size}. Received: n={n}"
        )
    return n
