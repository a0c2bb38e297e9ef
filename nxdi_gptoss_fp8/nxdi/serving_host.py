"""The serving-host lint (``nxdi-gptoss-fp8 doctor``): a ``vllm serve`` command line and the
environment it runs in, checked against the vLLM recipe (``recipes``) before the server starts.

Each finding is one line with its fix. What is checked, and why it matters on a real start:

* the override key: vllm-neuron reads ``--additional-config``'s ``override_neuron_config`` only
  (NxDI's own vLLM guide spells it ``override-neuron-config``; that object is silently ignored);
* the FP8 keys in it (``recipes.QUANTIZATION_KEYS``): vLLM's defaults are not quantized, and a
  ``quantized`` alone gets ``int8`` / ``per_tensor_symmetric`` filled in;
* the model: a local directory (a Hub id is re-saved through transformers first, which builds
  random weights for a ``quant_method`` it does not know), the one ``quantized_checkpoints_path`` names;
* ``CHECKPOINT_FORMAT`` set to exactly ``normalized_fp8``;
* ``NEURON_COMPILED_ARTIFACTS`` set, outside the checkpoint: unset, vllm-neuron 0.2.x compiles
  into ``MODEL/neuron-compiled-artifacts/<md5>/`` and deletes that directory at every start;
  with precompiled artifacts there, ``override_neuron_config`` is ignored (noted);
* Harmony's vocabulary: vLLM renders ``gpt_oss`` through openai-harmony, which with
  ``TIKTOKEN_ENCODINGS_BASE`` set reads ``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` and
  refuses it unless its SHA-256 is ``O200K_BASE_SHA256``, and without it downloads the file
  (an air-gapped host cannot).

Stdlib only; nothing is imported from NxDI or vLLM.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import format as fmt
from ..hub import is_repo_id
from ..safeio.hashing import sha256_file
from ..units import plural
from .recipes import (
    HARMONY_VOCABULARY_URL,
    MODULES_TO_NOT_CONVERT,
    QUANTIZATION_KEYS,
    VLLM_ADDITIONAL_CONFIG_FLAG,
    VLLM_OVERRIDE_KEY,
)

__all__ = ["HARMONY_VOCABULARY", "O200K_BASE_SHA256", "HostFinding", "HostReport", "lint_serving_host", "parse_command",
           "serve_arguments"]

HARMONY_VOCABULARY = "o200k_base.tiktoken"
# The SHA-256 openai-harmony expects of o200k_base.tiktoken (openai/harmony,
# src/tiktoken_ext/public_encodings.rs, Encoding::expected_hash; tiktoken's openai_public.py agrees)
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
ENV_FORMAT, ENV_COMPILED, ENV_TIKTOKEN = "CHECKPOINT_FORMAT", "NEURON_COMPILED_ARTIFACTS", "TIKTOKEN_ENCODINGS_BASE"
MAX_VOCABULARY_BYTES = 64 << 20  # o200k_base.tiktoken is 3.6 MB; never hash a huge file by mistake


@dataclass(frozen=True)
class HostFinding:
    """One setting that would break or slow the start: ``code`` is stable, ``message`` ends with the fix."""

    code: str
    severity: str  # "error" or "warning"
    setting: str  # the flag, JSON key or environment variable
    message: str

    def render(self) -> str:
        return f"{self.severity.upper()} {self.code} [{self.setting}]: {self.message}"


@dataclass
class HostReport:
    command: list[str]
    model: str | None
    findings: list[HostFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "command": self.command, "model": self.model,
                "findings": [asdict(f) for f in self.findings]}

    def render_text(self) -> str:
        lines = [f.render() for f in self.findings]
        errors = sum(f.severity == "error" for f in self.findings)
        lines.append(f"{'OK' if self.ok else 'FAILED'}: {plural(errors, 'error')}, {plural(len(self.findings) - errors, 'warning')} "
                     "(the vLLM recipe: README, \"Serving with vLLM\")")
        return "\n".join(lines)


def serve_arguments(command: Sequence[str]) -> list[str] | None:
    """The arguments after ``vllm serve`` (or ``python -m vllm.…``), past any ``VAR=value``
    prefixes; None when ``command`` is not a vLLM server's command line."""
    words = list(command)
    while words and not words[0].startswith("-") and "=" in words[0]:
        words.pop(0)  # VAR=value prefixes
    if words[:2] == ["vllm", "serve"]:
        return words[2:]
    if words[:1] and words[0].startswith("python") and words[1:2] == ["-m"] and words[2:3] and \
            words[2].split(".")[0] == "vllm":
        return words[3:]
    return None


def parse_command(command: Sequence[str]) -> tuple[str | None, dict[str, str | None]]:
    """The model and the ``--flag value`` options of a ``vllm serve MODEL ...`` (or ``python -m
    vllm.entrypoints.openai.api_server --model MODEL ...``) command; ``--flag=value`` too."""
    words = serve_arguments(command)
    if words is None:
        words = list(command)
    model, options, index = None, {}, 0
    while index < len(words):
        word = words[index]
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if not eq and index + 1 < len(words) and not words[index + 1].startswith("--"):
                value, index = words[index + 1], index + 1
            options[name] = value if (eq or value) else None
        elif model is None:
            model = word
        index += 1
    return options.get("--model") or model, options


def _finding(findings: list[HostFinding], code: str, setting: str, message: str, *, warning: bool = False) -> None:
    findings.append(HostFinding(code, "warning" if warning else "error", setting, message))


def _override(options: Mapping[str, str | None], findings: list[HostFinding]) -> dict[str, Any] | None:
    flag = VLLM_ADDITIONAL_CONFIG_FLAG
    for name in options:
        if name.replace("_", "-") == "--override-neuron-config":
            _finding(findings, "override_flag", name, f"vllm-neuron reads no {name} flag: put the object under "
                     f"{flag} '{{\"{VLLM_OVERRIDE_KEY}\": {{...}}}}'")
    raw = options.get(flag)
    if raw is None:
        _finding(findings, "no_override", flag, f"no {flag}: vLLM's default NeuronConfig is not quantized; add "
                 f"{flag} '{{\"{VLLM_OVERRIDE_KEY}\": {{...}}}}' with every FP8 key (the recipe)")
        return None
    try:
        document = json.loads(raw)
    except ValueError as exc:
        _finding(findings, "bad_additional_config", flag, f"{flag} is not JSON ({exc}): quote it in single quotes, "
                 "as in the recipe")
        return None
    if not isinstance(document, dict):
        _finding(findings, "bad_additional_config", flag, f"{flag} must be a JSON object with \"{VLLM_OVERRIDE_KEY}\"")
        return None
    override = document.get(VLLM_OVERRIDE_KEY)
    if not isinstance(override, dict):
        near = [key for key in document if difflib.SequenceMatcher(None, key.replace("-", "_").lower(),
                                                                    VLLM_OVERRIDE_KEY).ratio() >= 0.8]
        what = f"has {near[0]!r}, which vllm-neuron ignores" if near else f"has no \"{VLLM_OVERRIDE_KEY}\" object"
        _finding(findings, "override_key_spelling" if near else "no_override", f"{flag}.{near[0] if near else VLLM_OVERRIDE_KEY}",
                 f"{flag} {what}: spell the key {VLLM_OVERRIDE_KEY} (underscores), holding every FP8 key")
        return None
    return override


def _override_keys(override: Mapping[str, Any], model: str | None, findings: list[HostFinding]) -> None:
    wanted = {"quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE}
    defaults = {"quantization_type": "per_tensor_symmetric", "quantization_dtype": "int8"}
    for key in QUANTIZATION_KEYS:
        setting = f"{VLLM_OVERRIDE_KEY}.{key}"
        value = override.get(key)
        if key not in override:
            filled = f" (vLLM fills in {defaults[key]!r})" if key in defaults and "quantized" in override else ""
            example = {**wanted, "modules_to_not_convert": list(MODULES_TO_NOT_CONVERT),
                       "quantized_checkpoints_path": model or "MODEL"}.get(key)
            fix = (f"add \"{key}\": {json.dumps(example)}" if example is not None
                   else f"add \"{key}\" as the checkpoint records it (nxdi-gptoss-fp8 inspect MODEL)")
            _finding(findings, "missing_key", setting, f"{key} is missing{filled}: {fix}", warning=key.startswith("padded_"))
        elif key in wanted and value != wanted[key]:
            _finding(findings, "wrong_value", setting, f"{key} is {json.dumps(value)}: set it to {json.dumps(wanted[key])}")
        elif key == "modules_to_not_convert" and (not isinstance(value, list) or not set(MODULES_TO_NOT_CONVERT) <= set(value)):
            _finding(findings, "wrong_value", setting, f"{key} is {json.dumps(value)[:80]}: set it to "
                     f"{json.dumps(list(MODULES_TO_NOT_CONVERT))}")
        elif key == "quantized_checkpoints_path" and model and isinstance(value, str) \
                and os.path.realpath(value) != os.path.realpath(model):
            _finding(findings, "checkpoint_path_differs", setting, f"{key} is {value!r} but vLLM serves {model!r}: NxDI "
                     "reads the config from one and the weights from the other; set both to the checkpoint directory")


def _model(model: str | None, findings: list[HostFinding]) -> None:
    if model is None:
        _finding(findings, "no_model", "MODEL", "no model in the command: pass the normalized checkpoint's local directory")
    elif not os.path.isdir(model):
        if is_repo_id(model):
            _finding(findings, "hub_id", "MODEL", f"{model!r} is a Hub id: vLLM would re-save it through transformers "
                     "first (random weights for a quant_method it does not know); download it (hf download "
                     f"{model} --local-dir DIR) and serve DIR")
        else:
            _finding(findings, "model_not_found", "MODEL", f"{model!r} is not a directory: pass the normalized checkpoint's directory")


def _environment(environ: Mapping[str, str], model: str | None, override_given: bool,
                 findings: list[HostFinding]) -> None:
    value = environ.get(ENV_FORMAT)
    if value is None or value.strip().lower() != "normalized_fp8":
        shown = "unset" if value is None else f"{value!r}"
        _finding(findings, "checkpoint_format", ENV_FORMAT, f"{ENV_FORMAT} is {shown}: export {ENV_FORMAT}=normalized_fp8")
    compiled = environ.get(ENV_COMPILED)
    if not compiled:
        _finding(findings, "compiled_artifacts_unset", ENV_COMPILED, f"{ENV_COMPILED} is unset: vllm-neuron compiles into "
                 "MODEL/neuron-compiled-artifacts/<md5>/ and deletes it at every start (every restart recompiles); "
                 f"export {ENV_COMPILED}=DIR on persistent storage outside the checkpoint")
    else:
        inside = model is not None and os.path.isdir(model) and \
            os.path.commonpath([os.path.realpath(compiled), os.path.realpath(model)]) == os.path.realpath(model)
        if inside:
            _finding(findings, "compiled_artifacts_inside", ENV_COMPILED, f"{ENV_COMPILED}={compiled!r} is inside the "
                     "checkpoint: the preflight refuses weight files nested in it; point it outside the checkpoint")
        elif override_given and os.path.isfile(os.path.join(compiled, "neuron_config.json")):
            _finding(findings, "precompiled_override_ignored", ENV_COMPILED, f"{compiled} holds precompiled artifacts: "
                     "vLLM loads them and ignores override_neuron_config; their neuron_config.json decides (remove the "
                     "directory's contents to compile with the override)", warning=True)
    base = environ.get(ENV_TIKTOKEN)
    if not base:
        _finding(findings, "harmony_vocabulary_download", ENV_TIKTOKEN, f"{ENV_TIKTOKEN} is unset: Harmony downloads "
                 f"{HARMONY_VOCABULARY} from {HARMONY_VOCABULARY_URL} at the first request, which an air-gapped host "
                 f"cannot; put that file (SHA-256 {O200K_BASE_SHA256}) in a directory and export {ENV_TIKTOKEN}=DIR",
                 warning=True)
        return
    path = os.path.join(base, HARMONY_VOCABULARY)
    if not os.path.isfile(path):
        _finding(findings, "harmony_vocabulary_missing", ENV_TIKTOKEN, f"{path} does not exist: Harmony then fails "
                 f"(it never downloads when {ENV_TIKTOKEN} is set); copy {HARMONY_VOCABULARY} there (published at "
                 f"{HARMONY_VOCABULARY_URL}, SHA-256 {O200K_BASE_SHA256})")
    elif os.path.getsize(path) > MAX_VOCABULARY_BYTES:
        _finding(findings, "harmony_vocabulary_wrong", ENV_TIKTOKEN, f"{path} is not {HARMONY_VOCABULARY} (too large): "
                 f"copy the published file there ({HARMONY_VOCABULARY_URL}, SHA-256 {O200K_BASE_SHA256})")
    else:
        digest = sha256_file(path)
        if digest != O200K_BASE_SHA256:
            _finding(findings, "harmony_vocabulary_wrong", ENV_TIKTOKEN, f"{path} has SHA-256 {digest[:16]}…, Harmony "
                     f"expects {O200K_BASE_SHA256} and refuses it: copy the published {HARMONY_VOCABULARY} there "
                     f"({HARMONY_VOCABULARY_URL})")


def lint_serving_host(command: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> HostReport:
    """Every finding for ``command`` (a ``vllm serve ...`` argv; empty: the environment only)."""
    env = os.environ if environ is None else environ
    words = list(command)
    if len(words) == 1:
        words = shlex.split(words[0])  # the whole command pasted as one string
    findings: list[HostFinding] = []
    model, options = parse_command(words) if words else (None, {})
    if words:
        _model(model, findings)
        override = _override(options, findings)
        if override is not None:  # (a model that is no directory has its own finding)
            _override_keys(override, model if model is not None and os.path.isdir(model) else None, findings)
    _environment(env, model, bool(words) and VLLM_ADDITIONAL_CONFIG_FLAG in options, findings)
    return HostReport(words, model, findings)
