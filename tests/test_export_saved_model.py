"""``Translator.export``: a TensorFlow SavedModel that translates strings.

Per backend, one export of the trained number translator of
``tests/fixtures/v0_2_0`` (saved as ``.keras`` in this backend, reloaded,
exported: in process on TensorFlow, through a TensorFlow subprocess on JAX;
PyTorch takes the JAX route, not repeated in its run). A second process
that imports only ``tensorflow`` and ``tensorflow_text`` loads it and
translates; its translations must equal
``Translator.translate`` with the same search (the reference, computed
here by the translator itself), for an empty sentence, one longer than the
model's ``max_length``, unknown characters and more sentences than the
export's ``batch_size``. The argument checks run once, and so does the
comparison of the rules the graph restates in TensorFlow ops (the cut, the
output limit, ``decode``'s cut) with the translator's and the tokenizer's,
on the same inputs.
"""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.cli import export as export_command
from keras_transformer.data.contract import TextTokenizer
from keras_transformer.data.numbers import english
from keras_transformer.export import _saved_model_child, saved_model, saved_model_graph
from keras_transformer.search import shapes
from keras_transformer.search.options import SearchOptions
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID
from keras_transformer.translate.base import TranslatorBase

pytest.importorskip("tensorflow_text")

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "v0_2_0" / "translator.keras"
BATCH_SIZE = 16  # small, so that a few dozen sentences make several chunks
MAX_LENGTH = 64  # the fixture's

# Run by a fresh interpreter: argv[1] the SavedModel, stdin a JSON list of
# batches; prints JSON. Imports nothing of Keras' world on purpose.
LOADER = r"""
import json, sys
import tensorflow as tf
import tensorflow_text
before = set(sys.modules)
model = tf.saved_model.load(sys.argv[1])
translate = model.signatures["translate"]
outputs = []
for batch in json.loads(sys.stdin.read()):
    result = translate(texts=tf.constant(batch, tf.string))
    outputs.append([t.decode("utf-8") for t in result["translations"].numpy()])
metadata = {}
for key, value in model.metadata().items():
    value = value.numpy()
    value = value.decode() if isinstance(value, bytes) else value.item()
    metadata[key] = value
roots = lambda names: sorted({name.split(".")[0] for name in names})
print(json.dumps({
    "outputs": outputs,
    "metadata": metadata,
    "signature_inputs": sorted(translate.structured_input_signature[1]),
    "signature_outputs": sorted(translate.structured_outputs),
    "imported_by_tensorflow": roots(before),
    "imported_since": roots(set(sys.modules) - before),
}))
"""


def load_fixture():
    return kt.load_model(FIXTURE)


def sentences():
    rng = np.random.default_rng(0)
    numbers = [0, 7, 21, 101, 999, 4_321] + rng.integers(0, 10**6, 60).tolist()
    texts = [english(int(n)) for n in numbers]
    # A sentence longer than max_length (cut to its first 63 tokens + END),
    # an empty one, and characters the vocabulary has never seen.
    long = " ".join(english(n) for n in range(41, 61))
    texts[10:10] = [long, "", "seven ☃ ünd 😀", "   "]
    return texts


def load_in_new_process(path, batches):
    environment = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    environment["TF_CPP_MIN_LOG_LEVEL"] = "3"
    process = subprocess.run(
        [sys.executable, "-c", LOADER, os.fspath(path)],
        input=json.dumps(batches),
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


def xla_functions(path):
    """How many of the SavedModel's functions must be compiled with XLA."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
    library = proto.meta_graphs[0].graph_def.library
    return sum(
        "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
        for f in library.function
    )


@pytest.fixture(scope="module")
def translator():
    return load_fixture()


@pytest.fixture(scope="module")
def exported(translator, tmp_path_factory):
    """The fixture saved in this backend, reloaded, exported (over a stale
    directory, with ``overwrite=True``) and loaded by another process."""
    folder = tmp_path_factory.mktemp("export")
    translator.save(folder / "translator.keras")
    reloaded = kt.load_model(folder / "translator.keras")
    path = folder / "saved_model"
    path.mkdir()
    (path / "stale.txt").write_text("from an earlier export")
    returned = saved_model.export_saved_model(
        reloaded, path, batch_size=BATCH_SIZE, overwrite=True
    )
    texts = sentences()
    batches = [texts, []]
    loaded = load_in_new_process(path, batches)
    return reloaded, path, returned, texts, batches, loaded


def reference(translator, texts):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        translations = translator.translate(texts, batch_size=BATCH_SIZE)
    return translations, [str(w.message) for w in caught]


@pytest.mark.backends("tensorflow", "jax")  # PyTorch: the JAX route
def test_the_saved_model_translates_as_the_translator(exported):
    translator, path, returned, texts, batches, loaded = exported
    assert returned == os.path.abspath(path)
    assert not (path / "stale.txt").exists()
    ids = translator.tokenizer.encode(texts)
    assert len(texts) > 4 * BATCH_SIZE
    assert max(len(row) for row in ids) > MAX_LENGTH  # truncated
    assert any(UNK_ID in row for row in ids)
    want, messages = reference(translator, texts)
    # The translator said what the SavedModel does silently.
    assert any("longer than the model's max_length=64" in m for m in messages)
    assert any("never seen" in m for m in messages)
    got = loaded["outputs"]
    assert got[0] == want
    assert got[1] == []  # no sentences
    # A real translation task: most numbers come out as German words.
    assert want[:6] == TRANSLATIONS_0_2_0
    # The searches are XLA functions, loaded and run by tf.saved_model.load.
    assert xla_functions(path) >= 1
    assert loaded["signature_inputs"] == ["texts"]
    assert loaded["signature_outputs"] == ["translations"]


# What 0.2.0 gave for the first six sentences (tests/fixtures/v0_2_0).
TRANSLATIONS_0_2_0 = json.loads(
    (FIXTURE.parent / "expected.json").read_text(encoding="utf-8")
)["beam4"]


@pytest.mark.backends("tensorflow", "jax")  # PyTorch: the JAX route
def test_the_loading_process_imports_neither_keras_hub_nor_this_package(exported):
    loaded = exported[-1]
    everything = set(loaded["imported_by_tensorflow"]) | set(loaded["imported_since"])
    assert "keras_transformer" not in everything
    assert "keras_hub" not in everything
    # `import tensorflow` imports Keras itself when it is installed (TF 2.21
    # loads keras.src.optimizers eagerly); loading and translating add no
    # Keras, JAX, PyTorch or SentencePiece module of their own.
    for name in ("keras", "jax", "torch", "sentencepiece", "tf_keras"):
        assert name not in loaded["imported_since"]


@pytest.mark.backends("tensorflow", "jax")  # PyTorch: the JAX route
def test_the_search_settings_are_recorded(exported):
    translator, path, _, _, _, loaded = exported
    metadata = loaded["metadata"]
    assert metadata["beam_size"] == 4
    assert metadata["length_penalty"] == pytest.approx(0.6)
    assert metadata["batch_size"] == BATCH_SIZE
    assert metadata["keras_transformer_version"] == kt.__version__
    assert json.loads(metadata["model_config"])["max_length"] == MAX_LENGTH
    written = json.loads((path / "assets" / "translation.json").read_text())
    assert written["beam_size"] == 4 and written["length_penalty"] == 0.6
    assert written["jit_compile"] is True
    assert written["model_config"]["d_model"] == translator.transformer.d_model
    assert written["source_widths"] == [8, 16, 32, 64]
    # The limits and the special ids are the translator's and its tokenizer's.
    assert written["source_max_length"] == written["target_max_length"] == 64
    assert written["max_output_length"] is None
    assert written["extra_output_length"] == translator.extra_output_length == 50
    assert written["special_ids"] == translator.tokenizer.special_ids()
    # Every output limit is at least 50 (source + 50) and at most 64.
    assert written["output_widths"] == [64]


# -- argument checks (the same on every backend) ---------------------------------


@pytest.mark.once
def test_an_existing_path_is_refused_and_left_alone(translator, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "saved_model.pb").write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        saved_model.export_saved_model(translator, tmp_path / "model")
    assert (tmp_path / "model" / "saved_model.pb").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["model"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        saved_model.export_saved_model(translator, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.once
@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"beam_size": 0}, ValueError, "beam_size"),
        ({"length_penalty": "0.6"}, TypeError, "length_penalty"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"beam": 4}, TypeError, "Unknown search options"),
        ({"search": {"beam_size": 4}}, TypeError, "SearchOptions"),
        ({"jit_compile": "yes"}, TypeError, "jit_compile"),
        ({"overwrite": "no"}, TypeError, "overwrite"),
        (
            {"length_penalty_form": "transformers"},
            ValueError,
            "the SavedModel export searches with the GNMT length penalty only",
        ),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    translator, tmp_path, options, error, match
):
    with pytest.raises(error, match=match):
        saved_model.export_saved_model(translator, tmp_path / "model", **options)
    assert os.listdir(tmp_path) == []


@pytest.mark.once
def test_only_a_translator_exports(tmp_path):
    with pytest.raises(TypeError, match="Translator"):
        saved_model.export_saved_model(object(), tmp_path / "model")


@pytest.mark.once
@pytest.mark.parametrize("module", ["tensorflow", "tensorflow_text"])
def test_without_tensorflow_the_error_names_the_extra(
    translator, tmp_path, monkeypatch, module
):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError) as raised:
        saved_model.export_saved_model(translator, tmp_path / "model")
    assert f"({module} could not be imported)" in str(raised.value)
    assert 'pip install "keras-transformer-aiayn[saved-model]"' in str(raised.value)
    assert os.listdir(tmp_path) == []


class ForeignIds(TextTokenizer):
    """The fixture's tokenizer under another kind: one whose ids are not
    its SentencePiece model's (a Marian checkpoint's are ``vocab.json``'s),
    though it has a model file to offer."""

    kind = "marian"

    def __init__(self, tokenizer):
        self.inner = tokenizer

    def tokenize(self, texts):
        return self.inner.tokenize(texts)

    def detokenize(self, rows):
        return self.inner.detokenize(rows)

    def source_pieces(self):
        return self.inner.source_pieces()

    target_pieces = source_pieces

    def export_files(self):
        return self.inner.export_files()


@pytest.mark.once
def test_a_tokenizer_of_other_ids_is_refused_before_anything_is_written(
    translator, tmp_path, monkeypatch, capsys
):
    foreign = kt.Translator(ForeignIds(translator.tokenizer), translator.transformer)
    with pytest.raises(ValueError) as raised:
        saved_model.export_saved_model(foreign, tmp_path / "out" / "model")
    message = str(raised.value)
    assert "tokenizer (marian: ForeignIds) is not one" in message
    assert "--format ctranslate2 or --format marian" in message
    assert os.listdir(tmp_path) == []
    # kt-export prints it as one line (the model's loading left out).
    monkeypatch.setattr(export_command, "prepare_process", lambda verbose: None)
    monkeypatch.setattr(export_command, "start_engine", lambda engine, verbose: None)
    monkeypatch.setattr(export_command, "load_translator", lambda path: foreign)
    out = tmp_path / "cli"
    arguments = ["--model", "m.keras", "--format", "saved_model", "--out", str(out)]
    with pytest.raises(SystemExit) as stopped:
        export_command.main(arguments)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"kt-export: error: {message}\n"
    assert os.listdir(tmp_path) == []


@pytest.mark.once
def test_the_subprocess_reports_its_errors(tmp_path, capsys):
    """``main`` (the export subprocess) reports a failure as a type and a
    message, which the parent raises again."""
    assert _saved_model_child.main([]) == 2
    assert "JOB.json" in capsys.readouterr().err
    result = tmp_path / "result.json"
    job = {
        "model": os.fspath(tmp_path / "missing.keras"),
        "output": os.fspath(tmp_path / "out"),
        "search": {"beam_size": 0},
        "result": os.fspath(result),
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    code = _saved_model_child.main([os.fspath(tmp_path / "job.json")])
    assert code == 1
    outcome = json.loads(result.read_text())
    assert not outcome["ok"]
    assert outcome["type"] in ("ValueError", "RuntimeError")
    assert not (tmp_path / "out").exists()


@pytest.mark.once
def test_only_the_output_widths_a_chunk_can_need_are_compiled():
    widths = saved_model_graph._output_widths
    assert shapes.widths(256) == [8, 16, 32, 64, 128, 256]
    assert shapes.widths(100) == [8, 16, 32, 64, 100]
    assert widths(256, None, 50) == [64, 128, 256]  # limits from 50 to 256
    assert widths(256, None, 10) == [16, 32, 64, 128, 256]
    assert widths(40, None, 50) == [40]
    assert widths(256, 12, None) == [16]  # a fixed limit: one width
    assert widths(256, 1000, None) == [256]


class Limits(TranslatorBase):
    """The translator interface with limits of one's choosing and no model:
    the rules of ``TranslatorBase`` alone."""

    def __init__(self, tokenizer, source, target, fixed=None, extra=50):
        self.tokenizer = tokenizer
        self.source_max_length, self.target_max_length = source, target
        self.max_output_length, self.extra_output_length = fixed, extra


@pytest.mark.once("tensorflow")
def test_the_graphs_rules_are_the_translators(translator):
    """What the graph restates in TensorFlow ops gives what the translator
    and its tokenizer give on the same inputs: the cut of a long source and
    the output limit (``encode_sources``, ``output_limit``) for the
    fixture's limits and for others (source and target limits apart, an
    extra length that is not 50, a translator's fixed limit), each source
    length from 1 to past every limit, with the search's fixed limit around
    the target's; and ``decode``'s cut at the end id."""
    import tensorflow as tf

    tokenizer = translator.tokenizer
    op = saved_model_graph.tokenizer_op(tokenizer)
    ids = saved_model_graph.special_ids(tokenizer)
    assert ids == (START_ID, END_ID, PAD_ID)
    # "hundred" and "thousand" are one piece each: k words, k + 1 ids.
    words = ["hundred", "thousand"] * 34
    texts = [" ".join(words[:k]) for k in range(len(words) + 1)]
    texts += ["seven ☃ ünd 😀", "   ", "thousand ☃"]
    assert max(tokenizer.count(texts)) > MAX_LENGTH + 1
    translators = [
        translator,
        Limits(tokenizer, source=9, target=12, extra=7),
        Limits(tokenizer, source=12, target=9, fixed=5),
    ]
    for base in translators:
        target = base.target_max_length
        for fixed in (None, 1, target - 1, target, target + 1):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # too long, <unk>
                want = base.encode_sources(texts)
            limits = [base.output_limit(len(row) - 1, fixed) for row in want]
            rules = saved_model_graph.length_rules(
                base, SearchOptions(max_output_length=fixed)
            )
            n, lengths, got, got_limits = saved_model_graph.encode_sources(
                op, tf.constant(texts), rules, ids
            )
            case = (base.source_max_length, target, fixed)
            assert int(n) == len(texts)
            assert got.to_list() == want, case
            assert lengths.numpy().tolist() == [len(row) for row in want], case
            assert got_limits.numpy().tolist() == limits, case

    rows = [
        [8, 5, END_ID, 5, 8],  # cut at the end id
        [START_ID, 5, PAD_ID, 8, END_ID],  # start and padding dropped
        [5, 8, 5, 8, 5],  # no end id: the limit came first
        [END_ID, 5, END_ID, 8, 5],
        [PAD_ID] * 5,
        [UNK_ID, 5, UNK_ID, 8, PAD_ID],
    ]
    got = saved_model_graph.detokenize(op, tf.constant(rows), ids, len(rows))
    got = [text.decode("utf-8") for text in got.numpy()]
    assert got == tokenizer.decode(rows)
    assert got[0] == "thousand hundred" and got[4] == ""
    none = saved_model_graph.detokenize(op, tf.zeros([0, 5], tf.int32), ids, 0)
    assert none.numpy().tolist() == tokenizer.decode([]) == []


# -- other searches, TensorFlow only (in process: what they add is the graph) --
# Without XLA where XLA does not matter: a compilation per shape costs
# seconds.


def in_process(path, texts):
    import tensorflow as tf

    translate = tf.saved_model.load(os.fspath(path)).signatures["translate"]
    result = translate(texts=tf.constant(texts, tf.string))["translations"]
    return [text.decode("utf-8") for text in result.numpy()]


@pytest.mark.once("tensorflow")
def test_several_output_widths_are_chosen_per_chunk(translator, tmp_path):
    """The fixture's weights in a model of max_length=128, greedy search
    without the cache (the quickest to compile): output limits of 51 and 85
    tokens need the widths 64 and 128 in one call (one sentence per
    chunk)."""
    config = dict(translator.transformer.get_config(), max_length=128)
    transformer = type(translator.transformer).from_config(config)
    transformer.set_weights(translator.transformer.get_weights())
    wide = kt.Translator(translator.tokenizer, transformer)
    texts = [" ".join(english(n) for n in range(41, 41 + k)) for k in (8, 1)]
    # Output limits (tokens without END, + 50) in 128's and 64's bucket.
    extra = wide.extra_output_length
    limits = [len(row) - 1 + extra for row in wide.tokenizer.encode(texts)]
    assert limits[1] <= 64 < limits[0] <= 128
    options = dict(beam_size=1, batch_size=1, use_cache=False)
    path = saved_model.export_saved_model(
        wide, tmp_path / "model", jit_compile=False, **options
    )
    path = pathlib.Path(path)
    written = json.loads((path / "assets" / "translation.json").read_text())
    assert written["output_widths"] == [64, 128]
    assert not written["jit_compile"] and xla_functions(path) == 0
    assert in_process(path, texts) == wide.translate(texts, **options)
    # Its search has no constraints: a glossary is refused, not ignored.
    import tensorflow as tf

    translate = tf.saved_model.load(os.fspath(path)).signatures["translate"]
    with pytest.raises(TypeError, match="glossary"):
        translate(texts=tf.constant(texts), glossary=tf.constant(["a\tb"]))


@pytest.mark.once("tensorflow")
def test_a_fixed_output_limit(translator, tmp_path):
    texts = [english(n) for n in (7, 777_777, 123_456, 21)]
    options = dict(beam_size=2, max_output_length=12, batch_size=4)
    path = saved_model.export_saved_model(
        translator, tmp_path / "model", jit_compile=False, **options
    )
    want = translator.translate(texts, **options)
    ids = translator.translate_ids(texts, **options)
    assert in_process(path, texts) == want
    # The limit cut some translations (12 tokens, no END).
    assert any(len(row) == 12 and row[-1] != END_ID for row in ids)


@pytest.mark.backends("tensorflow")  # Keras' export's own route; ours for each
@pytest.mark.once("tensorflow")
def test_translator_export_is_keras_export_of_the_logits(translator, tmp_path):
    """``Translator.export`` keeps ``keras.Model.export``'s meaning: the
    model's call (the logits) as a SavedModel endpoint ``serve``."""
    import tensorflow as tf

    inputs = {
        "encoder_inputs": np.array([[5, 6, 7, END_ID]], "int32"),
        "decoder_inputs": np.array([[1, 8, 9]], "int32"),
    }
    translator.export(tmp_path / "logits", verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "logits"))
    served = loaded.serve(inputs)
    np.testing.assert_allclose(
        np.asarray(served), keras.ops.convert_to_numpy(translator(inputs)), atol=1e-5
    )
    # The search's options belong to export_saved_model, which the error names.
    with pytest.raises(TypeError, match="export_saved_model"):
        translator.export(tmp_path / "model", beam_size=4)
    assert not (tmp_path / "model").exists()
