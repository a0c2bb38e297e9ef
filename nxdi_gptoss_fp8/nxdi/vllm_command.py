"""A ``vllm serve`` command line read as vLLM reads it, and the settings vLLM derives from it (the
NeuronConfig vllm-neuron builds from them: ``validate.vllm_config``). Stdlib only; nothing is imported from vLLM (it is not needed to read its command line).

How the command is read (vLLM 0.10.2 / 0.11.0, the versions vllm-neuron 0.1.0 / 0.2.0 pin):

* the program: ``vllm serve`` by any path (``/opt/venv/bin/vllm serve``), ``python -m
  vllm.entrypoints.cli.main serve`` and ``python -m vllm.entrypoints.openai.api_server`` (which
  takes the model as ``--model`` only); ``VAR=value`` words before it are the environment vLLM
  gets (over the caller's);
* long option names: vLLM's ``FlexibleArgumentParser`` turns ``_`` into ``-`` in the name
  (up to its first ``.``), so ``--additional_config`` is ``--additional-config``;
  ``--name=value`` and ``--name value`` are the same; the last of a repeated option wins;
* ``--json-option.key.sub value`` (vLLM's dotted form) sets one key of a JSON option: those keys
  are merged into one object that replaces the option's whole JSON (vLLM appends it last);
* the model: the positional after ``serve``, wherever it stands among the options; else ``--model``
  (the positional wins when both are given, as ``vllm serve`` does);
* options that take no value: ``BOOLEAN_OPTIONS`` and every ``--no-NAME`` (only argparse's
  ``BooleanOptionalAction``, which vLLM gives every boolean engine field, makes ``--no-``
  options). ``NARGS_OPTIONS`` take every following word that is not an option. Any other option
  takes the next word as its value, unless that word starts with ``-``: an unknown option
  followed by a word is read as taking it (argparse does so for every option vLLM defines
  with a value); when that leaves no model, the finding names the option that took the word;
* ``--additional-config``: JSON as vLLM's ``json.loads`` reads it (``NaN``, ``Infinity`` and
  numbers like ``1e400`` included; integers up to Python's 4,300-digit limit);
* vLLM's ``--config FILE.yaml`` is not read (``CommandError``): pass its options on the line.

``BOOLEAN_OPTIONS`` lists the boolean options of vLLM 0.10.2 / 0.11.0's ``vllm serve``: the
``bool`` fields of ``EngineArgs`` (argparse ``BooleanOptionalAction``), the ``store_true``
options of ``AsyncEngineArgs`` and of the OpenAI server (``make_arg_parser``,
``FrontendArgs``), gathered from vLLM's ``vllm/engine/arg_utils.py`` and
``vllm/entrypoints/openai/cli_args.py``. vLLM is not a dependency, so the table is data: an
option missing from it is read by the rule for unknown options above.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..validate.vllm_config import VLLM_OVERRIDE_KEY, VllmSettings
from .recipes import VLLM_ADDITIONAL_CONFIG_FLAG

__all__ = [
    "BOOLEAN_OPTIONS", "MAX_ARGUMENT_BYTES", "NARGS_OPTIONS", "SHORT_OPTIONS", "CommandError", "CommandProblem",
    "VllmCommand", "read_vllm_command", "settings_from_command",
]

# Linux's MAX_ARG_STRLEN: no single argument longer than this reaches a program (execve refuses it)
MAX_ARGUMENT_BYTES = 131072

BOOLEAN_OPTIONS: frozenset[str] = frozenset(f"--{name}" for name in (
    # EngineArgs / AsyncEngineArgs (vllm/engine/arg_utils.py)
    "skip-tokenizer-init", "enable-prompt-embeds", "trust-remote-code", "enforce-eager", "disable-custom-all-reduce",
    "disable-sliding-window", "disable-cascade-attn", "enable-prefix-caching", "enable-chunked-prefill",
    "disable-chunked-mm-input", "enable-expert-parallel", "enable-eplb", "enable-dbo", "enable-lora", "enable-lora-bias",
    "fully-sharded-loras", "disable-log-stats", "enable-sleep-mode", "calculate-kv-scales", "async-scheduling",
    "disable-hybrid-kv-cache-manager", "ray-workers-use-nsight", "data-parallel-hybrid-lb", "data-parallel-external-lb",
    "disable-mm-preprocessor-cache", "skip-mm-profiling", "interleave-mm-strings", "kv-sharing-fast-prefill",
    "use-tqdm-on-load", "disable-async-output-proc", "enable-multimodal-encoder-data-parallel",
    "enable-log-requests", "disable-log-requests", "disable-cascade-attention", "enable-double-buffer",
    # the OpenAI server (vllm/entrypoints/openai/cli_args.py)
    "headless", "enable-auto-tool-choice", "disable-uvicorn-access-log", "disable-fastapi-docs",
    "enable-prompt-tokens-details", "enable-server-load-tracking", "enable-force-include-usage",
    "enable-tokenizer-info-endpoint", "enable-log-outputs", "return-tokens-as-token-ids",
    "disable-frontend-multiprocessing", "enable-request-id-headers", "enable-ssl-refresh", "log-error-stack",
    "exclude-tools-when-tool-choice-none", "allow-credentials", "h11-max-incomplete-event-size-disabled",
))
# options that take every following word up to the next option (argparse nargs="+")
NARGS_OPTIONS: frozenset[str] = frozenset({"--served-model-name", "--cuda-graph-sizes", "--api-key", "--middleware"})
# vLLM's short aliases (each takes a value)
SHORT_OPTIONS: dict[str, str] = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
                                 "-dp": "--data-parallel-size", "-q": "--quantization", "-O": "--compilation-config"}
# options this reader knows take one value (the others it meets are "unknown")
VALUE_OPTIONS: frozenset[str] = frozenset({
    "--model", "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-model-len",
    "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--dtype", "--num-gpu-blocks-override",
    VLLM_ADDITIONAL_CONFIG_FLAG, "--port", "--host", "--tokenizer", "--quantization", "--compilation-config",
    "--speculative-config", "--chat-template", "--gpu-memory-utilization", "--kv-cache-dtype", "--seed",
    "--load-format", "--download-dir", "--revision", "--uvicorn-log-level", "--api-server-count", "--tool-call-parser",
    "--reasoning-parser", "--override-neuron-config",
})
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"
_NAME = re.compile(r"(?<=--)[^.]*")  # vLLM's rule: underscores become dashes up to the first "."
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python[0-9.]*$")
HUMAN_READABLE = frozenset({"--max-model-len"})  # vLLM reads 8k / 8K there; other integers with int()
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class CommandError(ValueError):
    """A command line this reader does not judge (not a vLLM server, or options in a YAML file)."""


@dataclass(frozen=True)
class CommandProblem:
    """A word vLLM refuses before it starts (its argument parser or its JSON reading)."""

    code: str
    setting: str
    message: str


@dataclass
class VllmCommand:
    """The command as vLLM reads it: the model, the last value of each option (``True`` /
    ``False`` for a boolean), ``--additional-config`` parsed, and what vLLM would refuse."""

    words: list[str]
    program: str
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    additional_config: Any = None
    problems: list[CommandProblem] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)
    took_a_word: list[tuple[str, str]] = field(default_factory=list)  # (unknown option, the word it took)
    environment: dict[str, str] = field(default_factory=dict)  # VAR=value words before the program

    def refuse(self, code: str, setting: str, message: str) -> None:
        self.problems.append(CommandProblem(code, setting, message))


def _program(words: list[str], environment: dict[str, str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) for a vLLM server's command line, else None; the ``VAR=value``
    words before it (the shell puts them in vLLM's environment) into ``environment``."""
    while words and (_ASSIGNMENT.match(words[0]) or words[0] == "env"):
        name, _, value = words[0].partition("=")
        if words[0] != "env":
            environment[name] = value
        words = words[1:]
    if not words:
        return None
    head = os.path.basename(words[0])
    if head == "vllm":
        return ("vllm serve", words[2:]) if words[1:2] == ["serve"] else None
    if not _PYTHON.match(head):
        return None
    index = 1
    while index < len(words) and words[index].startswith("-") and words[index] != "-m":
        index += 2 if words[index] in ("-X", "-W") else 1  # the interpreter's own options
    module = words[index + 1] if words[index: index + 1] == ["-m"] and index + 1 < len(words) else None
    if module == API_SERVER_MODULE:
        return API_SERVER_MODULE, words[index + 2:]
    if module == CLI_MODULE and words[index + 2: index + 3] == ["serve"]:
        return "vllm serve", words[index + 3:]
    return None


def _takes_a_value(word: str) -> bool:
    """Whether argparse would take ``word`` as an option's value (not an option itself)."""
    return not word.startswith("-") or bool(_NEGATIVE_NUMBER.match(word)) or word == "-"


def _json_value(text: str) -> Any:
    """A dotted option's value as vLLM reads it: JSON, else the text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _python_dict(text: str) -> bool:
    """Whether ``text`` is a Python dict literal (``{'quantized': True}``): what a hurried user pastes."""
    if len(text) > MAX_ARGUMENT_BYTES:
        return False
    try:
        return isinstance(ast.literal_eval(text.strip()), dict)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def parse_json_option(text: str, name: str) -> tuple[Any, CommandProblem | None]:
    """A JSON option's value as vLLM's ``json.loads`` reads it, or why vLLM refuses it."""
    try:
        return json.loads(text), None
    except RecursionError:
        return None, CommandProblem("bad_additional_config", name, f"{name} is JSON nested deeper than Python's JSON "
                                    "reader allows: vLLM fails reading it; write the override as a flat object")
    except ValueError as exc:
        reason = str(exc).splitlines()[0][:160]
        shape = "a Python dict, not JSON" if _python_dict(text) else f"not JSON vLLM reads ({reason})"
        return None, CommandProblem("bad_additional_config", name, f"{name} is {shape}: vLLM refuses the command "
                                    "while parsing it; write JSON, with double quotes inside (and true / false / null "
                                    f"in lower case), wrapped in single quotes for the shell: {name} "
                                    f"'{{\"{VLLM_OVERRIDE_KEY}\": {{\"quantized\": true, ...}}}}'")


def read_vllm_command(words: Sequence[str]) -> VllmCommand:
    """``words`` (a ``vllm serve ...`` argv) read as vLLM reads it (the module docstring).
    Raises ``CommandError`` when it is not a vLLM server's command line, or uses ``--config``."""
    environment: dict[str, str] = {}
    found = _program([str(word) for word in words], environment)
    if found is None:
        raise CommandError("not a vLLM server's command line: pass `vllm serve MODEL ...` (any path to vllm) or "
                           f"`python -m {API_SERVER_MODULE} --model MODEL ...`")
    program, args = found
    command = VllmCommand(list(words), program, environment=environment)
    for position, word in enumerate(args):
        if len(word) > MAX_ARGUMENT_BYTES // 4 and len(word.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            command.refuse("argument_too_long", word[:20], f"an argument of {len(word):,} characters: Linux passes "
                           f"none longer than {MAX_ARGUMENT_BYTES:,} bytes to a program, so vLLM never starts")
            args[position] = ""  # read on as an empty word
    positionals: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if word == "--":
            positionals.extend(args[index:])
            break
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            name = _NAME.sub(lambda m: m.group(0).replace("_", "-"), name, count=1)
            if name == "--config":
                raise CommandError("vLLM's --config YAML file is not read here: pass its options on the command line")
            if "." in name:  # --json-option.key.sub value
                if not eq:
                    if index >= len(args):
                        command.refuse("missing_value", name, f"{name} has no value: vLLM refuses the command")
                        continue
                    value, index = args[index], index + 1
                _dotted(dotted, name, value)
                continue
            index = _option(command, name, value if eq else None, args, index)
            continue
        if word.startswith("-") and not _takes_a_value(word):
            attached = word.startswith("-O") and word != "-O"
            name = SHORT_OPTIONS.get(word[:2] if attached else word, word)
            index = _option(command, name, word[2:].lstrip("=") if attached else None, args, index)
            continue
        positionals.append(word)
    for option, document in dotted.items():  # vLLM appends them last: each replaces the option's JSON
        _set(command, option, json.dumps(document))
    _model(command, positionals)
    raw = command.options.get(VLLM_ADDITIONAL_CONFIG_FLAG)
    if isinstance(raw, str):
        command.additional_config, problem = parse_json_option(raw, VLLM_ADDITIONAL_CONFIG_FLAG)
        if problem is not None:
            command.problems.append(problem)
        elif not isinstance(command.additional_config, dict):
            command.refuse("bad_additional_config", VLLM_ADDITIONAL_CONFIG_FLAG,
                           f"{VLLM_ADDITIONAL_CONFIG_FLAG} must be a JSON object with \"{VLLM_OVERRIDE_KEY}\": "
                           "vLLM refuses anything else")
            command.additional_config = None
    return command


def _set(command: VllmCommand, name: str, value: Any) -> None:
    if name in command.options and name not in command.repeated:
        command.repeated.append(name)
    command.options[name] = value


def _dotted(dotted: dict[str, dict[str, Any]], name: str, value: str) -> None:
    """``--option.key.sub value`` merged into ``dotted[option]`` (``key+``: a comma-separated list)."""
    option, *keys = name.split(".")
    target = dotted.setdefault(option.removesuffix("+"), {})
    for key in keys[:-1]:
        inner = target.get(key)
        if not isinstance(inner, dict):
            inner = target[key] = {}
        target = inner
    if keys:
        last = keys[-1]
        target[last.removesuffix("+")] = value.split(",") if last.endswith("+") else _json_value(value)


def _option(command: VllmCommand, name: str, value: str | None, args: list[str], index: int) -> int:
    """One option (``value``: its ``=value``, else None) and the words it takes; the next index."""
    if (name.startswith("--no-") and name not in VALUE_OPTIONS | BOOLEAN_OPTIONS) or name in BOOLEAN_OPTIONS:
        if value is not None:
            command.refuse("boolean_with_value", name, f"{name} takes no value (an on/off option): vLLM refuses "
                           f"{name}=…; write {name} alone")
        elif name in BOOLEAN_OPTIONS:
            _set(command, name, True)
        else:
            _set(command, "--" + name[5:], False)
        return index
    if value is not None:
        _set(command, name, value)
        return index
    if name in NARGS_OPTIONS:
        values = []
        while index < len(args) and _takes_a_value(args[index]):
            values.append(args[index])
            index += 1
        if not values:
            command.refuse("missing_value", name, f"{name} has no value: vLLM refuses the command")
        _set(command, name, values)
        return index
    if index < len(args) and _takes_a_value(args[index]):
        if name not in VALUE_OPTIONS:
            command.took_a_word.append((name, args[index]))
        _set(command, name, args[index])
        return index + 1
    if name in VALUE_OPTIONS:
        command.refuse("missing_value", name, f"{name} has no value: vLLM refuses the command")
    else:
        _set(command, name, True)  # an option this reader does not know, with no value: an on/off option
    return index


def _model(command: VllmCommand, positionals: list[str]) -> None:
    flag_model = command.options.get("--model")
    if command.program == API_SERVER_MODULE:
        command.model = flag_model if isinstance(flag_model, str) else None
        if positionals:
            command.refuse("unexpected_argument", positionals[0], f"{API_SERVER_MODULE} takes no positional argument "
                           f"({positionals[0]!r}): vLLM refuses it; pass the model as --model")
        return
    command.model = positionals[0] if positionals else flag_model if isinstance(flag_model, str) else None
    for extra in positionals[1:2]:
        command.refuse("unexpected_argument", extra, f"a second positional argument {extra!r}: vllm serve takes one "
                       "model and refuses the rest; is an option missing its name?")


# --------------------------------------------------------------------------- vLLM's settings


def _integer(text: Any) -> Any:
    """An integer option as vLLM's parser takes it (``8192``, ``8k``, ``8K``), else the text."""
    if not isinstance(text, str):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kKmMgGtT]?)\s*", text)
    if not match or len(match.group(1)) > 30:
        return text
    number, suffix = match.groups()
    if not suffix:
        return int(number) if number.isdigit() else text
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1) if number.isdigit() else text


def _plain_integer(text: Any) -> Any:
    """An option of type ``int`` as argparse takes it, else the text."""
    try:
        return int(text) if isinstance(text, str) and len(text) <= 30 else text
    except ValueError:
        return text


def settings_from_command(command: VllmCommand, hf_config: Mapping[str, Any] | None) -> tuple[VllmSettings, list[CommandProblem]]:
    """The settings vLLM derives from the command (and from the model's ``config.json``)."""
    problems = []
    values: dict[str, Any] = {}
    for name, option, default in (("tensor_parallel_size", "--tensor-parallel-size", 1),
                                  ("max_model_len", "--max-model-len", None), ("max_num_seqs", "--max-num-seqs", None),
                                  ("block_size", "--block-size", None), ("num_gpu_blocks_override", "--num-gpu-blocks-override", None)):
        raw = command.options.get(option)
        value = default if raw is None else _integer(raw) if option in HUMAN_READABLE else _plain_integer(raw)
        if raw is not None and type(value) is not int:
            problems.append(CommandProblem("bad_value", option, f"{option} is {str(raw)[:40]!r}, not a whole number: "
                                           "vLLM refuses the command"))
            value = default
        values[name] = value
    config = hf_config or {}
    if values["max_model_len"] is None:
        values["max_model_len"] = config.get("max_position_embeddings")
    dtype = command.options.get("--dtype", "auto")
    torch_dtype = config.get("torch_dtype") if dtype == "auto" else {"half": "float16", "float": "float32"}.get(dtype, dtype)
    prefix_caching = command.options.get("--enable-prefix-caching", True) is not False
    block_size = values["block_size"] or 32
    if not prefix_caching and type(values["max_model_len"]) is int:
        block_size = values["max_model_len"]
    return VllmSettings(tensor_parallel_size=values["tensor_parallel_size"], max_model_len=values["max_model_len"],
                        max_num_seqs=values["max_num_seqs"] or 32, block_size=block_size,
                        enable_prefix_caching=prefix_caching, torch_dtype=torch_dtype,
                        num_gpu_blocks_override=values["num_gpu_blocks_override"]), problems
