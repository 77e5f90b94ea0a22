"""The translator behind a server: loaded and warmed up on the search
thread, the encoding that admits a request's texts, and the search call
the batcher makes.

Warm-up compiles every program an admitted request can reach, so that
nothing compiles on the search thread while others wait: for each admitted
beam size, the search at every source and output width a batch can have;
the n best (LibreTranslate's ``alternatives``, the page's ``/explain``)
share one program per beam size (``top_n``); the constrained searches of
glossaries at every constraint width up to ``--glossary-max-tokens``; and
the attention maps of ``/explain`` at every bucketed shape.
``kt_serve_compilations`` counts what compiled after warm-up: it stays 0.
"""

import sys

from keras_transformer.search.options import SearchOptions
from keras_transformer.serving import glossaries
from keras_transformer.serving.requests import Limits, RequestError
from keras_transformer.translate import scheduler


class Searcher:
    """One translator of the translator interface (``translate.base``).

    Args:
        load: ``load()`` → the translator; run on the search thread.
        settings: the server's ``Settings``.
        metrics: the server's ``Metrics`` (sentences dropped).
    """

    def __init__(self, load, settings, metrics):
        self._load = load
        self.settings = settings
        self.metrics = metrics
        self.state, self.error = "loading", None
        self.translator = None
        self.languages = None
        self.limits = None

    def load_and_warm_up(self):
        """Loads the translator and compiles what requests can reach (on
        the search thread); sets ``limits``, ``languages`` and, last,
        ``translator``."""
        translator = self._load()
        self.languages = languages(translator, self.settings.languages)
        # A call's sentences are sorted by length and searched in groups of
        # search_batch_size, each padded to that many rows: a Keras
        # translator then compiles one search per width and beam size, all
        # of them now, not one of several seconds on the search thread
        # whenever a group of a new size arrives.
        search = translator.search_options(
            batch_size=min(
                self.settings.search_batch_size, self.settings.max_batch_size
            ),
            fixed_batch=True,
        )
        beam_sizes = tuple(sorted({*self.settings.beam_sizes, search.beam_size}))
        self.limits = limits(self.settings, translator, beam_sizes, search)
        # Only an engine that takes constraints is asked to compile them.
        tokens = glossary_tokens(self.settings, translator)
        constrained = {"constraint_tokens": tokens} if tokens else {}
        for beam_size in beam_sizes:
            translator.warm_up(
                SearchOptions.of(search, beam_size=beam_size), **constrained
            )
        if translator.gives_attention:
            translator.warm_up_attention()
        self.translator = translator

    def encode(self, texts, target_language=None):
        """Each text's ids, as they are admitted and then searched: a
        request is encoded once, and only these ids reach the search
        thread. Not cut: a text over the model's length is refused."""
        translator = self.translator
        try:
            texts = translator.with_target_language(texts, target_language)
        except ValueError as error:
            # A model into several languages, asked for none.
            raise RequestError(400, str(error)[:300]) from None
        return translator.tokenizer.encode(texts)

    @property
    def takes_glossaries(self):
        """Whether a request's glossary is followed (the engine constrains
        its search and ``--glossary-max-tokens`` is not 0)."""
        return self.translator is not None and bool(
            glossary_tokens(self.settings, self.translator)
        )

    def constrain(self, texts, glossary, name):
        """A request's glossary as its texts' constraints
        (``glossaries.constrain``; ``RequestError`` for one refused)."""
        return glossaries.constrain(self.translator, self.limits, texts, glossary, name)

    def search(self, sources, options, wanted):
        """The batcher's search call: the sources sorted by length (the one
        sort they get) and searched a group of ``search.batch_size`` at a
        time (``translate.scheduler``), so that the sources of a client
        that has gone meanwhile are skipped, not searched.

        ``options`` is ``(search, n, constrained)``. A constrained batch's
        sources are ``(ids, phrases)`` (the id phrases its translation must
        hold), and its results ``(answer, missed)``: the indexes of the
        phrases the best translation does not hold."""
        search, n, constrained = options
        phrases = None
        if constrained:
            phrases = [row for _, row in sources]
            sources = [ids for ids, _ in sources]

        def still_wanted(group):
            still = wanted()
            flags = [still[i] for i in group]
            self.metrics.dropped.inc(flags.count(False))
            return flags

        return scheduler.schedule(
            sources,
            search.batch_size,
            lambda groups: (
                self._search_group(sources, phrases, group, search, n)
                for group in groups
            ),
            keep=still_wanted,
        )

    def _search_group(self, sources, phrases, group, search, n):
        translator = self.translator
        # Without constraints, the call an engine without them takes.
        extra = {} if phrases is None else {"constraints": [phrases[i] for i in group]}
        found = translator.search_ids_sorted(
            [sources[i] for i in group], search, top_n=top_n(search, n), **extra
        )
        if n is None:
            answers = translator.detokenize([row[0][0] for row in found])
        else:
            answers = translator.n_best_texts(found, n)
        if phrases is None:
            return answers
        return [
            (answer, glossaries.missed_phrases(row[0][0], phrases[i]))
            for i, answer, row in zip(group, answers, found, strict=True)
        ]


def limits(settings, translator, beam_sizes, search):
    """The ``Limits`` of requests to ``translator`` (its beam sizes and
    default search decided)."""
    return Limits(
        max_texts=settings.max_texts,
        max_tokens=translator.source_max_length or sys.maxsize,
        beam_sizes=beam_sizes,
        max_cost=settings.max_request_cost,
        max_chars=settings.char_limit,
        search=search,
        glossary_max_tokens=settings.glossary_max_tokens,
        glossary_max_entries=settings.glossary_max_entries,
        glossary_max_term_chars=settings.glossary_max_term_chars,
    )


def glossary_tokens(settings, translator):
    """The most glossary tokens a text may bring: ``--glossary-max-tokens``,
    or 0 for an engine whose search takes no constraints."""
    return settings.glossary_max_tokens if translator.takes_constraints else 0


def top_n(search, n):
    """The ``top_n`` a search of the ``n`` best (None: the best alone) is
    run with: the best alone has its own program; any n best share the
    one that makes all ``beam_size`` exact, which gives the same first n
    (the beam stops once its top_n best can no longer be outranked), so
    that one program per beam size serves every ``alternatives``."""
    return 1 if n is None else search.beam_size


def languages(translator, asked):
    """The pair the server offers: the translator's, or the one kt-serve
    was given for a translator that records none; a disagreement is an
    error rather than a guess."""
    if asked is None or translator.languages is None:
        return translator.languages or asked
    if tuple(asked) != tuple(translator.languages):
        raise ValueError(
            f"the model translates {' → '.join(translator.languages)}, but "
            f"--source-lang/--target-lang say {' → '.join(asked)}"
        )
    return tuple(asked)
