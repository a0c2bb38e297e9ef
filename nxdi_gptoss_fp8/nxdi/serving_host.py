"""The serving-host check (``nxdi-gptoss-fp8 doctor``): a ``vllm serve`` command line and the
environment it runs in, judged as the start judges them, before the server starts.

``doctor`` is the load's verdict, not a lint of its own: the command is read as vLLM reads it
(``vllm_command``), the NeuronConfig is built as vllm-neuron builds it (its defaults, then
``override_neuron_config``), and the checkpoint the load would read is judged by the one function
``validate DIR --neuron-config FILE`` runs (``validate.verdict.checkpoint_verdict``: the
preflight, with the NeuronConfig; a directory that is another kind of checkpoint named as
``inspect`` names it, with its action). Around it, what the start reads from the host:

* ``CHECKPOINT_FORMAT``, read by the hook's own parser (``hook.normalized_mode``; the config's
  ``checkpoint_format`` counts too): without the opt-in NxDI never runs our load path;
* ``NEURON_COMPILED_ARTIFACTS``: a regular file stops the start; unset, vllm-neuron compiles into
  ``MODEL/neuron-compiled-artifacts/<md5>/`` and deletes it at every start (every restart
  recompiles: a warning); inside the checkpoint, a warning (the compile output then sits in the
  checkpoint); holding precompiled artifacts, vLLM loads them and their ``neuron_config.json``
  replaces the override: that config is the one checked;
* Harmony's vocabulary: vLLM renders ``gpt_oss`` through openai-harmony, which with
  ``TIKTOKEN_ENCODINGS_BASE`` set reads ``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` and
  refuses it unless its SHA-256 is ``O200K_BASE_SHA256``, and without it downloads the file
  (an air-gapped host cannot: a warning).

Each finding is one line with its fix; errors are what stops the start. Stdlib only; nothing is
imported from NxDI or vLLM.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..hub import is_repo_id
from ..safeio.hashing import sha256_file
from ..validate.vllm_config import VLLM_OVERRIDE_KEY, vllm_neuron_config
from .recipes import HARMONY_VOCABULARY_URL, VLLM_ADDITIONAL_CONFIG_FLAG
from .vllm_command import CommandError, VllmCommand, read_vllm_command, settings_from_command

__all__ = ["HARMONY_VOCABULARY", "MAX_SHOWN_FINDINGS", "O200K_BASE_SHA256", "CommandError", "HostFinding", "HostReport",
           "lint_serving_host"]

HARMONY_VOCABULARY = "o200k_base.tiktoken"
# The SHA-256 openai-harmony expects of o200k_base.tiktoken (openai/harmony,
# src/tiktoken_ext/public_encodings.rs, Encoding::expected_hash; tiktoken's openai_public.py agrees)
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
ENV_FORMAT, ENV_COMPILED, ENV_TIKTOKEN = "CHECKPOINT_FORMAT", "NEURON_COMPILED_ARTIFACTS", "TIKTOKEN_ENCODINGS_BASE"
MAX_VOCABULARY_BYTES = 64 << 20  # o200k_base.tiktoken is 3.6 MB; never hash a huge file by mistake


MAX_SHOWN_FINDINGS = 50  # the checkpoint's findings shown (errors first); the rest are counted
MAX_SHOWN_WORD = 200  # a longer word of the command is shown cut, with its length
DOCS = "docs/serving.md#vllm-the-nxdi-backed-vllm-neuron"


@dataclass(frozen=True)
class HostFinding:
    """One setting that would break or slow the start: ``code`` is stable, ``message`` ends with the fix."""

    code: str
    severity: str  # "error" or "warning"
    setting: str  # the flag, JSON key, environment variable or checkpoint file
    message: str

    def render(self) -> str:
        from ..units import printable

        return printable(f"{self.severity.upper()} {self.code} [{self.setting}]: {self.message}")


@dataclass
class HostReport:
    """Every finding for one command on one host; ``ok`` (no error) is the start's verdict."""

    command: list[str]
    model: str | None
    findings: list[HostFinding] = field(default_factory=list)
    omitted: int = 0  # the checkpoint's findings beyond MAX_SHOWN_FINDINGS (validate lists them all)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        shown = [word if len(word) <= MAX_SHOWN_WORD else f"{word[:MAX_SHOWN_WORD]}… ({len(word):,} characters)"
                 for word in self.command]
        return {"ok": self.ok, "command": shown, "model": self.model,
                "findings": [asdict(f) for f in self.findings], "omitted": self.omitted}

    def render_text(self) -> str:
        from ..units import plural

        lines = [f.render() for f in self.findings]
        if self.omitted:
            lines.append(f"… and {plural(self.omitted, 'more finding')} of the checkpoint: `nxdi-gptoss-fp8 validate "
                         "MODEL --neuron-config FILE` lists them all")
        errors = sum(f.severity == "error" for f in self.findings)
        lines.append(f"{'OK' if self.ok else 'FAILED'}: {plural(errors, 'error')}, "
                     f"{plural(len(self.findings) - errors, 'warning')} (the vLLM recipe: {DOCS})")
        return "\n".join(lines)


def _finding(findings: list[HostFinding], code: str, setting: str, message: str, *, warning: bool = False) -> None:
    findings.append(HostFinding(code, "warning" if warning else "error", setting, message))


def _encodable(path: str) -> bool:
    """Whether ``path`` can name a file here (a lone surrogate that did not come from the
    filesystem's own bytes cannot: every file call would raise)."""
    try:
        os.fsencode(path)
    except UnicodeError:
        return False
    return "\x00" not in path


def _split(command: Sequence[str]) -> list[str]:
    """The argv; a single string (the whole command pasted as one) is split as the shell would."""
    words = [str(word) for word in command]
    if len(words) != 1:
        return words
    try:
        return shlex.split(words[0])
    except ValueError as exc:
        raise CommandError(f"the command cannot be split as the shell would ({exc}): pass it after -- as words") from None


def _command_findings(command: VllmCommand, findings: list[HostFinding]) -> dict[str, Any] | None:
    """What vLLM refuses in the command, and the object under ``override_neuron_config`` (None:
    vllm-neuron's defaults alone)."""
    for problem in command.problems:
        _finding(findings, problem.code, problem.setting, problem.message)
    flag = VLLM_ADDITIONAL_CONFIG_FLAG
    if "--override-neuron-config" in command.options:
        _finding(findings, "override_flag", "--override-neuron-config", "vLLM has no --override-neuron-config option "
                 f"(it refuses it) and vllm-neuron reads none: put the object under {flag} "
                 f"'{{\"{VLLM_OVERRIDE_KEY}\": {{...}}}}'")
    document = command.additional_config
    if flag not in command.options:
        _finding(findings, "no_override", flag, f"no {flag}: vLLM's default NeuronConfig is not quantized; add "
                 f"{flag} '{{\"{VLLM_OVERRIDE_KEY}\": {{...}}}}' with every FP8 key (the recipe)")
        return None
    if not isinstance(document, dict):
        return None  # a problem above says why
    override = document.get(VLLM_OVERRIDE_KEY)
    if VLLM_OVERRIDE_KEY not in document:
        import difflib

        near = [key for key in document if isinstance(key, str) and difflib.SequenceMatcher(
            None, key[:100].replace("-", "_").lower(), VLLM_OVERRIDE_KEY).ratio() >= 0.8]
        what = f"has {near[0][:60]!r}, which vllm-neuron ignores" if near else f"has no \"{VLLM_OVERRIDE_KEY}\" object"
        _finding(findings, "override_key_spelling" if near else "no_override", f"{flag}.{VLLM_OVERRIDE_KEY}",
                 f"{flag} {what}: spell the key {VLLM_OVERRIDE_KEY} (underscores), holding every FP8 key")
        return None
    if isinstance(override, dict):
        return override
    if override:  # vllm-neuron takes a falsy value for "no override" and fails on any other
        from ..validate.nxdi_config import describe

        _finding(findings, "bad_override", f"{flag}.{VLLM_OVERRIDE_KEY}", f"{VLLM_OVERRIDE_KEY} is {describe(override)}: "
                 "vllm-neuron fails on anything but a JSON object of NeuronConfig attributes")
    return None


def _model(command: VllmCommand, findings: list[HostFinding]) -> str | None:
    """The model directory, or None (with the finding saying why it is not one)."""
    model = command.model
    if model is None:
        took = command.took_a_word[:1]
        why = (f": {took[0][0]} was read as taking {took[0][1][:80]!r} as its value (vLLM reads an option it defines "
               f"with a value so); if {took[0][0]} takes no value, put the model right after `serve`") if took else ""
        _finding(findings, "no_model", "MODEL", f"no model in the command{why}: pass the normalized checkpoint's "
                 "local directory")
        return None
    if not _encodable(model):
        _finding(findings, "model_not_found", "MODEL", f"{model[:80]!r} cannot name a file (it holds characters no "
                 "file name here can): pass the normalized checkpoint's directory")
        return None
    if os.path.isdir(model):
        return model
    if os.path.exists(model):
        _finding(findings, "model_not_found", "MODEL", f"{model!r} is a file, not a directory: pass the normalized "
                 "checkpoint's directory")
    elif is_repo_id(model):
        _finding(findings, "hub_id", "MODEL", f"{model!r} is a Hub id: vLLM would re-save it through transformers "
                 "first (random weights for a quant_method it does not know); download it (hf download "
                 f"{model} --local-dir DIR) and serve DIR")
    else:
        _finding(findings, "model_not_found", "MODEL", f"{model!r} is not a directory: pass the normalized checkpoint's "
                 "directory")
    return None


def _hub_model(command: VllmCommand, findings: list[HostFinding]) -> Any:
    """The Hub repo vLLM would download for MODEL, read without downloading its weights
    (``hub.hub_checkpoint``, at vLLM's ``--revision``), or None when MODEL is no repo id (or,
    with a warning saying why, when the Hub cannot be read)."""
    model, revision = command.model, command.options.get("--revision")
    if model is None or not _encodable(model) or os.path.lexists(model) or not is_repo_id(model):
        return None
    from ..errors import HubAccessError, MissingDependencyError
    from ..hub import hub_checkpoint

    try:
        return hub_checkpoint(model, revision if isinstance(revision, str) else None)
    except (HubAccessError, MissingDependencyError) as exc:
        _finding(findings, "hub_unreadable", "MODEL", f"its checkpoint was not judged: {exc}", warning=True)
        return None


def _model_config(model: Any) -> dict[str, Any] | None:
    """The model's ``config.json`` (what vLLM and NxDI read the model from), or None; ``model``
    a directory or a Hub repo's ``CheckpointReader``."""
    if model is None:
        return None
    from .. import format as fmt
    from ..safeio.json_file import JsonFileError, read_json_file

    try:
        document = (read_json_file(os.path.join(model, fmt.CONFIG_FILE), what=fmt.CONFIG_FILE) if isinstance(model, str)
                    else model.read_json(fmt.CONFIG_FILE, what=fmt.CONFIG_FILE))
    except JsonFileError:
        return None  # the checkpoint's findings say why
    return document if isinstance(document, dict) else None


def _compiled_artifacts(environ: Mapping[str, str], model: str | None, findings: list[HostFinding]) -> Any:
    """The ``NEURON_COMPILED_ARTIFACTS`` checks; the precompiled ``neuron_config.json`` vLLM
    would load instead of building one (None: it builds one from the command)."""
    from ..recognize import COMPILED_MODEL_FILE, NEURON_CONFIG_FILE
    from ..validate.nxdi_config import read_config_file

    compiled = environ.get(ENV_COMPILED)
    if not compiled:
        _finding(findings, "compiled_artifacts_unset", ENV_COMPILED, f"{ENV_COMPILED} is unset: vllm-neuron compiles into "
                 "MODEL/neuron-compiled-artifacts/<md5>/ and deletes it at every start (every restart recompiles); "
                 f"export {ENV_COMPILED}=DIR on persistent storage outside the checkpoint", warning=True)
        return None
    if not _encodable(compiled):
        _finding(findings, "compiled_artifacts_not_a_directory", ENV_COMPILED, f"{ENV_COMPILED}={compiled[:80]!r} cannot "
                 "name a file here: set it to a directory on persistent storage")
        return None
    if os.path.exists(compiled) and not os.path.isdir(compiled):
        _finding(findings, "compiled_artifacts_not_a_directory", ENV_COMPILED, f"{ENV_COMPILED}={compiled!r} is a file, "
                 "not a directory: vllm-neuron loads and writes the compiled model there and fails; set it to a "
                 "directory (outside the checkpoint)")
        return None
    if model is not None and os.path.commonpath([os.path.realpath(compiled), os.path.realpath(model)]) == \
            os.path.realpath(model):
        _finding(findings, "compiled_artifacts_inside", ENV_COMPILED, f"{ENV_COMPILED}={compiled!r} is inside the "
                 "checkpoint: the compile output (and pre-sharded weights) would sit among its files; point it outside "
                 "the checkpoint", warning=True)
    config_file = os.path.join(compiled, NEURON_CONFIG_FILE)
    if not (os.path.isfile(config_file) and os.path.isfile(os.path.join(compiled, COMPILED_MODEL_FILE))):
        return None
    try:
        config = read_config_file(config_file, f"{ENV_COMPILED}/{NEURON_CONFIG_FILE}")
    except ConfigError as exc:
        _finding(findings, "precompiled_unreadable", ENV_COMPILED, f"{exc}: NxDI cannot load it, so vllm-neuron "
                 "compiles again with the command's override", warning=True)
        return None
    _finding(findings, "precompiled_override_ignored", ENV_COMPILED, f"{compiled} holds precompiled artifacts: "
             "vLLM loads them and ignores override_neuron_config; their neuron_config.json is the NeuronConfig checked "
             "(remove the directory's contents to compile with the override)", warning=True)
    return config


def _checkpoint_format(environ: Mapping[str, str], config: Any, findings: list[HostFinding]) -> None:
    """``CHECKPOINT_FORMAT`` (and the config's ``checkpoint_format``), read by the hook's parser."""
    from ..errors import CheckpointFormatError
    from .hook import normalized_mode

    try:
        normalized = normalized_mode(config, environ)
    except CheckpointFormatError as exc:
        _finding(findings, "checkpoint_format", ENV_FORMAT, str(exc))
        return
    if not normalized:
        value = environ.get(ENV_FORMAT)
        shown = "unset" if value is None else f"{value!r}"
        _finding(findings, "checkpoint_format", ENV_FORMAT, f"{ENV_FORMAT} is {shown}: NxDI then loads the directory "
                 f"with its own converters, not as a normalized FP8 checkpoint; export {ENV_FORMAT}=normalized_fp8")


def _checkpoint(model: Any, config: Any, model_config: dict[str, Any] | None, environ: Mapping[str, str],
                findings: list[HostFinding]) -> int:
    """The checkpoint the load reads (``quantized_checkpoints_path`` when quantized, as NxDI's
    ``checkpoint_loader_fn``), judged by ``checkpoint_verdict`` with ``config``: the preflight the
    hook runs at the start. Returns how many of its findings were not shown."""
    from .. import format as fmt
    from ..validate.nxdi_config import config_attr, neuron_config_view
    from ..validate.pipeline import allow_custom_from_env
    from ..validate.verdict import checkpoint_verdict

    try:
        allow_custom = allow_custom_from_env(environ)
    except ConfigError as exc:
        _finding(findings, "unreadable_setting", fmt.ALLOW_CUSTOM_ENV, f"{exc}; the load refuses to start")
        return 0
    nc = neuron_config_view(config)
    named = config_attr(nc, "quantized_checkpoints_path") if config_attr(nc, "quantized", False) else None
    path, setting, inference = model, "MODEL", None
    if isinstance(named, str) and named and isinstance(model, str):  # else: the preflight's neuron_config finding
        if not _encodable(named):
            _finding(findings, "model_not_found", "quantized_checkpoints_path", f"{named[:80]!r} cannot name a file "
                     "here: set quantized_checkpoints_path to the checkpoint directory")
            return 0
        if os.path.realpath(named) != os.path.realpath(model):
            if not isinstance(model_config, dict) or not model_config.get("architectures"):
                from ..recognize import recognize

                recognition = recognize(model)
                what = f"; {recognition.hint()}" if recognition.known else ""
                _finding(findings, "no_model_config", "MODEL", f"{model!r} has no config.json naming the model's "
                         f"architectures, which vLLM reads the model from{what}: serve the checkpoint directory")
            _finding(findings, "checkpoint_path_differs", "quantized_checkpoints_path", f"quantized_checkpoints_path is "
                     f"{named!r} but vLLM serves {model!r}: NxDI reads the weights from the first and the model config "
                     "from the second; set both to the checkpoint directory", warning=True)
            path, setting, inference = named, "quantized_checkpoints_path", model_config
    verdict = checkpoint_verdict(path, neuron_config=config, inference_config=inference, allow_custom_model=allow_custom)
    if verdict.recognition is not None:
        hint = verdict.hint or ""
        if verdict.recognition.kind == "nxdi-compiled":
            hint += f"; for vLLM: export {ENV_COMPILED}={path} and serve the checkpoint it was compiled from"
        _finding(findings, "not_normalized", setting, f"{hint} (nxdi-gptoss-fp8 inspect {path})")
        return 0
    shown = [f for f in verdict.report.findings if f.severity.value == "error"]
    shown += [f for f in verdict.report.findings if f.severity.value == "warning"]
    for finding in shown[:MAX_SHOWN_FINDINGS]:
        where = finding.key or finding.file or setting
        findings.append(HostFinding(finding.code, finding.severity.value, where, finding.message))
    return max(0, len(shown) - MAX_SHOWN_FINDINGS) + sum(verdict.report.omitted.values())


def _vocabulary(environ: Mapping[str, str], findings: list[HostFinding]) -> None:
    base = environ.get(ENV_TIKTOKEN)
    if not base:
        _finding(findings, "harmony_vocabulary_download", ENV_TIKTOKEN, f"{ENV_TIKTOKEN} is unset: Harmony downloads "
                 f"{HARMONY_VOCABULARY} from {HARMONY_VOCABULARY_URL} at the first request, which an air-gapped host "
                 f"cannot; put that file (SHA-256 {O200K_BASE_SHA256}) in a directory and export {ENV_TIKTOKEN}=DIR",
                 warning=True)
        return
    path = os.path.join(base, HARMONY_VOCABULARY)
    if not _encodable(path) or not os.path.isfile(path):
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
    """Every finding for ``command`` (a ``vllm serve ...`` argv, or the whole command as one
    string; empty: the environment only) on this host: ``report.ok`` is the start's verdict.
    Raises ``CommandError`` for a command line it does not judge (not a vLLM server's)."""
    env = os.environ if environ is None else environ
    words = _split(command)
    findings: list[HostFinding] = []
    if not words:
        _checkpoint_format(env, None, findings)
        _compiled_artifacts(env, None, findings)
        _vocabulary(env, findings)
        return HostReport(words, None, findings)
    vllm = read_vllm_command(words)
    env = {**env, **vllm.environment}  # `CHECKPOINT_FORMAT=normalized_fp8 vllm serve ...`
    override = _command_findings(vllm, findings)
    model = _model(vllm, findings)
    source = model if model is not None else _hub_model(vllm, findings)  # a Hub repo id: judged on the Hub, as validate does
    model_config = _model_config(source)
    settings, problems = settings_from_command(vllm, model_config)
    for problem in problems:
        _finding(findings, problem.code, problem.setting, problem.message)
    precompiled = _compiled_artifacts(env, model, findings)
    config = precompiled if precompiled is not None else vllm_neuron_config(settings, override)
    _checkpoint_format(env, config, findings)
    omitted = _checkpoint(source, config, model_config, env, findings) if source is not None else 0
    _vocabulary(env, findings)
    return HostReport(words, vllm.model, findings, omitted)
