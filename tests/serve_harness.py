"""``kt-serve`` with faults to inject, for tests/test_serve.py:

    python -m tests.serve_harness --model M --port 0 [kt-serve's options]

The real command (``keras_transformer.cli.serve.main``) around the real
translator, whose ``translate`` obeys two kinds of text: ``"sleep:S"`` sleeps
S seconds (a slow batch, so that a queue fills or a SIGTERM finds requests in
flight) and is translated as ``""``; ``"crash"`` raises ``RuntimeError`` (a
search that fails for one batch), and so does its attention map (an error
outside the search). Any other text is translated as usual.
"""

import sys
import time

from keras_transformer.cli import serve as kt_serve
from keras_transformer.translate.evaluation import load_translator


class FaultyTranslator:
    def __init__(self, translator):
        self._translator = translator

    def __getattr__(self, name):
        return getattr(self._translator, name)

    def translate(self, texts, search=None, **options):
        if "crash" in texts:
            raise RuntimeError("the search crashed (injected)")
        for text in texts:
            if text.startswith("sleep:"):
                time.sleep(float(text[len("sleep:") :]))
        texts = ["" if text.startswith("sleep:") else text for text in texts]
        return self._translator.translate(texts, search, **options)

    def attention_maps(self, source, target=None):
        if source == "crash":
            raise RuntimeError("the attention crashed (injected)")
        return self._translator.attention_maps(source, target)


if __name__ == "__main__":
    sys.exit(kt_serve.main(load=lambda path: FaultyTranslator(load_translator(path))))
