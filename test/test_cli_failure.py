"""How a command fails (``cli/_errors.py``): every command with ``--json`` answers every error —
usage errors argparse finds included — with the one JSON error document on stdout and one line
on stderr. The commands are discovered from the parser, so a new command with ``--json`` must
be added to ``CASES`` (the test says so) and is then covered."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8.cli import DEBUG_ENV, build_parser, main
from nxdi_gptoss_fp8.cli._errors import ERROR_KINDS, Terminated, error_document, interrupted_message, wants_json


def _json_commands() -> list[str]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(name for name, sub in commands.choices.items()
                  if any("--json" in action.option_strings for action in sub._actions))


Argv = Callable[[Path], "list[str] | None"]

# per command: (a missing path, or the closest usage error of its own when it takes no path;
# a refusal at run time). None: the command has no such case (a reason beside it).
CASES: dict[str, tuple[Argv, Argv]] = {
    "validate": (lambda t: ["validate", str(t / "missing")],
                 lambda t: ["validate", str(t / "empty"), "--neuron-config", str(t / "missing.json")]),
    "inspect": (lambda t: ["inspect", str(t / "missing")],
                lambda t: ["inspect", str(t / "file.txt")]),  # not a directory
    "convert": (lambda t: ["convert", str(t / "missing"), str(t / "out")],
                lambda t: ["convert", str(t / "empty"), str(t / "out")]),  # no config.json
    "verify-conversion": (lambda t: ["verify-conversion", str(t / "missing"), "--source", str(t / "empty")],
                          lambda t: ["verify-conversion", str(t / "empty"), "--source", str(t / "empty")]),
    "check-forward": (lambda t: ["check-forward", str(t / "missing"), "--source", str(t / "empty")],
                      lambda t: ["check-forward", str(t / "empty"), "--source", str(t / "empty"),
                                 "--neuron-config", str(t / "missing.json")]),
    "goldens": (lambda t: ["goldens", str(t / "missing"), "--reference", "dequantized", "--prompt", "x",
                           "--num-tokens", "1", "--output", str(t / "g.pt")],
                lambda t: ["goldens", str(t / "empty"), "--reference", "dequantized", "--prompt", "x",
                           "--num-tokens", "1", "--output", str(t / "g.pt")]),  # no tokenizer
    "selfcheck": (lambda t: ["selfcheck", "--tp", "0"],  # no path: its own usage error
                  lambda t: None),  # needs NxDI, which may be importable where the tests run: the env case covers it
    "env": (lambda t: None, lambda t: None),  # no path, no refusal of its own: the env case covers it
    # a missing MODEL is one of doctor's findings, not an error: its usage error is a command that is not vLLM's
    "doctor": (lambda t: ["doctor", "--", "python", str(t / "missing")], lambda t: None),
}


def test_every_command_with_json_has_its_cases() -> None:
    assert sorted(CASES) == _json_commands(), "a command with --json lacks its cases here"


def _scene(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("not a directory")
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_the_error_shape(command: str, code: int, out: str, err: str) -> dict[str, object]:
    document = json.loads(out)  # exactly one JSON document, nothing else on stdout
    assert set(document) == {"ok", "command", "exit_code", "error"}, document
    assert document["ok"] is False and document["command"] == command and document["exit_code"] == code != 0
    error = document["error"]
    assert set(error) == {"kind", "type", "message"} and error["kind"] in ERROR_KINDS and error["message"]
    assert f"nxdi-gptoss-fp8 {command}: {error['message']}" in err.splitlines() or error["message"] in err
    return error


CASE_NAMES = ("usage error", "missing path", "refusal", "bad setting")


def _applicable() -> list[tuple[str, str]]:
    """Every (command, case) there is: every command has a usage error and a bad setting."""
    return [(command, case) for command in _json_commands() for case in CASE_NAMES
            if case in ("usage error", "bad setting") or command not in CASES
            or CASES[command][case == "refusal"](Path("/")) is not None]


@pytest.mark.parametrize("command, case", _applicable())
def test_every_json_command_answers_every_error_in_json(command: str, case: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    scene = _scene(tmp_path)
    if case == "usage error":
        argv: list[str] | None = [command, "--no-such-option"]
    elif case == "bad setting":  # a setting every command reads, refused before it runs
        monkeypatch.setenv(DEBUG_ENV, "perhaps")
        argv = [command, *(CASES[command][0](scene) or [])[1:]]
    else:
        argv = CASES[command][case == "refusal"](scene)
    assert argv is not None
    code, out, err = _run([argv[0], "--json", *argv[1:]], capsys)  # before the arguments: doctor takes all after --
    error = _assert_the_error_shape(command, code, out, err)
    if case == "usage error":
        assert code == 2 and error["kind"] == "usage"
    if case == "bad setting":
        assert code == 2 and error["kind"] == "config" and DEBUG_ENV in str(error["message"])
    _, text_out, text_err = _run(argv, capsys)  # without --json: no JSON, the same one line on stderr
    assert not text_out.lstrip().startswith("{") and str(error["message"]) in text_err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interruption_is_one_sentence_whatever_the_signal(signum: int) -> None:
    exc: BaseException = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
    message, code = interrupted_message(exc, "nothing was written")
    name = signal.Signals(signum).name
    assert code == 128 + signum
    assert message == f"interrupted by {name}{' (Ctrl-C)' if signum == signal.SIGINT else ''}: nothing was written " \
                      f"(exit {code})"


@pytest.mark.parametrize("command", ["validate", "env", "inspect"])
def test_ctrl_c_in_a_read_only_command_says_nothing_was_written(command: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    parser = build_parser()
    monkeypatch.setattr("nxdi_gptoss_fp8.cli.build_parser", lambda prog="nxdi-gptoss-fp8": parser)
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands.choices[command].set_defaults(handler=interrupted)
    argv = [command] + ([str(tmp_path)] if command != "env" else [])
    code, out, err = _run([argv[0], "--json", *argv[1:]], capsys)  # before the arguments: doctor takes all after --
    assert code == 130
    assert err == f"nxdi-gptoss-fp8 {command}: interrupted by SIGINT (Ctrl-C): nothing was written (exit 130)\n"
    assert json.loads(out)["error"] == {"kind": "interrupted", "type": "Interrupted",
                                        "message": err.split(": ", 1)[1].strip()}


@given(st.lists(st.sampled_from(["--json", "--js", "--j", "-j", "--jsonx", "--", "x", "--all"]), max_size=6))
def test_wants_json_reads_the_command_line_as_argparse_does(argv: list[str]) -> None:
    before = argv[:argv.index("--")] if "--" in argv else argv
    assert wants_json(argv) == any(token in ("--json", "--js", "--j") for token in before)


def test_the_error_document_has_one_shape() -> None:
    assert error_document("convert", "io", "cannot access x", 2, "OSError") == {
        "ok": False, "command": "convert", "exit_code": 2,
        "error": {"kind": "io", "type": "OSError", "message": "cannot access x"}}
    with pytest.raises(AssertionError):
        error_document("convert", "no such kind", "m", 2, "E")


@pytest.mark.parametrize("prog", ["nxdi-gptoss-fp8", "python -m nxdi_gptoss_fp8"])
@pytest.mark.parametrize(("argv", "command"), [(["env", "--bogus"], "env"), (["validate"], "validate"),
                                              (["--json"], None), (["nosuch"], None)])
def test_usage_errors_name_the_command_whatever_the_prog(prog: str, argv: list[str], command: str | None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--json"] if "--json" not in argv else argv, prog=prog)
    document = json.loads(capsys.readouterr().out)
    assert exit_.value.code == 2 and document["command"] == command and document["error"]["kind"] == "usage"


USAGE_ERRORS = [
    (["convert", "SRC", "OUT", "--workers", "four"], "convert", "--workers"),
    (["convert", "SRC", "OUT", "--workers", "2.5"], "convert", "--workers"),
    (["verify-conversion", "OUT", "--source", "SRC", "--workers", "four"], "verify-conversion", "--workers"),
    (["validate", "DIR", "--no-such-option"], "validate", "--no-such-option"),
    (["inspect", "DIR", "--no-such-option"], "inspect", "--no-such-option"),
    (["selfcheck", "--tp", "two"], "selfcheck", "--tp"),
    (["convert", "SRC"], "convert", "required"),
    (["validate"], "validate", "required"),
    (["no-such-command"], None, "no-such-command"),
    ([], None, "required"),
]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(("argv", "command", "named"), USAGE_ERRORS)
def test_a_usage_error_argparse_finds_is_one_line(argv: list[str], command: str | None, named: str, as_json: bool,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Argparse's usage errors (a bad value, an unknown option, a missing argument or command):
    one line on stderr naming the command's --help, no usage block, with or without --json; with
    --json also the one error document, whose message is that line."""
    code, out, err = _run([*argv, "--json"] if as_json else argv, capsys)
    lines = err.splitlines()
    prefix = f"nxdi-gptoss-fp8 {command}: " if command else "nxdi-gptoss-fp8: "
    assert code == 2 and len(lines) == 1 and lines[0].startswith(prefix) and "usage:" not in err, err
    assert named in lines[0] and lines[0].endswith(f"(run 'nxdi-gptoss-fp8 {command + ' ' if command else ''}--help')")
    if as_json:
        document = json.loads(out)
        assert document["error"]["kind"] == "usage" and document["command"] == command
        assert prefix + document["error"]["message"] == lines[0]
    else:
        assert out == ""


# a name in a path, and how every message shows it
HOSTILE_NAMES = {"two\nlines": "two\\x0alines", "carriage\rreturn": "carriage\\x0dreturn",
                 "esc\x1b[31mred": "esc\\x1b[31mred", "byte\udcffname": "byte\\xffname", "tab\tname": "tab\\x09name"}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("argv", [
    lambda p: ["validate", p], lambda p: ["inspect", p], lambda p: ["convert", p, p + "-out"],
    lambda p: ["verify-conversion", p, "--source", p], lambda p: ["validate", p, p],
], ids=["validate", "inspect", "convert", "verify-conversion", "usage"])
@pytest.mark.parametrize("name, shown", HOSTILE_NAMES.items(), ids=["newline", "cr", "escape", "non-utf8", "tab"])
def test_a_path_that_would_break_the_line_is_escaped_alike_on_stderr_and_in_json(
        name: str, shown: str, argv: Callable[[str], list[str]], as_json: bool, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A line break, a control character or a byte that is not UTF-8 in a path: the one stderr
    line and the JSON ``message`` show it escaped the same way (``\\x0a``, ``\\xff``), so the
    line stays one line and the document holds only what any JSON reader can decode."""
    args = argv(str(tmp_path / name))
    code, out, err = _run([args[0], "--json", *args[1:]] if as_json else args, capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].isprintable(), err
    assert shown in lines[0]
    if as_json:
        message = json.loads(out)["error"]["message"]
        assert lines[0] == f"nxdi-gptoss-fp8 {args[0]}: {message}"
        out.encode("utf-8")  # no lone surrogate in the document


# --------------------------------------------------------------------------- NXDI_GPTOSS_FP8_DEBUG

TRACEBACK = "Traceback (most recent call last):"


def _raising(exc: BaseException) -> Callable[[argparse.Namespace], int]:
    def handler(_args: argparse.Namespace) -> int:
        raise exc
    return handler


# errors no command above raises on demand, raised from a command's handler: (kind, exception)
RAISED = {"io": OSError(13, "Permission denied", "/data/models/x"), "interrupted": KeyboardInterrupt()}


def _commands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def _minimal_argv(command: str, path: str) -> list[str]:
    """A command line ``command``'s parser accepts: ``path`` for each positional, "1" for each
    required option."""
    argv = [command]
    for action in _commands()[command]._actions:
        if not action.option_strings and action.nargs in (None, 1):
            argv.append(path)
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], "1"]
    return argv


def _debug_cases() -> list[tuple[str, str, bool]]:
    """(command, case, with --json when the command has it): every command's missing path and refusal of ``CASES``, a bad setting other
    than the switch itself, NxDI missing, a normalized checkpoint given to convert, and an I/O
    error and an interruption in every command."""
    cases = [(command, case) for command, case in _applicable() if case in ("missing path", "refusal")]
    cases += [("validate", "bad setting"), ("selfcheck", "no NxDI"), ("convert", "normalized source"),
              *((command, kind) for kind in RAISED for command in sorted(_commands()))]
    json_commands = _json_commands()
    return [(command, case, as_json) for command, case in cases for as_json in (False, True)
            if not as_json or command in json_commands]


@pytest.mark.parametrize("command, case, as_json", _debug_cases())
def test_debug_prints_the_traceback_and_keeps_the_one_line(command: str, case: str, as_json: bool, tmp_path: Path,
                                                           tiny_template: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``NXDI_GPTOSS_FP8_DEBUG=1`` every error a command raises prints its traceback on
    stderr before the one line; the line, the JSON document and the exit status are those
    without it (the page's promise: docs/environment-variables.md)."""
    scene = _scene(tmp_path)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    if case == "bad setting":
        monkeypatch.setenv("NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL", "ture")
        argv = ["validate", str(tiny_template)]
    elif case == "no NxDI":  # not importable here, whatever this host has
        for module in ("neuronx_distributed_inference", "neuronx_distributed"):
            monkeypatch.setitem(sys.modules, module, None)
        argv = ["selfcheck"]
    elif case == "normalized source":
        argv = ["convert", str(tiny_template), str(scene / "out")]
    elif case in RAISED:
        parser = build_parser()
        monkeypatch.setattr("nxdi_gptoss_fp8.cli.build_parser", lambda prog="nxdi-gptoss-fp8": parser)
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        commands.choices[command].set_defaults(handler=_raising(RAISED[case]))
        argv = _minimal_argv(command, str(scene / "empty"))
    else:
        found = CASES[command][case == "refusal"](scene)
        assert found is not None
        argv = found
    argv = [argv[0], *(["--json"] if as_json else []), *argv[1:]]
    code, out, err = _run(argv, capsys)
    assert code != 0 and TRACEBACK not in err, err
    monkeypatch.setenv(DEBUG_ENV, "1")
    debug_code, debug_out, debug_err = _run(argv, capsys)
    assert debug_code == code and debug_out == out, debug_err
    assert debug_err.startswith(TRACEBACK) and debug_err.endswith(err) and len(debug_err) > len(err), debug_err
    first = {"no NxDI": "CpuModelUnavailableError", "normalized source": "ConversionError"}.get(case)
    if first is not None:  # re-raised by the command as its own error: where the package first raised it shows too
        assert f"nxdi_gptoss_fp8.errors.{first}: " in debug_err and "was the direct cause" in debug_err
