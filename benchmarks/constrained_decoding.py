"""Lexically constrained decoding on real text: coverage, BLEU and time.

    python -m benchmarks.constrained_decoding --model runs/multi30k/translator.keras \\
        [--source ../shared/data/multi30k/val.de.gz] \\
        [--reference ../shared/data/multi30k/val.en.gz] \\
        [--backends tensorflow jax torch] [--repeats 1] [--json out.json]
    python -m benchmarks.constrained_decoding --numbers [--model numbers.keras] \\
        [--beams 4 8 12] [--backends ...] [--json out.json]

Why: a constraint the search drops silently, or one that costs many times a
plain search, makes a glossary useless; this measures both where they show,
on real sentences, as Post & Vilar (2018) did. Each sentence is translated
without constraints (beam 4, their α = 0.6); then one and, apart, two words
or phrases of its reference that the output misses are drawn
(``draw_constraints``) and it is translated again holding them. Reported
for each set: the share of constraints the constrained outputs hold (by
token ids, as the search sees them), overall and among those that fit the
output limit (the only ones the search promises); sacreBLEU of the
sentences with constraints, without and with them; and the seconds of the
plain and the constrained search of those sentences, each run once to
compile and warm, then ``--repeats`` times in turns (the median kept).

The constraints are drawn once, from the first backend's unconstrained
output, and the other backends get the same ones (``--constraints``): then
the backends' coverage and BLEU compare the same task, and the timing ratio
the same work. The Multi30k 2016 test set is not on this machine; the
default is the validation set (1014 sentences, de→en), as the data's README
asks (tune and report on val).

``--numbers`` measures a glossary on the numbers task (a model that writes
German number words): ``{"thirty": "dreissig"}``, the Swiss spelling the
model never writes (it writes "dreißig"). Over numbers whose English holds
"thirty" and numbers whose English does not, translated in one call with
the glossary, it reports the share of the first whose output holds
"dreissig", whose output is the plain one with "dreißig" spelled "dreissig"
(nothing else changed), and whose output is the reference so spelled; and
the share of the others whose output is the plain one (no term, no change).
For each beam of ``--beams``: dynamic beam allocation needs a beam wider
than the constraint has tokens to keep good hypotheses.

Each backend runs in its own process (``--backends``); without it the
current ``KERAS_BACKEND`` runs in this process.
"""

import argparse
import itertools
import json
import os
import platform
import random
import re
import statistics
import subprocess
import tempfile
import unicodedata
import warnings

from benchmarks import REPO, child_env, python_module
from benchmarks.timing import call_times

BACKENDS = ("tensorflow", "jax", "torch")
TEXT_MODEL = "runs/multi30k/translator.keras"
SOURCE = "../shared/data/multi30k/val.de.gz"
REFERENCE = "../shared/data/multi30k/val.en.gz"
NUMBERS_MODEL = str(REPO / "tests" / "fixtures" / "v0_3_0" / "translator.keras")
COUNTS = (1, 2)  # constraints per sentence, as Post & Vilar drew them
MAX_WORDS = 3  # the longest phrase drawn
SEARCH = {"beam_size": 4, "length_penalty": 0.6}
GLOSSARY = {"thirty": "dreissig"}
TEST_SET_NOTE = (
    "The Multi30k 2016 test set is not on this machine: the default source "
    "is its val set (tune and report on val, says the data's README)."
)
MODEL_SPELLING = "dreißig"


# -- drawing constraints (pure Python) -------------------------------------------


def _punctuation(text):
    return all(unicodedata.category(c).startswith("P") for c in text)


def _segments(reference):
    """The reference's runs of words that no punctuation separates: a phrase
    drawn from one reads, contiguous, in the reference. Punctuation is
    stripped from a token's ends ("hat," is "hat", and ends a run); a token
    of punctuation only is no word and ends a run too."""
    runs, run = [], []
    for token in reference.split():
        start, end = 0, len(token)
        while start < end and _punctuation(token[start]):
            start += 1
        while end > start and _punctuation(token[end - 1]):
            end -= 1
        if start > 0 and run:
            runs.append(run)
            run = []
        if start < end:
            run.append(token[start:end])
        if end < len(token) and run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return runs


def _occurs(phrase, output):
    """Whether ``phrase`` occurs in ``output`` as whole words (the same
    case; any run of whitespace between words)."""
    words = r"\s+".join(re.escape(word) for word in phrase.split())
    return re.search(rf"(?<!\w){words}(?!\w)", output) is not None


def candidates(reference, output, max_words=MAX_WORDS):
    """``(start, end, phrase)`` of every word n-gram of ``reference`` (1 to
    ``max_words`` words, within a run of ``_segments``) that ``output`` does
    not hold; ``start``/``end`` count words over the whole reference."""
    found, offset = [], 0
    for run in _segments(reference):
        for start in range(len(run)):
            for end in range(start + 1, min(start + max_words, len(run)) + 1):
                phrase = " ".join(run[start:end])
                if not _occurs(phrase, output):
                    found.append((offset + start, offset + end, phrase))
        offset += len(run)
    return found


def draw_constraints(reference, output, count, rng):
    """``count`` phrases of ``reference`` that ``output`` (its unconstrained
    translation) misses, as Post & Vilar (2018) drew constraints.

    The phrases are word n-grams of 1 to 3 words (``candidates``) that do
    not overlap in the reference and differ in text; the set is chosen
    uniformly, with ``rng`` (a ``random.Random``), among all such sets.
    Returns them in reference order, or ``[]`` when no set of ``count``
    exists (a sentence that cannot give ``count`` constraints is left out
    of that count's set, so that each set asks for exactly its number).
    """
    found = sorted(set(candidates(reference, output)))
    sets = [
        chosen
        for chosen in itertools.combinations(found, count)
        if all(a[1] <= b[0] for a, b in itertools.pairwise(chosen))
        and len({phrase for _, _, phrase in chosen}) == count
    ]
    if not sets:
        return []
    return [phrase for _, _, phrase in sets[rng.randrange(len(sets))]]


def draw_all(references, outputs, seed):
    """``{"1": [...], "2": [...]}``: per sentence, its drawn constraints for
    each count of ``COUNTS``, one seeded ``random.Random`` for each count."""
    drawn = {}
    for count in COUNTS:
        rng = random.Random(seed * 100 + count)
        drawn[str(count)] = [
            draw_constraints(reference, output, count, rng)
            for reference, output in zip(references, outputs, strict=True)
        ]
    return drawn


# -- searching, on the current backend --------------------------------------------


def search_ids(translator, texts, constraints=None, glossary=None, **search):
    """``(ids, warned)``: the best output ids of ``texts`` and whether the
    translator warned that some miss a constraint (the warning is kept
    here: it is a figure of the benchmark, not a fault)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings(
            "always", message=".*miss a constraint", category=UserWarning
        )
        ids = translator.translate_ids(
            texts, constraints=constraints, glossary=glossary, **search
        )
    warned = any("miss a constraint" in str(w.message) for w in caught)
    return [list(map(int, row)) for row in ids], warned


def output_limits(translator, texts):
    """Each text's output limit in tokens, as the translator sets it."""
    limits = []
    for row in translator.encode_sources(texts):
        row = list(row)
        length = len(row) - (1 if row and row[-1] == translator.end_id else 0)
        limits.append(translator.output_limit(length))
    return limits


def timed_pair(plain, constrained, repeats):
    """Seconds of ``plain()`` and ``constrained()``: each called once first
    (compiling, warming caches; reported apart), then ``repeats`` times in
    turns, so that a slower spell of a shared machine falls on both; the
    medians."""
    first = {"plain": call_times(plain, 1)[0]}
    first["constrained"] = call_times(constrained, 1)[0]
    times = {"plain": [], "constrained": []}
    for _ in range(repeats):
        times["plain"] += call_times(plain, 1)
        times["constrained"] += call_times(constrained, 1)
    return first, {name: statistics.median(t) for name, t in times.items()}


def _bleu(hypotheses, references):
    from keras_transformer.translate.evaluation import score

    return round(score(hypotheses, references)["bleu"], 2)


def coverage(outputs, wanted, limits):
    """Constraints held by ``outputs`` (id rows) of the id phrases
    ``wanted``: counts overall and among the rows whose phrases fit their
    output limit (``limits``) in total, and the rows holding all theirs."""
    from keras_transformer.translate.constraints import missing

    counts = {"constraints": 0, "held": 0, "feasible": 0, "feasible_held": 0}
    counts["sentences_all_held"] = 0
    for ids, phrases, limit in zip(outputs, wanted, limits, strict=True):
        held = len(phrases) - len(missing(ids, phrases))
        fits = sum(len(p) for p in phrases) <= limit
        counts["constraints"] += len(phrases)
        counts["held"] += held
        counts["feasible"] += len(phrases) if fits else 0
        counts["feasible_held"] += held if fits else 0
        counts["sentences_all_held"] += held == len(phrases)
    counts["coverage"] = round(counts["held"] / max(counts["constraints"], 1), 4)
    counts["coverage_feasible"] = round(
        counts["feasible_held"] / max(counts["feasible"], 1), 4
    )
    return counts


def constrained_set(translator, sources, references, plain_ids, drawn, repeats):
    """One count's figures: the sentences with constraints searched plain
    and constrained (timed), their coverage and BLEU."""
    from keras_transformer.translate.constraints import missing

    rows = [i for i, phrases in enumerate(drawn) if phrases]
    if not rows:
        return {"sentences": 0}
    texts = [sources[i] for i in rows]
    phrases = [drawn[i] for i in rows]
    wanted = translator.constraint_ids(texts, constraints=phrases)
    limits = output_limits(translator, texts)
    kept = {}

    def plain():
        kept["plain"] = search_ids(translator, texts, **SEARCH)[0]

    def constrained():
        kept["ids"], kept["warned"] = search_ids(
            translator, texts, constraints=phrases, **SEARCH
        )

    first, seconds = timed_pair(plain, constrained, repeats)
    result = {"sentences": len(rows)}
    result.update(coverage(kept["ids"], wanted, limits))
    result["warned"] = kept["warned"]
    result["held_by_plain_output"] = sum(
        len(w) - len(missing(plain_ids[i], w))
        for i, w in zip(rows, wanted, strict=True)
    )
    refs = [references[i] for i in rows]
    plain_texts = translator.detokenize(kept["plain"])
    constrained_texts = translator.detokenize(kept["ids"])
    result["bleu_plain"] = _bleu(plain_texts, refs)
    result["bleu_constrained"] = _bleu(constrained_texts, refs)
    result["examples"] = [
        {"reference": r, "constraints": c, "plain": p, "constrained": t}
        for r, c, p, t in itertools.islice(
            zip(refs, phrases, plain_texts, constrained_texts, strict=True), 5
        )
    ]
    result["seconds_plain"] = round(seconds["plain"], 2)
    result["seconds_constrained"] = round(seconds["constrained"], 2)
    result["first_call_seconds"] = {k: round(v, 2) for k, v in first.items()}
    result["time_ratio"] = round(seconds["constrained"] / seconds["plain"], 2)
    return result


def _machine():
    return f"{platform.machine()}, {os.cpu_count()} CPU cores"


def measure_text(model, source, reference, drawn=None, seed=0, repeats=1, limit=None):
    """The text task on the current backend; ``drawn`` (``draw_all``'s) are
    the constraints to use, or None to draw them from this output."""
    import keras

    from keras_transformer.data.corpus import read_parallel
    from keras_transformer.translate.evaluation import load_translator

    sources, references = read_parallel(source, reference)
    if limit is not None:
        sources, references = sources[:limit], references[:limit]
    translator = load_translator(model)
    plain_ids = search_ids(translator, sources, **SEARCH)[0]
    plain = translator.detokenize(plain_ids)
    origin = "given" if drawn is not None else "drawn from this backend's output"
    if drawn is None:
        drawn = draw_all(references, plain, seed)
    elif any(len(d) != len(sources) for d in drawn.values()):
        raise ValueError("the constraints given are for another set of sentences")
    sets = {
        key: constrained_set(translator, sources, references, plain_ids, rows, repeats)
        for key, rows in drawn.items()
    }
    return {
        "task": "text",
        "backend": keras.backend.backend(),
        "model": model,
        "source": source,
        "reference": reference,
        "sentences": len(sources),
        "search": dict(SEARCH),
        "seed": seed,
        "repeats": repeats,
        "constraints_origin": origin,
        "note": TEST_SET_NOTE,
        "bleu_all_plain": _bleu(plain, references),
        "sets": sets,
        "drawn": drawn,
        "machine": _machine(),
    }


# -- the numbers task -------------------------------------------------------------


def number_sets(seed=0, others=100):
    """``(matching, others)``: numbers whose English holds "thirty" (every
    n < 1000 with 30 <= n % 100 < 40, and some thousands), and ``others``
    numbers drawn at random (seeded) whose English does not."""
    from keras_transformer.data import numbers

    matching = [n for n in range(1000) if 30 <= n % 100 < 40]
    matching += [1030, 2035, 4739, 7136, 9938, 30000, 31000, 35250, 130000, 333333]
    rng = random.Random(seed)
    rest = []
    while len(rest) < others:
        n = rng.randrange(1_000_000)
        if "thirty" not in numbers.english(n) and n not in rest:
            rest.append(n)
    return matching, rest


def _share(flags):
    flags = list(flags)
    return round(sum(flags) / max(len(flags), 1), 4)


def numbers_at_beam(translator, matching, others, beam):
    """The glossary's figures at one beam size (see the module docstring):
    the numbers searched plain, then in one call with the glossary."""
    from keras_transformer.data import numbers

    texts = [numbers.english(n) for n in matching + others]
    search = dict(SEARCH, beam_size=beam)
    plain = translator.detokenize(search_ids(translator, texts, **search)[0])
    forced_ids, warned = search_ids(translator, texts, glossary=GLOSSARY, **search)
    forced = translator.detokenize(forced_ids)
    cut = len(matching)
    target = GLOSSARY["thirty"]
    pairs = list(zip(plain[:cut], forced[:cut], strict=True))
    references = [numbers.german(n).replace(MODEL_SPELLING, target) for n in matching]
    return {
        "beam_size": beam,
        "plain_writes_target": _share(target in p for p in plain),
        "plain_is_reference": _share(
            p == numbers.german(n)
            for p, n in zip(plain, matching + others, strict=True)
        ),
        "follows_glossary": _share(target in f for f in forced[:cut]),
        "only_term_changed": _share(
            f == p.replace(MODEL_SPELLING, target) for p, f in pairs
        ),
        "is_reference_respelled": _share(
            f == r for f, r in zip(forced[:cut], references, strict=True)
        ),
        "others_unchanged": _share(
            p == f for p, f in zip(plain[cut:], forced[cut:], strict=True)
        ),
        "warned": warned,
        "examples": [
            {"source": texts[i], "plain": plain[i], "glossary": forced[i]}
            for i in range(0, cut, max(cut // 8, 1))
        ],
    }


def measure_numbers(model, beams, seed=0):
    """The numbers task on the current backend, for each beam of ``beams``."""
    import keras

    from keras_transformer.data import numbers
    from keras_transformer.translate.evaluation import load_translator
    from keras_transformer.translate.glossary import Glossary

    matching, others = number_sets(seed)
    glossary = Glossary(GLOSSARY)
    for n in matching + others:
        if bool(glossary.targets(numbers.english(n))) != (n in matching):
            raise ValueError(f"{numbers.english(n)!r}: the glossary's match is off")
    translator = load_translator(model)
    return {
        "task": "numbers",
        "backend": keras.backend.backend(),
        "model": model,
        "glossary": dict(GLOSSARY),
        "matching": len(matching),
        "others": len(others),
        "length_penalty": SEARCH["length_penalty"],
        "beams": [numbers_at_beam(translator, matching, others, b) for b in beams],
        "machine": _machine(),
    }


# -- tables, processes, the command -------------------------------------------------


def table(runs):
    """Markdown table of runs of one task, one row per backend (and count or
    beam)."""
    if runs and runs[0]["task"] == "numbers":
        lines = [
            "| backend | beam | follows glossary | only the term changed "
            "| = reference respelled | others unchanged | plain writes it |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for run in runs:
            for b in run["beams"]:
                lines.append(
                    f"| {run['backend']} | {b['beam_size']} "
                    f"| {b['follows_glossary']:.1%} | {b['only_term_changed']:.1%} "
                    f"| {b['is_reference_respelled']:.1%} "
                    f"| {b['others_unchanged']:.1%} | {b['plain_writes_target']:.1%} |"
                )
        return "\n".join(lines)
    lines = [
        "| backend | constraints | sentences | coverage | coverage (feasible) "
        "| BLEU plain | BLEU constrained | plain s | constrained s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for count, s in run["sets"].items():
            if not s["sentences"]:
                lines.append(f"| {run['backend']} | {count} | 0 |" + " |" * 7)
                continue
            lines.append(
                f"| {run['backend']} | {count} | {s['sentences']} "
                f"| {s['coverage']:.2%} | {s['coverage_feasible']:.2%} "
                f"| {s['bleu_plain']:.2f} | {s['bleu_constrained']:.2f} "
                f"| {s['seconds_plain']:.1f} | {s['seconds_constrained']:.1f} "
                f"| {s['time_ratio']:.2f}x |"
            )
    return "\n".join(lines)


def _child(backend, setting, constraints=None):
    """One backend's run in a process of its own (``--json -``)."""
    command = python_module("benchmarks.constrained_decoding", *setting)
    command += ["--json", "-"]
    if constraints is not None:
        command += ["--constraints", constraints]
    env = child_env(KERAS_BACKEND=backend)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_backends(backends, setting, numbers):
    """Each backend in its own process; the text task's constraints drawn by
    the first and given to the others."""
    runs = [_child(backends[0], setting)]
    if numbers or len(backends) == 1:
        return runs + [_child(b, setting) for b in backends[1:]]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "constraints.json")
        with open(path, "w", encoding="utf-8") as file:
            json.dump(runs[0]["drawn"], file)
        runs += [_child(b, setting, path) for b in backends[1:]]
    for run in runs:
        run["constraints_origin"] = f"drawn from {backends[0]}'s output"
    return runs


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.constrained_decoding",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--model", help=f"default: {TEXT_MODEL}, or with --numbers the numbers fixture"
    )
    parser.add_argument("--source", default=SOURCE)
    parser.add_argument("--reference", default=REFERENCE)
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--numbers", action="store_true", help="the glossary task")
    parser.add_argument("--beams", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS)
    parser.add_argument("--constraints", help="(internal) constraints to reuse")
    parser.add_argument("--json", help="also write the results here ('-': stdout)")
    return parser


def _setting(args):
    """The command-line arguments a child gets."""
    model = args.model or (NUMBERS_MODEL if args.numbers else TEXT_MODEL)
    setting = ["--model", model, "--seed", str(args.seed)]
    if args.numbers:
        return [*setting, "--numbers", "--beams", *map(str, args.beams)]
    setting += ["--source", args.source, "--reference", args.reference]
    setting += ["--repeats", str(args.repeats)]
    return setting + ([] if args.limit is None else ["--limit", str(args.limit)])


def _here(args):
    """The run on the current backend, in this process."""
    model = args.model or (NUMBERS_MODEL if args.numbers else TEXT_MODEL)
    if args.numbers:
        return measure_numbers(model, args.beams, args.seed)
    drawn = None
    if args.constraints:
        with open(args.constraints, encoding="utf-8") as file:
            drawn = json.load(file)
    return measure_text(
        model, args.source, args.reference, drawn, args.seed, args.repeats, args.limit
    )


def main(argv=None):
    args = _parser().parse_args(argv)
    from keras_transformer.cli._process import prepare_process, start_tensorflow

    prepare_process()
    if args.backends:
        runs = run_backends(args.backends, _setting(args), args.numbers)
    else:
        start_tensorflow()  # quietly, before the tokenizer needs it
        runs = [_here(args)]
    if args.json == "-":
        print(json.dumps(runs[0]))
        return runs
    if not args.numbers:
        print(
            f"{runs[0]['sentences']} sentences of {runs[0]['source']}; beam 4, "
            f"alpha 0.6; constraints {runs[0]['constraints_origin']}"
            f"{', the same for every backend' if len(runs) > 1 else ''}. "
            f"{TEST_SET_NOTE}"
        )
    print(table(runs))
    if args.json:
        from keras_transformer.trainer.checkpoints import write_json_atomic

        write_json_atomic(args.json, runs)
    return runs


if __name__ == "__main__":
    main()
