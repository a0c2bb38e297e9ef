"""The serving-host check (``nxdi-gptoss-fp8 doctor``): a ``vllm serve`` command line and the
environment it runs in, judged by the start's own checks, before the server starts.

``doctor`` runs the start plan (``start_plan.PLAN``), the list of checks the hook runs at the
start, evaluated here without NxDI, check by check in its order (``EVALUATE``: doctor's reading
of each): the entry point vLLM loads (``VLLM_PLUGINS``), the NeuronConfig vllm-neuron builds from
the command (``vllm_command`` reads it as vLLM does; ``client_config`` builds it with vllm-neuron's
own functions where installed, else with the package's model) and what vllm-neuron refuses in it,
``CHECKPOINT_FORMAT``, every ``NXDI_GPTOSS_FP8_*`` setting by the load's readers, where the
compile writes, a precompiled directory's pre-sharded weights (its ``neuron_config.json`` then
replaces the override), and the checkpoint the load reads judged by ``checkpoint_verdict`` (what
``validate DIR --neuron-config FILE`` runs). Then Harmony's vocabulary: vLLM renders ``gpt_oss``
through openai-harmony, which with ``TIKTOKEN_ENCODINGS_BASE`` set reads
``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` and refuses it unless its SHA-256 is
``O200K_BASE_SHA256``, and without it downloads the file (an air-gapped host cannot: a warning).
A command vLLM refuses while parsing it is that finding alone.

Each finding is one line with its fix; errors are what stops the start. Stdlib only where
vllm-neuron is not installed; nothing is imported from NxDI.
"""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import format as fmt
from ..errors import (
    CheckpointFormatError,
    ConfigError,
    HubAccessError,
    IntegrityError,
    LoadError,
    MissingDependencyError,
    PreflightError,
    RegistrationError,
)
from ..hub import hub_checkpoint, is_repo_id
from ..recognize import NEURON_CONFIG_FILE, recognize
from ..safeio.hashing import sha256_file
from ..safeio.json_file import JsonFileError, read_json_file
from ..units import plural, printable
from ..validate.nxdi_config import config_attr, describe, neuron_config_view, read_config_file
from ..validate.verdict import PLACEHOLDER_PATH, checkpoint_path_problem
from ..validate.vllm_config import RELEASE_DIFFERENCES, VLLM_OVERRIDE_KEY, vllm_neuron_config
from .client_config import ClientStart
from .recipes import HARMONY_VOCABULARY, HARMONY_VOCABULARY_URL, O200K_BASE_SHA256, VLLM_ADDITIONAL_CONFIG_FLAG
from .start_plan import (
    ENV_COMPILED,
    ENV_FORMAT,
    ENV_PLUGINS,
    StartInputs,
    checkpoint_path,
    holds_precompiled,
    plan_names,
    run_check,
)
from .vllm_command import CommandError, VllmCommand, read_vllm_command, settings_from_command

__all__ = ["ENV_COMPILED", "ENV_FORMAT", "ENV_TIKTOKEN", "EVALUATE", "HARMONY_VOCABULARY", "MAX_SHOWN_FINDINGS",
           "O200K_BASE_SHA256", "CommandError", "HostFinding", "HostReport", "lint_serving_host"]

ENV_TIKTOKEN = "TIKTOKEN_ENCODINGS_BASE"
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
        return printable(f"{self.severity.upper()} {self.code} [{self.setting}]: {self.message}")


@dataclass
class HostReport:
    """Every finding for one command on one host; ``ok`` (no error) is the start's verdict."""

    command: list[str]
    model: str | None
    findings: list[HostFinding] = field(default_factory=list)
    omitted: int = 0  # the checkpoint's findings beyond MAX_SHOWN_FINDINGS (validate lists them all)
    built_by: str = ""  # what built the NeuronConfig: vllm-neuron's own functions, or the package's model of them

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        shown = [word if len(word) <= MAX_SHOWN_WORD else f"{word[:MAX_SHOWN_WORD]}… ({len(word):,} characters)"
                 for word in self.command]
        return {"ok": self.ok, "command": shown, "model": self.model,
                "findings": [asdict(f) for f in self.findings], "omitted": self.omitted,
                "neuron_config_built_by": self.built_by or None,
                "release_differences": dict(RELEASE_DIFFERENCES) if "model of" in self.built_by else None}

    def render_text(self) -> str:
        lines = [f.render() for f in self.findings]
        if self.built_by:
            lines.append(printable(f"the NeuronConfig was built by {self.built_by}"))
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
        near = [key for key in document if isinstance(key, str) and difflib.SequenceMatcher(
            None, key[:100].replace("-", "_").lower(), VLLM_OVERRIDE_KEY).ratio() >= 0.8]
        what = f"has {near[0][:60]!r}, which vllm-neuron ignores" if near else f"has no \"{VLLM_OVERRIDE_KEY}\" object"
        _finding(findings, "override_key_spelling" if near else "no_override", f"{flag}.{VLLM_OVERRIDE_KEY}",
                 f"{flag} {what}: spell the key {VLLM_OVERRIDE_KEY} (underscores), holding every FP8 key")
        return None
    if isinstance(override, dict):
        return override
    if override:  # vllm-neuron takes a falsy value for "no override" and fails on any other
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
    try:
        document = (read_json_file(os.path.join(model, fmt.CONFIG_FILE), what=fmt.CONFIG_FILE) if isinstance(model, str)
                    else model.read_json(fmt.CONFIG_FILE, what=fmt.CONFIG_FILE))
    except JsonFileError:
        return None  # the checkpoint's findings say why
    return document if isinstance(document, dict) else None


def _precompiled(compiled: str | None, findings: list[HostFinding]) -> Any:
    """The ``neuron_config.json`` of precompiled artifacts in ``NEURON_COMPILED_ARTIFACTS``, which
    vLLM loads instead of compiling (it replaces the override); None: it compiles."""
    if not compiled or not _encodable(compiled) or not holds_precompiled(compiled):
        return None
    try:
        config = read_config_file(os.path.join(compiled, NEURON_CONFIG_FILE), f"{ENV_COMPILED}/{NEURON_CONFIG_FILE}")
    except ConfigError as exc:
        _finding(findings, "precompiled_unreadable", ENV_COMPILED, f"{exc}: NxDI cannot load it, so vllm-neuron "
                 "compiles again with the command's override", warning=True)
        return None
    _finding(findings, "precompiled_override_ignored", ENV_COMPILED, f"{compiled} holds precompiled artifacts: "
             "vLLM loads them and ignores override_neuron_config; their neuron_config.json is the NeuronConfig checked "
             "(remove the directory's contents to compile with the override)", warning=True)
    return config


def _refused(findings: list[HostFinding], code: str, setting: str, exc: Exception, *, warning: bool = False) -> None:
    _finding(findings, code, setting, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, warning=warning)


def _no_model_config(model: str, findings: list[HostFinding]) -> None:
    if any(f.code == "no_model_config" for f in findings):
        return
    recognition = recognize(model)
    what = f"; {recognition.hint()}" if recognition.known else ""
    _finding(findings, "no_model_config", "MODEL", f"{model!r} has no config.json naming the model's architectures, "
             f"which vLLM reads the model from (vllm-neuron stops: \"No architectures specified\"){what}: serve the "
             "checkpoint directory")


def _plan_entry_point(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        run_check("entry_point", inputs)
    except RegistrationError as exc:
        _refused(findings, "entry_point_not_loaded", ENV_PLUGINS, exc)


def _plan_client_config(inputs: StartInputs, findings: list[HostFinding]) -> None:
    if inputs.client is None:
        return
    if inputs.model is None:  # vLLM stops reading the model first (its finding says why)
        inputs.config = vllm_neuron_config(inputs.client.settings, inputs.client.override)
        return
    if not isinstance(inputs.model_config, dict) or not inputs.model_config.get("architectures"):
        _no_model_config(inputs.model, findings)  # vllm-neuron's first step (_get_model_configs) refuses it
        inputs.config = vllm_neuron_config(inputs.client.settings, inputs.client.override)
        return
    try:
        run_check("client_config", inputs)
    except ConfigError as exc:
        _refused(findings, "client_refused", VLLM_ADDITIONAL_CONFIG_FLAG, exc)
        inputs.config = vllm_neuron_config(inputs.client.settings, inputs.client.override)  # judged on as modelled


def _plan_checkpoint_format(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        normalized = run_check("checkpoint_format", inputs)
    except CheckpointFormatError as exc:
        _refused(findings, "checkpoint_format", ENV_FORMAT, exc)
        return
    if not normalized:
        value = inputs.environ.get(ENV_FORMAT)
        shown = "unset" if value is None else f"{value!r}"
        _finding(findings, "checkpoint_format", ENV_FORMAT, f"{ENV_FORMAT} is {shown}: NxDI then loads the directory "
                 f"with its own converters, not as a normalized FP8 checkpoint; export {ENV_FORMAT}=normalized_fp8")


def _plan_allow_custom(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        run_check("allow_custom_model", inputs)
    except ConfigError as exc:
        _finding(findings, "unreadable_setting", fmt.ALLOW_CUSTOM_ENV, f"{exc}; the load refuses to start")


def _plan_compile_target(inputs: StartInputs, findings: list[HostFinding]) -> None:
    compiled = inputs.compiled
    if compiled and not _encodable(compiled):
        _finding(findings, "compiled_artifacts_not_a_directory", ENV_COMPILED, f"{ENV_COMPILED}={compiled[:80]!r} cannot "
                 "name a file here: set it to a directory on persistent storage")
        inputs.compiled = None
        return
    try:
        warning = run_check("compile_target", inputs)
    except ConfigError as exc:
        is_file = compiled is not None and os.path.exists(compiled) and not os.path.isdir(compiled)
        _refused(findings, "compiled_artifacts_not_a_directory" if is_file else "compiled_artifacts_is_the_checkpoint",
                 ENV_COMPILED, exc)
        inputs.compiled = None  # nothing more to read there
        return
    if warning:
        _finding(findings, "compiled_artifacts_unset" if not compiled else "compiled_artifacts_inside", ENV_COMPILED,
                 warning, warning=True)


def _plan_presharded(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        run_check("presharded", inputs)
    except (IntegrityError, ConfigError, LoadError, OSError) as exc:
        check = getattr(exc, "check", None)
        errors = check.report.errors if check is not None else []
        for finding in errors[:MAX_SHOWN_FINDINGS]:
            findings.append(HostFinding(finding.code, "error", finding.file or ENV_COMPILED, finding.message))
        if not errors:
            _refused(findings, "presharded_refused", ENV_COMPILED, exc)


def _plan_checkpoint(inputs: StartInputs, findings: list[HostFinding]) -> int:
    """The checkpoint the load reads (``quantized_checkpoints_path`` when set, as NxDI's
    ``checkpoint_loader_fn``), judged by the plan's ``checkpoint`` check: ``checkpoint_verdict``
    with the NeuronConfig, the preflight the hook runs at the start. Returns how many of its
    findings were not shown."""
    model, model_config = inputs.model, inputs.model_config
    if model is None:  # a repo id: its Hub reader (``_hub_model``) is the checkpoint, judged by the same check
        return _checkpoint_findings(inputs, findings, "MODEL") if inputs.checkpoint is not None else 0
    named = checkpoint_path(inputs.config, None) if config_attr(neuron_config_view(inputs.config), "quantized", False) \
        else None
    setting = "MODEL"
    if named is not None:
        if not _encodable(named):
            _finding(findings, "model_not_found", "quantized_checkpoints_path", f"{named[:80]!r} cannot name a file "
                     "here: set quantized_checkpoints_path to the checkpoint directory")
            return 0
        if os.path.realpath(named) != os.path.realpath(model):
            if not isinstance(model_config, dict) or not model_config.get("architectures"):
                _no_model_config(model, findings)
            problem = checkpoint_path_problem(inputs.config, model)  # the start's rule (validate DIR --neuron-config's)
            if problem is not None and named.rstrip("/") == PLACEHOLDER_PATH:
                _finding(findings, "checkpoint_path_placeholder", "quantized_checkpoints_path", problem)
                return 0
            _finding(findings, "checkpoint_path_differs", "quantized_checkpoints_path", f"{problem}; vLLM reads the "
                     f"model config from {model!r} and NxDI the weights from {named!r}", warning=True)
            setting = "quantized_checkpoints_path"
        else:
            inputs.model_config = None
    inputs.checkpoint = named or model
    return _checkpoint_findings(inputs, findings, setting)


def _checkpoint_findings(inputs: StartInputs, findings: list[HostFinding], setting: str) -> int:
    """The plan's ``checkpoint`` check on ``inputs.checkpoint``, as findings; how many were not shown."""
    path = getattr(inputs.checkpoint, "root", inputs.checkpoint)  # a Hub reader's root: REPO_ID@COMMIT
    try:
        verdict = run_check("checkpoint", inputs)
    except PreflightError:
        verdict = inputs.results["checkpoint"]
    except ConfigError as exc:
        _finding(findings, "unreadable_setting", fmt.ALLOW_CUSTOM_ENV, f"{exc}; the load refuses to start")
        return 0
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


def _plan_load_choices(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        run_check("load_choices", inputs)
    except LoadError as exc:
        _refused(findings, "unreadable_setting", f"{fmt.VERIFY_AT_LOAD_ENV}, {fmt.LOAD_MODE_ENV}", exc)


def _plan_reference(inputs: StartInputs, findings: list[HostFinding]) -> None:
    try:
        run_check("reference", inputs)
    except ConfigError as exc:
        _finding(findings, "unreadable_setting", fmt.REFERENCE_ENV, f"{exc} (NxDI's accuracy check refuses it; the "
                 "start does not read it)", warning=True)


# doctor's reading of each check of the start plan (every check of ``start_plan.PLAN``, by name)
EVALUATE: dict[str, Any] = {
    "entry_point": _plan_entry_point, "client_config": _plan_client_config, "checkpoint_format": _plan_checkpoint_format,
    "allow_custom_model": _plan_allow_custom, "compile_target": _plan_compile_target, "presharded": _plan_presharded,
    "checkpoint": _plan_checkpoint, "load_choices": _plan_load_choices, "reference": _plan_reference,
}


def _evaluate_plan(inputs: StartInputs, findings: list[HostFinding], precompiled: Any = None) -> int:
    """Every check of the start plan, in its order, as findings; the checkpoint's findings not shown."""
    omitted = 0
    for name in plan_names():
        if name == "presharded" and precompiled is None:
            continue  # nothing precompiled: the start compiles, then shards from the checkpoint (checked below)
        result = EVALUATE[name](inputs, findings)
        if name == "client_config" and precompiled is not None:
            inputs.config = precompiled  # vLLM loads the artifacts: their NeuronConfig is the one the hook sees
        if name == "checkpoint":
            omitted = result
    return omitted


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
    The start plan (``start_plan.PLAN``) is evaluated check by check, as the start would run it.
    Raises ``CommandError`` for a command line it does not judge (not a vLLM server's)."""
    env = os.environ if environ is None else environ
    words = _split(command)
    findings: list[HostFinding] = []
    if not words:
        inputs = StartInputs(env, compiled=env.get(ENV_COMPILED))
        for name in ("entry_point", "checkpoint_format", "allow_custom_model", "compile_target", "load_choices",
                     "reference"):
            EVALUATE[name](inputs, findings)
        _vocabulary(env, findings)
        return HostReport(words, None, findings)
    vllm = read_vllm_command(words)
    env = {**env, **vllm.environment}  # `CHECKPOINT_FORMAT=normalized_fp8 vllm serve ...`
    override = _command_findings(vllm, findings)
    if vllm.problems:  # vLLM refuses the command line while parsing it: nothing after that runs
        return HostReport(words, vllm.model, findings)
    model = _model(vllm, findings)
    hub = _hub_model(vllm, findings) if model is None else None  # a repo id: judged on the Hub, as validate does
    model_config = _model_config(model if model is not None else hub)
    settings, problems = settings_from_command(vllm, model_config)
    for problem in problems:
        _finding(findings, problem.code, problem.setting, problem.message)
    if problems:
        return HostReport(words, vllm.model, findings)
    compiled = env.get(ENV_COMPILED)
    client = ClientStart(settings, override)
    inputs = StartInputs(env, model=model, compiled=compiled, client=client, model_config=model_config, checkpoint=hub)
    precompiled = _precompiled(compiled, findings) if compiled and model is not None and os.path.realpath(compiled) != \
        os.path.realpath(model) else None
    omitted = _evaluate_plan(inputs, findings, precompiled)
    _vocabulary(env, findings)
    return HostReport(words, vllm.model, findings, omitted, client.built_by)
