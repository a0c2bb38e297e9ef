"""The contract every source kind follows (``SourceKind``), and the decoded expert rows a kind
gives the verifier (``ExpertRows``). Above ``source`` (the reader) and ``output`` (the writer),
below every kind: each arrow points one way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ... import format as fmt
from ...errors import ConversionError
from ...safeio.safetensors_header import TensorInfo
from ..output import ExpertStats, Output, Workspace, hf_biases, put_biases
from ..source import SourceReader, SourceSpec, expert_source_name, non_expert_specs

if TYPE_CHECKING:
    import torch

__all__ = ["ExpertRows", "FusedHfKind", "SourceKind"]


class SourceKind(Protocol):
    """What each source kind (one module each: ``hf_mxfp4``, ``hf_bf16``, ``compressed_tensors``)
    provides. Detection asks every kind ``recognizes``; exactly one must say yes."""

    name: str
    description: str

    def recognizes(self, names: set[str]) -> bool:
        """Whether these tensor names are this kind's expert layout."""

    def resolve(self, config: dict[str, Any], dims: fmt.ModelDims, tensors: dict[str, tuple[str, TensorInfo]],
                config_path: str, options: dict[str, Any]) -> dict[str, Any]:
        """Check the config against the tensors; return the resolved options (recorded in the
        provenance). Raises ``ConversionError`` with a one-line reason for anything unsupported."""

    def specs(self, dims: fmt.ModelDims, options: dict[str, Any]) -> dict[str, SourceSpec]:
        """Every tensor of a source of this kind (non-expert ones included)."""

    def convert_experts(self, reader: SourceReader, layer: int, out: Output, layout: fmt.Layout,
                        workspace: Workspace) -> list[ExpertStats]:
        """Write one layer's expert weights, scales and biases; return per-projection exactness."""

    def reference_rows(self, reader: SourceReader, layer: int, proj: str, expert: int) -> ExpertRows:
        """One expert [out, in] as the source means it (gate_up: rows interleaved, even = gate,
        odd = up), decoded row block by row block on demand, without sharing code with
        ``convert_experts``."""

    def reference_biases(self, reader: SourceReader, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """BF16 (gate_up [E, 2I] interleaved, down [E, H]) biases as the source means them."""


class ExpertRows:
    """One source expert's values [out, in], decoded on demand, a few rows at a time (so the
    verifier's comparison stays in cache): ``rows(start, stop, step)`` gives exact float32
    values (float64 where float32 cannot hold them exactly, ``dtype`` says which). This base
    class holds values already decoded; kinds subclass ``decode``."""

    def __init__(self, raw: torch.Tensor, shape: tuple[int, int], dtype: Any) -> None:
        self.raw, self.shape, self.dtype = raw, shape, dtype

    def decode(self, raw_rows: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
        """The values of ``raw_rows``, which are ``self.raw[index]`` (a slice or row indices)."""
        return raw_rows.to(self.dtype)

    def fp8_rows(self, start: int, stop: int, step: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For sources whose values are exactly E4M3 bytes × a float32 per-row scale: (uint8 rows
        ``start:stop:step``, their scales), so a verifier can compare bytes; None for the rest."""
        return None

    def rows(self, start: int, stop: int, step: int = 1, subset: torch.Tensor | None = None) -> torch.Tensor:
        """float [len(range(start, stop, step)), in]: the source rows ``start:stop:step`` (only
        the ``subset`` of them, row positions in that range, when given)."""
        index: slice | torch.Tensor = slice(start, stop, step)
        if subset is not None:
            index = subset * step + start
        return self.decode(self.raw[index], index)


class FusedHfKind:
    """What the HF kinds whose experts are fused per layer (``hf_mxfp4``, ``hf_bf16``) share:
    recognized by one fused tensor, their ``quant_method`` checked against the config, the fused
    HF biases. A subclass names ``marker``, ``quant_method`` (None: none allowed) and
    ``tensors_are`` (the refusal's words), and gives ``projection``."""

    name: str
    description: str
    marker: str
    quant_method: str | None = None
    tensors_are: str

    def recognizes(self, names: set[str]) -> bool:
        return expert_source_name(0, self.marker) in names

    def check_quant_method(self, config: dict[str, Any], config_path: str) -> None:
        """Refuse a config whose ``quantization_config.quant_method`` is not this kind's."""
        quant = config.get("quantization_config")
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method != self.quant_method:
            expected = f", not {self.quant_method!r}" if self.quant_method else ""
            raise ConversionError(
                f"{config_path}: tensors are {self.tensors_are} but quantization_config.quant_method is {method!r}"
                f"{expected}: config and weights come from different sets")

    def projection(self, reader: SourceReader, layer: int, proj: str, out: Output, layout: fmt.Layout,
                   workspace: Workspace) -> ExpertStats:
        """All experts of one projection of ``layer`` written; their exactness."""
        raise NotImplementedError

    @staticmethod
    def fused_specs(dims: fmt.ModelDims, experts: dict[str, tuple[tuple[int, ...], tuple[str, ...]]]
                    ) -> dict[str, SourceSpec]:
        """Every tensor of a source: the non-expert ones and, in each layer, the fused expert
        tensors ``experts`` (short name → shape, dtypes)."""
        specs = non_expert_specs(dims)
        for layer in range(dims.num_hidden_layers):
            for short, (shape, dtypes) in experts.items():
                name = expert_source_name(layer, short)
                specs[name] = SourceSpec(name, shape, dtypes)
        return specs

    def convert_experts(self, reader: SourceReader, layer: int, out: Output, layout: fmt.Layout,
                        workspace: Workspace) -> list[ExpertStats]:
        put_biases(out, layer, *hf_biases(reader, layer), layout)
        return [self.projection(reader, layer, proj, out, layout, workspace) for proj in (fmt.GATE_UP, fmt.DOWN)]

    def reference_biases(self, reader: SourceReader, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return hf_biases(reader, layer)
