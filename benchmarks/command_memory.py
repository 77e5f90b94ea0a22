"""Peak memory of ``kt-translate`` on a CTranslate2 export, against
CTranslate2 alone on the same export and sentences.

    python -m benchmarks.command_memory [--export DIR] [--source FILE] \\
        [--beam-size 4] [--repeats 5] [--json results.json]

Without ``--export``, the number task's translator
(``tests/fixtures/v0_2_0/translator.keras``) is exported with ``kt-export
--format ctranslate2`` into a temporary directory first. Without
``--source``, a fixed list of number words is translated.

Each system runs as a process of its own, in turns, ``--repeats`` times;
what is measured is the peak resident set size the kernel reports for that
process (``ru_maxrss`` from ``wait4``, the process forked from a small
launcher: a process's count starts at its parent's size). "CTranslate2
alone" is a Python process that imports ``ctranslate2`` and
``sentencepiece`` and nothing else, loads the export with
``ctranslate2.Translator`` and the engine's threads (``inter_threads=2,
intra_threads=1``), and translates the same sentences as SentencePiece
pieces ending with ``</s>``, with the same beam size: the floor for a
command that translates an export. Reported: each run's peak, the medians
and their ratio, which ``kt-translate`` keeps within ``LIMIT`` (1.10).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import REPO

FIXTURE = REPO / "tests" / "fixtures" / "v0_2_0" / "translator.keras"
# The command's peak over CTranslate2's: the most it may be.
LIMIT = 1.10
# The CTranslate2 engine's default threads
# (keras_transformer.translate.ctranslate2_translator).
INTER_THREADS = 2
INTRA_THREADS = 1
SENTENCES = [
    "zero",
    "seven",
    "forty-two",
    "one hundred",
    "nine hundred ninety-nine",
    "three hundred forty-two",
    "twenty-one thousand five",
    "thirty-one thousand four hundred fifteen",
    "four hundred thousand twelve",
    "nine hundred thousand seventeen",
    "nine hundred ninety-nine thousand nine hundred ninety-nine",
    "eighty",
]

# CTranslate2 alone: python -c ALONE EXPORT BEAM_SIZE INTER INTRA < sentences.
ALONE = """
import json, os, sys
import ctranslate2
import sentencepiece

path, beam, inter, intra = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:5])
with open(os.path.join(path, "keras_transformer.json")) as file:
    metadata = json.load(file)
processor = sentencepiece.SentencePieceProcessor(
    model_file=os.path.join(path, "tokenizer.model")  # kind "sentencepiece"
)
translator = ctranslate2.Translator(
    path, device="cpu", inter_threads=inter, intra_threads=intra
)
texts = [line.rstrip("\\n") for line in sys.stdin]
pieces = [p + ["</s>"] for p in processor.Encode(texts, out_type=str)]
results = translator.translate_batch(pieces, beam_size=beam, max_batch_size=0)
for result in results:
    print(processor.DecodePieces([t for t in result.hypotheses[0] if t != "</s>"]))
"""


def script(name):
    """The installed console script ``name`` beside this Python (the one a
    user runs), else the one on the PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.path.isfile(beside) else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not installed beside {sys.executable}")
    return found


# Runs a command and writes its exit status and peak RSS (ru_maxrss from
# wait4) to a file: python -c LAUNCH REPORT COMMAND... A process's ru_maxrss
# starts at its parent's resident size when it forks (the copy of the
# parent's memory before exec counts), so the command is forked from this
# small process rather than from the caller, which may be large (a test
# run that has loaded TensorFlow).
LAUNCH = """
import os, sys
report, command = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(command[0], command)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as file:
    file.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def run_measured(command, stdin_text="", env=None):
    """Run ``command`` to its end; ``(exit status, peak RSS in bytes,
    stdout, stderr)``, the peak that of that process alone."""
    with tempfile.TemporaryDirectory() as work:
        paths = {name: os.path.join(work, name) for name in ("in", "out", "err")}
        with open(paths["in"], "w", encoding="utf-8") as file:
            file.write(stdin_text)
        report = os.path.join(work, "report")
        with (
            open(paths["in"], encoding="utf-8") as stdin,
            open(paths["out"], "w", encoding="utf-8") as out,
            open(paths["err"], "w", encoding="utf-8") as err,
        ):
            subprocess.run(
                [sys.executable, "-c", LAUNCH, report, *map(str, command)],
                stdin=stdin,
                stdout=out,
                stderr=err,
                env=env,
                check=True,
            )
        with open(report) as file:
            status, peak = map(int, file.read().split())
        with open(paths["out"], encoding="utf-8") as out:
            with open(paths["err"], encoding="utf-8") as err:
                # ru_maxrss is in kibibytes on Linux.
                return status, peak * 1024, out.read(), err.read()


def alone_command(export, beam_size):
    return [
        sys.executable,
        "-c",
        ALONE,
        str(export),
        str(beam_size),
        str(INTER_THREADS),
        str(INTRA_THREADS),
    ]


def command_line(export, beam_size):
    """``kt-translate`` on the export, sentences from stdin (as the baseline
    reads them)."""
    beam = ["--beam-size", str(beam_size)]
    return [script("kt-translate"), "--model", str(export), *beam]


def make_export(model, out):
    """``kt-export --format ctranslate2`` of ``model`` into ``out``."""
    command = [script("kt-export"), "--model", str(model), "--format", "ctranslate2"]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"kt-export failed: {done.stderr.strip()[-2000:]}")
    return out


def measure(export, sentences, beam_size=4, repeats=5, env=None):
    """Both systems ``repeats`` times, in turns; the result dict.

    Raises:
        RuntimeError: a run failed, or did not print a line per sentence.
    """
    text = "".join(f"{sentence}\n" for sentence in sentences)
    systems = {
        "ctranslate2": alone_command(export, beam_size),
        "kt-translate": command_line(export, beam_size),
    }
    peaks = {name: [] for name in systems}
    outputs = {}
    for _ in range(repeats):
        for name, command in systems.items():
            status, peak, out, err = run_measured(command, text, env)
            lines = out.splitlines()
            if status != 0 or len(lines) != len(sentences):
                raise RuntimeError(
                    f"{name} exited with {status}, {len(lines)} lines for "
                    f"{len(sentences)} sentences: {err.strip()[-2000:]}"
                )
            peaks[name].append(peak)
            outputs[name] = lines
    return summarize(peaks, outputs, export, beam_size, len(sentences))


def summarize(peaks, outputs, export, beam_size, sentences):
    """The medians, their ratio and whether it is within ``LIMIT``."""
    median = {name: statistics.median(values) for name, values in peaks.items()}
    ratio = median["kt-translate"] / median["ctranslate2"]
    return {
        "export": str(export),
        "sentences": sentences,
        "beam_size": beam_size,
        "peak_rss_bytes": peaks,
        "median_peak_rss_bytes": median,
        "ratio": ratio,
        "limit": LIMIT,
        "within_limit": ratio <= LIMIT,
        "same_translations": outputs.get("kt-translate") == outputs.get("ctranslate2"),
    }


def report(result):
    """The result as a few lines of text."""
    mib = 1 << 20
    lines = [
        f"{result['sentences']} sentences, beam {result['beam_size']}, "
        f"export {result['export']}"
    ]
    for name, values in result["peak_rss_bytes"].items():
        runs = ", ".join(f"{v / mib:.1f}" for v in values)
        median = result["median_peak_rss_bytes"][name] / mib
        lines.append(f"  {name:<12} peak RSS {median:7.1f} MiB (runs: {runs})")
    verdict = "within" if result["within_limit"] else "OVER"
    lines.append(
        f"  kt-translate / CTranslate2 alone: {result['ratio']:.3f} "
        f"({verdict} the limit {result['limit']:.2f})"
    )
    return "\n".join(lines)


def read_sentences(path):
    with open(path, encoding="utf-8") as file:
        return [line.rstrip("\r\n") for line in file]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.command_memory",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--export", help="a CTranslate2 export (default: made)")
    parser.add_argument("--model", default=str(FIXTURE), help="exported if no --export")
    parser.add_argument("--source", help="sentences, one per line")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sentences = read_sentences(args.source) if args.source else SENTENCES
    with tempfile.TemporaryDirectory() as work:
        export = args.export or make_export(args.model, os.path.join(work, "ct2"))
        result = measure(export, sentences, args.beam_size, args.repeats)
    print(report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
            file.write("\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["within_limit"] else 1)
