"""How a ``Translator`` searches: one value, checked once (§6.1)."""

import dataclasses
import numbers

import numpy as np

from keras_transformer.search import decoding


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The search settings of ``Translator.translate`` and its kin.

    Checked and normalised when made: a bad value raises ``TypeError`` or
    ``ValueError`` naming it, before any sentence is read. The methods take
    one as ``search=`` and its fields as keyword arguments
    (``translator.translate(texts, beam_size=1)``).

    Attributes:
        beam_size: int >= 1, hypotheses kept per sentence; the paper's 4
            (§6.1). 1 is greedy search.
        length_penalty: finite float >= 0, α of the length penalty
            ``((5 + |Y|) / 6) ** α`` (paper: 0.6).
        max_output_length: optional int >= 1, the most tokens generated per
            sentence (``END_ID`` included); by default the translator's, or
            the source length + 50 (§6.1). Capped by the model's
            ``max_length``.
        batch_size: int >= 1, the most sentences decoded together.
        use_cache: bool, decode with the key/value cache (default), or rerun
            the whole model on the prefix at each step (slower; the same
            tokens).
        verbose: 0 (silent) or 1: sentences done, sentences per second and
            time left on stderr (``keras_transformer.progress``).
        fixed_batch: bool, pad every batch to ``batch_size`` rows (padding
            rows cost compute, not results), so that the compiled search
            has one shape per source and output width whatever the number
            of sentences: what a server that batches requests wants
            (``Translator.warm_up`` then compiles them all). By default a
            batch is padded to a power of two of rows.
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    max_output_length: int | None = None
    batch_size: int = 64
    use_cache: bool = True
    verbose: int = 0
    fixed_batch: bool = False

    def __post_init__(self):
        # A truthy string such as "no" would otherwise be taken for True.
        for name in ("use_cache", "fixed_batch"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool. Received: {name}={value!r}")
        if isinstance(self.verbose, float) or self.verbose not in (0, 1):
            raise ValueError(
                f"verbose must be 0 or 1. Received: verbose={self.verbose!r}"
            )
        checked = {
            "beam_size": decoding.check_beam_size(self.beam_size),
            "length_penalty": decoding.check_length_penalty(self.length_penalty),
            "max_output_length": check_length(
                self.max_output_length, "max_output_length"
            ),
            "batch_size": check_length(self.batch_size, "batch_size", optional=False),
            "use_cache": bool(self.use_cache),
            "verbose": int(self.verbose),
            "fixed_batch": bool(self.fixed_batch),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

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


def _known(cls, options):
    """``options``, or ``TypeError`` for a name that is not a field."""
    fields = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(
            f"Unknown search options {unknown}. Expected some of {sorted(fields)}."
        )
    return options


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
