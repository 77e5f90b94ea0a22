"""Nothing compiles after a server's warm-up.

``backend.compilations()`` counts the traces of what ``backend.compile_loop``
builds (the searches, the attention maps of §3.2.1). A server warms up
every search it admits (``Translator.warm_up``, per beam size: every
``top_n`` shares the beam's program) and the attention maps
(``Translator.warm_up_attention``); then no request, whatever its length
or n best, compiles: each would keep every other one waiting.
"""

import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer import backend
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german
from keras_transformer.search import shapes

MAX_LENGTH = 16  # two widths, 8 and 16
SMALL = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=MAX_LENGTH)
BEAM_SIZES = (1, 4)
WORD = "one"  # one piece: k words are k ids


@pytest.fixture(scope="module")
def translator():
    numbers = range(0, 1000, 7)
    proto = tk.train_tokenizer(
        [english(n) for n in numbers] + [german(n) for n in numbers], 60
    )
    tokenizer = tk.make_tokenizer(proto)
    model = kt.build_model("tiny", src_vocab_size=tokenizer.vocabulary_size(), **SMALL)
    return kt.Translator(tokenizer, model)


def test_compile_loop_counts_each_trace():
    """One count per traced shape on JAX and TensorFlow; none on PyTorch,
    which runs the function eagerly and compiles nothing."""
    run = backend.compile_loop(None, lambda x: ops.sum(x))
    before = backend.compilations()
    run(np.ones(3, "float32"))
    run(np.zeros(3, "float32"))  # the same shape: no new trace
    run(np.ones(4, "float32"))
    traces = 0 if backend.name() == "torch" else 2
    assert backend.compilations() - before == traces


# PyTorch compiles nothing (compile_loop is an eager call there): its count
# stays 0 whatever runs, as the test above checks.
@pytest.mark.backends("jax", "tensorflow")
def test_nothing_compiles_after_warm_up(translator):
    before = backend.compilations()
    searches = []
    for beam_size in BEAM_SIZES:
        search = translator.search_options(
            beam_size=beam_size, batch_size=2, fixed_batch=True
        )
        translator.warm_up(search)
        searches.append(search)
    attention = translator.warm_up_attention()
    widths = len(shapes.widths(MAX_LENGTH))
    # One program per source width: the decoder is padded to its whole width.
    assert attention == widths == 2
    # Greedy search and beam search: 2 source widths x 1 output width (every
    # limit is 16) each; every top_n shares the beam's. Each traced once.
    assert backend.compilations() - before == 2 + 2 + attention
    warmed = backend.compilations()

    texts = [" ".join([WORD] * k) for k in range(MAX_LENGTH)]
    sources = [translator.tokenizer.encode([text])[0] for text in texts]
    assert [len(ids) for ids in sources] == list(range(1, MAX_LENGTH + 1))
    for search in searches:
        # The server's calls: the best alone, and the n best of any n.
        for top_n in range(1, search.beam_size + 1):
            for ids in sources:
                translator.search_ids_sorted([ids], search, top_n=top_n)
            translator.search_ids_sorted(sources, search, top_n=top_n)
    for source in texts:
        for target in texts:
            translator.attention_maps(source, target)
    assert backend.compilations() == warmed


@pytest.mark.backends("jax", "tensorflow")
def test_nothing_compiles_for_constraints_after_a_constrained_warm_up(translator):
    """``warm_up(constraint_tokens=N)``, a server's with glossaries: then no
    source length, top_n or constraints of up to N tokens (in one phrase or
    several) compiles."""
    tokens = 12  # constraint widths 8 and 16
    search = translator.search_options(beam_size=4, batch_size=2, fixed_batch=True)
    translator.warm_up(search, constraint_tokens=tokens)
    warmed = backend.compilations()
    word = translator.tokenizer.encode([WORD], add_end=False)[0]
    assert len(word) == 1
    sources = [translator.tokenizer.encode([" ".join([WORD] * k)])[0] for k in range(6)]
    for held in range(1, tokens + 1):
        for phrases in ([word * held], [word] * held):
            for top_n in (1, search.beam_size):
                for ids in sources:
                    translator.search_ids_sorted(
                        [ids], search, top_n=top_n, constraints=[phrases]
                    )
    # Rows with and without constraints in one batch.
    translator.search_ids_sorted(
        sources[:2], search, top_n=1, constraints=[[word * tokens], []]
    )
    assert backend.compilations() == warmed
