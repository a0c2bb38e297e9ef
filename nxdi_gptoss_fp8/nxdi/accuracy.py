"""The hooked ``load_hf_model``: what NxDI's accuracy check compares the device with, in normalized mode.

NxDI's ``check_accuracy`` / ``check_accuracy_logits`` (and ``inference_demo
--check-accuracy-mode``) build their CPU reference with ``neuron_model.load_hf_model(
neuron_model.model_path)``. A normalized checkpoint holds no Hugging Face model, so in normalized
mode the hook builds one only when asked which (``NXDI_GPTOSS_FP8_REFERENCE`` or
``neuron_config.normalized_fp8_reference``, docs/accuracy.md): ``dequantized`` or the path of the
HF source, through ``forward.hf_reference``. Unset, it refuses in one line naming the variable.

``load_hf_model`` is a static method NxDI calls on the application object; it is installed as
``ConfigAwareStaticMethod``, so the call also sees that object's config (the config opt-in and
the NeuronConfig key) while a call on the class still works without one. Importing this module
imports neither NxDI nor torch.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from .. import format as fmt
from ..errors import LoadError
from .start_plan import StartInputs, run_check

__all__ = ["ConfigAwareStaticMethod", "load_reference", "wrap_load_hf_model"]

logger = logging.getLogger(__name__)
_CONFIG = "_nxdi_gptoss_fp8_config"  # the keyword the descriptor passes the instance's config under


class ConfigAwareStaticMethod(staticmethod):
    """A static method that, read from an instance, also receives that instance's ``config``."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        func = super().__get__(obj, objtype)
        if obj is None:
            return func
        return functools.partial(func, **{_CONFIG: getattr(obj, "config", None)})


def load_reference(model_path: Any, config: Any, **kwargs: Any) -> Any:
    """The transformers model the reference setting asks for (``LoadError``/``ConfigError``, one
    line, when none is set or the value cannot be used). Its dtype: ``dtype`` / ``torch_dtype`` in
    ``kwargs``, else the NeuronConfig's ``torch_dtype`` when bfloat16 or float32 (the model under
    test's), else bfloat16."""
    inputs = StartInputs(os.environ, config)
    choice = run_check("reference", inputs)  # the start plan's readers of the settings
    if choice is None:
        raise LoadError(
            f"load_hf_model({os.fspath(model_path)!r}): a normalized FP8 checkpoint holds no Hugging Face model; for "
            f"NxDI's accuracy check set {fmt.REFERENCE_ENV}=dequantized (the checkpoint's own numbers) or "
            f"{fmt.REFERENCE_ENV}=/path/to/the/HF/source it was converted from (docs/accuracy.md)")
    from ..forward.hf_reference import build_reference  # torch and transformers: only the accuracy check needs them

    neuron_config = getattr(config, "neuron_config", config) if config is not None else None
    ckpt = os.fspath(getattr(neuron_config, "quantized_checkpoints_path", None) or model_path)
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype is None and str(getattr(neuron_config, "torch_dtype", "")).removeprefix("torch.") in ("float32", "bfloat16"):
        dtype = str(neuron_config.torch_dtype).removeprefix("torch.")  # the dtype the model under test runs in
    build = build_reference(ckpt, choice, dtype=dtype, allow_custom_model=run_check("allow_custom_model", inputs),
                            say=lambda line: logger.warning("load_hf_model: %s", line))
    logger.warning("load_hf_model: %s", build.describe())
    return build.model


def wrap_load_hf_model(func: Callable[..., Any], *, is_normalized: Callable[[Any], bool]) -> Callable[..., Any]:
    """NxDI's ``load_hf_model`` outside normalized mode, ``load_reference`` in it."""

    def load_hf_model(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.pop(_CONFIG, None)
        if not is_normalized(config):
            return func(*args, **kwargs)
        path = args[0] if args else kwargs.pop("model_path", None)
        return load_reference(path, config, **kwargs)

    return load_hf_model
