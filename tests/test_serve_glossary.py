"""Glossaries in ``kt-serve``, over real HTTP on 127.0.0.1: the numbers
fixture served by the real command (``tests/serve_harness.py``, whose
"sleep:S" texts hold the search thread so that requests queue together).

Checked: a request's glossary puts its target terms in the translations, as
``Translator.translate(glossary=...)`` does, and the answer lists the terms
each translation missed; a request without one (absent or null) is answered
as before, in both APIs; requests with and without glossaries arriving
together are answered as if alone (constrained requests share a batch with
one another only); LibreTranslate's ``/translate`` takes the field, with
HTML and alternatives; a malformed glossary or one over a limit is a 4xx
naming it; the glossary counts in the request's cost; nothing compiles
after warm-up; the page sends its glossary box; a CTranslate2 export
refuses glossaries in one line. Without a server: a missed term is
reported for its own text through the batch's sort, and the options.

In the JAX run when there is one: compilations are counted there (PyTorch
compiles nothing, so its count would say nothing).
"""

import concurrent.futures
import os
import time
import types

import pytest

from keras_transformer.translate.evaluation import load_translator
from tests.test_serve import FIXTURE, Server

pytestmark = pytest.mark.once("jax")

GLOSSARY = {"thirty": "dreissig"}  # 8 target tokens in the fixture's vocabulary
PAIR = {"source": "en", "target": "de"}
MAX_COST = 512
MAX_TOKENS = 8  # one constraint width to compile: a shorter warm-up
MAX_ENTRIES = 50


@pytest.fixture(scope="module")
def translator():
    return load_translator(FIXTURE)


@pytest.fixture(scope="module")
def server():
    running = Server(
        "tests.serve_harness", "--model", FIXTURE, "--source-lang", "en",
        "--target-lang", "de", "--beam-sizes", "4", "--max-wait-ms", "50",
        "--max-request-cost", str(MAX_COST),
        "--glossary-max-tokens", str(MAX_TOKENS),
        "--glossary-max-entries", str(MAX_ENTRIES),
    )  # fmt: skip
    yield running
    assert running.stop() == 0, "".join(running.stderr)


def test_a_glossary_puts_its_terms_in_the_translations(server, translator):
    texts = ["thirty", "seven"]
    expected = translator.translate(texts, glossary=GLOSSARY)
    # The glossary changes the translation: the model alone writes "ß".
    assert (expected[0], translator.translate(["thirty"])) == ("dreissig", ["dreißig"])
    status, _, health = server.request("GET", "/health")
    assert (status, health["glossary"]) == (200, True)
    status, _, body = server.translate(texts, glossary=GLOSSARY)
    assert status == 200, body
    assert (body["translations"], body["glossary_missed"]) == (expected, [[], []])
    # Absent or null: the answer of a server without glossaries.
    _, _, absent = server.translate(texts)
    _, _, null = server.translate(texts, glossary=None)
    assert absent == null
    assert set(absent) == {"translations", "model", "version"}
    assert absent["translations"] == translator.translate(texts)
    # No term of the glossary in the text: nothing to hold, nothing missed.
    _, _, unused = server.translate(["seven"], glossary=GLOSSARY)
    assert (unused["translations"], unused["glossary_missed"]) == (["sieben"], [[]])


def test_requests_with_and_without_glossaries_are_answered_as_if_alone(
    server, translator
):
    """Three requests queue behind a slow batch: the two with glossaries
    share the next batch, each text with its own terms through the sort;
    the one without has its own, answered as without glossaries."""
    other = {"seven": "acht"}
    before = server.metric("kt_serve_batch_sentences_count")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        slow = pool.submit(server.translate, ["sleep:1.5"])
        time.sleep(0.5)  # the slow batch runs
        calls = [
            pool.submit(server.translate, ["thirty", "seven"], glossary=GLOSSARY),
            pool.submit(server.translate, ["seven"], glossary=other),
            pool.submit(server.translate, ["seven", "thirty"]),
        ]
        answers = [call.result()[2] for call in calls]
        assert slow.result()[0] == 200
    assert answers[0]["translations"] == translator.translate(
        ["thirty", "seven"], glossary=GLOSSARY
    )
    assert answers[1]["translations"] == ["siebenacht"]
    assert answers[1]["translations"] == translator.translate(["seven"], glossary=other)
    assert answers[2]["translations"] == translator.translate(["seven", "thirty"])
    assert "glossary_missed" not in answers[2]
    # The slow batch, the two with glossaries, the one without.
    assert server.metric("kt_serve_batch_sentences_count") - before == 3


def test_libretranslate_takes_the_glossary_field(server, translator):
    texts = ["thirty", "seven"]
    expected = translator.translate(texts, glossary=GLOSSARY)
    _, _, one = server.request(
        "POST", "/translate", {"q": "thirty", "glossary": GLOSSARY, **PAIR}
    )
    assert one == {"translatedText": "dreissig", "glossaryMissed": []}
    _, _, listed = server.request(
        "POST", "/translate", {"q": texts, "glossary": GLOSSARY, **PAIR}
    )
    assert listed == {"translatedText": expected, "glossaryMissed": [[], []]}
    _, _, plain = server.request("POST", "/translate", {"q": texts, **PAIR})
    assert plain == {"translatedText": translator.translate(texts)}
    _, _, html = server.request(
        "POST", "/translate",
        {"q": "<p>thirty <b>seven</b></p>", "format": "html", "glossary": GLOSSARY,
         **PAIR},
    )  # fmt: skip
    assert html == {
        "translatedText": f"<p>{expected[0]} <b>{expected[1]}</b></p>",
        "glossaryMissed": [],
    }
    best = translator.n_best(["thirty"], n=2, glossary=GLOSSARY)[0]
    _, _, alternatives = server.request(
        "POST", "/translate",
        {"q": "thirty", "alternatives": 1, "glossary": GLOSSARY, **PAIR},
    )  # fmt: skip
    assert alternatives == {
        "translatedText": best[0][0],
        "alternatives": [best[1][0]],
        "glossaryMissed": [],
    }


TWO_TERMS = {"thirty": "dreissig", "seven": "sieben"}  # 8 + 1 tokens
BAD = [
    ({"glossary": ["thirty", "dreissig"]}, 400, "glossary must be an object"),
    ({"glossary": {"thirty": 30}}, 400, "glossary['thirty'] must be a string"),
    ({"glossary": {"": "dreissig"}}, 400, "glossary['']: the source term is empty"),
    ({"glossary": {"thirty": " "}}, 400, "the target term is empty"),
    ({"glossary": {"thirty": "drei\tssig"}}, 400, "holds a tab or a line break"),
    (
        {"glossary": {"Thirty": "dreissig", " thirty": "vierzig"}},
        400,
        "glossary[' thirty']: the same source term as glossary['Thirty']",
    ),
    ({"glossary": {"thirty": "Hund"}}, 400, "glossary: the target term 'Hund' has"),
    # A term is quoted 40 characters long at most, as any value sent.
    ({"glossary": {"thirty": "Q" * 99}}, 400, f"term '{'Q' * 40}…' has"),
    ({"glossary": {"thirty\ud800": "x"}}, 400, "not valid Unicode"),
    ({"glossary": {str(i): "x" for i in range(51)}}, 413, "glossary has 51 entries"),
    ({"glossary": {"a" * 101: "x"}}, 413, "source term is 101 characters long"),
    ({"glossary": {"thirty": "x" * 101}}, 413, "target term is 101 characters"),
    ({"glossary": TWO_TERMS}, 413, "uses glossary terms of 9 target tokens"),
]


def test_a_bad_glossary_is_a_4xx_naming_it_in_either_api(server, translator):
    for extra, status, words in BAD:
        for body in (
            {"texts": ["thirty seven"], **extra},
            {"q": "thirty seven", **PAIR, **extra},
            {"text": "thirty seven", **extra},
        ):
            path = "/explain" if "text" in body else "/translate"
            got, _, answer = server.request("POST", path, body)
            assert (got, words in answer["error"]) == (status, True), (body, answer)
            assert "\n" not in answer["error"] and len(answer["error"]) < 400
    # A form field is a string: the message says to send JSON.
    form = "q=thirty&source=en&target=de&glossary=thirty%3Ddreissig"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    got, _, answer = server.request("POST", "/translate", form, headers)
    assert got == 400 and "not a string (a form or query field" in answer["error"]
    assert server.translate(["thirty"], glossary=GLOSSARY)[2]["translations"] == [
        "dreissig"
    ]


def test_a_glossary_counts_in_the_request_cost(server, translator):
    """Each glossary token costs two source tokens: eight texts fit the
    cost without their glossary, not with it."""
    texts = ["thirty"] * 8
    tokens = sum(len(ids) for ids in translator.tokenizer.encode(texts))
    held = 8 * len(translator.constraint_ids(["thirty"], glossary=GLOSSARY)[0][0])
    beam = server.request("GET", "/health")[2]["beam_size"]
    assert tokens * beam <= MAX_COST < (tokens + 2 * held) * beam
    assert server.translate(texts)[0] == 200
    status, _, answer = server.translate(texts, glossary=GLOSSARY)
    assert status == 413, answer
    assert (
        f"({tokens} source tokens + 2 × {held} glossary tokens) × beam_size "
        f"{beam} = {(tokens + 2 * held) * beam}; this server takes at most "
        f"{MAX_COST}" in answer["error"]
    )


def test_nothing_compiles_for_a_glossary_after_warm_up(server):
    """Sources of every width, the best and the n best, with the widest
    constraints a text may bring."""
    for words in (1, 2, 4, 8):  # 8 to 57 source tokens: widths 8 to 64
        text = " ".join(["thirty"] * words)
        status, _, answer = server.translate([text], glossary=GLOSSARY)
        assert status == 200 and answer["glossary_missed"] == [[]], answer
        body = {"q": text, "alternatives": 2, "glossary": GLOSSARY, **PAIR}
        assert server.request("POST", "/translate", body)[0] == 200
        body = {"text": text, "glossary": GLOSSARY}
        status, _, explained = server.request("POST", "/explain", body)
        assert status == 200 and explained["glossary_missed"] == []
    assert server.metric("kt_serve_compilations_after_warm_up") == 0


def test_the_page_sends_its_glossary_box(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests import browser

    driver = browser.chromium()
    try:
        driver.get(f"http://{server.host}:{server.port}/")
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#beam option"))
        assert driver.find_element(By.ID, "glossary").is_displayed()
        driver.find_element(By.ID, "glossary").send_keys("# numbers\nthirty = dreissig")
        driver.find_element(By.ID, "source").send_keys("thirty")
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_element(By.ID, "translation").text)
        translation = driver.find_element(By.ID, "translation").text
        browser.screenshot(driver, tmp_path, "page-glossary")
        driver.find_element(By.ID, "glossary").send_keys("\nseven")
        driver.find_element(By.ID, "translate").click()
        error = wait.until(lambda d: d.find_element(By.ID, "error").text)
    finally:
        driver.quit()
    assert translation == "dreissig"
    assert error.startswith("glossary line 3:"), error
    assert os.path.getsize(tmp_path / "page-glossary.png") > 1000


def test_a_ctranslate2_export_refuses_a_glossary_in_one_line(translator, tmp_path):
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    path = export_ctranslate2(translator, tmp_path / "numbers")
    running = Server(
        "keras_transformer.cli.serve", "--model", str(path), "--source-lang", "en",
        "--target-lang", "de",
    )  # fmt: skip
    try:
        health = running.request("GET", "/health")[2]
        refused = [
            running.translate(["thirty"], glossary=GLOSSARY),
            running.request(
                "POST", "/translate", {"q": "thirty", "glossary": {}, **PAIR}
            ),
        ]
        plain = running.translate(["thirty"])
    finally:
        status = running.stop()
    assert health["glossary"] is False
    for got, _, answer in refused:
        assert got == 400, answer
        assert "cannot follow a glossary" in answer["error"], answer
        assert "\n" not in answer["error"]
    assert plain[0] == 200 and "glossary_missed" not in plain[2]
    assert status == 0, "".join(running.stderr)


class Recording:
    """An engine whose best translation is ``[5, 6]`` for every source; it
    records the constraints it is given."""

    takes_constraints = True
    engine = "recording"

    def __init__(self):
        self.given = []

    def search_ids_sorted(self, sources, search, top_n=None, constraints=None):
        self.given.append(constraints)
        return [[([5, 6, 2], 0.0)] for _ in sources]

    def detokenize(self, rows):
        return [f"{len(row)} ids" for row in rows]


def test_a_missed_term_is_reported_for_its_own_text():
    """The longer source comes first in the request and second in the
    search: each text's phrases travel with it, and the terms its
    translation lacks come back in the request's order."""
    from keras_transformer.search.options import SearchOptions
    from keras_transformer.serving.glossaries import split_missed
    from keras_transformer.serving.requests import TranslateRequest
    from keras_transformer.serving.searcher import Searcher
    from keras_transformer.serving.settings import Settings

    counter = types.SimpleNamespace(inc=lambda n: None)
    searcher = Searcher(None, Settings(), types.SimpleNamespace(dropped=counter))
    searcher.translator = engine = Recording()
    search = SearchOptions(batch_size=8)
    request = TranslateRequest(
        texts=["a b", "c"], sources=[[1, 1, 1, 2], [3, 2]], search=search,
        terms=[["T1", "T2"], ["T3"]], constraints=[[[5, 6], [7]], [[6, 5]]],
    )  # fmt: skip
    items = list(zip(request.sources, request.constraints, strict=True))
    results = searcher.search(items, (search, None, True), lambda: [True, True])
    assert engine.given == [[[[6, 5]], [[5, 6], [7]]]]
    assert split_missed(request, results) == (["3 ids"] * 2, [["T2"], ["T3"]])


def test_glossary_options_and_a_server_that_takes_none():
    from keras_transformer.cli import serve as kt_serve
    from keras_transformer.serving.glossaries import constrain
    from keras_transformer.serving.requests import Limits, RequestError

    parse = kt_serve.parser().parse_args
    settings = kt_serve.settings(
        parse(["--model", "m", "--glossary-max-tokens", "0",
               "--glossary-max-entries", "5", "--glossary-max-term-chars", "9"])
    )  # fmt: skip
    assert (
        settings.glossary_max_tokens,
        settings.glossary_max_entries,
        settings.glossary_max_term_chars,
    ) == (0, 5, 9)
    for bad in (["--glossary-max-tokens", "-1"], ["--glossary-max-entries", "0"]):
        with pytest.raises(SystemExit):
            parse(["--model", "m", *bad])
    off = Limits(max_texts=4, max_tokens=20)  # glossary_max_tokens=0
    with pytest.raises(RequestError, match="takes none") as refused:
        constrain(Recording(), off, ["thirty"], GLOSSARY, "texts")
    assert refused.value.status == 400
