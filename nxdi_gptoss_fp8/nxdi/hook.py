"""The ``CHECKPOINT_FORMAT=normalized_fp8`` hook on NxDI's GPT-OSS application class.

``register()`` patches ``NeuronGptOssForCausalLM`` in place, so every way of reaching it sees
the hook: direct imports, ``utils.constants.MODEL_TYPES["gpt_oss"]["causal-lm"]`` (the same
class object; vllm-neuron's lookup) and NxDI's ``inference_demo`` (given a ``gpt_oss`` entry when
loaded). Each wrapped method decides the mode at call time, as NxDI does: normalized mode → our
path (preflight with NxDI's config, every finding raised, never a fallback; then the zero-copy
``loader.load_checkpoint`` given that report and the same config object); any other value → the
original NxDI method, same arguments, result untouched; a misspelling of ``normalized_fp8`` or
two contradicting opt-ins → ``CheckpointFormatError``. Our part of each call runs under
``errors.refusals_stop_the_start``, so no refusal leaves as a ValueError/OSError a client turns
into a recompile.

The opt-in can also live in NxDI's config: ``neuron_config.checkpoint_format =
"normalized_fp8"``. NxDI's ``NeuronConfig.__init__`` drops unknown keyword arguments with only a
warning, so ``GptOssNeuronConfig.__init__`` is wrapped to keep that keyword and the two load-time
choices (``normalized_fp8_verify_at_load``, ``normalized_fp8_load_mode``) and the accuracy
reference (``normalized_fp8_reference``) as attributes, which NxDI's ``neuron_config.json``
round trip keeps. Pre-sharded weights: ``shard_weights`` and ``load_weights`` are wrapped by
``nxdi.presharded``; ``load_hf_model`` (NxDI's accuracy check) by ``nxdi.accuracy``.

Importing this module does not import NxDI; ``register()`` does.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import format as fmt
from ..deps import importable
from ..errors import CheckpointFormatError, LoadError, PreflightError, RegistrationError, refusals_stop_the_start
from ..validate.findings import PreflightReport
from ..validate.nxdi_config import config_attr, neuron_config_view
from ..validate.pipeline import allow_custom_from_env, preflight
from .accuracy import ConfigAwareStaticMethod, wrap_load_hf_model
from .presharded import SHARD_SOURCES, fingerprint_or_none, record_source, wrap_load_weights, wrap_shard_weights
from .recipes import vllm_hint

logger = logging.getLogger(__name__)

NORMALIZED_FP8 = "normalized_fp8"
ENV_VAR = "CHECKPOINT_FORMAT"
CONFIG_ATTR = "checkpoint_format"
# the NeuronConfig keywords NxDI would drop and the hook keeps as attributes (the opt-in and the
# load-time choices), so they survive NxDI's config JSON round trip
KEPT_ATTRS = (CONFIG_ATTR, fmt.VERIFY_AT_LOAD_ATTR, fmt.LOAD_MODE_ATTR, fmt.REFERENCE_ATTR)
NXDI_PACKAGE = "neuronx_distributed_inference"
MODELING_MODULE = f"{NXDI_PACKAGE}.models.gpt_oss.modeling_gpt_oss"
CONSTANTS_MODULE = f"{NXDI_PACKAGE}.utils.constants"
DEMO_MODULE = f"{NXDI_PACKAGE}.inference_demo"
APP_CLASS = "NeuronGptOssForCausalLM"
NEURON_CONFIG_CLASS = "GptOssNeuronConfig"
MODEL_TYPE = "gpt_oss"
TASK_TYPE = "causal-lm"

_MARK = "__nxdi_gptoss_fp8_original__"  # on each installed wrapper: the attribute it replaced
_MISSING = object()  # "the class had no attribute of its own" (it was inherited)
_ADDED: list[tuple[dict[str, Any], str]] = []  # (a MODEL_TYPES dict, the key we added to it)


# --------------------------------------------------------------------------- mode selection


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
    import unicodedata  # local: the rest of this module does not need it

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
    env_value = env.get(ENV_VAR)
    env_normalized = env_value is not None and env_value.strip().lower() == NORMALIZED_FP8
    if env_value is not None and is_near_miss(env_value):
        raise near_miss_error(env_value, ENV_VAR)
    config_value = config_attr(neuron_config_view(config), CONFIG_ATTR) if config is not None else None
    if config_value is None or (isinstance(config_value, str) and not config_value.strip()):
        return env_normalized
    source = f"neuron_config.{CONFIG_ATTR}"
    if not isinstance(config_value, str) or config_value.strip().lower() != NORMALIZED_FP8:
        if isinstance(config_value, str) and is_near_miss(config_value):
            raise near_miss_error(config_value, source)
        raise CheckpointFormatError(
            f"{source}={config_value!r}: this setting only opts in to {NORMALIZED_FP8!r}; NxDI picks "
            f"its hf/legacy converters from the {ENV_VAR} environment variable, so remove it from "
            "the config and set the environment variable instead"
        )
    if env_value is not None and not env_normalized:
        raise CheckpointFormatError(
            f"{ENV_VAR}={env_value!r} contradicts {source}={config_value!r}: set both to "
            f"{NORMALIZED_FP8}, or unset {ENV_VAR}"
        )
    return True


# --------------------------------------------------------------------------- the normalized path


def _checkpoint_path(model_path: Any, config: Any) -> str:
    """Where NxDI reads a quantized checkpoint from: ``quantized_checkpoints_path`` if set."""
    quantized_path = getattr(neuron_config_view(config), "quantized_checkpoints_path", None)
    ok = isinstance(quantized_path, (str, os.PathLike))  # a number, a list: the preflight's finding says so
    return os.fspath(quantized_path if ok and quantized_path else model_path)


def checked_preflight(path: str, config: Any) -> PreflightReport:
    """Run the preflight with NxDI's config, log the verdict, raise ``PreflightError`` on any error."""
    neuron_config = neuron_config_view(config) if config is not None else None
    report = preflight(
        path,
        neuron_config=neuron_config,
        inference_config=config if config is not neuron_config else None,
        allow_custom_model=allow_custom_from_env(),
    )
    if report.ok:
        logger.info("normalized FP8 checkpoint %s passed the preflight (%d tensors, %d shards, %.1f ms)",
                    path, report.tensors, report.shards, report.elapsed_s * 1000)
        return report
    hint = wrong_format_hint(path) or vllm_hint(report, path)
    logger.error("normalized FP8 checkpoint %s failed the preflight:\n%s", path,
                 f"{hint}\n{report.render_text()}" if hint else report.render_text())
    raise PreflightError(report, hint=hint)


def wrong_format_hint(path: str) -> str | None:
    """When ``path`` is another kind of checkpoint (HF, legacy, compressed-tensors, compiled
    NxDI output, ...), one line naming it and what to do instead; None when it looks normalized
    or unknown (then the findings speak for themselves)."""
    from ..recognize import NORMALIZED, recognize

    recognition = recognize(path)
    if not recognition.known or recognition.kind == NORMALIZED:
        return None
    return (f"{ENV_VAR}={NORMALIZED_FP8} (or neuron_config.{CONFIG_ATTR}) asks for a normalized FP8 "
            f"checkpoint, but {recognition.hint()}")


def normalized_state_dict(cls: type, model_name_or_path: Any, config: Any) -> dict[str, Any]:
    """What our ``get_state_dict`` returns in normalized mode: preflight, map, derive, prefix."""
    from ..loader import load_checkpoint

    if getattr(neuron_config_view(config), "is_medusa", False):
        raise LoadError("Medusa heads are not supported with normalized FP8 checkpoints (NxDI would "
                        "unpickle medusa_heads.pt, which this format never opens): disable is_medusa")
    path = os.fspath(model_name_or_path)
    sources = SHARD_SOURCES.get()
    fingerprint = fingerprint_or_none(path) if sources is not None else None
    report = checked_preflight(path, config)
    if sources is not None:
        record_source(sources, path, fingerprint)
    loaded = load_checkpoint(path, config, report=report)
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s: %s", path, loaded.describe().replace("\n", "; "))
    state_dict = loaded.state_dict
    if getattr(config, "tie_word_embeddings", False):
        cls.update_state_dict_for_tied_weights(state_dict)  # type: ignore[attr-defined]
    prefix = getattr(cls, "_FUSED_PREFIX", "")
    if prefix:
        state_dict = {f"{prefix}.{key}": tensor for key, tensor in state_dict.items()}
    return state_dict


# --------------------------------------------------------------------------- wrappers


def _bound_config(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``config`` argument of a call, wherever the caller put it (None if absent)."""
    try:
        return signature.bind_partial(*args, **kwargs).arguments.get("config")
    except TypeError:
        return None  # the original will raise the caller's TypeError itself


def _wrap_get_state_dict(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def get_state_dict(cls: type, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(cls, *args, **kwargs).arguments
        except TypeError:
            return func(cls, *args, **kwargs)  # let NxDI raise the caller's TypeError
        if not normalized_mode(bound["config"]):
            return func(cls, *args, **kwargs)
        with refusals_stop_the_start():
            return normalized_state_dict(cls, bound["model_name_or_path"], bound["config"])

    return get_state_dict


def _wrap_convert(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def convert_hf_to_neuron_state_dict(*args: Any, **kwargs: Any) -> Any:
        if not normalized_mode(_bound_config(signature, args, kwargs)):
            return func(*args, **kwargs)
        raise LoadError(
            "a normalized FP8 checkpoint is already in NxDI's namespace and is never converted; it "
            "loads through get_state_dict (call nxdi_gptoss_fp8.register() before NxDI loads weights)"
        )

    return convert_hf_to_neuron_state_dict


def _wrap_save_quantized(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def save_quantized_state_dict(cls: type, *args: Any, **kwargs: Any) -> Any:
        config = _bound_config(signature, (cls, *args), kwargs)
        if not normalized_mode(config):
            return func(cls, *args, **kwargs)
        model_path = signature.bind_partial(cls, *args, **kwargs).arguments.get("model_path")
        path = _checkpoint_path(model_path, config)
        logger.info("normalized FP8 mode: not regenerating %s (already quantized); checking it instead", path)
        with refusals_stop_the_start():
            checked_preflight(path, config)
        return None

    return save_quantized_state_dict


def _wrap_generate_quantized(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def generate_quantized_state_dict(cls: type, *args: Any, **kwargs: Any) -> Any:
        config = _bound_config(signature, (cls, *args), kwargs)
        if not normalized_mode(config):
            return func(cls, *args, **kwargs)
        model_path = signature.bind_partial(cls, *args, **kwargs).arguments.get("model_path")
        # the checkpoint is the quantized state dict: load it (after its preflight), never rebuild it
        with refusals_stop_the_start():
            return normalized_state_dict(cls, _checkpoint_path(model_path, config), config)

    return generate_quantized_state_dict


def _wrap_neuron_config_init(func: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        ours = {name: kwargs.pop(name) for name in KEPT_ATTRS if name in kwargs}
        func(self, *args, **kwargs)
        for name, value in ours.items():
            setattr(self, name, value)

    return __init__


@dataclass(frozen=True)
class _Patch:
    """One attribute we replace: where, what kind NxDI defines it as, and its leading parameters."""

    owner: str  # "app" or "neuron_config"
    name: str
    kind: type  # classmethod, staticmethod or function (a plain method)
    params: tuple[str, ...]  # the parameter names we rely on, in order
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None  # None: relied upon, not wrapped
    installed_as: type | None = None  # the descriptor the wrapper is installed as (default: ``kind``)


_PATCHES = (
    _Patch("app", "get_state_dict", classmethod, ("cls", "model_name_or_path", "config"), _wrap_get_state_dict),
    _Patch("app", "convert_hf_to_neuron_state_dict", staticmethod, ("state_dict", "config"), _wrap_convert),
    _Patch("app", "load_hf_model", staticmethod, ("model_path",),  # installed seeing the instance's config
           functools.partial(wrap_load_hf_model, is_normalized=normalized_mode), ConfigAwareStaticMethod),
    _Patch("app", "save_quantized_state_dict", classmethod, ("cls", "model_path", "config"), _wrap_save_quantized),
    _Patch("app", "generate_quantized_state_dict", classmethod, ("cls", "model_path", "config"), _wrap_generate_quantized),
    _Patch("app", "checkpoint_loader_fn", type(lambda: None), ("self", "mmap"), None),
    _Patch("app", "shard_weights", type(lambda: None), ("self", "compiled_model_path"),
           functools.partial(wrap_shard_weights, is_normalized=normalized_mode)),
    _Patch("app", "load_weights", type(lambda: None), ("self", "compiled_model_path"),
           functools.partial(wrap_load_weights, is_normalized=normalized_mode)),
    _Patch("neuron_config", "__init__", type(lambda: None), ("self",), _wrap_neuron_config_init),
)


def _problems(owners: Mapping[str, type]) -> list[str]:
    """Why the installed NxDI is not what the hook understands (empty when it is)."""
    problems = []
    for patch in _PATCHES:
        owner = owners[patch.owner]
        try:
            attr = inspect.getattr_static(owner, patch.name)
        except AttributeError:
            problems.append(f"{owner.__name__}.{patch.name} does not exist")
            continue
        if not isinstance(attr, patch.kind):
            problems.append(f"{owner.__name__}.{patch.name} is a {type(attr).__name__}, expected a {patch.kind.__name__}")
            continue
        func = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):
            problems.append(f"{owner.__name__}.{patch.name} has no inspectable signature")
            continue
        names = tuple(p.name for p in params[: len(patch.params)])
        extra_required = [p.name for p in params[len(patch.params):]
                          if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if names != patch.params or extra_required:
            found = ", ".join(p.name for p in params)
            problems.append(f"{owner.__name__}.{patch.name}({found}) does not start with "
                            f"({', '.join(patch.params)}) or needs more arguments")
    prefix = getattr(owners["app"], "_FUSED_PREFIX", None)
    if not isinstance(prefix, str):
        problems.append(f"{owners['app'].__name__}._FUSED_PREFIX is {prefix!r}, expected a string")
    return problems


def _install(owner: type, patch: _Patch) -> None:
    original = owner.__dict__.get(patch.name, _MISSING)
    attr = inspect.getattr_static(owner, patch.name)
    func = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
    wrapper = patch.wrap(func)  # type: ignore[misc]
    functools.update_wrapper(wrapper, func)
    setattr(wrapper, _MARK, original)
    kind = patch.installed_as or patch.kind
    setattr(owner, patch.name, kind(wrapper) if patch.kind in (classmethod, staticmethod) else wrapper)


def _installed_wrapper(owner: type, name: str) -> Any:
    """Our wrapper function if ``owner`` has one installed for ``name``, else None."""
    attr = owner.__dict__.get(name)
    func = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
    return func if func is not None and hasattr(func, _MARK) else None


def _targets() -> dict[str, type]:
    try:
        modeling = importlib.import_module(MODELING_MODULE)
    except ImportError as exc:
        raise RegistrationError(
            f"cannot import {MODELING_MODULE} ({exc}): install neuronx-distributed-inference on a "
            "Neuron host; the hook has nothing to patch without it"
        ) from None
    owners = {"app": getattr(modeling, APP_CLASS, None), "neuron_config": getattr(modeling, NEURON_CONFIG_CLASS, None)}
    missing = [name for name, owner in (("app", APP_CLASS), ("neuron_config", NEURON_CONFIG_CLASS))
               if not isinstance(owners[name], type)]
    if missing:
        raise RegistrationError(f"{MODELING_MODULE} has no class {', '.join(missing)}: this NxDI is not supported; nothing was patched")
    return owners  # type: ignore[return-value]


def _model_types_entry(app: type) -> str | None:
    """Why ``utils.constants.MODEL_TYPES`` (if loaded) would not see the patched class."""
    constants = sys.modules.get(CONSTANTS_MODULE)
    registered = getattr(constants, "MODEL_TYPES", {}).get(MODEL_TYPE, {}).get(TASK_TYPE) if constants else None
    if registered is None or (isinstance(registered, type) and issubclass(registered, app)):
        return None
    return f"{CONSTANTS_MODULE}.MODEL_TYPES[{MODEL_TYPE!r}][{TASK_TYPE!r}] is {registered!r}, not {APP_CLASS}"


def add_model_type_entry(model_types: Any, key: str, app: type) -> str | None:
    """``model_types[key]`` (a ``MODEL_TYPES`` dict of NxDI's) made to reach ``app`` when absent, recorded
    so ``unregister()`` removes it; None when it reaches ``app`` now, else why not (never replaced)."""
    if not isinstance(model_types, dict):
        return f"MODEL_TYPES is {type(model_types).__name__}, not a dict"
    if key not in model_types:
        model_types[key] = {TASK_TYPE: app}
        _ADDED.append((model_types, key))
    held = model_types[key].get(TASK_TYPE) if isinstance(model_types[key], dict) else model_types[key]
    return None if isinstance(held, type) and issubclass(held, app) else f"MODEL_TYPES[{key!r}] holds {held!r}, not {APP_CLASS}"


def register() -> None:
    """Install the hook on NxDI's GPT-OSS classes; idempotent.

    Checks first that every method we wrap exists with the kind and signature we understand;
    otherwise raises ``RegistrationError`` listing every difference, with nothing patched.
    ``inference_demo.MODEL_TYPES`` gets a ``gpt_oss`` entry if that module is loaded (it is not
    imported here: importing it reseeds the global RNG).
    """
    owners = _targets()
    if not is_registered():
        from ..support import warn_unverified_nxdi

        warn_unverified_nxdi(logger, sys.modules.get(NXDI_PACKAGE))  # once per process, outside the verified set
        problems = _problems(owners)
        conflict = _model_types_entry(owners["app"])
        if conflict:
            problems.append(conflict)
        if problems:
            raise RegistrationError("the installed NxDI differs from what the hook wraps; nothing was patched:\n  - "
                                    + "\n  - ".join(problems))
        for patch in _PATCHES:
            if patch.wrap is not None:
                _install(owners[patch.owner], patch)
        logger.info("registered the %s=%s hook on %s", ENV_VAR, NORMALIZED_FP8, APP_CLASS)
    # a loaded inference_demo gets a gpt_oss model type (it has none at NxDI 0.9)
    add_model_type_entry(getattr(sys.modules.get(DEMO_MODULE), "MODEL_TYPES", None), MODEL_TYPE, owners["app"])


def unregister() -> None:
    """Restore NxDI's original attributes exactly (and remove the model-type entries we added)."""
    modeling = sys.modules.get(MODELING_MODULE)
    if modeling is None:
        return
    owners = {"app": getattr(modeling, APP_CLASS, None), "neuron_config": getattr(modeling, NEURON_CONFIG_CLASS, None)}
    for patch in _PATCHES:
        owner = owners[patch.owner]
        wrapper = _installed_wrapper(owner, patch.name) if isinstance(owner, type) else None
        if wrapper is None:
            continue
        original = getattr(wrapper, _MARK)
        if original is _MISSING:
            delattr(owner, patch.name)
        else:
            setattr(owner, patch.name, original)
    while _ADDED:
        model_types, key = _ADDED.pop()
        if isinstance(model_types.get(key), dict) and model_types[key].get(TASK_TYPE) is owners["app"]:
            del model_types[key]


def is_registered() -> bool:
    """Whether NxDI's GPT-OSS class currently carries the hook (False if NxDI is not loaded)."""
    modeling = sys.modules.get(MODELING_MODULE)
    app = getattr(modeling, APP_CLASS, None) if modeling is not None else None
    return isinstance(app, type) and _installed_wrapper(app, "get_state_dict") is not None


# --------------------------------------------------------------------------- inference demo


def nxdi_available() -> bool:
    """Whether NxDI can be imported here (without importing it)."""
    return importable(NXDI_PACKAGE)


def run_inference_demo(argv: Sequence[str]) -> int:
    """Register the hook, then run NxDI's ``inference_demo.main()`` with ``argv``."""
    demo = importlib.import_module(DEMO_MODULE)
    register()
    saved = sys.argv
    sys.argv = [f"{DEMO_MODULE}", *argv]
    try:
        demo.main()
    finally:
        sys.argv = saved
    return 0


__all__ = [
    "CONFIG_ATTR", "ENV_VAR", "KEPT_ATTRS", "NORMALIZED_FP8", "add_model_type_entry", "checked_preflight", "is_near_miss",
    "is_registered", "near_miss_error", "normalized_mode", "register", "run_inference_demo", "unregister",
]
