"""``kt-serve`` with faults to inject, for tests/test_serve.py:

    python -m tests.serve_harness --model M --port 0 [kt-serve's options]

The real command (``keras_transformer.cli.serve.main``) around the real
translator, which obeys two kinds of text: ``"sleep:S"`` sleeps S seconds
when it is searched (a slow batch, so that a queue fills or a SIGTERM finds
requests in flight) and is translated as ``""``; ``"crash"`` raises
``RuntimeError`` in a search for the best translations (a search that fails
for one batch; the n best of ``/explain`` are searched as usual), and so
does its attention map (an error outside the search). Any other text is
translated as usual.

The server encodes a request's texts when it admits them and searches their
ids: the tokenizer tags the ids of those texts (``Fault``), and the search
obeys the tags of the sources it is given.

    python -m tests.serve_harness --copying --model DIR [kt-serve's options]

serves ``Copying`` instead, a translator that gives each text back as it
came, for the tests of what the server does around a translation (keys,
limits, their storage's outages, bodies over the limit, logs): it starts
in a second, loading no model. A directory as ``--model`` (an export's
place) keeps Keras and its backend unimported.
"""

import sys
import time

from keras_transformer.cli import serve as kt_serve
from keras_transformer.data.contract import TextTokenizer
from keras_transformer.translate.base import TranslatorBase
from keras_transformer.translate.evaluation import load_translator

COPYING = "--copying"


class Fault(list):
    """A source's ids that sleep ``sleep`` seconds, or raise (``crash``),
    when they are searched."""

    def __init__(self, ids, sleep=0.0, crash=False):
        super().__init__(ids)
        self.sleep = sleep
        self.crash = crash


class FaultyTokenizer:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def encode(self, texts, add_end=True):
        plain = ["" if text.startswith("sleep:") else text for text in texts]
        rows = self._tokenizer.encode(plain, add_end)
        for i, text in enumerate(texts):
            if text.startswith("sleep:"):
                rows[i] = Fault(rows[i], sleep=float(text[len("sleep:") :]))
            elif text == "crash":
                rows[i] = Fault(rows[i], crash=True)
        return rows


class FaultyTranslator:
    def __init__(self, translator):
        self._translator = translator
        self.tokenizer = FaultyTokenizer(translator.tokenizer)

    def __getattr__(self, name):
        return getattr(self._translator, name)

    def search_ids_sorted(self, sources, search, top_n=None, **constraints):
        if top_n == 1 and any(getattr(ids, "crash", False) for ids in sources):
            raise RuntimeError("the search crashed (injected)")
        for ids in sources:
            time.sleep(getattr(ids, "sleep", 0.0))
        plain = [list(ids) for ids in sources]
        return self._translator.search_ids_sorted(plain, search, top_n, **constraints)

    def attention_maps(self, source, target=None):
        if source == "crash":
            raise RuntimeError("the attention crashed (injected)")
        return self._translator.attention_maps(source, target)


class Characters(TextTokenizer):
    """A character's id is its code point, past the special ids."""

    kind = "characters"
    SHIFT = 4

    def tokenize(self, texts):
        return [[ord(c) + self.SHIFT for c in text] for text in texts]

    def detokenize(self, rows):
        return ["".join(chr(i - self.SHIFT) for i in row) for row in rows]


class Copying(TranslatorBase):
    """Each text's translation is the text itself, every hypothesis of
    the beam alike: the server's two calls (``warm_up``,
    ``search_ids_sorted``) answered without a search."""

    engine = "copying"
    default_batch_size = 8
    source_max_length = target_max_length = max_output_length = None

    def __init__(self):
        self.tokenizer = Characters()

    def warm_up(self, search=None, constraint_tokens=0, **options):
        return 0

    def search_ids_sorted(self, sources, search, top_n=None, constraints=None):
        return [[(list(row), 0.0)] * search.beam_size for row in sources]


if __name__ == "__main__":
    if sys.argv[1:2] == [COPYING]:
        sys.exit(kt_serve.main(sys.argv[2:], load=lambda path: Copying()))
    sys.exit(kt_serve.main(load=lambda path: FaultyTranslator(load_translator(path))))
