"""docs/commands.md, the reference of every command's options, rendered from
the argparse parsers the commands parse with, so that it cannot say other
than ``--help`` (``tests/test_commands_reference.py`` compares the two).

    python docs/commands_reference.py           # print it
    python docs/commands_reference.py --write   # rewrite docs/commands.md

A tool of the repository, not of the package: it documents the parsers of
the clone it sits in. argparse has no public way to list a parser's
options; its private lists are read through the package's one fence for
private names (``keras_transformer._guards.private_api``), and where they
cannot be (an untested Python), each section shows the command's
``--help`` text instead of tables.
"""

import argparse
import copy
import difflib
import functools
import importlib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # The parsers of this clone, whatever else is installed.
    sys.path.insert(0, str(ROOT))

from keras_transformer._guards import private_api  # noqa: E402

REGENERATE = "python docs/commands_reference.py --write"

# Each installed command ([project.scripts]): its module in this package and
# the function of that module that builds its parser (the one ``main`` uses).
COMMANDS = {
    "kt-train": ("train", "_parser"),
    "kt-evaluate": ("evaluate", "_parser"),
    "kt-translate": ("translate", "_parser"),
    "kt-attention": ("attention", "_parser"),
    "kt-launch": ("launch", "_parser"),
    "kt-export": ("export", "_parser"),
    "kt-serve": ("serve", "parser"),
    "kt-import": ("import_checkpoint", "_parser"),
}

# The usage lines are wrapped here, not by argparse, whose width follows the
# terminal's (COLUMNS): the file must not depend on where it was made.
WIDTH = 80

# "(default: the model's; ...)", "default 127.0.0.1", "default: lines of
# stdin": what an option's help says its default is, up to the end of that
# clause.
_STATED_DEFAULT = re.compile(r"\bdefault:? ([^;)]+)")


def document_path():
    """docs/commands.md, beside this file."""
    return ROOT / "docs" / "commands.md"


def build_parser(command):
    """The argparse parser of ``command`` (``"kt-train"``), freshly built."""
    module, function = COMMANDS[command]
    module = importlib.import_module(f"keras_transformer.cli.{module}")
    return getattr(module, function)()


def render(parsers=None):
    """The Markdown of docs/commands.md; ``parsers``: command name -> parser
    (default: each command's, built now)."""
    if parsers is None:
        parsers = {name: build_parser(name) for name in COMMANDS}
    lines = [
        f"*Generated from the commands' parsers by `{REGENERATE}`; "
        "change the parsers, not this file.*",
        "",
        "# Commands",
        "",
        "Every option of every command, as its `--help` gives it. Each command "
        "also takes `-h`/`--help`. The guides say how the options combine: "
        "[training.md](training.md), [deploy.md](deploy.md), "
        "[serving.md](serving.md).",
        "",
    ]
    lines += [f"- [{name}](#{name})" for name in parsers]
    for name, parser in parsers.items():
        lines += ["", *_section(name, parser)]
    return "\n".join(lines) + "\n"


def _section(name, parser):
    """One command's heading, description, usage and option tables (its
    ``--help`` text where argparse's lists cannot be read)."""
    lines = [f"## {name}", ""]
    if not private_api.argparse_readable(parser, argparse.HelpFormatter):
        return lines + ["```", *_help_text(parser).splitlines(), "```"]
    if parser.description:
        lines += [parser.description, ""]
    lines += ["```", *_usage(parser), "```"]
    if parser.epilog:
        lines += ["", parser.epilog]
    required_together = _required_groups(parser)
    for title, description, actions in _groups(parser):
        rows = [_row(parser, action, required_together) for action in actions]
        if not rows:
            continue
        heading = f"**{title}**"
        if description:
            heading += f" ({_escaped(description)})"
        kind = "option" if actions[0].option_strings else "argument"
        lines += ["", heading, "", f"| {kind} | default | help |", "|---|---|---|"]
        lines += rows
    return lines


def _formatted(parser, width):
    """A copy of ``parser`` whose help is formatted ``width`` wide, whatever
    the terminal."""
    fixed = copy.copy(parser)
    fixed.formatter_class = functools.partial(argparse.HelpFormatter, width=width)
    return fixed


def _help_text(parser):
    """``--help``, ``WIDTH`` wide."""
    return _formatted(parser, WIDTH).format_help().rstrip()


def _usage(parser):
    """argparse's usage line, unwrapped, then wrapped at ``WIDTH`` between
    its bracketed parts, continued under the first argument as argparse
    does."""
    text = _formatted(parser, sys.maxsize).format_usage().strip()
    head = f"usage: {parser.prog} "
    parts = _top_level_parts(text[len(head) :])
    lines, line = [], head
    for part in parts:
        if line.strip() != head.strip() and len(line) + len(part) > WIDTH:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += part + " "
    return lines + [line.rstrip()]


def _top_level_parts(text):
    """``text`` split at the spaces outside brackets (``[--out OUT]``,
    ``(--task TASK | --data DATA)``), a required option kept with its
    metavar (``--model MODEL``)."""
    parts, depth, current = [], 0, ""
    for char in text + " ":
        if char == " " and depth == 0:
            if current:
                parts.append(current)
            current = ""
            continue
        depth += (char in "[({") - (char in "])}")
        current += char
    joined = []
    for part in parts:
        follows_flag = joined and joined[-1].startswith("-") and " " not in joined[-1]
        if follows_flag and not part.startswith(("-", "[", "(")):
            joined[-1] += " " + part
        else:
            joined.append(part)
    return joined


def _groups(parser):
    """(title, description, actions) of each group of the parser: its
    arguments, its options, then the groups it names itself; the help
    action and hidden options left out."""
    shown = [
        action
        for action in private_api.parser_actions(parser)
        if action.help != argparse.SUPPRESS and not _is_help(parser, action)
    ]
    groups = private_api.argument_groups(parser)
    own = {id(a) for _, _, actions in groups for a in actions}
    yield "Arguments", None, [a for a in shown if not a.option_strings]
    yield "Options", None, [a for a in shown if a.option_strings and id(a) not in own]
    for title, description, actions in groups:
        listed = {id(a) for a in actions}
        yield title, description, [a for a in shown if id(a) in listed]


def _is_help(parser, action):
    """Whether ``action`` is the ``-h``/``--help`` that ``add_help`` adds."""
    prefix = parser.prefix_chars[0]
    flags = [f"{prefix}h", f"{prefix * 2}help"]
    return parser.add_help and action.option_strings == flags and action.nargs == 0


def _required_groups(parser):
    """action id -> the options of its required mutually exclusive group
    (one of which must be given)."""
    together = {}
    for required, actions in private_api.exclusive_groups(parser):
        if required:
            names = [a.option_strings[0] for a in actions]
            for action in actions:
                together[id(action)] = names
    return together


def _row(parser, action, required_together):
    """One table row: the option as ``--help`` spells it, its default, its
    help (and its choices where a metavar hides them)."""
    formatter = argparse.HelpFormatter(parser.prog, width=sys.maxsize)
    # argparse's own spelling: flags, metavar or choices, optional values.
    invocation = private_api.action_invocation(formatter, action)
    text = private_api.expanded_help(formatter, action) if action.help else ""
    if action.choices is not None and action.metavar is not None:
        choices = ", ".join(f"`{choice}`" for choice in action.choices)
        text = f"{text} (one of {choices})".strip()
    default = _default(action, text, required_together.get(id(action)))
    return f"| `{_cell(invocation)}` | {default} | {_escaped(text)} |"


def _default(action, text, one_of):
    """What an option is when it is not given: required, argparse's default,
    or, where argparse's is None, what its help says it is."""
    if one_of is not None:
        return "required: one of " + ", ".join(f"`{name}`" for name in one_of)
    if action.required and action.nargs not in ("?", "*", argparse.REMAINDER):
        return "required"
    if action.default is not None:
        value = action.default
        if isinstance(value, (tuple, list)):  # as it is typed: 1,4
            value = ",".join(str(item) for item in value)
        return f"`{_cell(str(value))}`"
    stated = _STATED_DEFAULT.search(text)
    return _escaped(stated.group(1).strip()) if stated else ""


def _cell(text):
    """``text`` inside a code span of a table cell."""
    return text.replace("|", "\\|")


def _escaped(text):
    """Help text as Markdown that shows it as written: no emphasis from
    ``**``, no HTML from ``<model dir>``, no cell break at ``|Y|``."""
    for char, escape in (("\\", "\\\\"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(char, escape)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def difference(written, rendered, name="docs/commands.md"):
    """None when ``written`` is ``rendered``, else a message that says where
    they part and how to regenerate the file."""
    if written == rendered:
        return None
    diff = difflib.unified_diff(
        written.splitlines(),
        rendered.splitlines(),
        name,
        "the parsers now",
        n=1,
        lineterm="",
    )
    shown = list(diff)[:40]  # enough to see what changed
    return (
        f"{name} differs from what the commands' parsers give now; regenerate "
        f"it with `{REGENERATE}`:\n" + "\n".join(shown)
    )


def main(argv=None):
    """Print docs/commands.md, or with ``--write`` rewrite it; returns it."""
    parser = argparse.ArgumentParser(
        prog="python docs/commands_reference.py",
        description="Render docs/commands.md from the commands' parsers.",
    )
    parser.add_argument(
        "--write", action="store_true", help="rewrite docs/commands.md (else print it)"
    )
    args = parser.parse_args(argv)
    text = render()
    if not args.write:
        sys.stdout.write(text)
        return text
    path = document_path()
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return text


if __name__ == "__main__":
    main()
