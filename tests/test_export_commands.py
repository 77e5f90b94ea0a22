"""kt-export, and kt-translate / kt-evaluate / kt-attention given an export.

The commands are run through their ``main`` on the trained number-task
translator of 0.2.0; what they print and write is checked against the
``Translator`` the export came from. Marked ``once``: the commands' own
Python, the same on every backend (the exports' parity per backend is in
test_export_ctranslate2.py and test_export_saved_model.py).
"""

import gzip
import json

import pytest

from keras_transformer.cli import attention, evaluate, export, translate
from keras_transformer.data.numbers import english, german
from tests.test_export_ctranslate2 import FIXTURE, load

pytestmark = pytest.mark.once
NUMBERS = [0, 7, 42, 100, 999, 31_415, 900_017]


@pytest.fixture(scope="module")
def numbers():
    return load(FIXTURE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "ct2"
    assert export.main(
        ["--model", FIXTURE, "--format", "ctranslate2", "--out", str(out)]
    ) == str(out)
    return out


def test_kt_translate_takes_the_folder(numbers, folder, capsys):
    sentences = [english(n) for n in NUMBERS]
    got = translate.main(["--model", str(folder), *sentences])
    assert got == numbers.translate(sentences)
    assert capsys.readouterr().out.splitlines() == got
    n_best = translate.main(
        ["--model", str(folder), "--n-best", "2", "--beam-size", "2", sentences[3]]
    )
    assert [t for t, _ in n_best[0]] == [
        t for t, _ in numbers.n_best(sentences[3:4], n=2, beam_size=2)[0]
    ]


def test_kt_evaluate_takes_the_folder(numbers, folder, tmp_path):
    source, reference = tmp_path / "src.gz", tmp_path / "ref.gz"
    with gzip.open(source, "wt") as file:
        file.write("".join(f"{english(n)}\n" for n in NUMBERS))
    with gzip.open(reference, "wt") as file:
        file.write("".join(f"{german(n)}\n" for n in NUMBERS))
    out, hypotheses = tmp_path / "eval.json", tmp_path / "hyp.txt"
    result = evaluate.main(
        [
            "--model",
            str(folder),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--out",
            str(out),
            "--hypotheses",
            str(hypotheses),
        ]
    )
    assert result["engine"] == "ctranslate2 float32"
    assert json.loads(out.read_text())["bleu"] == result["bleu"]
    expected = numbers.translate([english(n) for n in NUMBERS])
    assert hypotheses.read_text().splitlines() == expected


def test_commands_that_need_the_keras_file_say_so(folder, tmp_path, capsys):
    text = tmp_path / "one.txt"
    text.write_text("seven\n")
    cases = {
        "attention": lambda: attention.main(
            ["--model", str(folder), "--out", str(tmp_path / "a.png"), "seven"]
        ),
        "checkpoint": lambda: evaluate.main(
            [
                "--model",
                str(folder),
                "--source",
                str(text),
                "--reference",
                str(text),
                "--checkpoint",
                str(tmp_path),
            ]
        ),
        "export of an export": lambda: export.main(
            ["--model", str(folder), "--format", "saved_model", "--out", str(tmp_path)]
        ),
    }
    for case, run in cases.items():
        with pytest.raises(SystemExit) as stopped:
            run()
        assert stopped.value.code == 2, case
    errors = capsys.readouterr().err
    assert "an export has no attention weights" in errors
    assert "is an export, not a translator.keras" in errors
    assert "is already an export" in errors


def test_kt_export_refuses_what_it_cannot_do(folder, tmp_path, capsys):
    before = sorted(p.name for p in folder.iterdir())
    cases = [
        (["--format", "ctranslate2", "--out", str(folder)], "overwrite"),
        (["--format", "saved_model", "--quantization", "int8"], "--quantization"),
        (["--format", "ctranslate2", "--beam-size", "2"], "--beam-size"),
        (["--format", "ctranslate2", "--quantization", "int3"], "quantization"),
        (["--format", "onnx"], "invalid choice"),
    ]
    for arguments, words in cases:
        if "--out" not in arguments:
            arguments = [*arguments, "--out", str(tmp_path / "x")]
        with pytest.raises(SystemExit) as stopped:
            export.main(["--model", FIXTURE, *arguments])
        assert stopped.value.code == 2, arguments
        assert words in capsys.readouterr().err, arguments
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not (tmp_path / "x").exists()
    with pytest.raises(IsADirectoryError, match="not a CTranslate2 export"):
        from keras_transformer.translate.evaluation import load_translator

        load_translator(tmp_path)
