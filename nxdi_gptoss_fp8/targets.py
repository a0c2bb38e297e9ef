"""Named conversion targets: a geometry a checkpoint is converted for (``convert --target NAME``).

A target is a preset over the padded sizes, recorded in the index as ``metadata.target``
(docs/format.md, Index metadata) so ``inspect`` and ``validate`` name it. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TARGETS", "ConversionTarget", "target_problems"]


@dataclass(frozen=True)
class ConversionTarget:
    """A named geometry a checkpoint is converted for (``convert --target NAME``): fixed padded
    sizes, recorded in the index as ``metadata.target`` so ``inspect`` and ``validate`` name it."""

    name: str
    padded_hidden_size: int
    padded_intermediate_size: int
    purpose: str  # what it is for, one sentence (the dry run, the card, inspect)
    status: str  # who loads it today, one sentence


# docs/format.md, Index metadata (target); docs/vllm-neuron-plugin.md for nki-moe
TARGETS: dict[str, ConversionTarget] = {
    "nki-moe": ConversionTarget(
        "nki-moe", 3072, 3072,
        "the geometry of the vLLM Neuron plugin's GPT-OSS (Neuron SDK 2.32 and later): hidden and intermediate "
        "sizes padded to 3072, the expert layout the NKI library's MoE kernels (moe_block_tkg, moe_cte) read",
        "no released vLLM Neuron plugin loads FP8 GPT-OSS experts yet (docs/vllm-neuron-plugin.md); NxDI loads it "
        "like any padded checkpoint, with these padded sizes in its NeuronConfig",
    ),
}


def target_problems(target: str, padded_hidden_size: int, padded_intermediate_size: int) -> list[str]:
    """Why an index's ``target`` does not hold (empty when it does): an unknown name, or padded
    sizes other than the target's."""
    known = TARGETS.get(target)
    if known is None:
        return [f"target {target!r} is not one this package knows ({', '.join(TARGETS)})"]
    found = (padded_hidden_size, padded_intermediate_size)
    wanted = (known.padded_hidden_size, known.padded_intermediate_size)
    if found != wanted:
        return [f"target {target!r} pads hidden and intermediate sizes to {wanted[0]} and {wanted[1]}, but the "
                f"index records {found[0]} and {found[1]}"]
    return []
