"""Translators written as Marian checkpoint folders (``export/marian.py``).

The references are the readers of such a folder: transformers'
``MarianMTModel`` and ``MarianTokenizer`` (logits, token ids, greedy
``generate``), this package's own import (``Translator.from_preset``: the
same logits and translations, and the same folder written again), and
CTranslate2's converter. The trained number-task translator of 0.2.0
(tests/fixtures/v0_2_0: post-LN, shared embeddings, ReLU, epsilon 1e-6)
translates; tiny random models with a tokenizer trained here cover the
options (a logits bias, GELU and swish, separate vocabularies of different
sizes). transformers computes its layer norms with epsilon 1e-5 whatever
the folder says, so it is compared with models built with 1e-5; the
default 1e-6 round-trips exactly through ``from_preset``.
"""

import io
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers

from keras_transformer import SearchOptions, Translator, build_model
from keras_transformer.cli import export
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german
from keras_transformer.data.sentencepiece import SentencePiece
from keras_transformer.export.marian import write_marian
from keras_transformer.pretrained.marian import vocabulary_order
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID
from tests import subprocess_coverage
from tests.test_export_ctranslate2 import FIXTURE, load
from tests.test_marian import make_checkpoint

# Writing a folder reads the weights out as NumPy arrays and computes the
# rest in NumPy, whatever the backend, and its readers run on PyTorch: one
# backend's run. That imported models search alike on every backend is
# tests/test_marian.py's.
pytestmark = pytest.mark.once

REPO = Path(__file__).resolve().parents[1]
NUMBERS = [0, 1, 7, 12, 21, 40, 99, 101, 345, 1000, 2024, 70001, 999999]
TEXTS = [english(n) for n in NUMBERS]
# Tiny random models: the options Marian has beyond the paper's model.
VARIANTS = {
    "bias_gelu_shared": dict(logits_bias=True, activation="gelu", vocab=(60, 60)),
    "swish_separate": dict(
        logits_bias=True, activation="silu", share_embeddings=False, vocab=(60, 60)
    ),
    # Vocabularies of different sizes (past the tokenizer's pieces): <pad>
    # sits at the same id in both, and each side has its own vocab file.
    "relu_separate_sizes": dict(share_embeddings=False, vocab=(66, 62)),
}


def quiet_tokenizer(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        return transformers.MarianTokenizer.from_pretrained(str(folder))


def hf_model(folder):
    return transformers.MarianMTModel.from_pretrained(str(folder)).eval()


def orders(folder):
    """Marian's id of each of this package's source and target ids, from the
    folder's config (the order ``from_preset`` reads it back in)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    pad = config["pad_token_id"]
    special = dict(pad=pad, start=config["decoder_start_token_id"], end=0, unk=1)
    return [
        vocabulary_order(config[name], **special)
        for name in ("vocab_size", "decoder_vocab_size")
    ]


def padded(rows, start=None):
    prefix = [] if start is None else [start]
    rows = [prefix + list(row) for row in rows]
    array = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


def our_logits(translator, sources, targets):
    """Logits of this package's model, and the inputs: sources padded, the
    decoder's inputs the start id then the targets."""
    encoder = padded(sources)
    decoder = padded([row[:-1] for row in targets], start=START_ID)
    inputs = {"encoder_inputs": encoder, "decoder_inputs": decoder}
    logits = keras.ops.convert_to_numpy(translator.transformer(inputs))
    return logits, encoder, decoder


def their_logits(model, folder, encoder, decoder):
    """transformers' logits for the same inputs, columns in this package's
    order (column 0, the pad id, is a copy of the start id's)."""
    source_order, target_order = orders(folder)
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(source_order[encoder]),
            attention_mask=torch.tensor((encoder != PAD_ID).astype("int64")),
            decoder_input_ids=torch.tensor(target_order[decoder]),
        ).logits.numpy()
    return logits[..., target_order]


def max_difference(ours, theirs, decoder):
    """The largest difference over the decoder's real positions and the ids
    a search may emit (all but the pad id)."""
    real = decoder != PAD_ID
    real[:, 0] = True
    return np.abs(ours[..., 1:] - theirs[..., 1:])[real].max()


def with_epsilon(translator, epsilon, start_row=None):
    """The translator's model rebuilt with another layer-norm epsilon (and,
    given one, another start row), with the same weights."""
    config = dict(translator.transformer.get_config(), layer_norm_epsilon=epsilon)
    model = type(translator.transformer).from_config(config)
    model.set_weights(translator.transformer.get_weights())
    if start_row is not None:
        table = keras.ops.convert_to_numpy(model.target_embedding.embeddings).copy()
        table[START_ID] = start_row
        model.target_embedding.embeddings.assign(table)
    return Translator(tk.make_tokenizer(bytes(translator.tokenizer.proto)), model)


@pytest.fixture(scope="module")
def numbers():
    """The trained translator of 0.2.0 (layer-norm epsilon 1e-6)."""
    return load(FIXTURE)


@pytest.fixture(scope="module")
def numbers_1e5(numbers):
    """The same weights with transformers' epsilon."""
    return with_epsilon(numbers, 1e-5)


@pytest.fixture(scope="module")
def folders(numbers, numbers_1e5, tmp_path_factory):
    root = tmp_path_factory.mktemp("marian_export")
    return {
        "default": write_marian(numbers, root / "default"),
        "1e-5": write_marian(numbers_1e5, root / "1e-5"),
    }


@pytest.fixture(scope="module")
def proto():
    """A SentencePiece model trained here on number words in both languages."""
    numbers = range(0, 3000, 7)
    return tk.train_tokenizer(
        [english(n) for n in numbers] + [german(n) for n in numbers], 60
    )


def random_translator(proto, vocab, **options):
    keras.utils.set_random_seed(1)
    model = build_model(
        "tiny", src_vocab_size=vocab[0], tgt_vocab_size=vocab[1], num_layers=2,
        d_model=32, num_heads=4, d_ff=48, max_length=64, layer_norm_epsilon=1e-5,
        **options,
    )  # fmt: skip
    # Less tidy weights than the initial ones (zero biases, unit gammas), so
    # that each one matters.
    rng = np.random.default_rng(2)
    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable)
        variable.assign(value + rng.normal(0, 0.1, value.shape).astype(value.dtype))
    return Translator(tk.make_tokenizer(proto), model)


# -- transformers' MarianMTModel -----------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_transformers_computes_the_options_logits(proto, variant, tmp_path):
    translator = random_translator(proto, **VARIANTS[variant])
    folder = write_marian(translator, tmp_path / variant)
    sources = tk.encode(translator.tokenizer, TEXTS[:5])
    targets = tk.encode(translator.tokenizer, [german(n) for n in NUMBERS[:5]])
    ours, encoder, decoder = our_logits(translator, sources, targets)
    theirs = their_logits(hf_model(folder), folder, encoder, decoder)
    scale = np.abs(theirs).max()
    assert max_difference(ours, theirs, decoder) <= 1e-5 * scale
    separate = (Path(folder) / "target_vocab.json").exists()
    assert separate == (variant == "relu_separate_sizes")
    assert quiet_tokenizer(folder).separate_vocabs == separate


def test_transformers_logits_differ_by_the_epsilon_only(numbers, numbers_1e5, folders):
    sources = tk.encode(numbers.tokenizer, TEXTS)
    targets = tk.encode(numbers.tokenizer, [german(n) for n in NUMBERS])
    differences = {}
    for name, translator in (("default", numbers), ("1e-5", numbers_1e5)):
        ours, encoder, decoder = our_logits(translator, sources, targets)
        theirs = their_logits(hf_model(folders[name]), folders[name], encoder, decoder)
        differences[name] = max_difference(ours, theirs, decoder) / np.abs(theirs).max()
    # transformers computes with 1e-5 whatever config.json says: a few
    # millionths of the logits' scale for this model (3e-6 measured), where
    # float32 rounding makes a few ten-millionths (4e-7).
    assert differences["1e-5"] <= 1e-6, differences
    assert differences["1e-5"] < differences["default"] <= 3e-5, differences


def test_greedy_translations_equal_transformers_generate(numbers_1e5, folders):
    """Their generation forbids <pad> (this package's start row) and is not
    forced to end with </s> at the limit, as the greedy search here is not."""
    folder = folders["1e-5"]
    model = hf_model(folder)
    source_order, target_order = orders(folder)
    sources = tk.encode(numbers_1e5.tokenizer, TEXTS)
    expected = []
    for row in map(np.array, sources):
        with torch.no_grad():
            out = model.generate(
                torch.tensor(source_order[row][None]), num_beams=1, do_sample=False,
                max_new_tokens=numbers_1e5.output_limit(len(row) - 1),
                bad_words_ids=[[model.config.pad_token_id]],
                forced_eos_token_id=None,
            )[0].tolist()  # fmt: skip
        expected.append(out[1:])  # without the start id
    ours = numbers_1e5.translate_ids(TEXTS, beam_size=1)
    assert [target_order[row].tolist() for row in ours] == expected
    assert all(row[-1] == END_ID for row in ours)  # they end by themselves


def test_beam_translations_equal_transformers_generate(numbers_1e5, folders):
    """Beam 4 as the written generation config asks (its α, transformers'
    length penalty, </s> forced at the limit) and as the search here gives
    it with ``length_penalty_form="transformers"``."""
    folder = folders["1e-5"]
    model = hf_model(folder)
    source_order, target_order = orders(folder)
    expected = []
    for row in map(np.array, tk.encode(numbers_1e5.tokenizer, TEXTS)):
        limit = numbers_1e5.output_limit(len(row) - 1)
        with torch.no_grad():
            out = model.generate(
                torch.tensor(source_order[row][None]), max_length=limit + 1
            )[0].tolist()
        expected.append(out[1:])
    assert model.generation_config.num_beams == 4
    ours = numbers_1e5.translate_ids(
        TEXTS, length_penalty=model.generation_config.length_penalty,
        length_penalty_form="transformers",
    )  # fmt: skip
    assert [target_order[row].tolist() for row in ours] == expected


# -- this package's import -----------------------------------------------------


def test_from_preset_reads_back_the_same_translator(numbers, folders, tmp_path):
    folder = folders["default"]
    imported = Translator.from_preset(folder, max_output_length=None)
    assert imported.transformer.config == numbers.transformer.config.replace(
        logits_bias=True  # zeros: Marian's checkpoints always have one
    )
    sources = tk.encode(numbers.tokenizer, TEXTS)
    targets = tk.encode(numbers.tokenizer, [german(n) for n in NUMBERS])
    ours, encoder, decoder = our_logits(numbers, sources, targets)
    theirs, _, _ = our_logits(imported, sources, targets)
    # Padded positions embed the start row there (the pad row is not
    # written), which the masks hide.
    assert max_difference(ours, theirs, decoder) <= 1e-6
    assert imported.tokenizer.tokenize(TEXTS) == numbers.tokenizer.tokenize(TEXTS)
    for beam_size in (1, 4):
        search = SearchOptions(beam_size=beam_size)
        assert imported.translate(TEXTS, search=search) == numbers.translate(
            TEXTS, search=search
        )
    # Written again, an imported translator is the same folder.
    again = Path(write_marian(imported, tmp_path / "again"))
    names = sorted(os.listdir(folder))
    assert sorted(os.listdir(again)) == names
    for name in names:
        assert (again / name).read_bytes() == (Path(folder) / name).read_bytes(), name


@pytest.fixture(scope="module")
def hf_checkpoint(proto, tmp_path_factory):
    """A checkpoint saved by transformers (random weights, biases and norms
    too; Marian's layout: </s> 0, <unk> 1, <pad> last and zero), with a
    tokenizer whose vocab.json numbers the SentencePiece model's pieces."""
    processor = spm.SentencePieceProcessor(model_proto=proto)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for i in range(4, processor.get_piece_size()):
        vocabulary[processor.id_to_piece(i)] = len(vocabulary)
    vocabulary["<pad>"] = pad = len(vocabulary)
    folder = tmp_path_factory.mktemp("hf") / "checkpoint"
    make_checkpoint(
        folder, vocab_size=pad + 1, pad_token_id=pad, decoder_start_token_id=pad,
        activation_function="swish",
    )  # fmt: skip
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(proto)
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    return folder


def test_an_imported_checkpoint_is_written_back_as_it_came(hf_checkpoint, tmp_path):
    from safetensors.numpy import load_file

    imported = Translator.from_preset(hf_checkpoint)
    folder = Path(write_marian(imported, tmp_path / "again"))
    original = load_file(hf_checkpoint / "model.safetensors")
    written = load_file(folder / "model.safetensors")
    assert sorted(written) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (folder / name).read_bytes() == (hf_checkpoint / name).read_bytes()
    theirs = json.loads((hf_checkpoint / "config.json").read_text())
    ours = json.loads((folder / "config.json").read_text())
    for key in ("vocab_size", "pad_token_id", "d_model", "activation_function"):
        assert ours[key] == theirs[key], key
    assert ours["layer_norm_epsilon"] == 1e-5


# -- the tokenizer and the configs ---------------------------------------------


def test_marian_tokenizer_gives_the_same_ids_and_texts(numbers, folders):
    folder = folders["default"]
    theirs = quiet_tokenizer(folder)
    source_order, target_order = orders(folder)
    # Text the vocabulary cannot spell ("Ω", "q") reads as <unk> in both.
    texts = TEXTS + ["seventy-one quick Ωs", ""]
    ours = tk.encode(numbers.tokenizer, texts)
    assert any(3 in row for row in ours)
    expected = theirs(texts)["input_ids"]
    assert [source_order[row].tolist() for row in ours] == expected
    words = [german(n) for n in NUMBERS]
    rows = tk.encode(numbers.tokenizer, words, add_end=False)
    decoded = [
        theirs.decode(target_order[row].tolist(), skip_special_tokens=True)
        for row in rows
    ]
    assert decoded == words == tk.decode(numbers.tokenizer, rows)


def test_the_configs_say_how_transformers_searches(numbers, folders):
    folder = Path(folders["default"])
    config = transformers.MarianConfig.from_pretrained(str(folder))
    pad = config.pad_token_id
    assert (config.vocab_size, pad, config.decoder_start_token_id) == (59, 58, 58)
    assert (config.eos_token_id, config.forced_eos_token_id) == (0, 0)
    assert config.activation_function == "relu" and config.scale_embedding
    assert config.max_position_embeddings == numbers.transformer.max_length == 64
    assert json.loads((folder / "config.json").read_text())["layer_norm_epsilon"] == (
        1e-6
    )
    vocabulary = json.loads((folder / "vocab.json").read_text())
    assert (vocabulary["</s>"], vocabulary["<unk>"], vocabulary["<pad>"]) == (0, 1, pad)
    assert "<s>" not in vocabulary and len(vocabulary) == 59
    generation = transformers.GenerationConfig.from_pretrained(str(folder))
    assert (generation.num_beams, generation.length_penalty) == (4, 0.6)
    assert generation.bad_words_ids == [[pad]] and generation.renormalize_logits
    # The start token counts in transformers' max_length: 64 generated.
    assert generation.max_length == 65
    assert (folder / "source.spm").read_bytes() == bytes(numbers.tokenizer.proto)
    # transformers' generate takes the settings as they are.
    with torch.no_grad():
        out = hf_model(folder).generate(torch.tensor([[5, 6, 0]]))[0].tolist()
    assert out[0] == pad and out[-1] == 0 and pad not in out[1:]


# -- CTranslate2's converter ---------------------------------------------------


def test_ctranslate2_converts_the_folder(numbers_1e5, tmp_path):
    """CTranslate2's Marian loader starts decoding from a zero vector, not
    from the <pad> row (Marian's own models keep that row at zero): it
    computes this model where the start row is zero."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    d_model = numbers_1e5.transformer.d_model
    translator = with_epsilon(numbers_1e5, 1e-5, start_row=np.zeros(d_model))
    folder = write_marian(translator, tmp_path / "marian")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sacremoses, and torch's own
        TransformersConverter(folder).convert(str(tmp_path / "ct2"), force=True)
    engine = ctranslate2.Translator(str(tmp_path / "ct2"))
    pieces = spm.SentencePieceProcessor(model_proto=bytes(translator.tokenizer.proto))
    ours = translator.translate_ids(TEXTS, beam_size=1)
    for text, row in zip(TEXTS, ours, strict=True):
        source = pieces.encode(text, out_type=str) + ["</s>"]
        limit = translator.output_limit(len(source) - 1)
        (result,) = engine.translate_batch(
            [source], beam_size=1, max_decoding_length=limit
        )
        expected = [pieces.id_to_piece(i) for i in row if i != END_ID]
        assert result.hypotheses[0] == expected, text


# -- what is refused, and the command ------------------------------------------


def test_what_marian_cannot_express_is_refused_by_name(proto, tmp_path):
    model = build_model(
        "tiny", src_vocab_size=60, num_layers=1, d_model=8, num_heads=2, d_ff=8,
        norm_first=True, max_length=None, activation="tanh",
    )  # fmt: skip
    with pytest.raises(ValueError) as error:
        write_marian(Translator(tk.make_tokenizer(proto), model), tmp_path / "a")
    for words in ("norm_first=True (pre-LN)", "max_length=None", "activation='tanh'"):
        assert words in str(error.value)
    model = build_model(
        "tiny", src_vocab_size=60, num_layers=1, d_model=8, num_heads=2, d_ff=8
    )
    other_kind = types.SimpleNamespace(kind="words")  # a tokenizer of another kind
    no_proto = types.SimpleNamespace(transformer=model, tokenizer=other_kind)
    with pytest.raises(ValueError, match="tokenizer is of kind 'words'"):
        write_marian(no_proto, tmp_path / "b")
    # SentencePiece's own reserved ids (<unk> 0, <s> 1, </s> 2) are not these.
    other = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS * 5), model_writer=other, vocab_size=40,
        hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    foreign = SentencePiece(other.getvalue())
    with pytest.raises(ValueError, match="ids 0-3 are"):
        write_marian(types.SimpleNamespace(transformer=model, tokenizer=foreign),
                     tmp_path / "d")  # fmt: skip
    with pytest.raises(TypeError, match="must be a keras_transformer Translator"):
        write_marian(model, tmp_path / "c")
    assert os.listdir(tmp_path) == []


def test_an_existing_folder_is_kept_unless_overwritten(numbers, tmp_path):
    folder = tmp_path / "marian"
    folder.mkdir()
    (folder / "mine.txt").write_text("kept")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_marian(numbers, folder)
    assert os.listdir(folder) == ["mine.txt"]
    assert write_marian(numbers, folder, overwrite=True) == str(folder)
    assert "mine.txt" not in os.listdir(folder)
    assert "model.safetensors" in os.listdir(folder)
    assert os.listdir(tmp_path) == ["marian"]  # no temporary folder left


def test_kt_export_writes_a_marian_folder(tmp_path, capsys):
    out = tmp_path / "marian"
    env = subprocess_coverage.environment(dict(os.environ, PYTHONPATH=str(REPO)))
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.export", "--model", FIXTURE,
         "--format", "marian", "--out", str(out), "--beam-size", "2"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"wrote {out}"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 2
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    for arguments, words in (
        ([], "overwrite"),
        (["--quantization", "int8"], "--quantization applies to"),
    ):
        with pytest.raises(SystemExit) as stopped:
            export.main(["--model", FIXTURE, "--format", "marian", "--out", str(out),
                         *arguments])  # fmt: skip
        assert stopped.value.code == 2
        assert words in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
