"""The ``vllm.general_plugins`` entry point: vLLM calls ``register_plugin()`` in each process.

On a Neuron host it installs the normalized-FP8 hook and makes GPT-OSS reachable through the
NxDI-backed vllm-neuron's model lookup: that plugin maps the architecture to NxDI's
``utils.constants.MODEL_TYPES`` key by lower-casing the text before "For" (``GptOssForCausalLM``
→ ``gptoss``) where NxDI registers ``gpt_oss``; its 0.1.0 release special-cased the name, 0.2.0
and later do not (``vllm_neuron/worker/neuronx_distributed_model_loader.py``,
``_get_neuron_model_cls``). So ``MODEL_TYPES["gptoss"]`` is added for the same hooked class when
absent (never replacing another class; ``nxdi.hook.unregister()`` removes it). The client tests
(``test/test_client_vllm.py``) run both releases' loaders: ``RUN_AGAINST``.

Installing this package must never take down a vLLM server that did not ask for it, so what
happens when the hook cannot be installed (no NxDI, or an NxDI the hook does not understand)
depends on ``CHECKPOINT_FORMAT``:

* ``normalized_fp8``: raise, with the reason — a server that would load a normalized checkpoint
  through NxDI's own converters must not start;
* a near-miss spelling (``normalized-fp8``, ``fp8``): raise ``CheckpointFormatError`` saying it is
  a typo of ``normalized_fp8``, whether or not NxDI is installed;
* anything else (unset, ``hf``, ``legacy``, ...): log one warning (WARNING, visible at vLLM's
  default level) and return.
"""

from __future__ import annotations

import importlib
import logging
import os
import re

from .. import format as fmt
from .. import support
from ..errors import RegistrationError
from . import hook as nxdi_hook

__all__ = ["RUN_AGAINST", "logger", "register_plugin", "vllm_model_type"]

logger = logging.getLogger(__name__)

RUN_AGAINST = support.VLLM_NEURON_RUN_AGAINST  # the vllm-neuron releases whose loader the client tests run


def vllm_model_type(architecture: str = fmt.ARCHITECTURE) -> tuple[str, str]:
    """The ``MODEL_TYPES`` key and task the NxDI-backed vllm-neuron (0.2.0 and later) computes for
    ``architecture``: the text before "For" lower-cased, the task after it in kebab case."""
    model, task = architecture.split("For", 1)
    return model.lower(), re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1-\2", task)).lower()


def _requested() -> str | None:
    """``CHECKPOINT_FORMAT`` when it is exactly ``normalized_fp8`` (any case and spaces), else None;
    raises ``CheckpointFormatError`` for a near miss (a typo is said as one, NxDI or not)."""
    value = os.environ.get(nxdi_hook.ENV_VAR)
    if value is None:
        return None
    if nxdi_hook.is_near_miss(value):
        raise nxdi_hook.near_miss_error(value, nxdi_hook.ENV_VAR)
    return value if value.strip().lower() == nxdi_hook.NORMALIZED_FP8 else None


def _without_nxdi() -> str:
    """On a host without NxDI: what normalized FP8 needs and what to serve instead (one line)."""
    if nxdi_hook.nxdi_available():
        return ""
    kind = support.vllm_neuron_kind()
    here = (f" (installed here: {kind.distribution} {kind.version}, the plugin that does not use NxDI)"
            if kind.kind == support.WITHOUT_NXDI_KIND else "")
    return f". NxDI is not installed{here}: {support.WITHOUT_NXDI}"


def _install() -> None:
    """``register()``, then the ``MODEL_TYPES`` entry vllm-neuron looks up (``RegistrationError`` if
    another class holds it)."""
    nxdi_hook.register()
    model_type, _task = vllm_model_type()  # the task is causal-lm, the entry's only one
    app = getattr(importlib.import_module(nxdi_hook.MODELING_MODULE), nxdi_hook.APP_CLASS)
    constants = importlib.import_module(nxdi_hook.CONSTANTS_MODULE)
    problem = nxdi_hook.add_model_type_entry(getattr(constants, "MODEL_TYPES", None), model_type, app)
    if problem:
        raise RegistrationError(f"vllm-neuron looks GPT-OSS up as {model_type!r}, but {problem}; left as it is, so "
                                "vLLM would not load through the hook")


def register_plugin() -> None:
    """Install the hook when NxDI is importable; idempotent (vLLM may call it more than once).

    Raises ``CheckpointFormatError`` for a near-miss ``CHECKPOINT_FORMAT``, and ``RegistrationError``
    (with the reason) when it asks for the normalized format and the hook cannot be installed;
    otherwise a failure is one warning.
    """
    wanted = _requested()
    if not nxdi_hook.nxdi_available() and wanted is None:
        logger.warning("nxdi-gptoss-fp8: NxDI is not installed here, so the normalized FP8 hook is not installed; "
                       "%s does not ask for it, so vLLM continues without it (%s)", nxdi_hook.ENV_VAR,
                       support.SERVING_NEEDS)
        return
    try:
        _install()
    except Exception as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the exception's layout
        if wanted is not None:
            raise RegistrationError(
                f"{nxdi_hook.ENV_VAR}={wanted!r} asks for the normalized FP8 hook, which could not be "
                f"installed: {reason}{_without_nxdi()}"
            ) from exc
        logger.warning(
            "nxdi-gptoss-fp8: the normalized FP8 hook was not installed (%s: %s); %s does not ask for it, "
            "so vLLM continues without it", type(exc).__name__, reason, nxdi_hook.ENV_VAR,
        )
