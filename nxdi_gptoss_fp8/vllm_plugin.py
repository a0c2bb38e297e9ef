"""The ``vllm.general_plugins`` entry point: vLLM calls ``register_plugin()`` in each process.

On a Neuron host it installs the normalized-FP8 hook, so vllm-neuron's model lookup
(``utils.constants.MODEL_TYPES``) finds the hooked GPT-OSS class. Where NxDI is not installed
(e.g. a GPU vLLM that happens to have this package) it only logs that and returns. An NxDI
that the hook does not understand raises ``RegistrationError``: a server that would silently
load a normalized checkpoint through the wrong converter must not start.
"""

from __future__ import annotations

import logging

from . import nxdi_hook

logger = logging.getLogger(__name__)


def register_plugin() -> None:
    """Install the hook when NxDI is importable; idempotent (vLLM may call it more than once)."""
    if not nxdi_hook.nxdi_available():
        logger.info("nxdi-gptoss-fp8: NxDI is not installed here; the normalized FP8 hook is not installed")
        return
    nxdi_hook.register()
