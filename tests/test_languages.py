"""The language codes a translator records: checked, saved with a
``.keras`` file and a CTranslate2 export, read from an imported
checkpoint's config or name, and reconciled with kt-serve's options."""

import json

import pytest

from keras_transformer.data.languages import (
    check_code,
    check_languages,
    language_name,
    languages_of_name,
)
from keras_transformer.export.marian import tokenizer_config
from keras_transformer.pretrained.preset import checkpoint_languages
from keras_transformer.serving.searcher import languages as _languages
from keras_transformer.translate.evaluation import load_translator
from keras_transformer.translate.keras_translator import Translator
from tests.test_serve import FIXTURE


@pytest.mark.once
@pytest.mark.parametrize("code", ["de", "en", "pt_br", "zh-Hant", "fil"])
def test_language_codes_are_accepted(code):
    assert check_code(code) == code


@pytest.mark.once
@pytest.mark.parametrize(
    "code", ["", "D", "german", "de en", "de/", 7, None, "x" * 500]
)
def test_other_values_are_refused_quoting_a_short_prefix(code):
    with pytest.raises(ValueError, match="language code") as refused:
        check_code(code)
    assert len(str(refused.value)) < 160


@pytest.mark.once
def test_pairs_names_and_checkpoint_names():
    assert check_languages(["de", "en"]) == ("de", "en")
    assert check_languages(None) is None
    for bad in ("de", ("de",), ("de", "en", "fr"), ("de", "English")):
        with pytest.raises(ValueError):
            check_languages(bad)
    assert [language_name(c) for c in ("de", "pt_br", "xx")] == [
        "German",
        "Portuguese",
        "xx",
    ]
    assert languages_of_name("opus-mt-de-en") == ("de", "en")
    assert languages_of_name("models--Helsinki-NLP--opus-mt-en-zh_Hant") == (
        "en",
        "zh_Hant",
    )
    assert languages_of_name("opus-mt-en-ROMANCE") is None
    assert languages_of_name("translator") is None


@pytest.mark.once
def test_an_imported_checkpoint_takes_its_config_then_its_name(tmp_path):
    named = tmp_path / "models--Helsinki-NLP--opus-mt-fr-de" / "snapshots" / "0a1b"
    named.mkdir(parents=True)
    assert checkpoint_languages(str(named)) == ("fr", "de")
    (named / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "fra", "target_lang": "deu"})
    )
    assert checkpoint_languages(str(named)) == ("fra", "deu")
    plain = tmp_path / "checkpoint"
    plain.mkdir()
    (plain / "tokenizer_config.json").write_text(json.dumps({"source_lang": None}))
    assert checkpoint_languages(str(plain)) is None


@pytest.fixture(scope="module")
def fixture_translator():
    return load_translator(FIXTURE)


def test_a_translator_saves_its_languages(fixture_translator, tmp_path):
    # A 0.2.0 file records none.
    assert fixture_translator.languages is None
    translator = Translator(
        fixture_translator.tokenizer,
        fixture_translator.transformer,
        languages=("en", "de"),
    )
    translator.save(tmp_path / "t.keras")
    assert load_translator(tmp_path / "t.keras").languages == ("en", "de")
    config = tokenizer_config(
        translator.transformer, _Vocabulary(), translator.languages
    )
    assert (config["source_lang"], config["target_lang"]) == ("en", "de")
    with pytest.raises(ValueError, match="the target language"):
        Translator(
            fixture_translator.tokenizer,
            fixture_translator.transformer,
            languages=("en", "Deutsch"),
        )


class _Vocabulary:
    files = {}


@pytest.mark.once
def test_a_ctranslate2_export_carries_the_languages(fixture_translator, tmp_path):
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.translate.ctranslate2_translator import load_ctranslate2

    translator = Translator(
        fixture_translator.tokenizer,
        fixture_translator.transformer,
        languages=("en", "de"),
    )
    path = export_ctranslate2(translator, tmp_path / "ct2")
    assert load_ctranslate2(path).languages == ("en", "de")


@pytest.mark.once
def test_kt_serve_options_fill_in_missing_languages_and_never_contradict():
    class Engine:
        languages = None

    assert _languages(Engine(), ("en", "de")) == ("en", "de")
    assert _languages(Engine(), None) is None
    Engine.languages = ("en", "de")
    assert _languages(Engine(), None) == ("en", "de")
    assert _languages(Engine(), ("en", "de")) == ("en", "de")
    with pytest.raises(ValueError, match="translates en → de, but"):
        _languages(Engine(), ("fr", "de"))
