"""kt-evaluate: scoring, the command end to end, and its failures."""

import json
import pathlib

import keras
import pytest

import keras_transformer as kt
from keras_transformer import data as data_module
from keras_transformer.cli import evaluate
from keras_transformer.data import tokenizer as tk
from keras_transformer.translate import evaluation

SENTENCES = [
    "a man is walking",
    "a woman is running",
    "two dogs play in the park",
    "the child eats an apple",
    "a girl reads a book",
    "the boy is swimming",
    "three men are talking",
    "a cat sleeps on the sofa",
    "people walk down the street",
    "a dog runs on the beach",
    "ein mann geht",
    "eine frau rennt",
    "zwei hunde spielen im park",
    "das kind isst einen apfel",
    "ein mädchen liest ein buch",
    "der junge schwimmt",
    "drei männer reden",
    "eine katze schläft auf dem sofa",
    "leute gehen die straße entlang",
    "ein hund rennt am strand",
    "a man and a woman",
    "the dog and the cat",
    "ein mann und eine frau",
    "der hund und die katze",
    "the street is busy",
    "die straße ist voll",
    "a red car",
    "ein rotes auto",
    "the sun is shining",
    "die sonne scheint",
]


# -- score ---------------------------------------------------------------------


@pytest.mark.once
def test_score_of_the_references_is_100():
    refs = SENTENCES[:8]
    result = evaluation.score(refs, refs)
    assert result["bleu"] == pytest.approx(100.0)
    assert result["chrf"] == pytest.approx(100.0)
    assert result["sentences"] == 8
    assert result["bleu_signature"].startswith("nrefs:1|")
    assert "tok:13a" in result["bleu_signature"]
    assert result["chrf_signature"].startswith("nrefs:1|")
    assert result["bleu_details"].startswith("BLEU = 100.00")


@pytest.mark.once
def test_score_of_unrelated_words_is_0():
    result = evaluation.score(["x y z w", "q r s t"], ["a b c d", "e f g h"])
    assert result["bleu"] == 0.0 and result["chrf"] == 0.0


@pytest.mark.once
def test_score_matches_sacrebleu():
    import sacrebleu

    hyps = ["the cat sat on the mat .", "a dog runs", ""]
    refs = ["the cat sat on a mat .", "a dog is running", "hello world"]
    result = evaluation.score(hyps, refs)
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    assert result["bleu"] == bleu.score and result["chrf"] == chrf.score
    assert 0 < result["bleu"] < 100 and 0 < result["chrf"] < 100
    assert result["bleu_details"] == str(bleu)
    assert isinstance(result["bleu"], float) and isinstance(result["chrf"], float)
    json.dumps(result)  # plain types only
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        evaluation.score(hyps[:2], refs)


@pytest.mark.once
def test_default_out(tmp_path):
    model = str(tmp_path / "run" / "translator.keras")
    for source in ("data/val.de", "data/val.de.gz"):
        expected = str(tmp_path / "run" / "eval-val.json")
        assert evaluate.default_out(model, source) == expected
    assert evaluate.default_out("translator.keras", "sources") == "eval-sources.json"


@pytest.mark.once
def test_write_atomic(tmp_path):
    path = tmp_path / "new" / "dir" / "out.txt"
    evaluate.write_atomic(path, "Männer\n")
    evaluate.write_atomic(path, "ß\n")  # replaces
    assert path.read_text(encoding="utf-8") == "ß\n"
    assert [p.name for p in path.parent.iterdir()] == ["out.txt"]  # no temp left


# -- the command ---------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """An untrained tiny translator saved as a .keras file."""
    keras.utils.set_random_seed(0)
    tokenizer = tk.make_tokenizer(tk.train_tokenizer(SENTENCES, 80))
    model = kt.build_model(
        "tiny",
        src_vocab_size=tokenizer.vocabulary_size(),
        share_embeddings=True,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_layers=1,
        max_length=32,
    )
    path = tmp_path_factory.mktemp("model") / "translator.keras"
    kt.Translator(tokenizer, model).save(path)
    return path


@pytest.fixture
def data(tmp_path):
    source = tmp_path / "test.de"
    reference = tmp_path / "test.en"
    source.write_text("\n".join(SENTENCES[10:15]) + "\n", encoding="utf-8")
    reference.write_text("\n".join(SENTENCES[:5]) + "\n", encoding="utf-8")
    return source, reference


@pytest.mark.slow
@pytest.mark.once
def test_end_to_end(model_path, data, tmp_path, capsys):
    source, reference = data
    out = tmp_path / "results" / "eval.json"
    hyps = tmp_path / "results" / "hyps.txt"
    argv = ["--model", str(model_path), "--source", str(source)]
    argv += ["--reference", str(reference), "--out", str(out)]
    argv += ["--hypotheses", str(hyps), "--batch-size", "2"]
    argv += ["--beam-size", "3", "--length-penalty", "0.5"]
    result = evaluate.main(argv)
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved == result
    assert 0.0 <= saved["bleu"] <= 100.0 and 0.0 <= saved["chrf"] <= 100.0
    assert saved["sentences"] == 5
    assert saved["backend"] == keras.backend.backend()
    assert saved["model"] == str(model_path)
    assert saved["source"] == str(source) and saved["reference"] == str(reference)
    assert saved["seconds"] >= 0
    lines = hyps.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == ""  # five lines, each with "\n"
    # The scores are those of the hypotheses written, and these come from
    # the search asked for.
    assert evaluation.score(lines[:5], SENTENCES[:5])["bleu"] == saved["bleu"]
    assert saved["beam_size"] == 3 and saved["length_penalty"] == 0.5
    translator = evaluation.load_translator(model_path)
    sources = SENTENCES[10:15]
    assert lines[:5] == translator.translate(sources, beam_size=3, length_penalty=0.5)
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "chrF" in printed and str(out) in printed


@pytest.mark.slow
@pytest.mark.once
def test_weights_from_a_checkpoint(model_path, data, tmp_path, capsys):
    from keras_transformer.trainer import checkpoints

    source, reference = data
    translator = evaluation.load_translator(model_path)
    model = translator.transformer
    model.set_weights([w * 1.5 for w in model.get_weights()])
    path = checkpoints.save_checkpoint(model, tmp_path / "ckpt", {"iterations": 7})
    out, hyps = tmp_path / "run" / "eval.json", tmp_path / "run" / "hyps.txt"
    argv = ["--model", str(model_path), "--source", str(source)]
    argv += ["--reference", str(reference), "--out", str(out)]
    argv += ["--hypotheses", str(hyps), "--beam-size", "2"]
    result = evaluate.main([*argv, "--checkpoint", str(path)])
    assert result["checkpoint"] == str(path)
    expected = translator.translate(SENTENCES[10:15], beam_size=2)
    assert hyps.read_text(encoding="utf-8").splitlines() == expected
    bad = [*argv[:6], "--checkpoint", str(tmp_path)]
    err = run_failing(bad, capsys, tmp_path / "o")
    assert f"{tmp_path}: not a checkpoint folder" in err


@pytest.mark.slow
@pytest.mark.once
def test_default_out_next_to_the_model(model_path, data):
    source, reference = data
    argv = ["--model", str(model_path), "--source", str(source)]
    result = evaluate.main(argv + ["--reference", str(reference)])
    out = model_path.parent / "eval-test.json"
    assert json.loads(out.read_text(encoding="utf-8")) == result


def run_failing(argv, capsys, out):
    """Run main expecting exit status 2; it must leave the output files alone.

    Returns:
        What it printed to stderr.
    """
    out.write_text("earlier results\n")
    hyps = out.parent / "hyps.txt"
    with pytest.raises(SystemExit) as info:
        evaluate.main(argv + ["--out", str(out), "--hypotheses", str(hyps)])
    assert info.value.code == 2
    assert out.read_text() == "earlier results\n"
    assert not hyps.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []
    return capsys.readouterr().err


@pytest.mark.once
def test_line_counts_differ(model_path, data, tmp_path, capsys):
    source, _ = data
    reference = tmp_path / "short.en"
    reference.write_text("one\ntwo\n")
    argv = ["--model", str(model_path), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert str(source) in err and str(reference) in err
    assert "5 lines" in err and "has 2" in err


@pytest.mark.once
def test_missing_source(model_path, data, tmp_path, capsys):
    _, reference = data
    source = tmp_path / "missing.de"
    argv = ["--model", str(model_path), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert f"{source}: no such file" in err


@pytest.mark.once
def test_bad_data_is_reported_before_the_model_is_loaded(data, tmp_path, capsys):
    source, _ = data
    reference = tmp_path / "blank.en"
    reference.write_text("a\nb\n\nd\ne\n")
    argv = ["--model", str(tmp_path / "absent.keras"), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert f"{reference}:3: empty line" in err


@pytest.mark.once
def test_encodings_of_sources_and_references(data, tmp_path, capsys):
    """The corpus rule holds here too: old Mac line endings are named, a
    byte-order mark is removed and said (before the model is loaded)."""
    source, reference = data
    mac = tmp_path / "mac.de"
    mac.write_bytes(b"ein Hund\rzwei\r")
    argv = ["--model", str(tmp_path / "absent.keras"), "--reference", str(reference)]
    err = run_failing(argv + ["--source", str(mac)], capsys, tmp_path / "o")
    assert f"{mac}:1: one line with carriage returns" in err
    marked = tmp_path / "bom.en"
    marked.write_bytes(b"\xef\xbb\xbf" + reference.read_bytes())
    argv = ["--model", str(tmp_path / "absent.keras"), "--source", str(source)]
    with pytest.warns(data_module.CorpusWarning, match=f"{marked}: starts with a"):
        err = run_failing(argv + ["--reference", str(marked)], capsys, tmp_path / "o")
    assert "absent.keras" in err  # the model, next: the files were read


@pytest.mark.once
def test_missing_model(data, tmp_path, capsys):
    source, reference = data
    model = tmp_path / "absent" / "translator.keras"
    argv = ["--model", str(model), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert f"{model}: no such model file" in err
    argv = ["--model", str(tmp_path), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert f"{tmp_path}: is a directory" in err


@pytest.mark.slow
@pytest.mark.once
def test_model_that_is_not_a_translator(data, tmp_path, capsys):
    source, reference = data
    model = tmp_path / "transformer.keras"
    kt.build_model("tiny", src_vocab_size=20, d_model=16, num_heads=2, d_ff=32).save(
        model
    )
    argv = ["--model", str(model), "--source", str(source)]
    err = run_failing(argv + ["--reference", str(reference)], capsys, tmp_path / "o")
    assert f"{model}: holds a Transformer, not a keras_transformer Translator" in err


# -- kt-translate ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.once
def test_translate_command_arguments_and_stdin(model_path, capsys):
    import io

    from keras_transformer.cli import translate

    sentences = SENTENCES[:3]
    expected = evaluation.load_translator(model_path).translate(sentences)
    from_args = translate.main(["--model", str(model_path), *sentences])
    assert from_args == expected
    assert capsys.readouterr().out == "".join(t + "\n" for t in expected)
    stdin = io.StringIO("".join(s + "\n" for s in sentences))
    out = io.StringIO()
    assert translate.main(["--model", str(model_path)], stdin=stdin, stdout=out) == (
        expected
    )
    assert out.getvalue().splitlines() == expected


@pytest.mark.slow
@pytest.mark.once
def test_translate_command_search_options(model_path, capsys):
    from keras_transformer.cli import translate

    sentences = SENTENCES[3:5]
    translator = evaluation.load_translator(model_path)
    greedy = translate.main(
        ["--model", str(model_path), "--beam-size", "1"] + sentences
    )
    assert greedy == translator.translate(sentences, beam_size=1)
    capsys.readouterr()
    n_best = translate.main(
        ["--model", str(model_path), "--beam-size", "3", "--n-best", "2", *sentences]
    )
    assert n_best == translator.n_best(sentences, n=2, beam_size=3)
    blocks = capsys.readouterr().out.split("\n\n")
    assert len(blocks) == 3 and blocks[2] == ""  # two sentences, then the end
    for block, hypotheses in zip(blocks, n_best, strict=False):
        lines = block.split("\n")
        assert [line.split("\t", 1)[1] for line in lines] == [t for t, _ in hypotheses]
        assert [float(line.split("\t")[0]) for line in lines] == pytest.approx(
            [score for _, score in hypotheses], abs=1e-4
        )
    for bad in (["--beam-size", "0"], ["--length-penalty", "-1"], ["--n-best", "5"]):
        with pytest.raises(SystemExit) as raised:
            translate.main(["--model", str(model_path), *bad, "x"])
        assert raised.value.code == 2
    err = capsys.readouterr().err
    # SearchOptions' own checks, named after the option.
    assert "argument --beam-size: must be >= 1. Received: beam_size=0" in err
    assert "argument --length-penalty: must be >= 0 and finite" in err
    assert "--n-best 5 is more than the model's beam size 4" in err


@pytest.mark.once
def test_translate_command_missing_model(tmp_path, capsys):
    from keras_transformer.cli import translate

    with pytest.raises(SystemExit) as raised:
        translate.main(["--model", str(tmp_path / "none.keras"), "hello"])
    assert raised.value.code == 2
    assert "none.keras" in capsys.readouterr().err


# -- --glossary ------------------------------------------------------------------

# The trained number-task translator of 0.2.0 and what it gives unconstrained.
NUMBERS = pathlib.Path(__file__).parent / "fixtures" / "v0_2_0" / "translator.keras"
UNCONSTRAINED = json.loads((NUMBERS.parent / "expected.json").read_text("utf-8"))


def write_glossary(tmp_path, text):
    path = tmp_path / "terms.tsv"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.once
def test_bad_glossary_is_reported_before_the_model_is_loaded(data, tmp_path, capsys):
    from keras_transformer.cli import translate

    glossary = write_glossary(tmp_path, "# numbers\nzero\tnull\nseven sieben\n")
    message = f'{glossary}, line 3: expected "source<TAB>target", found no tab\n'
    absent = str(tmp_path / "absent.keras")  # a model error would come later
    source, reference = data
    argv = ["--model", absent, "--source", str(source), "--reference", str(reference)]
    err = run_failing([*argv, "--glossary", str(glossary)], capsys, tmp_path / "o")
    assert err.endswith(f"kt-evaluate: error: {message}")
    for glossary_path, expected in (
        (glossary, message),
        (tmp_path / "none.tsv", f"{tmp_path / 'none.tsv'}: no such file\n"),
    ):
        with pytest.raises(SystemExit) as raised:
            translate.main(["--model", absent, "--glossary", str(glossary_path), "x"])
        assert raised.value.code == 2
        assert capsys.readouterr().err.endswith(f"kt-translate: error: {expected}")


@pytest.mark.slow
@pytest.mark.once
def test_translate_and_evaluate_with_a_glossary(tmp_path, capsys):
    from keras_transformer.cli import translate

    glossary = write_glossary(tmp_path, "zero\tnull\n")
    index = UNCONSTRAINED["sentences"].index("zero")
    assert "null" not in UNCONSTRAINED["beam4"][index]  # "drei"
    with_terms = ["--model", str(NUMBERS), "--glossary", str(glossary)]
    translations = translate.main([*with_terms, "zero", "seven"])
    assert "null" in translations[0] and translations[1] == "sieben"
    best = translate.main([*with_terms, "--n-best", "2", "zero"])
    assert "null" in best[0][0][0]
    capsys.readouterr()
    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("zero\nseven\n", encoding="utf-8")
    reference.write_text("null\nsieben\n", encoding="utf-8")
    hyps = tmp_path / "hyps.txt"
    argv = [*with_terms, "--source", str(source), "--reference", str(reference)]
    argv += ["--out", str(tmp_path / "eval.json"), "--hypotheses", str(hyps)]
    result = evaluate.main(argv)
    assert hyps.read_text(encoding="utf-8").splitlines() == translations
    assert result["glossary"] == str(glossary)


@pytest.mark.slow
@pytest.mark.once
def test_glossary_the_model_cannot_follow(tmp_path, capsys, monkeypatch):
    """A target term the vocabulary cannot spell, or an engine without
    constrained search, stop the command like other bad input."""
    from keras_transformer.cli import translate

    argv = ["--model", str(NUMBERS), "--glossary"]
    unspellable = write_glossary(tmp_path, "zero\t\u2603\n")
    with pytest.raises(SystemExit) as raised:
        translate.main([*argv, str(unspellable), "zero"])
    assert raised.value.code == 2
    assert "target term '\u2603' has characters" in capsys.readouterr().err

    def unconstrained(path):
        translator = evaluation.load_translator(path)
        translator.takes_constraints = False  # as a CTranslate2 export's
        return translator

    monkeypatch.setattr(translate, "load_translator", unconstrained)
    glossary = write_glossary(tmp_path, "zero\tnull\n")
    with pytest.raises(SystemExit) as raised:
        translate.main([*argv, str(glossary), "zero"])
    assert raised.value.code == 2
    assert "cannot follow a glossary" in capsys.readouterr().err
