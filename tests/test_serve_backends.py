"""``kt-serve`` on each backend's run: the real command over real HTTP on
127.0.0.1, its search on this backend, against the same translator offline.

What the server adds around the translator (the HTTP API, LibreTranslate's
fields, the page in a browser, keys and limits, queues, crashes, clients
that leave, stopping with requests in flight) does not depend on the
backend: test_serve.py, test_serve_access.py and test_serve_abuse.py check
it once. Here each backend's engine is served: translations of requests sent
together, LibreTranslate's route, the n best with their scores and
cross-attention of ``POST /explain`` (what the page draws), and SIGTERM's
clean exit.
"""

import numpy as np

import keras_transformer as kt
from keras_transformer.translate.evaluation import load_translator
from tests.test_serve import FIXTURE, SENTENCES, Server, concurrently


def test_this_backend_serves_as_it_translates_offline():
    translator = load_translator(FIXTURE)
    text = SENTENCES[0]
    # The beam size these requests use: one size compiled at warm-up.
    server = Server(
        "keras_transformer.cli.serve", "--model", FIXTURE, "--beam-sizes", "4",
        "--source-lang", "en", "--target-lang", "de",
    )  # fmt: skip
    try:
        _, _, health = server.request("GET", "/health")
        calls = [lambda t=t: server.translate([t]) for t in SENTENCES]
        calls.append(lambda: server.translate(SENTENCES[:3]))
        answers = concurrently(calls)
        libre = server.request(
            "POST", "/translate", {"q": SENTENCES[:2], "source": "en", "target": "de"}
        )
        explained = server.request("POST", "/explain", {"text": text})
    finally:
        status = server.stop()
    assert status == 0, "".join(server.stderr)
    assert health["status"] == "ready" and health["attention"], health
    assert all(code == 200 for code, _, _ in answers), answers
    expected = translator.translate(SENTENCES)
    assert [body["translations"] for _, _, body in answers] == [
        *[[t] for t in expected],
        expected[:3],
    ]
    assert libre[0] == 200 and libre[2]["translatedText"] == expected[:2], libre
    code, _, body = explained
    assert code == 200, body
    n_best = translator.n_best([text])[0]
    assert [t["text"] for t in body["translations"]] == [t for t, _ in n_best]
    np.testing.assert_allclose(
        [t["score"] for t in body["translations"]], [s for _, s in n_best], atol=1e-4
    )
    # The second translation's map, as the page would draw it.
    shown = body["attention"][1]
    maps = kt.attention_maps(translator, text, n_best[1][0])
    assert (shown["target_tokens"], shown["source_tokens"]) == (
        maps.target_tokens,
        maps.source_tokens,
    )
    np.testing.assert_allclose(
        shown["cross_attention"], maps.cross_attention, atol=1e-5
    )
