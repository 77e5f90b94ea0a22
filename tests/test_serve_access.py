"""``kt-serve`` with API keys, a request limit and a character limit, over
real HTTP on 127.0.0.1, once (keys and limits are the server's, whatever the
backend): a real LibreTranslate client (``libretranslatepy``) and a real
browser (headless chromium) as callers.

Checked: a key in the clear and a hashed one are accepted and translate as
offline; a missing or wrong key is a 403 in LibreTranslate's error shape,
for the API, the metrics and the page; a caller over its rate gets 429 with
Retry-After while another key's answers are unchanged; a request over the
character limit is a 413 naming it; the metrics count by key without
showing it; the page works with a key typed once; a non-loopback host
without keys, and a bad key file, stop the command before the model loads.
"""

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import urllib.error

import numpy as np
import pytest

from keras_transformer.translate.base import TranslatorBase
from keras_transformer.translate.evaluation import load_translator
from tests import browser
from tests.test_serve import FIXTURE, ROOT, SENTENCES, Server, libretranslate

KEYS = {"clear": "alpha-7f3c9e", "hashed": "bravo-51d2aa", "flood": "charlie-0b8e4d"}
REQ_LIMIT = 20
CHAR_LIMIT = 120

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def translator():
    return load_translator(FIXTURE)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    digest = hashlib.sha256(KEYS["hashed"].encode()).hexdigest()
    path = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    path.write_text(
        f"# kt-serve's keys\n{KEYS['clear']}\n\nsha256:{digest}\n  {KEYS['flood']}  \n"
    )
    return path


@pytest.fixture(scope="module")
def server(key_file):
    running = Server(
        "tests.serve_harness", "--model", FIXTURE, "--source-lang", "en",
        "--target-lang", "de", "--api-keys", str(key_file),
        "--req-limit", str(REQ_LIMIT), "--char-limit", str(CHAR_LIMIT),
        "--beam-sizes", "4",  # the one these tests use: a shorter warm-up
    )  # fmt: skip
    yield running
    assert running.stop() == 0, "".join(running.stderr)


def refusal(call):
    """``(status, error body)`` of a client call that must be refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        call()
    return refused.value.code, json.loads(refused.value.read())


def test_keys_in_the_clear_and_hashed_translate_as_offline(server, translator):
    expected = translator.translate(SENTENCES[:4])
    for key in (KEYS["clear"], KEYS["hashed"]):
        got = [
            libretranslate(server, key).translate(text, "en", "de")
            for text in SENTENCES[:4]
        ]
        assert got == expected
    assert libretranslate(server, KEYS["clear"]).languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_a_missing_or_wrong_key_is_403_everywhere(server):
    for key in (None, "alpha", KEYS["clear"] + "x", f"sha256:{'0' * 64}"):
        status, body = refusal(
            lambda key=key: libretranslate(server, key).translate("seven", "en", "de")
        )
        assert status == 403 and "API key" in body["error"], body
    status, _, body = server.request("POST", "/explain", {"text": "seven"})
    assert status == 403 and "API key" in body["error"]
    status, _, body = server.request("GET", "/metrics")
    assert status == 403 and "API key" in body["error"]
    # The hashed line of the file is its digest: the digest itself is no key.
    digest = hashlib.sha256(KEYS["hashed"].encode()).hexdigest()
    status, _, _ = server.translate(["seven"], api_key=digest)
    assert status == 403


def test_metrics_count_by_key_without_showing_it(server):
    status, _, _ = server.translate(["seven"], api_key=KEYS["hashed"])
    assert status == 200
    status, _, text = server.request(
        "GET", "/metrics", headers={"Authorization": f"Bearer {KEYS['clear']}"}
    )
    text = text.decode()
    assert status == 200
    # The hashed key is the file's fourth line.
    assert 'kt_serve_caller_requests_total{caller="key4",code="200"}' in text
    assert 'caller="anonymous",code="403"' in text
    for key in KEYS.values():
        assert key not in text
        assert hashlib.sha256(key.encode()).hexdigest()[:16] not in text


def test_the_character_limit_is_a_413_naming_it(server):
    text = "one " * 40  # 160 characters
    status, body = refusal(
        lambda: libretranslate(server, KEYS["clear"]).translate(text, "en", "de")
    )
    assert status == 413 and f"at most {CHAR_LIMIT} (--char-limit)" in body["error"]


def test_a_caller_over_its_rate_gets_429_and_the_others_are_answered(
    server, translator
):
    """The flooding key's requests ask for a pair the model cannot serve
    (a 400, answered after the rate is checked, and at once): the first
    REQ_LIMIT get it, the rest 429; meanwhile another key translates."""
    flood = [
        lambda: server.request(
            "POST",
            "/translate",
            {"q": "seven", "source": "en", "target": "fr", "api_key": KEYS["flood"]},
        )  # fmt: skip
        for _ in range(REQ_LIMIT + 10)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        other = [
            pool.submit(server.translate, [text], api_key=KEYS["clear"])
            for text in SENTENCES[:4]
        ]
        flooded = [call() for call in flood]
        answers = [future.result() for future in other]
    statuses = [status for status, _, _ in flooded]
    # A bucket refills one token every 60 / REQ_LIMIT = 3 s.
    assert REQ_LIMIT <= statuses.count(400) <= REQ_LIMIT + 1, statuses
    assert statuses.count(429) == len(flood) - statuses.count(400)
    _, headers, body = flooded[-1]
    assert int(headers["retry-after"]) >= 1 and "Too many requests" in body["error"]
    assert [status for status, _, _ in answers] == [200] * 4
    assert [body["translations"][0] for _, _, body in answers] == translator.translate(
        SENTENCES[:4]
    )


def test_the_page_works_with_a_key(server, translator, tmp_path):
    """Wrong key: the page says why in words; the right key, typed once and
    kept for the tab: the translation equals the API's, and the heat map is
    the attention of kt.attention_maps (last layer, mean of the heads)."""
    import keras_transformer as kt

    url = f"http://{server.host}:{server.port}/"
    text = SENTENCES[0]
    _, _, api = server.translate([text], api_key=KEYS["clear"])
    driver = browser.chromium()
    try:
        translation, error = browser.translate_on_page(driver, url, text, key="nope")
        assert translation == "" and "403" in error and "Invalid API key" in error
        translation, error = browser.translate_on_page(
            driver, url, text, key=KEYS["clear"]
        )
        assert (translation, error) == (api["translations"][0], "")
        rows, columns, row_labels, column_labels = browser.heat_map_shape(driver)
        weights = browser.cell_weights(driver)
        browser.screenshot(driver, tmp_path, "page-with-key")
        driver.refresh()  # the key stays in the tab's session storage
        kept = browser.wait_for(
            driver, "return document.getElementById('api-key').value"
        )
    finally:
        driver.quit()
    maps = kt.attention_maps(translator, text, translation)
    assert (row_labels, column_labels) == (maps.target_tokens, maps.source_tokens)
    assert rows == len(maps.target_tokens)
    assert columns == [len(maps.source_tokens)] * rows
    np.testing.assert_allclose(weights, maps.cross_attention[-1].mean(0), atol=1e-5)
    assert kept == KEYS["clear"]
    assert os.path.getsize(tmp_path / "page-with-key.png") > 1000


def test_a_public_host_without_keys_and_a_bad_key_file_stop_before_loading(
    tmp_path,
):
    bad = tmp_path / "keys.txt"
    bad.write_text("good-key\nsha256:12ab\n")
    cases = [
        (["--host", "0.0.0.0"], "give --api-keys FILE, or --allow-anonymous"),
        (["--api-keys", str(bad)], "keys.txt, line 2: a hashed key is sha256:"),
        (["--api-keys", str(tmp_path / "none.txt")], "none.txt: cannot read"),
        (["--source-lang", "en"], "give both --source-lang and --target-lang"),
    ]
    command = [sys.executable, "-m", "keras_transformer.cli.serve", "--model", FIXTURE]
    for args, words in cases:
        done = subprocess.run(
            command + args + ["--port", "0"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and done.stdout == "", (args, done)
        assert words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_key_file_is_read_and_its_mistakes_named(tmp_path):
    from keras_transformer.serving.access import KeyFileError, KeyRing

    path = tmp_path / "keys.txt"
    digest = hashlib.sha256(b"zwei").hexdigest()
    path.write_text(f"# keys\neins\n\nsha256:{digest.upper()}\n")
    ring = KeyRing.read(path)
    assert len(ring) == 2
    assert [ring.name_of(k) for k in ("eins", "zwei", "drei", "", None, 7)] == [
        "key2", "key4", None, None, None, None,
    ]  # fmt: skip
    assert ring.name_of(f"sha256:{digest}") is None
    for text, words in [
        ("eins\neins\n", "line 2: the same key as key1"),
        (f"eins\nsha256:{digest}\nzwei\n", "line 3: the same key as key2"),
        ("sha256:xyz\n", "line 1: a hashed key is sha256: and 64 hex digits"),
        ("# only a comment\n\n", "no API keys in the file"),
    ]:
        path.write_text(text)
        with pytest.raises(KeyFileError, match=words) as refused:
            KeyRing.read(path)
        assert "keys.txt" in str(refused.value)


def test_the_rate_limiter_is_a_token_bucket_per_caller():
    from keras_transformer.serving.access import RateLimiter

    now = [0.0]
    limiter = RateLimiter(3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 20]
    assert limiter.take("b") == 0  # another caller's bucket is full
    now[0] = 19.0
    assert limiter.take("a") == 1  # 0.95 of a token: one more second
    now[0] = 20.0
    assert limiter.take("a") == 0
    now[0] = 1000.0  # a long pause refills to the burst, not beyond
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 20]
    limiter.SWEEP_AT = 2
    limiter.take("c")  # "b", full again, is forgotten; "a" is not
    assert set(limiter._buckets) == {"a", "c"}
    for bad, error in ((0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error):
            RateLimiter(bad)


class LengthTokenizer:
    """Each text's "ids": its length and the end id; the target languages
    Spanish and French."""

    target_languages = ("es", "fr")

    def encode(self, texts):
        return [[len(text), 2] for text in texts]


class SeveralTargets(TranslatorBase):
    tokenizer = LengthTokenizer()


def test_a_model_into_several_languages_serves_each_of_its_targets():
    from keras_transformer.serving.app import Service
    from keras_transformer.serving.libretranslate import (
        languages_answer,
        parse_libretranslate,
    )
    from keras_transformer.serving.requests import Limits, RequestError

    def encode(texts, target_language):
        # The target-language token's id, a piece's, the end id.
        return [[target_language, 4, 2] for _ in texts]

    limits = Limits(max_texts=4, max_tokens=20)
    request = parse_libretranslate(
        {"q": ["eins", "zwei"], "source": "de", "target": "fr"},
        limits, encode, ("de", "mul"), ("es", "fr"),
    )  # fmt: skip
    assert (request.texts, request.target_language, request.n) == (
        ["eins", "zwei"], "fr", None,
    )  # fmt: skip
    assert request.sources == [["fr", 4, 2]] * 2
    assert request.answer(["un", "deux"]) == {"translatedText": ["un", "deux"]}
    with pytest.raises(RequestError, match="de → es, de → fr"):
        parse_libretranslate(
            {"q": "eins", "source": "de", "target": "mul"},
            limits, encode, ("de", "mul"), ("es", "fr"),
        )  # fmt: skip
    with pytest.raises(RequestError, match="parses at most 100000") as refused:
        parse_libretranslate(
            {"q": ["<p>eins</p>" * 6000] * 2, "source": "de", "target": "es",
             "format": "html"},
            limits, encode, ("de", "mul"), ("es", "fr"),
        )  # fmt: skip
    assert refused.value.status == 413
    # The server's encoder leads each text with its target-language token,
    # and refuses, as the client's error, a request that names none.
    service = Service(lambda: None, "m", "0")
    service.translator = SeveralTargets()
    try:
        assert service._encode(["eins"], "fr") == [[len(">>fr<< eins"), 2]]
        with pytest.raises(RequestError, match="give target_language") as refused:
            service._encode(["eins"])
    finally:
        service.executor.shutdown()
    assert refused.value.status == 400
    assert languages_answer(("de", "mul"), ("es", "fr")) == [
        {"code": "de", "name": "German", "targets": ["es", "fr"]},
        {"code": "es", "name": "Spanish", "targets": []},
        {"code": "fr", "name": "French", "targets": []},
    ]


def test_the_serving_options_become_settings(capsys):
    from keras_transformer.cli import serve as kt_serve

    parse = kt_serve.parser().parse_args
    args = parse(["--model", "m", "--beam-sizes", "8,2,2", "--source-lang", "de",
                  "--target-lang", "en", "--char-limit", "500"])  # fmt: skip
    settings = kt_serve.settings(args)
    assert (settings.beam_sizes, settings.languages, settings.char_limit) == (
        (2, 8), ("de", "en"), 500,
    )  # fmt: skip
    # --max-beam-size, replaced by --beam-sizes, still bounds them.
    settings = kt_serve.settings(parse(["--model", "m", "--max-beam-size", "3"]))
    assert settings.beam_sizes == (1,)
    assert "--max-beam-size is replaced by --beam-sizes" in capsys.readouterr().err
    for bad in (["--beam-sizes", "0,4"], ["--beam-sizes", "four"],
                ["--source-lang", "Deutsch"], ["--header-timeout", "0"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(["--model", "m", *bad])
    assert [kt_serve.is_loopback(h) for h in ("127.0.0.1", "::1", "localhost")] == [
        True, True, True,
    ]  # fmt: skip
    assert not any(kt_serve.is_loopback(h) for h in ("0.0.0.0", "10.1.2.3", "my.host"))
