"""The ``CHECKPOINT_FORMAT=normalized_fp8`` hook on NxDI's GPT-OSS application class.

``register()`` patches ``NeuronGptOssForCausalLM`` in place, so every way of reaching it sees
the hook: direct imports, ``utils.constants.MODEL_TYPES["gpt_oss"]["causal-lm"]`` (the same
class object; vllm-neuron's lookup) and NxDI's ``inference_demo`` (given a ``gpt_oss`` entry when
loaded). Each wrapped method decides the mode at call time, as NxDI does: normalized mode → our
path (the start plan's checks, ``start_plan.run_check``: the settings by the load's readers, the
preflight with NxDI's config, every finding raised, never a fallback; then the zero-copy
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

import functools
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import format as fmt
from .. import support
from ..deps import importable
from ..errors import LoadError, PreflightError, RegistrationError, refusals_stop_the_start
from ..validate.findings import PreflightReport
from ..validate.nxdi_config import neuron_config_view
from .accuracy import ConfigAwareStaticMethod, wrap_load_hf_model
from .presharded import SHARD_SOURCES, fingerprint_or_none, record_source, wrap_load_weights, wrap_shard_weights
from .start_plan import (
    CONFIG_ATTR,
    NORMALIZED_FP8,
    StartInputs,
    checkpoint_path,
    is_near_miss,
    near_miss_error,
    normalized_mode,
    run_check,
    wrong_format_hint,
)
from .start_plan import ENV_FORMAT as ENV_VAR

logger = logging.getLogger(__name__)

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


def _mode(config: Any) -> bool:
    """The opt-in decision of one hooked call: the start plan's ``checkpoint_format`` check."""
    return bool(run_check("checkpoint_format", StartInputs(os.environ, config)))


# --------------------------------------------------------------------------- the normalized path


def checked_preflight(path: str, config: Any, inputs: StartInputs | None = None) -> PreflightReport:
    """The start plan's ``checkpoint`` check of ``path`` with NxDI's config: log the verdict, raise
    ``PreflightError`` (with the hint naming another kind of directory, or vLLM's key) on any error."""
    inputs = inputs if inputs is not None else StartInputs(os.environ, config)
    inputs.checkpoint = path
    try:
        report = run_check("checkpoint", inputs).report
    except PreflightError as exc:
        logger.error("normalized FP8 checkpoint %s failed the preflight:\n%s", path,
                     f"{exc.hint}\n{exc.report.render_text()}" if exc.hint else exc.report.render_text())
        raise
    logger.info("normalized FP8 checkpoint %s passed the preflight (%d tensors, %d shards, %.1f ms)",
                path, report.tensors, report.shards, report.elapsed_s * 1000)
    return report


def normalized_state_dict(cls: type, model_name_or_path: Any, config: Any) -> dict[str, Any]:
    """What our ``get_state_dict`` returns in normalized mode: the start plan's checks (the
    settings, the preflight), then map, derive, prefix."""
    from ..loader import LoadPolicy, load_checkpoint  # torch: the loader maps tensors

    if getattr(neuron_config_view(config), "is_medusa", False):
        raise LoadError("Medusa heads are not supported with normalized FP8 checkpoints (NxDI would "
                        "unpickle medusa_heads.pt, which this format never opens): disable is_medusa")
    path = os.fspath(model_name_or_path)
    sources = SHARD_SOURCES.get()
    fingerprint = fingerprint_or_none(path) if sources is not None else None
    inputs = StartInputs(os.environ, config)
    allow_custom = run_check("allow_custom_model", inputs)
    report = checked_preflight(path, config, inputs)
    verify, mode = run_check("load_choices", inputs)  # after the preflight, which names a bad key as a finding
    if sources is not None:
        record_source(sources, path, fingerprint)
    loaded = load_checkpoint(path, config, report=report, allow_custom_model=allow_custom,
                             policy=LoadPolicy(verify_digests=verify, load_mode=mode))
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
        if not _mode(bound["config"]):
            return func(cls, *args, **kwargs)
        with refusals_stop_the_start():
            return normalized_state_dict(cls, bound["model_name_or_path"], bound["config"])

    return get_state_dict


def _wrap_convert(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def convert_hf_to_neuron_state_dict(*args: Any, **kwargs: Any) -> Any:
        if not _mode(_bound_config(signature, args, kwargs)):
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
        if not _mode(config):
            return func(cls, *args, **kwargs)
        model_path = signature.bind_partial(cls, *args, **kwargs).arguments.get("model_path")
        path = checkpoint_path(config, os.fspath(model_path))
        logger.info("normalized FP8 mode: not regenerating %s (already quantized); checking it instead", path)
        with refusals_stop_the_start():
            checked_preflight(path, config)
        return None

    return save_quantized_state_dict


def _wrap_generate_quantized(func: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(func)

    def generate_quantized_state_dict(cls: type, *args: Any, **kwargs: Any) -> Any:
        config = _bound_config(signature, (cls, *args), kwargs)
        if not _mode(config):
            return func(cls, *args, **kwargs)
        model_path = signature.bind_partial(cls, *args, **kwargs).arguments.get("model_path")
        # the checkpoint is the quantized state dict: load it (after its preflight), never rebuild it
        with refusals_stop_the_start():
            return normalized_state_dict(cls, checkpoint_path(config, os.fspath(model_path)), config)

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
           functools.partial(wrap_load_hf_model, is_normalized=_mode), ConfigAwareStaticMethod),
    _Patch("app", "save_quantized_state_dict", classmethod, ("cls", "model_path", "config"), _wrap_save_quantized),
    _Patch("app", "generate_quantized_state_dict", classmethod, ("cls", "model_path", "config"), _wrap_generate_quantized),
    _Patch("app", "checkpoint_loader_fn", type(lambda: None), ("self", "mmap"), None),
    _Patch("app", "shard_weights", type(lambda: None), ("self", "compiled_model_path"),
           functools.partial(wrap_shard_weights, is_normalized=_mode)),
    _Patch("app", "load_weights", type(lambda: None), ("self", "compiled_model_path"),
           functools.partial(wrap_load_weights, is_normalized=_mode)),
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
        support.warn_unverified_nxdi(logger, sys.modules.get(NXDI_PACKAGE))  # once per process, outside the verified set
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
    "wrong_format_hint",
]
