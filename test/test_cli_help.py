"""Every command's --help ends with its examples, and every example parses with the real parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import clients
import pytest

from nxdi_gptoss_fp8.cli import build_parser, main
from nxdi_gptoss_fp8.cli._help import EXAMPLES_HEADING, Example, render_examples, subcommands
from nxdi_gptoss_fp8.cli.make_tiny import MAKE_TINY_EXAMPLES

PROG = "nxdi-gptoss-fp8"
SHELL_OPERATORS = set("();<>|&")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """The top-level parser ("") and every subcommand's, as ``build_parser`` registers them."""
    parser = build_parser(PROG)
    return {"": parser, **{name: command for name, (_, command) in subcommands(parser).items()}}


COMMANDS = sorted(command_parsers())


def invocations(command: str) -> list[list[str]]:
    """The arguments after ``nxdi-gptoss-fp8`` of each invocation of it in a shell example (each
    command as ``clients.shell_commands`` splits it, then split at ``&&``, ``|``, ``;`` and
    redirections; leading ``VAR=value`` assignments dropped)."""
    found = []
    for words in clients.shell_commands(command):
        segment: list[str] = []
        for word in [*words, ";"]:
            if set(word) <= SHELL_OPERATORS:
                while segment and ASSIGNMENT.match(segment[0]):
                    segment.pop(0)
                if segment[:1] == [PROG]:
                    found.append(segment[1:])
                segment = []
            else:
                segment.append(word)
    return found


def test_the_splitter_reads_shell_as_a_user_types_it() -> None:
    assert invocations("A=1 B=x nxdi-gptoss-fp8 validate d --json | jq .ok") == [["validate", "d", "--json"]]
    assert invocations("echo '{\"a\": 1}' > f.json\nnxdi-gptoss-fp8 x \\\n  --y 'a b' && nxdi-gptoss-fp8 z") == \
        [["x", "--y", "a b"], ["z"]]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_help_ends_with_its_examples(name: str) -> None:
    parser = command_parsers()[name]
    examples = getattr(parser, "examples", ())
    assert examples, f"`{PROG} {name} --help` has no examples: pass examples=... to its add_parser (cli/_help.py)"
    text = parser.format_help()
    assert text.rstrip("\n").endswith(render_examples(examples))
    assert text.count(EXAMPLES_HEADING) == 1


@pytest.mark.parametrize(("name", "example"), [(name, example) for name in COMMANDS
                                               for example in getattr(command_parsers()[name], "examples", ())])
def test_every_example_parses_with_the_real_parser(name: str, example: Example) -> None:
    """Each invocation of an example parses (paths are not read while parsing); a command's
    examples start with that command."""
    calls = invocations(example.command)
    assert calls, f"{example.command!r} does not run {PROG}"
    for number, argv in enumerate(calls):
        try:
            args = build_parser(PROG).parse_args(argv)
        except SystemExit as exited:
            pytest.fail(f"{name or PROG} example {example.command!r} does not parse (exit {exited.code})")
        if number == 0 and name:
            assert args.command == name, f"an example of {name} runs {args.command}"
    assert example.what and "\n" not in example.what


def test_the_make_tiny_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Their paths are relative: run in an empty directory, each invocation succeeds in order."""
    monkeypatch.chdir(tmp_path)
    for example in MAKE_TINY_EXAMPLES:
        for argv in invocations(example.command):
            assert main(argv) == 0, (argv, capsys.readouterr())


def test_help_wraps_prose_and_keeps_examples_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    text = command_parsers()["doctor"].format_help()
    examples = text[text.index(EXAMPLES_HEADING):]
    assert max(len(line) for line in text[:text.index(EXAMPLES_HEADING)].splitlines()) <= 60
    assert '--additional-config \'{"override_neuron_config": {"quantized": true, ' in examples
