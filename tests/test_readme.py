"""The README and the results page read as a front page and a summary
(the Python blocks of the README and docs/ run in
tests/test_docs_snippets.py)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_results_page_is_current_not_a_diary():
    text = (README.parent / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 400
    assert not re.search(r"(?<![\w&/])#\d+\b", text)  # no issue numbers


def test_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 250
    assert not re.search(r"(?<![\w&/])#\d+\b", README.read_text())  # no issue numbers


def api_rows():
    """The first cell of each row of the README's API table."""
    text = README.read_text().split("## API", 1)[1].split("\n## ", 1)[0]
    return [line.split(" | ")[0].strip("| ") for line in text.splitlines()[2:] if line]


def shown_calls(cell):
    """``(name, parameters)`` for each ``name(parameters)`` the cell shows;
    a bare ``(parameters)`` belongs to every bare name before it."""
    names, calls = [], []
    for span in re.findall(r"`([^`]+)`", cell):
        call = re.fullmatch(r"([A-Za-z_][\w.]*)?\((.*)\)", span)
        if call is None:
            names.append(span)
        elif call[1] is None:
            calls += [(name, call[2]) for name in names]
        else:
            calls.append((call[1], call[2]))
    return calls


def resolve(name):
    import keras_transformer as kt

    if hasattr(kt, name):
        return getattr(kt, name)
    return getattr(kt.Translator, name)


def check_signature(name, shown):
    """What differs between the parameters the README shows for ``name`` and
    its code's signature (empty when they agree)."""
    import ast
    import inspect

    args = ast.parse(f"def f({shown}): pass").body[0].args
    said = [(a.arg, "positional") for a in args.args]
    said += [(a.arg, "keyword") for a in args.kwonlyargs]
    # ast keeps the defaults of the last positional parameters only.
    with_default = args.args[len(args.args) - len(args.defaults) :]
    defaults = {a.arg: d for a, d in zip(with_default, args.defaults, strict=True)}
    pairs = zip(args.kwonlyargs, args.kw_defaults, strict=True)
    defaults.update({a.arg: d for a, d in pairs if d is not None})
    target = resolve(name)
    code = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    params = {p.name: p for p in code.parameters.values() if p.name != "self"}
    kinds = {
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
    }
    wrong = []
    for arg, kind in said:
        p = params.get(arg)
        if p is None or kinds.get(p.kind) != kind:
            wrong.append(f"{arg}: not a {kind} parameter")
            continue
        has = p.default is not inspect.Parameter.empty
        if (arg in defaults) != has or (
            has and ast.literal_eval(defaults[arg]) != p.default
        ):
            shown_default = ast.unparse(defaults[arg]) if arg in defaults else None
            wrong.append(f"{arg}: shown default {shown_default}, code's {p.default!r}")
    order = [n for n, _ in said if n in params]
    code_order = [n for n in params if n in order]
    if order != code_order:
        wrong.append(f"order {order}, code's {code_order}")
    # Shown positionally, a parameter must sit where the code has it.
    positional = [n for n, kind in said if kind == "positional"]
    code_positional = [
        n for n, p in params.items() if kinds.get(p.kind) == "positional"
    ]
    if positional != code_positional[: len(positional)]:
        wrong.append(f"positional {positional}, code's {code_positional}")
    required = [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty and p.kind in kinds
    ]
    wrong += [f"{n}: required, not shown" for n in required if n not in order]
    return wrong


def test_the_api_tables_signatures_are_the_codes():
    calls = [call for cell in api_rows() for call in shown_calls(cell)]
    assert len(calls) >= 12, calls  # the table still shows its signatures
    wrong = {name: check_signature(name, shown) for name, shown in calls}
    assert not {k: v for k, v in wrong.items() if v}


def test_a_wrong_signature_is_caught():
    assert check_signature("transformer_config", "name, **overrides")
    shown = 'tokenizer, transformer, search_dtype="float32"'
    assert check_signature("Translator", shown)
    assert not check_signature("transformer_config", "config=None, **overrides")


def test_the_install_section_names_each_export_formats_extra():
    """The README's install section names, for each ``kt-export`` format, an
    extra that installs the package that format's writer imports."""
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    install = README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    install = " ".join(install.split())
    # format -> (the extra named beside it, a package its writer imports)
    writers = {
        "ctranslate2": ("ctranslate2", "ctranslate2"),
        "saved_model": ("saved-model", "tensorflow-text"),
        "marian": ("pretrained", "safetensors"),
    }
    for form, (extra, package) in writers.items():
        assert f"`{extra}`" in install, form
        assert any(re.match(rf"{package}\b", dep) for dep in extras[extra]), form
    assert "`--format marian`" in install
