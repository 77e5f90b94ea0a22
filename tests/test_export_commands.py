"""kt-export, and kt-translate / kt-evaluate / kt-attention / kt-serve given
an export.

The commands are run through their ``main`` on the trained number-task
translator of 0.2.0; what they print and write is checked against the
``Translator`` the export came from. Marked ``once``: the commands' own
Python, the same on every backend (the exports' parity per backend is in
test_export_ctranslate2.py and test_export_saved_model.py).

Given an export, the installed ``kt-translate`` and ``kt-serve`` import
neither Keras, nor a backend, nor TensorFlow (the modules a process imported
are written when it exits, by a ``sitecustomize``), and ``kt-translate``'s
peak memory stays within 10 % of CTranslate2's alone on the same export and
sentences (``benchmarks/command_memory.py``).
"""

import gzip
import json
import os
import re
import subprocess

import pytest

from benchmarks import command_memory
from keras_transformer.cli import attention, evaluate, export, translate
from keras_transformer.data.numbers import english, german
from tests.installed_commands import (
    Server,
    command,
    environment,
    heavy,
    imported,
    sitecustomize,
)
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
        # A search CTranslate2's engine cannot run is not kept as the default.
        (
            ["--format", "ctranslate2", "--length-penalty-form", "transformers"],
            'length_penalty_form="gnmt"',
        ),
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


# -- the installed commands: no Keras, the memory of CTranslate2 alone -------------

PROGRESS = re.compile(r"\d+/\d+ sentences, .*")


def user_environment():
    """The environment of a user who set no log level (the suite sets one)."""
    return environment(os.environ.get("KERAS_BACKEND"), log_level=None)


def test_kt_translate_on_an_export_imports_no_keras(numbers, folder, tmp_path):
    report = tmp_path / "modules.json"
    env = sitecustomize(tmp_path / "site", user_environment(), report=report)
    sentences = [english(n) for n in NUMBERS]
    done = subprocess.run(
        [*command("kt-translate"), "--model", str(folder), *sentences],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == numbers.translate(sentences)
    lines = done.stderr.splitlines()
    assert [line for line in lines if not PROGRESS.fullmatch(line)] == []
    modules = imported(report)
    assert "ctranslate2" in modules and "keras_transformer.cli.translate" in modules
    assert heavy(modules) == []


def test_kt_serve_on_an_export_imports_no_keras(folder, tmp_path):
    report = tmp_path / "modules.json"
    env = sitecustomize(tmp_path / "site", user_environment(), report=report)
    server = Server(["--model", str(folder)], env=env)
    try:
        assert server.url, (server.ready_line, "".join(server.stderr)[-3000:])
        texts = [english(n) for n in NUMBERS]
        status, body = server.post("/translate", {"texts": texts})
        assert status == 200 and len(body["translations"]) == len(texts), body
    finally:
        exit_status = server.stop()
    assert exit_status == 0, "".join(server.stderr)[-3000:]
    modules = imported(report)
    assert "ctranslate2" in modules and "uvicorn" in modules
    assert heavy(modules) == []


def test_kt_translate_on_an_export_takes_the_memory_of_ctranslate2_alone(folder):
    result = command_memory.measure(folder, command_memory.SENTENCES, repeats=1)
    assert result["ratio"] <= command_memory.LIMIT, command_memory.report(result)
