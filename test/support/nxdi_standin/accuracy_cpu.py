"""Test-only: NxDI's own accuracy check (``utils.accuracy``) run on NxDI's CPU-mode model.

NxDI's ``check_accuracy_logits`` compares logits through ``torch_neuronx.testing.validation.
logit_validation``, part of the Neuron SDK's ``torch-neuronx`` wheel, which is not installable
here (``cpu_roots`` stubs that root). NxDI ships its own implementation of the same comparison
(``experimental.core.accuracy.logit_validation``: teacher forcing, per-top-k ``(atol, rtol)``,
the divergence rule), which needs only ``neuron_allclose``; ``install()`` makes NxDI's accuracy
module call that implementation, with ``neuron_allclose`` as ``torch.allclose``'s rule
(``|actual − expected| ≤ atol + rtol·|expected|`` everywhere), and reports the torch-neuronx
build that selects the current call signature. NxDI's accuracy module imports its vision models
at module level, which need ``torchvision``: when it is not installed, that root is stubbed too
(no vision code runs). Nothing else in NxDI's check is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RESULTS", "AllClose", "install", "neuron_allclose"]

TORCH_NEURONX_BUILD = "2.11.19230"  # the first build whose logit_validation takes generate_fn_divergence


@dataclass(frozen=True)
class AllClose:
    allclose: bool
    max_abs_error: float
    max_rel_error: float


def neuron_allclose(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-8) -> AllClose:
    """``allclose`` by ``torch.allclose``'s rule; ``max_rel_error`` is the smallest ``rtol`` with which
    it would hold at this ``atol`` (what the tolerance measurement reads)."""
    import torch

    actual, expected = actual.double(), expected.double()
    error = (actual - expected).abs()
    needed = ((error - atol).clamp(min=0) / expected.abs().clamp(min=torch.finfo(torch.float32).tiny))
    return AllClose(bool(torch.all(error <= atol + rtol * expected.abs())),
                    float(error.max()) if error.numel() else 0.0, float(needed.max()) if needed.numel() else 0.0)


RESULTS: list[Any] = []  # each validation's per-token results (``_validate_single_token_logits``), last one last


def install() -> None:
    """Make ``neuronx_distributed_inference.utils.accuracy`` use NxDI's own logit validation."""
    import importlib.util
    import sys

    import packaging.version

    from . import neuron_stubs

    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, neuron_stubs._Finder(("torchvision",)))
    from neuronx_distributed_inference.experimental.core.accuracy import logit_validation as nxdi_validation
    from neuronx_distributed_inference.utils import accuracy

    nxdi_validation.neuron_allclose = neuron_allclose
    printed = nxdi_validation._print_logit_validation_results

    def keep_results(results: Any, *args: Any, **kwargs: Any) -> Any:
        RESULTS.append(results)
        return printed(results, *args, **kwargs)

    nxdi_validation._print_logit_validation_results = keep_results

    def logit_validation(input_ids: Any, generate_fn: Any, expected_logits: Any, tol_map: Any = None,
                         divergence_difference_tol: Any = None, generate_fn_divergence: bool = False) -> Any:
        import torch

        ids = [list(map(int, row)) for row in (input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)]

        def generate(current: list[list[int]]) -> Any:  # NxDI's generate_fn takes a tensor
            return generate_fn(torch.tensor(current, dtype=torch.int64))

        passed = nxdi_validation.logit_validation(ids, generate, expected_logits, tol_map=tol_map,
                                                  divergence_difference_tol=divergence_difference_tol, colorize=False)
        return passed, {"input_ids": ids}, "passed" if passed else "logit validation failed"

    accuracy.logit_validation = logit_validation
    accuracy.get_torch_neuronx_build_version = lambda: packaging.version.parse(TORCH_NEURONX_BUILD)
