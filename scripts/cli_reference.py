"""docs/cli.md, the command-line reference, generated from the argument parser (a docs tool,
not a command: it lives beside the other scripts, outside the package).

    python scripts/cli_reference.py docs/cli.md

Every command ``build_parser`` registers gets a section (sorted by name): its summary, usage,
description, every argument with its help, and its examples. The page is rendered from the
parser's structure, not from ``--help``'s text, so it does not depend on the terminal's width or
on how a Python version's argparse lays out help; the one path in the help (where the format
document is installed) is written as the page's link to it. ``test/test_cli_reference.py`` fails
when docs/cli.md differs from what this renders.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's package

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import build_parser
from nxdi_gptoss_fp8.cli._help import Example, render_examples, subcommands

__all__ = ["PAGE", "REGENERATE", "main", "render_reference"]

PAGE = os.path.join("docs", "cli.md")
REGENERATE = f"python scripts/cli_reference.py {PAGE}"
PROG = "nxdi-gptoss-fp8"


def render_reference() -> str:
    """The whole page, as Markdown."""
    parser = build_parser(PROG)
    commands = subcommands(parser)
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Generated from the argument parser: do not edit. Regenerate with `{REGENERATE}`. -->",
        "",
        f"Generated from the command line's own parser (`nxdi_gptoss_fp8.cli.build_parser`) by `{REGENERATE}`;",
        "`test/test_cli_reference.py` fails when this page is stale. `nxdi-gptoss-fp8 COMMAND --help` prints",
        "the same help, examples last.",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`{name}`](#{name}) | {_inline(summary)} |" for name, (summary, _) in commands.items()),
        "",
        f"## {PROG}",
        "",
        *_section(parser),
    ]
    for name, (summary, command) in commands.items():
        lines += [f"## {name}", "", f"{_inline(summary[:1].upper() + summary[1:])}.", "", *_section(command)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _section(parser: argparse.ArgumentParser) -> list[str]:
    """Usage, description, arguments, the epilog's text and the examples of one parser."""
    lines = ["```text", _usage(parser), "```", ""]
    lines += _paragraphs(parser.description or "")
    shown = [action for action in parser._actions
             if action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)]
    arguments = sorted(shown, key=lambda action: bool(action.option_strings))  # positionals first, as --help
    if arguments:
        lines += ["| argument | meaning |", "|---|---|"]
        lines += [f"| `{_invocation(action)}` | {_inline(_help(parser, action))} |" for action in arguments]
        lines.append("")
    examples: Sequence[Example] = getattr(parser, "examples", ())
    epilog = (parser.epilog or "").removesuffix(render_examples(examples)) if examples else parser.epilog or ""
    lines += _paragraphs(epilog.replace(fmt.format_document_ref(), "docs/format.md"))
    if examples:
        lines += ["Examples:", "", "```sh", *"\n\n".join(f"# {e.what}\n{e.command}" for e in examples).split("\n"),
                  "```", ""]
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    """``PROG COMMAND [options] POSITIONALS``, or the parser's own usage line."""
    if parser.usage:
        return parser.usage % {"prog": parser.prog}
    options = any(action.option_strings and action.help != argparse.SUPPRESS for action in parser._actions)
    words = [parser.prog, *(["[options]"] if options else [])]
    for action in parser._actions:
        if action.option_strings:
            continue
        metavar = _metavar(action)
        words.append(f"[{metavar}]" if action.nargs in ("?", "*", argparse.REMAINDER) else metavar)
    return " ".join(words)


def _metavar(action: argparse.Action) -> str:
    if isinstance(action, argparse._SubParsersAction):
        return "COMMAND ..."
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _invocation(action: argparse.Action) -> str:
    """``--workers N``, ``--deep``, ``SRC``: the argument as it is typed."""
    if not action.option_strings:
        return _metavar(action)
    value = "" if action.nargs == 0 else f" {_metavar(action)}"
    return ", ".join(f"{option}{value}" for option in action.option_strings)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The argument's help as ``--help`` shows it, with what the parser alone knows added:
    required, and the options it cannot be combined with."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    notes = []
    if action.option_strings and action.required:
        notes.append("Required.")
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [other.option_strings[-1] for other in group._group_actions if other is not action]
            notes.append(f"Not with {', '.join(f'`{other}`' for other in others)}.")
    return " ".join(part for part in (text.rstrip(".") + "." if text else "", *notes) if part)


def _paragraphs(text: str) -> list[str]:
    """Text paragraphs as Markdown paragraphs; a paragraph of indented lines as a code block."""
    lines: list[str] = []
    for paragraph in text.strip("\n").split("\n\n"):
        if not paragraph.strip():
            continue
        rows = paragraph.split("\n")
        if any(row[:1].isspace() for row in rows):
            lines += ["```text", *(row[2:] if row.startswith("  ") else row for row in rows), "```", ""]
        else:
            lines += [_inline(paragraph), ""]
    return lines


def _inline(text: str) -> str:
    """Help text on one Markdown line: whitespace joined; outside `code spans` the characters
    Markdown would read as syntax escaped, and ``|`` everywhere (a table cell)."""
    parts = re.sub(r"\s+", " ", text).strip().split("`")
    for index in range(0, len(parts), 2):  # outside the code spans
        parts[index] = re.sub(r"([\\*<>\[\]])", r"\\\1", parts[index])
    return "`".join(parts).replace("|", "\\|")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page to the path given (``docs/cli.md``), or print it."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = render_reference()
    if not args:
        sys.stdout.buffer.write(text.encode("utf-8"))
        return 0
    with open(args[0], "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
