"""Marian checkpoints read into the Transformer (``pretrained/marian.py``).

The reference is Hugging Face transformers' ``MarianMTModel`` itself: small
checkpoints with random weights are built and saved in the test (nothing is
fetched from a hub), then their PyTorch forward pass is compared with the
imported model's on each backend, through the vocabulary order the import
reports (``logits[..., i]`` here is Marian's ``logits[..., target_ids[i]]``).
"""

import io
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
import transformers

from keras_transformer import Translator
from keras_transformer.data.numbers import english, german
from keras_transformer.layers.position import sinusoidal_table
from keras_transformer.pretrained import marian
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID
from keras_transformer.translate.constraints import missing
from tests import subprocess_coverage
from tests.test_keras_habits import load_in_new_process

REPO = Path(__file__).resolve().parents[1]
VOCAB, PAD = 50, 49  # Marian's layout: </s> 0, <unk> 1, <pad> the last id
NUMBERS = [1, 7, 12, 21, 40, 99, 101, 345, 1000, 2024, 70001, 999999]
# The checkpoint families' differences, each in one small config: swish
# (most OPUS-MT models), ReLU, GELU with separate source and target
# vocabularies (the opus-mt-tc models), and one without embedding scaling.
CASES = {
    "swish_shared": dict(activation_function="swish"),
    "relu_shared": dict(activation_function="relu"),
    "gelu_separate": dict(
        activation_function="gelu",
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=60,
    ),
    "unscaled": dict(activation_function="swish", scale_embedding=False),
}


def make_checkpoint(folder, **changes):
    """A MarianMTModel with random weights (biases and layer norms too, so
    that each matters) saved as Hugging Face saves one."""
    torch.manual_seed(0)
    settings = dict(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=PAD,
        eos_token_id=0, decoder_start_token_id=PAD, scale_embedding=True,
    )  # fmt: skip
    config = transformers.MarianConfig(**{**settings, **changes})
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
        for name, weight in model.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                weight.add_(0.1 * torch.randn_like(weight))
    model.save_pretrained(folder)
    return model


def sentencepiece_model(lines, size):
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=size,
        model_type="unigram", hard_vocab_limit=False, minloglevel=2,
        character_coverage=1.0,
    )  # fmt: skip
    return model.getvalue()


@pytest.fixture(scope="module")
def tokenizer_files():
    """Marian's tokenizer files for English -> German number words: two
    SentencePiece models and the joint vocab.json that Marian's converter
    writes (</s> 0, <unk> 1, the pieces, <pad> last)."""
    import sentencepiece as spm

    numbers = range(0, 3000, 7)
    source = sentencepiece_model([english(n) for n in numbers], 40)
    target = sentencepiece_model([german(n) for n in numbers], 40)
    pieces = []
    for proto in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i):
                if piece not in pieces:
                    pieces.append(piece)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocabulary[piece] = len(vocabulary)
    vocabulary["<pad>"] = len(vocabulary)
    return {
        "source.spm": source,
        "target.spm": target,
        "vocab.json": json.dumps(vocabulary).encode(),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer_files):
    root = tmp_path_factory.mktemp("marian")
    made = {
        name: (root / name, make_checkpoint(root / name, **changes))
        for name, changes in CASES.items()
    }
    # One checkpoint with its tokenizer, its vocabulary the model's.
    size = len(json.loads(tokenizer_files["vocab.json"]))
    folder = root / "with_tokenizer"
    reference = make_checkpoint(
        folder, vocab_size=size, pad_token_id=size - 1,
        decoder_start_token_id=size - 1, activation_function="swish",
    )  # fmt: skip
    for name, data in tokenizer_files.items():
        (folder / name).write_bytes(data)
    made["with_tokenizer"] = folder, reference
    return made


def our_ids(order, marian_ids):
    """This package's id of each Marian id (the first of this package's ids
    that stands for it: pad before start)."""
    inverse = np.full(order.max() + 1, -1)
    for ours in range(len(order) - 1, -1, -1):
        inverse[order[ours]] = ours
    return inverse[marian_ids]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(checkpoints, case, tmp_path):
    folder, reference = checkpoints[case]
    model, checkpoint = marian.marian_transformer(str(folder))
    # Two sources, the second padded; decoder inputs from the start id.
    source = np.array([[5, 7, 9, 11, 0], [6, 8, 0, PAD, PAD]])
    attention = (source != PAD).astype("int64")
    target = np.array([[PAD, 3, 4, 5, 6], [PAD, 7, 8, 9, 2]])
    with torch.no_grad():
        expected = reference(
            input_ids=torch.tensor(source),
            attention_mask=torch.tensor(attention),
            decoder_input_ids=torch.tensor(target),
        ).logits.numpy()[..., checkpoint.target_ids]
    inputs = {
        "encoder_inputs": np.where(
            attention == 1, our_ids(checkpoint.source_ids, source), PAD_ID
        ).astype("int32"),
        "decoder_inputs": np.concatenate(
            [np.full((2, 1), START_ID), our_ids(checkpoint.target_ids, target[:, 1:])],
            axis=1,
        ).astype("int32"),
    }
    got = keras.ops.convert_to_numpy(model(inputs))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * scale)
    # The options round-trip through a .keras file, with the weights.
    model.save(tmp_path / "imported.keras")
    loaded = keras.saving.load_model(tmp_path / "imported.keras")
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(inputs)), got)


@pytest.mark.once
def test_the_options_come_from_the_config(checkpoints):
    arguments = marian.read_checkpoint(str(checkpoints["gelu_separate"][0])).arguments
    assert arguments["activation"] == "gelu"
    assert arguments["logits_bias"] is True
    assert arguments["layer_norm_epsilon"] == 1e-5
    assert arguments["share_embeddings"] is False
    # One more row than Marian's vocabularies: the start id's copy of <pad>.
    assert (arguments["src_vocab_size"], arguments["tgt_vocab_size"]) == (51, 61)
    swish = marian.read_checkpoint(str(checkpoints["swish_shared"][0])).arguments
    assert (swish["activation"], swish["scale_embeddings"]) == ("silu", True)


@pytest.mark.once
def test_the_vocabulary_order_puts_the_special_ids_first():
    order = marian.vocabulary_order(8, pad=7, start=7, end=0, unk=1)
    assert order[PAD_ID] == order[START_ID] == 7
    assert (order[END_ID], order[UNK_ID]) == (0, 1)
    assert list(order[4:]) == [2, 3, 4, 5, 6]  # the others, in Marian's order
    with pytest.raises(ValueError, match="unk id 9 is outside the vocabulary of 8"):
        marian.vocabulary_order(8, pad=7, start=7, end=0, unk=9)
    with pytest.raises(ValueError, match="three different ids"):
        marian.vocabulary_order(8, pad=7, start=7, end=7, unk=1)


@pytest.mark.once
@pytest.mark.parametrize("d_model", [4, 16, 512])
def test_the_permutation_maps_marians_sinusoid_onto_the_papers(d_model):
    from transformers.models.marian.modeling_marian import (
        MarianSinusoidalPositionalEmbedding,
    )

    theirs = MarianSinusoidalPositionalEmbedding(40, d_model).create_weight().numpy()
    ours = keras.ops.convert_to_numpy(sinusoidal_table(np.arange(40), d_model))
    order = marian.residual_order(d_model)
    assert sorted(order) == list(range(d_model))
    # Float32 angles here, float64 ones cast there: a few ulps of pos * freq.
    np.testing.assert_allclose(ours, theirs[:, order], atol=1e-5)


def _write_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.once
@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_type="bart"), "model_type 'bart'; only 'marian'"),
        (dict(activation_function="gelu_new"), "activation_function='gelu_new'"),
        (dict(decoder_layers=3), "encoder_layers=2 but decoder_layers=3"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=false"),
        (dict(normalize_before=True), "normalize_before=true"),
    ],
)
def test_what_cannot_be_expressed_is_refused_by_name(
    checkpoints, tmp_path, changes, message
):
    import shutil

    folder = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["relu_shared"][0], folder)
    _write_config(folder, **changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        marian.marian_transformer(str(folder))
    assert "config.json" in str(error.value)


@pytest.mark.once
def test_a_folder_without_a_checkpoint_names_what_it_looked_for(checkpoints, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        marian.read_checkpoint(str(tmp_path))
    config = checkpoints["relu_shared"][0] / "config.json"
    (tmp_path / "config.json").write_bytes(config.read_bytes())
    with pytest.raises(FileNotFoundError, match="none of model.safetensors, "):
        marian.read_checkpoint(str(tmp_path))


@pytest.fixture(scope="module")
def preset(checkpoints):
    folder, reference = checkpoints["with_tokenizer"]
    return Translator.from_preset(folder), reference, folder


TEXTS = [english(n) for n in NUMBERS] + ["seventy-one quick jumps", ""]


@pytest.mark.once
def test_the_tokenizer_gives_marians_ids(preset):
    translator, _, folder = preset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        theirs = transformers.MarianTokenizer(
            *(str(folder / name) for name in ("source.spm", "target.spm", "vocab.json"))
        )
    expected = theirs(TEXTS)["input_ids"]
    with pytest.warns(UserWarning, match="never seen"):
        ours = translator.encode_sources(TEXTS)
    tokenizer = translator.tokenizer
    assert [
        [int(tokenizer.text.source_ids[i]) for i in row] for row in ours
    ] == expected
    assert any(1 in row for row in expected)  # "quick" has pieces not in vocab.json
    # And back: target pieces through target.spm, as Marian decodes them.
    words = [german(n) for n in NUMBERS]
    ids = [theirs(text_target=text)["input_ids"][:-1] for text in words]
    order = our_ids(
        tokenizer.text.target_ids, np.arange(len(tokenizer.text.target_ids) - 1)
    )
    assert tokenizer.detokenize([[order[i] for i in row] for row in ids]) == [
        theirs.decode(row, skip_special_tokens=True) for row in ids
    ]


def test_greedy_translations_equal_transformers_generate(preset):
    """The paper's greedy search on an imported model: their generation
    forbids <pad> (which is also this package's start row), and without
    forced_eos_token_id is not forced to end with </s> at the limit, as the
    paper's searches here are not."""
    beam_size = 1
    translator, reference, _ = preset
    sources = translator.encode_sources(TEXTS[:6])
    limits = [len(row) - 1 + 50 for row in sources]
    expected = []
    for row, limit in zip(sources, limits, strict=True):
        marian_ids = [int(translator.tokenizer.text.source_ids[i]) for i in row]
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([marian_ids]), num_beams=beam_size, do_sample=False,
                max_new_tokens=limit, bad_words_ids=[[reference.config.pad_token_id]],
                forced_eos_token_id=None, length_penalty=1.0, early_stopping=True,
            )[0].tolist()  # fmt: skip
        expected.append(out[1:])  # without the start id
    ours = translator.translate_ids(
        TEXTS[:6], beam_size=beam_size, length_penalty_form="gnmt",
        max_output_length=None,
    )  # fmt: skip
    got = [[int(translator.tokenizer.text.target_ids[i]) for i in row] for row in ours]
    assert got == expected


# OPUS-MT's generation config, as their checkpoints ship it (bar the limit,
# which the small checkpoint's positions cap).
GENERATION = dict(
    num_beams=4, max_length=40, renormalize_logits=True, forced_eos_token_id=0,
)  # fmt: skip


def train_briefly(folder, out, steps=300):
    """The checkpoint in ``folder`` trained for a few hundred steps on the
    number words with transformers itself, so that its translations end at
    varied lengths and beam search finds other outputs than greedy search
    (random weights repeat one token up to the limit); saved to ``out``
    with OPUS-MT's generation config."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).train()
    torch.manual_seed(0)
    numbers = list(range(0, 3000, 3))
    # transformers 5 leaves the sinusoids trainable but saves none of them
    # (they are remade on loading): fixed here, as the paper and Marian have
    # them, so that the saved model is the trained one.
    trained = [
        weight for name, weight in model.named_parameters()
        if "embed_positions" not in name
    ]  # fmt: skip
    optimizer = torch.optim.Adam(trained, lr=3e-3)
    for _ in range(steps):
        batch = [numbers[i] for i in torch.randint(0, len(numbers), (32,)).tolist()]
        encoded = tokenizer(
            [english(n) for n in batch], text_target=[german(n) for n in batch],
            padding=True, return_tensors="pt",
        )  # fmt: skip
        labels = encoded["labels"]
        encoded["labels"] = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
        loss = model(**encoded).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    pad = model.config.pad_token_id
    model.generation_config.update(bad_words_ids=[[pad]], **GENERATION)
    model.save_pretrained(out)
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(Path(folder) / name, Path(out) / name)
    return model


@pytest.fixture(scope="module")
def trained(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trained")
    reference = train_briefly(checkpoints["with_tokenizer"][0], folder)
    return Translator.from_preset(folder), reference, folder


def generated(translator, reference, texts, **options):
    """transformers' ``generate`` on each text alone, with the checkpoint's
    generation config and ``options``, as this package's target ids; <pad>
    forbidden and the rest renormalized, as OPUS-MT's configs ask, and the
    translator's output limit unless ``options`` set one."""
    marian_to_ours = our_ids(
        translator.tokenizer.text.target_ids, np.arange(reference.config.vocab_size)
    )
    pad = reference.config.pad_token_id
    options = dict(bad_words_ids=[[pad]], renormalize_logits=True, **options)
    outputs = []
    for row in translator.encode_sources(texts):
        marian_ids = [int(translator.tokenizer.text.source_ids[i]) for i in row]
        limit = translator.output_limit(len(row) - 1, translator.max_output_length)
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([marian_ids]), **{"max_length": limit + 1, **options}
            )
        outputs.append([int(marian_to_ours[i]) for i in out[0, 1:]])
    return outputs


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="generation_config"),
        # Another value through the same compiled rules: one backend's run.
        pytest.param(dict(length_penalty=0.6), id="alpha_0.6", marks=pytest.mark.once),
        pytest.param(dict(num_beams=1), id="greedy"),
        pytest.param(dict(max_length=7), id="forced_end"),
    ],
)
def test_searches_equal_transformers_generate(trained, options):
    """An imported model searches as its generation config says, and as
    ``generate`` does: beam 4 under transformers' length penalty, the end
    token forced at the limit."""
    translator, reference, _ = trained
    texts = [english(n) for n in (*NUMBERS, 3, 58, 777, 1234, 4321, 80808)]
    ours = {
        "num_beams": "beam_size", "length_penalty": "length_penalty",
        "max_length": "max_output_length",
    }  # fmt: skip
    asked = {ours[name]: value for name, value in options.items()}
    if "max_output_length" in asked:
        asked["max_output_length"] -= 1  # theirs counts the start token
    expected = generated(translator, reference, texts, **options)
    assert translator.translate_ids(texts, **asked) == expected
    if options.get("num_beams") != 1 and "max_length" not in options:
        # Beam search found other outputs than greedy search, and the
        # paper's search (GNMT penalty, one pool) others again: both rules
        # are exercised.
        assert expected != generated(translator, reference, texts, num_beams=1)
        gnmt = translator.translate_ids(texts, **asked, length_penalty_form="gnmt")
        assert gnmt != expected


def test_the_default_search_comes_from_the_generation_config(trained):
    translator, _, _ = trained
    search = translator.search_options()
    assert (search.beam_size, search.length_penalty) == (4, 1.0)
    assert search.length_penalty_form == "transformers"
    assert translator.max_output_length == GENERATION["max_length"] - 1
    # A call's options replace the defaults one by one.
    assert translator.search_options(beam_size=2).length_penalty_form == "transformers"


def test_an_imported_model_follows_constraints(trained):
    """Under its own search's rules (transformers' length penalty, the end
    forced at the limit), constrained: the translation of "seven" put into
    those of two other numbers, spelled by the target tokenizer."""
    translator, _, _ = trained
    texts = [english(n) for n in (30, 58, 7)]
    plain = translator.translate(texts)
    constraints = [[plain[2]], [plain[2]], []]
    ids = translator.translate_ids(texts, constraints=constraints)
    wanted = translator.constraint_ids(texts, constraints=constraints)
    for row, phrases in zip(ids, wanted, strict=True):
        assert missing(row, phrases) == []
    assert ids[2] == translator.translate_ids(texts[2:])[0]


@pytest.fixture(scope="module")
def multi_target(tokenizer_files, tmp_path_factory):
    """A checkpoint whose vocabulary has two target-language tokens, as the
    multi-target OPUS-MT models have (``>>deu<<`` before a source asks for
    German)."""
    vocabulary = json.loads(tokenizer_files["vocab.json"])
    pad = vocabulary.pop("<pad>")
    for code in (">>nld<<", ">>deu<<"):
        vocabulary[code] = pad
        pad += 1
    vocabulary["<pad>"] = pad
    folder = tmp_path_factory.mktemp("multi")
    reference = make_checkpoint(
        folder, vocab_size=pad + 1, pad_token_id=pad, decoder_start_token_id=pad,
    )  # fmt: skip
    files = {**tokenizer_files, "vocab.json": json.dumps(vocabulary).encode()}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Translator.from_preset(folder), reference, folder


@pytest.mark.once  # the target-language token is text: no backend in it
def test_a_multi_target_model_asks_for_its_target_language(multi_target):
    translator, reference, folder = multi_target
    assert translator.target_languages == ("deu", "nld")
    texts = TEXTS[:5]
    with pytest.raises(
        ValueError, match=r"give target_language, one of \['deu', 'nld'\]"
    ):
        translator.translate(texts)
    with pytest.raises(ValueError, match=r"one of \['deu', 'nld'\]. Received: 'fra'"):
        translator.translate(texts, target_language="fra")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        theirs = transformers.MarianTokenizer.from_pretrained(folder)
    asked = [f">>deu<< {text}" for text in texts]
    got = translator.translate_ids(texts, target_language="deu", beam_size=1)
    assert got == generated(translator, reference, asked, num_beams=1)
    # The token is read as one piece, its own id, as transformers reads it.
    sources = translator.with_target_language(texts, "deu")
    ids = [[int(translator.tokenizer.text.source_ids[i]) for i in row]
           for row in translator.encode_sources(sources)]  # fmt: skip
    assert ids == theirs(asked)["input_ids"]
    assert {row[0] for row in ids} == {theirs.convert_tokens_to_ids(">>deu<<")}
    # Texts that carry their own token need no argument.
    assert translator.translate_ids(asked, beam_size=1) == got


@pytest.mark.once  # the target-language token is text: no backend in it
def test_kt_translate_takes_the_target_language(multi_target, tmp_path, capsys):
    from keras_transformer.cli import translate

    translator, _, _ = multi_target
    path = tmp_path / "multi.keras"
    translator.save(path)
    with pytest.raises(SystemExit) as stopped:
        translate.main(["--model", str(path), "one", "seven"])
    assert stopped.value.code == 2
    assert "give target_language, one of ['deu', 'nld']" in capsys.readouterr().err
    got = translate.main(["--model", str(path), "--target-language", "nld", "one"])
    assert got == translator.translate(["one"], target_language="nld")


def test_a_single_target_model_refuses_a_target_language(preset):
    translator, _, _ = preset
    assert translator.target_languages == ()
    with pytest.raises(ValueError, match="translates into one language only"):
        translator.translate(["one"], target_language="deu")


def test_an_imported_translator_saves_and_loads_as_any_other(preset, tmp_path):
    """The Keras user's way, in a new process: ``import keras_transformer``
    then ``keras.saving.load_model``, no ``custom_objects``; the same
    translations."""
    translator, _, _ = preset
    translator.save(tmp_path / "imported.keras")
    texts = TEXTS[:4]
    got = load_in_new_process(
        [tmp_path / "imported.keras"], "import keras_transformer\nimport keras", texts
    )
    assert isinstance(got, dict), got[-3000:]
    ((name, count, translations),) = got["loaded"]
    assert (name, count) == ("Translator", translator.count_params())
    assert translations == translator.translate(texts, beam_size=1)


# -- kt-import, from a folder or the hub's cache -------------------------------

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root, repo, folder):
    """A Hugging Face cache holding ``folder`` as the snapshot of ``repo``'s
    main branch, laid out as huggingface_hub lays out what it downloads."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(SNAPSHOT)
    shutil.copytree(folder, base / "snapshots" / SNAPSHOT)
    return root


def kt_import(*args, cache, **environment):
    env = subprocess_coverage.environment(
        dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_HUB_CACHE=str(cache),
            PYTHONPATH=str(REPO),
            **environment,
        )
    )
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.import_checkpoint", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.once("jax")  # a conversion that costs the same on any backend
@pytest.mark.slow
def test_kt_import_reads_the_hub_cache_offline(preset, tmp_path):
    from keras_transformer.translate.evaluation import load_translator

    translator, _, folder = preset
    cache = hub_cache(tmp_path / "hub", "test-owner/opus-mt-tiny", folder)
    out = tmp_path / "runs" / "imported.keras"
    done = kt_import("hf://test-owner/opus-mt-tiny", "--out", str(out), cache=cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"wrote {out}")
    texts = TEXTS[:4]
    assert load_translator(str(out)).translate(texts, beam_size=1) == (
        translator.translate(texts, beam_size=1)
    )
    # An existing file is kept; a repository missing from the cache, offline,
    # is one line naming it and the cache.
    before = out.read_bytes()
    done = kt_import("hf://test-owner/opus-mt-tiny", "--out", str(out), cache=cache)
    assert done.returncode == 2 and "--overwrite" in done.stderr
    # Under TensorFlow (the default backend), whose start-up lines would
    # otherwise come first.
    missing = kt_import("hf://test-owner/absent", "--out", str(tmp_path / "x.keras"),
                        cache=cache, KERAS_BACKEND="tensorflow")  # fmt: skip
    assert missing.returncode == 2
    line = missing.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "test-owner/absent is not in the Hugging Face cache" in line
    assert str(cache) in line and "HF_HUB_OFFLINE" in line
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["imported.keras"]


@pytest.mark.once
def test_a_pytorch_bin_checkpoint_reads_as_its_safetensors(checkpoints, tmp_path):
    folder, reference = checkpoints["gelu_separate"]
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    from_bin = marian.read_checkpoint(str(tmp_path)).weights
    from_safetensors = marian.read_checkpoint(str(folder)).weights
    assert sorted(from_bin) == sorted(from_safetensors)
    for path, value in from_safetensors.items():
        np.testing.assert_array_equal(from_bin[path], value, err_msg=path)


@pytest.mark.once
def test_the_finetuning_script_trains_an_imported_model(preset, tmp_path, capsys):
    from training import finetune_marian

    _, _, folder = preset
    numbers = range(3, 3000, 47)
    (tmp_path / "train.en").write_text("".join(f"{english(n)}\n" for n in numbers))
    (tmp_path / "train.de").write_text("".join(f"{german(n)}\n" for n in numbers))
    out = tmp_path / "finetuned" / "translator.keras"
    history = finetune_marian.main(
        ["--preset", str(folder), "--source", str(tmp_path / "train.en"),
         "--target", str(tmp_path / "train.de"), "--out", str(out), "--epochs", "8",
         "--batch-tokens", "256", "--learning-rate", "1e-2"]
    )  # fmt: skip
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses
    assert out.is_file()
    assert f"  {english(3)}  ->  " in capsys.readouterr().out


@pytest.mark.once
def test_kt_train_starts_from_a_checkpoint(trained, checkpoints, tmp_path):
    """``kt-train --init-from``: the checkpoint's tokenizer, architecture,
    weights and search, trained further on a corpus with ``fit``."""
    from keras_transformer.cli import train
    from keras_transformer.translate.evaluation import load_translator

    start, _, folder = trained
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pairs = {"train": range(5, 3000, 37), "val": range(11, 3000, 301)}
    for split, numbers in pairs.items():
        (corpus / f"{split}.en").write_text("".join(f"{english(n)}\n" for n in numbers))
        (corpus / f"{split}.de").write_text("".join(f"{german(n)}\n" for n in numbers))
    out = tmp_path / "run"
    train.main(
        ["--init-from", str(folder), "--data", str(corpus), "--source", "en",
         "--target", "de", "--epochs", "4", "--batch-tokens", "256",
         "--warmup-steps", "10", "--lr-scale", "0.05", "--average-last", "1",
         "--label-smoothing", "0",
         "--beam-size", "1", "--verbose", "0", "--out", str(out)]
    )  # fmt: skip
    tuned = load_translator(str(out / "translator.keras"))
    assert type(tuned.tokenizer).__name__ == "MarianTokenizer"
    assert tuned.default_search == start.default_search
    assert tuned.max_output_length == start.max_output_length
    before, after = start.transformer.get_weights(), tuned.transformer.get_weights()
    assert [w.shape for w in before] == [w.shape for w in after]
    train_pairs = (
        [english(n) for n in pairs["train"]],
        [german(n) for n in pairs["train"]],
    )
    assert cross_entropy(tuned, *train_pairs) < 0.95 * cross_entropy(
        start, *train_pairs
    )


def cross_entropy(translator, sources, targets):
    """The mean cross-entropy per target token (end token included) of
    ``translator``'s model on the pairs, teacher-forced."""
    tokenizer = translator.tokenizer
    source_rows = [row + [END_ID] for row in tokenizer.tokenize(sources)]
    target_rows = tokenizer.tokenize_targets(targets)
    width = max(len(row) + 1 for row in source_rows + target_rows)
    shape = (len(sources), width)
    encoder, decoder, labels = (np.zeros(shape, "int32") for _ in range(3))
    for i, (source, target) in enumerate(zip(source_rows, target_rows, strict=True)):
        encoder[i, : len(source)] = source
        decoder[i, : len(target) + 1] = [START_ID, *target]
        labels[i, : len(target) + 1] = [*target, END_ID]
    logits = translator.transformer(
        {"encoder_inputs": encoder, "decoder_inputs": decoder}
    )
    losses = keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True
    )
    mask = labels != PAD_ID
    return float(np.sum(keras.ops.convert_to_numpy(losses) * mask) / mask.sum())
