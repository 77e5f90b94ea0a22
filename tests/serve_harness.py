"""``kt-serve`` with faults to inject, for tests/test_serve.py:

    python -m tests.serve_harness --model M --port 0 [kt-serve's options]

The real server (``keras_transformer.serving``) around the real translator,
whose ``translate`` obeys two kinds of text: ``"sleep:S"`` sleeps S seconds
(a slow batch, so that a queue fills or a SIGTERM finds requests in flight)
and is translated as ``""``; ``"crash"`` raises ``RuntimeError`` (a search
that fails for one batch).
"""

import sys
import time

from keras_transformer.cli import serve as kt_serve
from keras_transformer.evaluation import load_translator
from keras_transformer.serving.app import Service
from keras_transformer.serving.server import listen, run


class FaultyTranslator:
    def __init__(self, translator):
        self._translator = translator

    def __getattr__(self, name):
        return getattr(self._translator, name)

    def translate(self, texts, **options):
        if "crash" in texts:
            raise RuntimeError("the search crashed (injected)")
        for text in texts:
            if text.startswith("sleep:"):
                time.sleep(float(text[len("sleep:") :]))
        texts = ["" if text.startswith("sleep:") else text for text in texts]
        return self._translator.translate(texts, **options)


def main(argv=None):
    args = kt_serve.parser().parse_args(argv)
    service = Service(
        lambda: FaultyTranslator(load_translator(args.model)),
        "faulty",
        "0",
        kt_serve.settings(args),
    )
    return run(service, listen(args.host, args.port))


if __name__ == "__main__":
    sys.exit(main())
