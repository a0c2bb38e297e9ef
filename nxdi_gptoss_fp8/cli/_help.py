"""What every command's ``--help`` is made of: a description wrapped by paragraph, then examples.

Each command keeps its examples beside its parser, as a module constant of ``Example`` rows
(``VALIDATE_EXAMPLES`` beside ``add_validate_command``), and passes them to ``add_parser(...,
examples=...)``; ``CommandParser`` renders them as the epilog, the last block of ``--help``.
``scripts/cli_reference.py`` renders the same rows into docs/cli.md (every command ``subcommands``
lists), and the tests parse every example with the real parser.
"""

from __future__ import annotations

import argparse
import re
import shlex
import textwrap
from collections.abc import Sequence
from typing import Any, NamedTuple

from ._errors import JsonAwareParser

__all__ = ["EXAMPLES_HEADING", "CommandParser", "Example", "ParagraphHelpFormatter", "render_examples", "shell_lines",
           "subcommands"]


EXAMPLES_HEADING = "Examples:"


class Example(NamedTuple):
    """One realistic invocation: what it does (one line) and the command line as a user types it
    (continued over lines with `` \\`` where it is long)."""

    what: str
    command: str


def render_examples(examples: Sequence[Example]) -> str:
    """The examples block of ``--help``: each example a ``#`` comment over its command, so the
    block pastes into a shell as it is."""
    blocks = [f"  # {example.what}\n" + textwrap.indent(example.command, "  ") for example in examples]
    return EXAMPLES_HEADING + "\n" + "\n\n".join(blocks)


def shell_lines(words: Sequence[str], width: int = 100) -> str:
    """``words`` quoted for a shell and continued over lines of at most ``width`` characters
    (`` \\`` at each break, never between an option and its value)."""
    quoted = [shlex.quote(word) for word in words]
    units: list[str] = []
    for index, word in enumerate(quoted):
        if units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-") \
                and index > 0 and quoted[index - 1].startswith("-"):
            units[-1] += " " + word  # an option and its value stay on one line
        else:
            units.append(word)
    lines = [units[0]]
    for unit in units[1:]:
        if len(lines[-1]) + 1 + len(unit) + 2 > width:
            lines.append("  " + unit)
        else:
            lines[-1] += " " + unit
    return " \\\n".join(lines)


class ParagraphHelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description or epilog to the terminal (as argparse does the whole
    text), but keeps a paragraph with indented lines (examples, commands) exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip("\n").split("\n\n"):
            lines = paragraph.split("\n")
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(re.sub(r"\s+", " ", paragraph, flags=re.ASCII).strip(), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)


class CommandParser(JsonAwareParser):
    """The command line's parser class (every subcommand's parser is one too): ``examples`` become
    the epilog's last block, and descriptions are wrapped by paragraph (``ParagraphHelpFormatter``)."""

    def __init__(self, *args: Any, examples: Sequence[Example] = (), **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", ParagraphHelpFormatter)
        if examples:
            kwargs["epilog"] = "\n\n".join(part for part in (kwargs.get("epilog"), render_examples(examples)) if part)
        super().__init__(*args, **kwargs)
        self.examples = tuple(examples)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """{name: (one-line summary, its parser)} of every subcommand, sorted by name."""
    found: dict[str, tuple[str, argparse.ArgumentParser]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, command in action.choices.items():
                found[name] = (summaries.get(name, ""), command)
    return dict(sorted(found.items()))
