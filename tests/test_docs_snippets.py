"""Every Python block of the README and of docs/*.md runs as written.

The extractor is a regular expression over fenced ```` ```python ````
blocks (indented ones too, inside a list item), not pytest's doctest
machinery: the blocks are programs, not ``>>>`` sessions, and their results
are claimed in comments (``model.count_params()  # 63,082,496``). Each page's
blocks run in order in one namespace (a block uses the names of the blocks
above it), in a fresh working directory, on one backend (``once``); a
traceback names the page and its line.

What a page assumes is provided, never faked: its numbers translator
(``runs/numbers/translator.keras``) is 0.3.0's trained one from
``tests/fixtures/v0_3_0``. A block that trains runs with the sizes a test
can afford (``SMALLER``: the page's text and what runs instead, shown here).
An expression statement whose comment is a Python literal (a number,
thousands separated by commas, a string, a list or tuple of them) is a
claim: the value must equal it. A block that cannot run in a test (a
network, a GPU, a server) says so in the page, on the line just before its
fence: ``<!-- snippet: skip (the reason) -->``; the reason is required, and
only a handful may be skipped.
"""

import ast
import dataclasses
import io
import pathlib
import re
import shutil
import tokenize

import keras
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += [ROOT / "notebooks" / "README.md"]
TRANSLATOR = ROOT / "tests" / "fixtures" / "v0_3_0" / "translator.keras"

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
MARKER = re.compile(r"<!--\s*snippet:(?P<what>.*?)-->", re.S)
SKIP = re.compile(r"\s*skip\s*\((?P<reason>.*\S.*)\)\s*")
MOST_SKIPPED = 3

# A block that trains: the page's text, and what runs in its place (a tiny
# model, one epoch over a few hundred numbers, a greedy report).
SMALLER = {"max_minutes=3)": "max_minutes=3, **SMALL_RUN)"}
TRAINS = re.compile(r"\btrain\(")
RUN_FOLDER = re.compile(r'\bout="(?P<out>[^"]+)"')

# Claims that a page must keep making and the test checks (the expression
# as the page writes it).
CLAIMS = {"README.md": {"model.count_params()"}}


class Block:
    def __init__(self, page, line, code, skip):
        self.page, self.line, self.code, self.skip = page, line, code, skip

    def __repr__(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page):
    """The page's ```python blocks: their first line's number (the fence's),
    their code (dedented as its fence) and the reason to skip, or None."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        indent, line = match["indent"], text.count("\n", 0, match.start()) + 1
        lines = match["body"].splitlines()
        assert all(not s.strip() or s.startswith(indent) for s in lines), line
        code = "\n".join(s[len(indent) :] for s in lines) + "\n"
        before = text[: match.start()][:-1].rpartition("\n")[2]  # the line above
        marker = MARKER.fullmatch(before.strip())
        skip = None
        if marker:  # "" for a marker without its reason
            skipped = SKIP.fullmatch(marker["what"])
            skip = skipped["reason"].strip() if skipped else ""
        found.append(Block(page, line, code, skip))
    return found


def markers(page):
    """``(line, text)`` of each snippet marker of the page."""
    text = page.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(0)) for m in MARKER.finditer(text)
    ]


WITH_BLOCKS = [page for page in PAGES if page.exists() and blocks(page)]


def claimed(comment):
    """The literal a comment claims, or None."""
    text = comment.lstrip("#").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", text):
        return int(text.replace(",", ""))
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (int, float, str, list, tuple)) else None


def comments(code):
    """``{line: comment}`` of ``code``, lines from 1."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def same(value, expected):
    if hasattr(value, "shape") and not isinstance(value, tuple):
        value = np.asarray(value).tolist()
    return value == expected


def smaller(block):
    """The block's code with ``SMALLER``'s sizes; a block that trains must
    take them."""
    code = block.code
    for page_text, test_text in SMALLER.items():
        code = code.replace(page_text, test_text)
    if TRAINS.search(block.code):
        assert code != block.code, f"{block}: a block that trains, at full size"
    return code


def run(block, namespace, checked):
    """Run the block statement by statement in ``namespace``; check its
    claims, adding the expressions checked to ``checked``."""
    code = smaller(block)
    notes = comments(code)
    tree = ast.parse(code)
    ast.increment_lineno(tree, block.line)  # the page's line numbers
    where = str(block.page)
    for node in tree.body:
        claim = None
        if isinstance(node, ast.Expr):
            claim = claimed(notes.get(node.end_lineno - block.line, ""))
        if claim is None:
            exec(compile(ast.Module([node], []), where, "exec"), namespace)
            continue
        value = eval(compile(ast.Expression(node.value), where, "eval"), namespace)
        source = ast.unparse(node.value)
        said = f"{where}:{node.lineno}: {source} is {value!r}, not {claim!r}"
        assert same(value, claim), said
        checked.add(source)


def prepare(tmp_path, block):
    """What the page assumes before the block runs: its numbers translator;
    for a block that trains, the run folder it names without it (a run
    refuses a folder holding files no run wrote)."""
    if TRAINS.search(block.code):
        for folder in RUN_FOLDER.findall(block.code):
            shutil.rmtree(tmp_path / folder, ignore_errors=True)
    else:
        translator = tmp_path / "runs" / "numbers" / "translator.keras"
        if not translator.exists():
            translator.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(TRANSLATOR, translator)


def small_run():
    """``SMALLER``'s settings: tests/test_train.py's short runs, for one
    epoch, as the ``TrainConfig`` fields they set."""
    from keras_transformer.cli.train import parse_config
    from tests.test_train import NUMBERS, SMALL

    short = parse_config([*NUMBERS, *SMALL, "--epochs", "1", "--out", "x"])[0]
    plain = parse_config(["--task", "numbers", "--out", "x"])[0]
    return {
        field.name: getattr(short, field.name)
        for field in dataclasses.fields(short)
        if getattr(short, field.name) != getattr(plain, field.name)
    }


# Slow: the README's blocks build Table 3's base model, train, save, load
# and compile a dozen searches, docs/training.md's trains and reports (on two
# cores, 17 s and 6 s with tests/run_all.sh's XLA flags, 28 s and 12 s
# without).
@pytest.mark.once("jax")
@pytest.mark.slow
@pytest.mark.parametrize(
    "page", WITH_BLOCKS, ids=lambda page: page.relative_to(ROOT).as_posix()
)
def test_a_pages_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks write t.keras, runs/...
    # A block may set KERAS_BACKEND for Keras' first import: Keras has been
    # imported already, on this backend; the variable says so, and is put back.
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    namespace, checked = {"SMALL_RUN": small_run()}, set()
    ran = [block for block in blocks(page) if block.skip is None]
    if not ran:
        pytest.skip(f"every block of {page.name} is marked to skip")
    for block in ran:
        prepare(tmp_path, block)
        run(block, namespace, checked)
    wanted = CLAIMS.get(page.relative_to(ROOT).as_posix(), set())
    assert wanted <= checked, f"claims no longer checked: {wanted - checked}"
    if page.name == "README.md" and page.parent == ROOT:
        readme_results(namespace)


def readme_results(namespace):
    """The README's usage: the halves and the searches give the shapes its
    text gives."""
    src, tokens = namespace["src"], namespace["tokens"]
    assert namespace["model"].count_params() > 0
    assert tokens.shape[0] == src.shape[0] and np.all(tokens >= 0)
    vocabulary = namespace["model"].tgt_vocab_size
    logits, targets = namespace["logits"], namespace["tgt"][:, :-1]
    assert tuple(logits.shape) == (*targets.shape, vocabulary)  # (B, T, V)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(namespace["step_logits"].shape) == (src.shape[0], vocabulary)


def test_skips_are_few_and_say_why():
    skipped = [
        f"{block}: {block.skip}" for page in WITH_BLOCKS for block in blocks(page)
        if block.skip is not None
    ]  # fmt: skip
    assert len(skipped) <= MOST_SKIPPED, skipped
    unsaid = [line for line in skipped if line.endswith(": ")]
    assert not unsaid, f"<!-- snippet: skip (reason) -->, with its reason: {unsaid}"
    for page in PAGES:
        if not page.exists():
            continue
        fences = {block.line - 1 for block in blocks(page)}
        stray = [m for m in markers(page) if m[0] not in fences]
        assert not stray, f"{page.name}: markers not just above a python fence: {stray}"


def test_the_front_page_has_blocks_to_run():
    assert len([b for b in blocks(ROOT / "README.md") if b.skip is None]) >= 2
