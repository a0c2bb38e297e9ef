"""The ``vllm.general_plugins`` entry point: vLLM calls ``register_plugin()`` in each process.

On a Neuron host it installs the normalized-FP8 hook, so vllm-neuron's model lookup
(``utils.constants.MODEL_TYPES``) finds the hooked GPT-OSS class. Installing this package must
never take down a vLLM server that did not ask for it, so what happens when the hook cannot be
installed (no NxDI, or an NxDI the hook does not understand) depends on ``CHECKPOINT_FORMAT``:

* it asks for ``normalized_fp8`` (or is a near-miss spelling the hook treats as an error): raise,
  with the reason — a server that would load a normalized checkpoint through NxDI's own
  converters must not start;
* anything else (unset, ``hf``, ``legacy``, ...): log one warning and return.
"""

from __future__ import annotations

import logging
import os

from . import nxdi_hook, support
from .errors import RegistrationError

__all__ = ["logger", "register_plugin"]

logger = logging.getLogger(__name__)


def _asked_for_us() -> str | None:
    """The ``CHECKPOINT_FORMAT`` value when it asks for this hook (exactly or as a near miss), else None."""
    value = os.environ.get(nxdi_hook.ENV_VAR)
    if value is None:
        return None
    if value.strip().lower() == nxdi_hook.NORMALIZED_FP8 or nxdi_hook.is_near_miss(value):
        return value
    return None


def _without_nxdi() -> str:
    """On a host without NxDI: what normalized FP8 needs and what to serve instead (one line)."""
    if nxdi_hook.nxdi_available():
        return ""
    kind = support.vllm_neuron_kind()
    here = (f" (installed here: {kind.distribution} {kind.version}, the plugin that does not use NxDI)"
            if kind.kind == support.WITHOUT_NXDI_KIND else "")
    return f". NxDI is not installed{here}: {support.WITHOUT_NXDI}"


def register_plugin() -> None:
    """Install the hook when NxDI is importable; idempotent (vLLM may call it more than once).

    Raises ``RegistrationError`` (with the reason) only when ``CHECKPOINT_FORMAT`` asks for the
    normalized format and the hook cannot be installed; otherwise a failure is one warning.
    """
    wanted = _asked_for_us()
    if not nxdi_hook.nxdi_available() and wanted is None:
        logger.info("nxdi-gptoss-fp8: NxDI is not installed here; the normalized FP8 hook is not installed")
        return
    try:
        nxdi_hook.register()
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
