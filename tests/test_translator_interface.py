"""One behavioural suite over every engine of the translator interface
(``translate.base.TranslatorBase``): the Keras ``Translator``, the
``CTranslate2Translator`` of its export, and a rule written in this file
(a third engine is one class: an encoder of nothing, a "search" that copies
its source), which checks what the base does around any engine's search.

The trained number-task translator of 0.2.0 (tests/fixtures/v0_2_0) is the
model; test_export_ctranslate2.py compares the two real engines' outputs
token for token. Once: the suite is about what the base does around an
engine; the Keras engine's search on each backend is test_translator.py's
and test_compat.py's.
"""

import gc
import inspect
import os
import warnings

import pytest

from keras_transformer.data.numbers import english
from keras_transformer.data.sentencepiece import SentencePiece
from keras_transformer.saving import load_model
from keras_transformer.search.options import SearchOptions
from keras_transformer.translate.base import TranslatorBase

FIXTURE = os.path.join(
    os.path.dirname(__file__), "fixtures", "v0_2_0", "translator.keras"
)
TEXTS = [english(n) for n in (7, 42, 1999, 300000, 15, 888888)]
FAST = dict(beam_size=2, max_output_length=12)

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def keras_engine():
    with warnings.catch_warnings():
        # keras-hub 0.32 leaves the vocabulary asset open (test_compat.py).
        warnings.simplefilter("ignore", ResourceWarning)
        translator = load_model(FIXTURE)
        gc.collect()
    return translator


class CopyEngine(TranslatorBase):
    """An engine that "translates" a sentence into itself: each hypothesis
    is the source's pieces, the k-th one cut by k tokens, scored -k. It
    records what the base hands its search."""

    def __init__(self, proto, source_max_length=64, target_max_length=64):
        self.tokenizer = SentencePiece(proto)
        self.source_max_length = source_max_length
        self.target_max_length = target_max_length
        self.max_output_length = None
        self.source_vocabulary_size = self.tokenizer.vocabulary_size()
        self.calls = []

    @property
    def engine(self):
        return "copy"

    @property
    def default_batch_size(self):
        return 3

    def _search_batches(self, batches, search, top_n):
        for batch in batches:
            self.calls.append((batch.sources, batch.limits, search.batch_size_or(3)))
            results = []
            for source, limit in zip(batch.sources, batch.limits, strict=True):
                body = source[:-1][: limit - 1] + [self.end_id]
                results.append(
                    [
                        (body[: len(body) - k] or body, -float(k))
                        for k in range(search.beam_size)
                    ]
                )
            yield results


@pytest.fixture(scope="module", params=["keras", "ctranslate2", "copy"])
def engine(request, keras_engine, tmp_path_factory):
    if request.param == "keras":
        return keras_engine
    if request.param == "copy":
        return CopyEngine(keras_engine.tokenizer.proto)
    from keras_transformer.export.ctranslate2 import (
        export_ctranslate2,
        load_ctranslate2,
    )

    folder = tmp_path_factory.mktemp("ct2") / "numbers"
    return load_ctranslate2(export_ctranslate2(keras_engine, folder))


def test_every_engine_is_a_translator_base(engine):
    assert isinstance(engine, TranslatorBase)
    assert isinstance(engine.engine, str) and engine.engine
    assert engine.default_batch_size >= 1


def test_translations_keep_the_callers_order(engine):
    forward = engine.translate(TEXTS, **FAST)
    backward = engine.translate(TEXTS[::-1], **FAST)
    assert len(forward) == len(TEXTS) and all(isinstance(t, str) for t in forward)
    assert backward == forward[::-1]
    assert engine.translate([], **FAST) == []
    # Batches of one and of all give the same answers.
    assert engine.translate(TEXTS, batch_size=1, **FAST) == forward


def test_n_best_is_sorted_and_starts_with_the_translation(engine):
    best = engine.translate(TEXTS[:3], **FAST)
    rows = engine.n_best(TEXTS[:3], n=2, **FAST)
    for row, first in zip(rows, best, strict=True):
        assert len(row) == 2 and row[0][0] == first
        scores = [score for _, score in row]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="n must be between 1 and beam_size=2"):
        engine.n_best(TEXTS[:1], n=3, **FAST)


def test_bad_texts_are_refused_with_their_index(engine):
    with pytest.raises(TypeError, match="not one string"):
        engine.translate("seven")
    with pytest.raises(TypeError, match=r"texts\[1\] must be str, got NoneType"):
        engine.translate(["seven", None])
    with pytest.raises(ValueError, match=r"texts\[0\] cannot be encoded as UTF-8"):
        engine.translate(["\ud800"])
    with pytest.raises(TypeError, match=r"Unknown search options \['beam'\]"):
        engine.translate(["seven"], beam=2)


def test_source_ids_are_checked_the_same_on_every_engine(engine):
    end = engine.end_id
    with pytest.raises(ValueError, match="must not contain padding"):
        engine.decode_ids([[5, 0, end]])
    with pytest.raises(ValueError, match="more than the model's max_length"):
        engine.decode_ids([[5] * (engine.source_max_length + 1)])
    vocabulary = engine.source_vocabulary_size
    with pytest.raises(ValueError, match=rf"Source ids must be in \[0, {vocabulary}\)"):
        engine.decode_ids([[vocabulary, end]])


def test_the_output_limit_is_every_engines(engine):
    assert engine.output_limit(3) == min(3 + 50, engine.target_max_length)
    assert engine.output_limit(3, 4) == 4
    ids = engine.translate_ids(TEXTS, beam_size=1, max_output_length=2)
    assert all(1 <= len(row) <= 2 for row in ids)


def test_long_and_unknown_sources_warn(engine):
    long_text = " ".join([english(777777)] * 20)
    with pytest.warns(UserWarning, match=rf"max_length={engine.source_max_length}"):
        ids = engine.encode_sources([long_text])
    assert len(ids[0]) == engine.source_max_length and ids[0][-1] == engine.end_id
    with pytest.warns(UserWarning, match="never seen"):
        engine.encode_sources(["seven \u4e03"])


def test_source_lengths_count_what_encode_sources_encodes(engine):
    texts = TEXTS + [""]
    assert engine.source_lengths(texts) == [
        len(r) for r in engine.encode_sources(texts)
    ]


def test_search_options_are_one_value(engine):
    options = SearchOptions(beam_size=1, max_output_length=8)
    assert engine.translate(TEXTS[:2], options) == engine.translate(
        TEXTS[:2], beam_size=1, max_output_length=8
    )


def test_the_base_sorts_by_length_and_hands_each_limit(keras_engine):
    copy = CopyEngine(keras_engine.tokenizer.proto, target_max_length=20)
    texts = [english(888888), english(7), english(42)]
    out = copy.translate(texts, beam_size=1)
    assert out[1:] == texts[1:]  # the copy rule, back in the callers' order
    assert texts[0].startswith(out[0]) and len(out[0]) < len(texts[0])  # cut
    ((sources, limits, batch),) = copy.calls
    assert [len(s) for s in sources] == sorted(len(s) for s in sources)
    # §6.1's limit, source length (end token excluded) + 50, capped at 20.
    assert limits == [min(len(s) - 1 + 50, 20) for s in sources]
    assert batch == 3  # the engine's default batch size
    copy.calls.clear()
    copy.translate(texts, beam_size=1, batch_size=2, max_output_length=5)
    # Batches of batch_size, cut from the sorted sources.
    assert [len(s) for s, _, _ in copy.calls] == [2, 1]
    assert [s for batch, _, _ in copy.calls for s in batch] == sources
    assert [limits for _, limits, _ in copy.calls] == [[5, 5], [5]]


def test_an_empty_source_is_answered_without_a_search(keras_engine):
    copy = CopyEngine(keras_engine.tokenizer.proto)
    assert copy.n_best(["", english(7), ""], n=1, beam_size=1) == [
        [("", 0.0)],
        [(english(7), 0.0)],
        [("", 0.0)],
    ]
    ((sources, _, _),) = copy.calls
    assert len(sources) == 1
    copy.calls.clear()
    assert copy.translate(["", ""]) == ["", ""] and copy.calls == []


def test_every_engine_supplies_one_batch_search_of_one_signature():
    """The engines search batches (``_search_batches``, one signature);
    sorting, batching and restoring the order are the base's, through
    ``translate.scheduler``, and no engine redefines them."""
    from keras_transformer.translate.ctranslate2_translator import (
        CTranslate2Translator,
    )
    from keras_transformer.translate.keras_translator import Translator

    signature = inspect.signature(TranslatorBase._search_batches)
    for engine in (Translator, CTranslate2Translator, CopyEngine):
        assert "_search_batches" in vars(engine), engine
        assert inspect.signature(engine._search_batches) == signature, engine
        shared = ("_search_sorted", "_decode", "search_ids_sorted")
        assert not set(shared) & set(vars(engine)), engine
