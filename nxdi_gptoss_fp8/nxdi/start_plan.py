"""The start plan: every check the start of a normalized FP8 checkpoint makes, in the order it
makes them, as one list (``PLAN``) that the hook runs at the start and ``doctor`` evaluates ahead
of it, without NxDI. A check the start gains is in ``doctor`` by construction.

Each ``StartCheck`` reads ``StartInputs`` (the environment, the NeuronConfig — NxDI's object or
the dict vllm-neuron builds —, MODEL, the compiled model path) and raises the very exception the
start raises, with the same one-line message; it returns what the next step needs. The checks:

1. ``entry_point`` (vLLM): ``VLLM_PLUGINS`` set without ``nxdi_gptoss_fp8``: vLLM loads only the
   plugins it names, so the hook is never installed (``RegistrationError``);
2. ``client_config`` (vllm-neuron): the NeuronConfig vllm-neuron builds and its own refusals
   (``nxdi.client_config``: by its own functions where installed, else the package's model);
3. ``checkpoint_format``: ``CHECKPOINT_FORMAT`` and ``neuron_config.checkpoint_format``, by the one
   parser (``normalized_mode``): a near miss, a non-opt-in value or a contradiction refuses;
4. ``allow_custom_model``: ``NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL`` by the load's reader (``ConfigError``: ``ture``);
5. ``compile_target`` (vllm-neuron): where the compile writes: ``NEURON_COMPILED_ARTIFACTS`` a
   regular file, or the checkpoint itself (``MODEL``, ``MODEL/``, a symlink to it): the compile
   writes ``model.pt`` beside the shards, which the preflight then refuses (``filesystem.stray_weight_file``);
6. ``presharded``: a compiled directory with pre-sharded weights, checked as ``validate COMPILED``
   and the hooked ``load_weights`` check it (``ShardedWeightsError``: a rank file or the manifest
   missing, ``tp_degree`` not the manifest's);
7. ``checkpoint``: the checkpoint the load reads (``quantized_checkpoints_path`` when quantized),
   judged by ``checkpoint_verdict`` with the NeuronConfig (``PreflightError``);
8. ``load_choices``: ``NXDI_GPTOSS_FP8_VERIFY_AT_LOAD`` / ``NXDI_GPTOSS_FP8_LOAD_MODE`` and their
   ``normalized_fp8_*`` keys, by the loader's one reader (``LoadError``: ``ture``, ``privat``, an
   environment mode disagreeing with the override's), after the preflight that names a bad key.

``reference`` (``NXDI_GPTOSS_FP8_REFERENCE``) is read by NxDI's accuracy check, not by the start:
it is listed, and ``doctor`` reports it as a warning.

Its own module, below the hook and ``serving_host`` (both import it; it imports neither), so no
module of ``nxdi/`` imports another lazily to dodge a circle. Stdlib only; NxDI is never imported.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import format as fmt
from ..errors import CheckpointFormatError, ConfigError, PreflightError, RegistrationError
from ..recognize import COMPILED_MODEL_FILE, NEURON_CONFIG_FILE, NORMALIZED, recognize
from ..validate.nxdi_config import config_attr, load_choices, neuron_config_view, reference_choice
from ..validate.pipeline import allow_custom_from_env
from ..validate.presharded import check_presharded, compiled_verdict, loader_source, refusal
from ..validate.verdict import CheckpointVerdict, checkpoint_verdict
from .recipes import vllm_hint

__all__ = [
    "CONFIG_ATTR", "ENTRY_POINT", "ENV_COMPILED", "ENV_FORMAT", "ENV_PLUGINS", "NORMALIZED_FP8", "PLAN", "StartCheck",
    "StartInputs", "active_check", "checkpoint_path", "compile_target", "entry_point", "holds_precompiled",
    "is_near_miss", "near_miss_error", "normalized_mode", "plan_names", "run_check", "wrong_format_hint",
]

NORMALIZED_FP8 = "normalized_fp8"
ENV_FORMAT = "CHECKPOINT_FORMAT"
CONFIG_ATTR = "checkpoint_format"
ENV_COMPILED = "NEURON_COMPILED_ARTIFACTS"
ENV_PLUGINS = "VLLM_PLUGINS"
ENTRY_POINT = "nxdi_gptoss_fp8"  # the vllm.general_plugins name setup.py declares
# the plan check running now (None outside one): what the test of "every check the hook runs is in the plan" reads
_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar("nxdi_gptoss_fp8_start_check", default=None)


# --------------------------------------------------------------------------- the opt-in (moved here from the hook)


def _squash(value: str) -> str:
    return re.sub(r"[^a-z0-9]", "", value.lower().replace("normalis", "normaliz"))


def is_near_miss(value: str) -> bool:
    """Whether ``value`` looks like an attempt at ``normalized_fp8`` without being it.

    The rule is a similarity test, not a list: separators and British spelling ignored, any
    mention of FP8/E4M3, anything starting like "normalized", or a string similarity ≥ 0.6.
    ``hf``, ``legacy``, ``neuron``, ``original`` and the empty string are not near misses.
    Look-alikes from other scripts (full-width ``ｎｏｒｍａｌｉｚｅｄ＿ｆｐ８``, ligatures) are
    folded with NFKC first, so they are near misses too, never "not normalized".
    """
    squashed = _squash(unicodedata.normalize("NFKC", value))
    if not squashed or value.strip().lower() == NORMALIZED_FP8:
        return False
    if any(part in squashed for part in ("fp8", "f8", "e4m3")) or squashed.startswith(("norm", "nrm")):
        return True
    return difflib.SequenceMatcher(None, squashed, _squash(NORMALIZED_FP8)).ratio() >= 0.6


def near_miss_error(value: str, source: str) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{source}={value!r} is not a checkpoint format: did you mean {NORMALIZED_FP8!r}? "
        f"Set it to exactly {NORMALIZED_FP8} to load a normalized FP8 checkpoint, or to hf / legacy "
        "for NxDI's own converters (nothing was loaded)"
    )


def normalized_mode(config: Any = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this call should take the normalized path (read now, like NxDI reads its env).

    ``config`` is NxDI's InferenceConfig or NeuronConfig, a mapping of one (``doctor``), or None. Raises
    ``CheckpointFormatError`` for a near-miss spelling in either place, for a config value
    other than ``normalized_fp8``, and when the environment and the config disagree.
    """
    env = os.environ if environ is None else environ
    env_value = env.get(ENV_FORMAT)
    env_normalized = env_value is not None and env_value.strip().lower() == NORMALIZED_FP8
    if env_value is not None and is_near_miss(env_value):
        raise near_miss_error(env_value, ENV_FORMAT)
    config_value = config_attr(neuron_config_view(config), CONFIG_ATTR) if config is not None else None
    if config_value is None or (isinstance(config_value, str) and not config_value.strip()):
        return env_normalized
    source = f"neuron_config.{CONFIG_ATTR}"
    if not isinstance(config_value, str) or config_value.strip().lower() != NORMALIZED_FP8:
        if isinstance(config_value, str) and is_near_miss(config_value):
            raise near_miss_error(config_value, source)
        raise CheckpointFormatError(
            f"{source}={config_value!r}: this setting only opts in to {NORMALIZED_FP8!r}; NxDI picks "
            f"its hf/legacy converters from the {ENV_FORMAT} environment variable, so remove it from "
            "the config and set the environment variable instead"
        )
    if env_value is not None and not env_normalized:
        raise CheckpointFormatError(
            f"{ENV_FORMAT}={env_value!r} contradicts {source}={config_value!r}: set both to "
            f"{NORMALIZED_FP8}, or unset {ENV_FORMAT}"
        )
    return True


# --------------------------------------------------------------------------- the inputs and the checks


@dataclass
class StartInputs:
    """What a start has: its environment, the NeuronConfig (NxDI's object, or the dict
    vllm-neuron builds), MODEL (the path the application is built from) and the compiled model
    path (``NEURON_COMPILED_ARTIFACTS`` for vLLM). ``client`` is the vLLM start's own part
    (``nxdi.client_config.ClientStart``: vLLM's settings and the override), None for NxDI's
    own clients; ``ranks`` the ranks a pre-sharded load reads (None: those of the config)."""

    environ: Mapping[str, str]
    config: Any = None
    model: str | None = None
    compiled: str | None = None
    client: Any = None
    ranks: Iterable[int] | None = None
    checkpoint: Any = None  # the directory the load reads, when the caller knows it (else from config and MODEL);
    # doctor: a Hub repo's ``CheckpointReader`` when MODEL is a repo id vLLM would download
    model_config: Any = None  # the model's config.json, when the NeuronConfig is a mapping and the checkpoint is not MODEL
    results: dict[str, Any] = field(default_factory=dict)  # each check's return value, by name


@dataclass(frozen=True)
class StartCheck:
    """One check of the start: ``run(inputs)`` raises what the start raises, else returns a value.
    ``by`` is who makes it at the start: ``vllm`` (vLLM and vllm-neuron, before NxDI), ``hook``
    (our load), ``accuracy`` (NxDI's accuracy check only: ``doctor`` warns)."""

    name: str
    setting: str
    by: str
    run: Callable[[StartInputs], Any]


def checkpoint_path(config: Any, model: str | None) -> str | None:
    """Where NxDI reads a quantized checkpoint from: ``quantized_checkpoints_path`` if set (a
    string or path), else MODEL; anything else is the preflight's ``neuron_config`` finding."""
    nc = neuron_config_view(config) if config is not None else None
    named = config_attr(nc, "quantized_checkpoints_path") if nc is not None else None
    ok = isinstance(named, (str, os.PathLike)) and os.fspath(named)
    return os.fspath(named) if ok else model


def holds_precompiled(compiled: str | None) -> bool:
    """Whether ``compiled`` holds a compiled NxDI model a start loads instead of compiling."""
    return bool(compiled) and os.path.isfile(os.path.join(compiled, NEURON_CONFIG_FILE)) and \
        os.path.isfile(os.path.join(compiled, COMPILED_MODEL_FILE))  # type: ignore[arg-type]


def entry_point(environ: Mapping[str, str]) -> None:
    """``VLLM_PLUGINS`` as vLLM reads it (unset: every plugin; set: the comma-separated names,
    exactly): ``RegistrationError`` when it does not name this package's entry point."""
    value = environ.get(ENV_PLUGINS)
    if value is None or ENTRY_POINT in value.split(","):
        return
    raise RegistrationError(
        f"{ENV_PLUGINS}={value!r} does not name {ENTRY_POINT}: vLLM loads only the plugins listed there, so the "
        "normalized FP8 hook is never installed (vllm-neuron 0.2.0 then stops with \"Model GptOssForCausalLM is not "
        f"supported\"; 0.1.0 loads through NxDI's own converters); add {ENTRY_POINT} to {ENV_PLUGINS} "
        f"(e.g. {ENV_PLUGINS}={value + ',' if value else ''}{ENTRY_POINT}) or unset it")


def compile_target(model: str | None, compiled: str | None) -> str | None:
    """Where the compile writes, judged: ``ConfigError`` when ``compiled`` is a regular file or the
    checkpoint itself (the compile writes ``model.pt`` and ``neuron_config.json`` beside its shards,
    and the next load's preflight refuses the stray ``model.pt``); a warning's text (returned)
    when it lies inside the checkpoint or is unset (vllm-neuron then compiles into
    ``MODEL/neuron-compiled-artifacts/<md5>/`` and deletes it at every start); else None."""
    if not compiled:
        return (f"{ENV_COMPILED} is unset: vllm-neuron compiles into MODEL/neuron-compiled-artifacts/<md5>/ and deletes "
                f"it at every start (every restart recompiles); export {ENV_COMPILED}=DIR on persistent storage "
                "outside the checkpoint")
    if os.path.exists(compiled) and not os.path.isdir(compiled):
        raise ConfigError(f"{ENV_COMPILED}={compiled!r} is a file, not a directory: vllm-neuron loads and writes the "
                          "compiled model there and fails; set it to a directory (outside the checkpoint)")
    if model is None or not os.path.isdir(model):
        return None
    real_compiled, real_model = os.path.realpath(compiled), os.path.realpath(model)
    if real_compiled == real_model:
        raise ConfigError(f"{ENV_COMPILED}={compiled!r} is the checkpoint itself: the compile writes "
                          f"{COMPILED_MODEL_FILE} and {NEURON_CONFIG_FILE} beside its shards, and the load then refuses "
                          f"the stray {COMPILED_MODEL_FILE} (filesystem.stray_weight_file); point it at a directory "
                          "outside the checkpoint")
    if os.path.commonpath([real_compiled, real_model]) == real_model:
        return (f"{ENV_COMPILED}={compiled!r} is inside the checkpoint: the compile output (and pre-sharded weights) "
                "would sit among its files; point it outside the checkpoint")
    return None


def wrong_format_hint(path: str) -> str | None:
    """When ``path`` is another kind of checkpoint (HF, legacy, compressed-tensors, compiled
    NxDI output, ...), one line naming it and what to do instead; None when it looks normalized
    or unknown (then the findings speak for themselves)."""
    recognition = recognize(path)
    if not recognition.known or recognition.kind == NORMALIZED:
        return None
    return (f"{ENV_FORMAT}={NORMALIZED_FP8} (or neuron_config.{CONFIG_ATTR}) asks for a normalized FP8 "
            f"checkpoint, but {recognition.hint()}")


def _client_config(inputs: StartInputs) -> Any:
    if inputs.client is None:
        return inputs.config
    inputs.config = inputs.client.neuron_config(inputs.environ)  # raises the client's own refusal
    return inputs.config


def _presharded(inputs: StartInputs) -> Any:
    """The pre-sharded check of the hooked ``load_weights`` (explicit ``ranks``), or of
    ``validate COMPILED`` (the config's ranks) for a precompiled directory; None: none to check."""
    compiled, config = inputs.compiled, inputs.config
    if not compiled or (not holds_precompiled(compiled) and inputs.ranks is None):
        return None
    verify, _mode = load_choices(config, inputs.environ)
    if inputs.ranks is not None:
        check = check_presharded(compiled, ranks=inputs.ranks, config=config, verify=verify, progress=None,
                                 checkpoint=loader_source(config, inputs.model) or inputs.model)
    else:
        check = compiled_verdict(compiled, config, verify=verify, progress=None)
    if check is not None and not check.ok:
        raise refusal(check)
    return check


def _checkpoint(inputs: StartInputs) -> CheckpointVerdict:
    """``checkpoint_verdict`` of the checkpoint the load reads; ``PreflightError`` (with the hint
    naming another kind of directory, or vLLM's key to add) when it refuses."""
    path = inputs.checkpoint or checkpoint_path(inputs.config, inputs.model)
    if path is None:
        raise ConfigError("no checkpoint to load: pass the normalized checkpoint's directory as MODEL")
    config = inputs.config
    neuron_config = neuron_config_view(config) if config is not None else None
    inference = config if config is not None and config is not neuron_config and not isinstance(config, Mapping) else \
        inputs.model_config
    verdict = checkpoint_verdict(path, neuron_config=neuron_config, inference_config=inference,
                                 allow_custom_model=allow_custom_from_env(inputs.environ))
    if not verdict.report.ok:
        inputs.results["checkpoint"] = verdict  # what a caller reading the refusal needs (what the directory is)
        local = isinstance(path, (str, os.PathLike))  # else a Hub repo's reader (doctor): its verdict names the kind
        raise PreflightError(verdict.report, hint=(wrong_format_hint(path) or vllm_hint(verdict.report, path)) if local
                             else None)
    return verdict


PLAN: tuple[StartCheck, ...] = (
    StartCheck("entry_point", ENV_PLUGINS, "vllm", lambda inputs: entry_point(inputs.environ)),
    StartCheck("client_config", "--additional-config", "vllm", _client_config),
    StartCheck("checkpoint_format", ENV_FORMAT, "hook", lambda inputs: normalized_mode(inputs.config, inputs.environ)),
    StartCheck("allow_custom_model", fmt.ALLOW_CUSTOM_ENV, "hook", lambda inputs: allow_custom_from_env(inputs.environ)),
    StartCheck("compile_target", ENV_COMPILED, "vllm", lambda inputs: compile_target(inputs.model, inputs.compiled)),
    StartCheck("presharded", ENV_COMPILED, "hook", _presharded),
    StartCheck("checkpoint", "MODEL", "hook", _checkpoint),
    StartCheck("load_choices", f"{fmt.VERIFY_AT_LOAD_ENV}, {fmt.LOAD_MODE_ENV}", "hook",
               lambda inputs: load_choices(inputs.config, inputs.environ)),
    StartCheck("reference", fmt.REFERENCE_ENV, "accuracy", lambda inputs: reference_choice(inputs.config, inputs.environ)),
)
_BY_NAME = {check.name: check for check in PLAN}


def plan_names() -> tuple[str, ...]:
    """The plan's checks by name, in order."""
    return tuple(check.name for check in PLAN)


@contextlib.contextmanager
def _running(name: str) -> Iterator[None]:
    token = _ACTIVE.set(name)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_check() -> str | None:
    """The name of the plan check running now (None outside one)."""
    return _ACTIVE.get()


def run_check(name: str, inputs: StartInputs) -> Any:
    """Run the plan's check ``name`` on ``inputs`` (what the hook does at the start); its value
    is kept in ``inputs.results``. Raises what the start raises."""
    with _running(name):
        result = _BY_NAME[name].run(inputs)
    inputs.results[name] = result
    return result
