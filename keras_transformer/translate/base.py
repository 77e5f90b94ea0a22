"""The translator interface: what every engine shares, written once.

An engine (the Keras ``Translator``, the ``CTranslate2Translator`` of an
export, the next one) supplies a tokenizer, its limits and one method that
searches sorted, encoded sources; ``TranslatorBase`` does the rest the same
way for all of them:

- text checks: every sentence a ``str`` with a UTF-8 encoding (``None``,
  bytes or a number raise ``TypeError`` naming the index, rather than being
  translated as the words "None", "b'...'" or "42"; a lone surrogate
  ``ValueError``);
- encoding: the tokenizer's pieces and the end token; a source longer than
  the model's ``max_length`` keeps its first ``max_length - 1`` pieces and the
  end token, with a ``UserWarning`` that names the limit (translating the
  beginning is more useful than failing a whole batch for one long line);
  text the tokenizer cannot spell becomes the unknown id, also with a
  ``UserWarning``;
- the id checks of ``decode_ids`` (no padding, within the model's length and
  vocabulary);
- each sentence's output limit: the source length (end token excluded) + 50
  (§6.1), or the fixed ``max_output_length``, never more than the model's
  ``max_length``;
- ``translate``, ``translate_ids``, ``n_best``, ``decode_ids``, progress,
  and the token counts a server checks requests with.

Sorting by length, cutting into batches and putting the results back in
the callers' order are ``translate.scheduler``'s, shared with the server;
an engine searches the batches it is handed (``_search_batches``).

This module imports neither Keras nor a backend: an engine that needs none
(CTranslate2) must not pay for them.
"""

import warnings
from typing import NamedTuple

from keras_transformer.progress import Progress
from keras_transformer.search.options import (
    EXTRA_OUTPUT_LENGTH,
    SearchOptions,
    check_n_best,
)
from keras_transformer.translate import scheduler
from keras_transformer.translate.constraints import constraint_ids, warn_missing


def check_texts(texts):
    """``texts`` as a list of str; refuses anything ``str()`` would have
    turned into words to translate ("None", "b'...'", "42")."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of sentences, not one string.")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(
            f"texts must be an iterable of str, got {type(texts).__name__}"
        ) from None
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            # E.g. a lone surrogate, from bytes decoded with "surrogateescape".
            bad = text[error.start : error.end]
            raise ValueError(
                f"texts[{i}] cannot be encoded as UTF-8 ({error.reason}): "
                f"{bad!r} at index {error.start}"
            ) from None
    return texts


class Batch(NamedTuple):
    """Sources searched together (``TranslatorBase._search_batches``)."""

    sources: list  # lists of int, sorted by length, none empty
    limits: list  # each source's output limit, end token included
    constraints: list | None  # per source, its id phrases; None: none given


class TranslatorBase:
    """Text in, text out, on any engine.

    What an engine supplies (attributes, set in its ``__init__``):

    - ``tokenizer``: a ``TextTokenizer`` (``keras_transformer.data.contract``):
      the special ids, ``encode``, ``decode``, ``count``, the pieces in
      the model's id order, the target languages;
    - ``source_max_length``, ``target_max_length``: the model's position
      limits (int, or None for none);
    - ``max_output_length``: None (source length + ``extra_output_length``)
      or a fixed limit;
    - ``source_vocabulary_size``: the ids a source may hold (or None);
    - ``extra_output_length`` if not §6.1's 50;
    - ``default_search``: the ``SearchOptions`` a call without ``search``
      starts from, if not the paper's (a model imported from a checkpoint
      searches as its generation config says);
    - ``languages``: ``(source, target)`` language codes where known
      (``keras_transformer.data.languages``), else None;

    and methods: ``engine`` (a property: what translates, in words),
    ``default_batch_size`` (a property) and ``_search_batches`` (below);
    optionally ``check_tokenizer``, ``warm_up`` and ``warm_up_attention``.
    An engine whose search takes constraints (glossaries) sets
    ``takes_constraints``; the others refuse a glossary rather than ignore
    it, and their batches never hold constraints.

    The methods keep no state between calls: several threads may translate
    with one translator at once (an engine that needs a lock takes its own).
    """

    extra_output_length = EXTRA_OUTPUT_LENGTH
    source_vocabulary_size = None
    default_search = None
    languages = None

    # The special ids are the tokenizer's: one place for every engine.
    pad_id = property(lambda self: self.tokenizer.pad_id)
    start_id = property(lambda self: self.tokenizer.start_id)
    end_id = property(lambda self: self.tokenizer.end_id)
    unk_id = property(lambda self: self.tokenizer.unk_id)

    # -- what an engine supplies ----------------------------------------------------

    @property
    def engine(self):
        """What translates, in words (``"keras jax float32"``, ...)."""
        raise NotImplementedError(f"{type(self).__name__} must define engine")

    @property
    def default_batch_size(self):
        """Sentences searched together when ``SearchOptions.batch_size`` is
        None."""
        raise NotImplementedError(
            f"{type(self).__name__} must define default_batch_size"
        )

    def _search_batches(self, batches, search, top_n):
        """Search batches of encoded sources, in turn.

        Args:
            batches: an iterator of ``Batch``: sources sorted by length
                (shortest first), at most ``search.batch_size_or(
                self.default_batch_size)`` of them, none empty (an empty
                source is answered without a search). A batch is cut when
                it is read: read one when ready to search it (an engine
                that searches several at once reads ahead).
            search: a ``SearchOptions``.
            top_n: how many of the best hypotheses must be exact (None: all
                ``beam_size``); an engine may give more.

        Yields:
            per batch, in the order read, one list per source of hypotheses
            ``(ids, score)``, best first, ``ids`` without the start id,
            ending with the end id unless the limit came first; ``score``
            is ``log P(Y | X) / lp(Y)``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define _search_batches")

    def search_options(self, search=None, **options):
        """The ``SearchOptions`` of a call: ``search``, or else this
        translator's ``default_search`` (the paper's when None), with
        ``options`` replacing its fields."""
        return SearchOptions.of(
            self.default_search if search is None else search, **options
        )

    def check_tokenizer(self):
        """Raise ``ValueError`` if the tokenizer cannot be used (an engine
        whose tokenizer is read later than it is made checks it here)."""

    def warm_up(self, search=None, constraint_tokens=0, **options):
        """Do what the first call would do slowly (load, compile), so that a
        server answers its first request as fast as the rest
        (``constraint_tokens``: the most constraint tokens a sentence may
        bring, for an engine that compiles its constrained searches).

        Returns:
            int: the searches compiled (0 for an engine that compiles
            nothing).
        """
        self.translate([""], search, **options)
        return 0

    def warm_up_attention(self):
        """Compile what ``attention_maps`` runs, for every shape a call can
        reach (an engine that gives attention, ``gives_attention``).

        Returns:
            int: the programs compiled (0 here: no attention, nothing to
            compile).
        """
        return 0

    # -- text ---------------------------------------------------------------------

    def translate(
        self,
        texts,
        search=None,
        target_language=None,
        glossary=None,
        constraints=None,
        **options,
    ):
        """Translate sentences with beam search (greedy with ``beam_size=1``).

        Args:
            texts: list (or other iterable) of str; anything else, or text
                with no UTF-8 encoding (a lone surrogate), is refused.
            search: optional ``SearchOptions`` (default: the translator's
                ``default_search``).
            target_language: the language to translate into, for a model
                that translates into several (one of
                ``translator.target_languages``; Marian's ``>>fra<<`` token
                is put before each text). Required by such a model unless
                every text starts with its token; refused by any other.
            glossary: optional ``{source term: target term}`` (a dict or a
                ``keras_transformer.translate.glossary.Glossary``): each
                source term found in a text (``Glossary.targets`` says how
                it matches) makes its target term a constraint of that
                text's translation.
            constraints: optional list, one per text, of lists of target
                phrases (str) the translation must contain, each spelled by
                the tokenizer as it would spell it inside a sentence.
                With either, the search is lexically constrained beam search
                (``keras_transformer.search.constrained``); a constraint
                that cannot fit in the output limit is left out and named
                in a ``UserWarning``. Engines that cannot constrain their
                search (``takes_constraints`` False) refuse both.
            **options: its fields, replacing ``search``'s: ``beam_size``
                (4), ``length_penalty`` (0.6), ``length_penalty_form``,
                ``max_output_length``, ``batch_size``, ``use_cache``,
                ``verbose``, ``fixed_batch``.

        Returns:
            list of str, one per input (``""`` where the model ends at once).

        Raises:
            TypeError, ValueError: a bad argument, before any sentence is
                read.
        """
        best = self.translate_ids(
            texts,
            self.search_options(search, **options),
            target_language,
            glossary,
            constraints,
        )
        return self.detokenize(best)

    def translate_ids(
        self,
        texts,
        search=None,
        target_language=None,
        glossary=None,
        constraints=None,
        **options,
    ):
        """Like ``translate`` but returns the generated token ids.

        Returns:
            list of lists of int: the tokens after the start id, ending with
            the end id unless the maximum output length was reached first.
        """
        search = self.search_options(search, **options)
        hypotheses = self._decode_texts(
            texts, search, 1, target_language, glossary, constraints
        )
        return [row[0][0] for row in hypotheses]

    def n_best(
        self,
        texts,
        n=None,
        search=None,
        target_language=None,
        glossary=None,
        constraints=None,
        **options,
    ):
        """The ``n`` best translations of each sentence, with their scores.

        Args:
            texts: list of str.
            n: int, at most ``beam_size`` (default: ``beam_size``).
            search, target_language, glossary, constraints, **options: as
                for ``translate``.

        Returns:
            list (one per input) of lists of ``(translation, score)``, best
            first; the score is the search's ``log P(Y | X) / lp(Y)``, the
            quantity it ranks by (with constraints, the translations that
            hold more constraint tokens come first).
        """
        # The search first: n defaults to beam_size and is bounded by it.
        search = self.search_options(search, **options)
        n = check_n_best(n, search.beam_size)
        found = self._decode_texts(
            texts, search, n, target_language, glossary, constraints
        )
        return self.n_best_texts(found, n)

    def _decode_texts(self, texts, search, top_n, target_language, glossary, terms):
        """``_decode`` of texts: their constraints (from ``glossary`` and
        the phrases ``terms``) found in the texts as given, then the
        target-language token put before each, then encoded."""
        texts = check_texts(texts)
        wanted = self.constraint_ids(texts, glossary, terms)
        texts = self.with_target_language(texts, target_language)
        return self._decode(
            self.encode_sources(texts), search, top_n=top_n, constraints=wanted
        )

    def n_best_texts(self, found, n):
        """``[(translation, score), ...]`` per source: the ``n`` best of
        ``found`` (``decode_ids``' or ``search_ids_sorted``'s hypotheses),
        detokenized together."""
        rows = [row[:n] for row in found]
        texts = iter(self.detokenize([ids for row in rows for ids, _ in row]))
        return [[(next(texts), score) for _, score in row] for row in rows]

    def decode_ids(self, source_ids, search=None, **options):
        """Search for the translations of encoded sources.

        Args:
            source_ids: list of lists of int, each ending with the end id
                (as ``encode_sources`` gives them), no padding, at most the
                model's ``max_length`` long.
            search, **options: as for ``translate``.

        Returns:
            list (one per source) of ``beam_size`` hypotheses ``(ids,
            score)``, best first: ids as in ``translate_ids``, the score the
            search's ``log P(Y | X) / lp(Y)``.
        """
        return self._decode(source_ids, self.search_options(search, **options))

    gives_attention = False

    def attention_maps(self, source, target=None):
        """The attention weights of one sentence pair (an ``AttentionMaps``),
        for an engine that gives them (``gives_attention``); an engine that
        computes none raises ``NotImplementedError`` naming itself."""
        raise NotImplementedError(f"{self.engine} gives no attention weights")

    @property
    def target_languages(self):
        """The languages a model that translates into several can be asked
        for (Marian's ``>>fra<<`` tokens), sorted; ``()`` for one."""
        return tuple(self.tokenizer.target_languages)

    def with_target_language(self, texts, target_language):
        """``texts`` led by the target-language token of ``target_language``;
        ``ValueError`` naming the choices where one is missing or wrong."""
        choices = self.target_languages
        if target_language is None and not choices:
            return texts
        texts = check_texts(texts)
        if target_language is None:
            if not all(text.startswith(">>") for text in texts):
                raise ValueError(
                    "This model translates into several languages: give "
                    f"target_language, one of {list(choices)}."
                )
            return texts
        if not choices:
            raise ValueError(
                "target_language: this model translates into one language only "
                "(it has no target-language tokens). "
                f"Received: {target_language!r}"
            )
        if target_language not in choices:
            raise ValueError(
                f"target_language must be one of {list(choices)}. "
                f"Received: {target_language!r}"
            )
        return [f">>{target_language}<< {text}" for text in texts]

    def encode_sources(self, texts):
        """Source ids ending with the end id, cut to the model's ``max_length``.

        A source that is too long keeps its first ``max_length - 1`` pieces
        and the end id, with a ``UserWarning``. A source with text the
        tokenizer cannot spell (the unknown id) also gives a ``UserWarning``:
        it is translated, but the model has not seen those characters.

        Raises:
            TypeError: ``texts`` is one string, or an item is not a str
                (the message names its index and type).
            ValueError: an item has no UTF-8 encoding (e.g. a lone
                surrogate), or the tokenizer has no vocabulary.
        """
        texts = check_texts(texts)
        self.check_tokenizer()
        ids = self.tokenize(texts)
        unknown = [i for i, row in enumerate(ids) if self.unk_id in row]
        if unknown:
            example = texts[unknown[0]]
            warnings.warn(
                f"{len(unknown)} of {len(ids)} sources contain characters the "
                f"tokenizer has never seen (read as <unk>), e.g. source "
                f"{unknown[0]}: {example[:60]!r}. Their translations may be "
                "poor there.",
                UserWarning,
                stacklevel=3,
            )
        limit = self.source_max_length
        too_long = 0 if limit is None else sum(len(row) > limit for row in ids)
        if too_long:
            warnings.warn(
                f"{too_long} of {len(ids)} sources are longer than the model's "
                f"max_length={limit} tokens (end token included); each is "
                f"truncated to its first {limit - 1} tokens and the end token.",
                UserWarning,
                stacklevel=3,
            )
            ids = [
                row if len(row) <= limit else row[: limit - 1] + [self.end_id]
                for row in ids
            ]
        return ids

    def tokenize(self, texts):
        """Each text's piece ids and the end id (no truncation, no checks)."""
        return self.tokenizer.encode(texts)

    def detokenize(self, rows):
        """Texts from rows of generated ids: each cut at its first end id,
        padding and start ids dropped."""
        return self.tokenizer.decode(rows)

    def source_lengths(self, texts):
        """Each text's length in tokens, end token included, before any cut:
        what a server compares with ``source_max_length`` to refuse a
        request (the tokenizer runs in Python on every engine: no
        framework op on a server's event loop)."""
        return self.tokenizer.count(check_texts(texts))

    # -- the shared search ----------------------------------------------------------

    def output_limit(self, source_length, max_output_length=None):
        """The most tokens generated for a source of ``source_length``
        pieces (end token excluded): ``max_output_length``, else the
        translator's fixed one, else ``source_length + extra_output_length``
        (§6.1); never more than ``target_max_length``. An empty source has
        nothing to translate: its limit is 0 and its translation empty, on
        every engine (CTranslate2 answers an empty source so without running
        the model, and the others keep its rule)."""
        if source_length == 0:
            return 0
        if max_output_length is None:
            max_output_length = self.max_output_length
        if max_output_length is None:
            max_output_length = source_length + self.extra_output_length
        if self.target_max_length is not None:
            max_output_length = min(max_output_length, self.target_max_length)
        return max_output_length

    def check_source_ids(self, source_ids):
        """``source_ids`` as lists of int, or ``ValueError`` for a source with
        padding, one longer than the model's ``max_length``, or an id
        outside its vocabulary."""
        sources = [[int(i) for i in row] for row in source_ids]
        limit, vocabulary = self.source_max_length, self.source_vocabulary_size
        for row in sources:
            if limit is not None and len(row) > limit:
                raise ValueError(
                    f"A source has {len(row)} tokens, more than the model's "
                    f"max_length={limit}."
                )
            if self.pad_id in row:
                raise ValueError(
                    f"Source ids must not contain padding ({self.pad_id})."
                )
            if vocabulary is not None and any(not 0 <= i < vocabulary for i in row):
                raise ValueError(
                    f"Source ids must be in [0, {vocabulary}). Received: {row}"
                )
        return sources

    def _limits(self, sources, search):
        return [
            self.output_limit(
                len(row) - (1 if row and row[-1] == self.end_id else 0),
                search.max_output_length,
            )
            for row in sources
        ]

    def constraint_ids(self, texts, glossary=None, constraints=None):
        """Per text, the target-id phrases its translation must hold (from
        ``glossary`` and ``constraints``, as ``translate`` takes them), or
        None for none; ``ValueError`` from an engine that cannot constrain
        its search (``takes_constraints``)."""
        if glossary is None and constraints is None:
            return None
        if not self.takes_constraints:
            raise ValueError(
                f"{self.engine} cannot follow a glossary or constraints (its "
                "search has no constraints); translate with the .keras model."
            )
        self.check_tokenizer()
        return constraint_ids(self.tokenizer, check_texts(texts), glossary, constraints)

    takes_constraints = False

    def _decode(self, source_ids, search, top_n=None, constraints=None):
        sources = self.check_source_ids(source_ids)
        limits = self._limits(sources, search)
        progress = Progress(len(sources)) if search.verbose else None
        results = scheduler.in_length_order(
            sources,
            lambda order: self._search_sorted(
                [sources[i] for i in order],
                [limits[i] for i in order],
                search,
                top_n,
                progress.update if progress is not None else _ignore,
                None if constraints is None else [constraints[i] for i in order],
            ),
        )
        if constraints is not None:
            warn_missing(results, constraints, limits)
        return results

    def _search_sorted(self, sources, limits, search, top_n, report, constraints=None):
        """``search_ids_sorted`` with each source's output limit given and
        progress reported (``report(sources done)``): the sources cut into
        batches (``scheduler.in_batches``) that the engine searches
        (``_search_batches``). A source whose limit is 0 (an empty one) is
        answered without a search: the empty translation, scored 0."""
        kept = [i for i, limit in enumerate(limits) if limit > 0]
        outputs = [[([], 0.0)] for _ in sources]
        if not kept:
            report(len(sources))
            return outputs
        empty = len(sources) - len(kept)

        def batches_of(cut):  # the positions in sources of each batch
            for batch in cut:
                yield Batch(
                    [sources[i] for i in batch],
                    [limits[i] for i in batch],
                    None if constraints is None else [constraints[i] for i in batch],
                )

        found = scheduler.in_batches(
            kept,
            search.batch_size_or(self.default_batch_size),
            lambda cut: self._search_batches(batches_of(cut), search, top_n),
            report=lambda done: report(done + empty),
        )
        for i, output in zip(kept, found, strict=True):
            outputs[i] = output
        return outputs

    # -- sources sorted and checked by the caller (kt-serve) -----------------------

    def search_ids_sorted(self, sources, search, top_n=None, constraints=None):
        """Search encoded sources that the caller has sorted by length
        (shortest first) and checked as ``check_source_ids`` does: they are
        neither sorted nor checked again (a server sorts each batch once,
        and its requests' ids were checked when they were admitted).

        Args:
            sources: list of lists of int, each ending with the end id.
            search: a ``SearchOptions`` (``batch_size`` None: the engine's
                default); ``verbose`` is not read.
            top_n: how many of the best hypotheses must be exact (None: all
                ``beam_size``; 1 for ``translate``'s, ``n`` for ``n_best``'s).
            constraints: optional, per source, the id phrases its
                translation must hold (``constraint_ids``); rows with none
                may be ``[]``. The caller checks the outputs
                (``translate.constraints.missing``).

        Returns:
            one list per source, in the order of ``sources``, of hypotheses
            ``(ids, score)``, best first, as ``decode_ids`` gives them.
        """
        limits = self._limits(sources, search)
        if constraints is not None and not any(constraints):
            constraints = None
        # Positional, as in _decode: one form of call for whoever wraps it.
        return self._search_sorted(sources, limits, search, top_n, _ignore, constraints)


def _ignore(done):
    pass
