"""Verify a converted checkpoint against its source, value by value.

Re-reads both sides one tensor (one expert) at a time. Every non-expert tensor must equal the
source, renamed, cast to BF16 and zero-padded, bit for bit. Every FP8 expert is dequantized
(``fp8 × scale``) and compared with the source decoded independently of the converter (MXFP4
through a value table and ``ldexp``; BF16 as is), after an independent de-interleave,
transpose and pad. With ``y = source / scale``:

* wherever ``y`` is an E4M3 value within ±240 the result must be exact;
* elsewhere ``|dequantized − source| ≤ max(2^-4·|source|, 2^-10·scale) · (1 + 2^-16)``:
  half an E4M3 step (3 mantissa bits; 2^-10 is half the subnormal step 2^-9), with room for
  one float32 rounding of ``y``;
* every stored FP8 value lies within ±240 (no NaN, no exponent-all-ones byte).

This is what catches a swapped gate/up interleave, a missing transpose, a swapped nibble order
or an exponent bias off by one. Requires torch and safetensors.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import format as fmt
from . import mxfp4
from .checks import preflight
from .convert import SOURCE_MXFP4, Source, SourceReader, expert_source_name, non_expert_names, open_source
from .quant import FP8_DTYPE

BOUND_TEXT = (
    "exact wherever source/scale is an E4M3 value within ±240; otherwise "
    "|fp8·scale − source| ≤ max(2^-4·|source|, 2^-10·scale)·(1 + 2^-16)"
)
RELATIVE_STEP = 2.0**-4
SUBNORMAL_STEP = 2.0**-10
SLACK = 1.0 + 2.0**-16
MAX_PROBLEMS = 20
_ROWS_PER_CHUNK = 512


@dataclass
class LayerRow:
    """One line of the per-layer table."""

    layer: str
    tensors: int = 0
    tensor_mismatches: int = 0
    values: int = 0
    exact: int = 0
    inexact: int = 0
    violations: int = 0
    max_rel_error: float = 0.0


@dataclass
class VerificationReport:
    """The verdict of ``verify_conversion``: a row per layer and the first problems found."""

    out: str
    source: str
    source_format: str = ""
    rows: list[LayerRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    bound: str = BOUND_TEXT
    problem_count: int = 0

    @property
    def violations(self) -> int:
        return sum(row.violations + row.tensor_mismatches for row in self.rows) + self.problem_count

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def note(self, message: str, *, counts: bool = True) -> None:
        """Record a problem (the first ``MAX_PROBLEMS`` messages are kept)."""
        if counts:
            self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(ok=self.ok, violations=self.violations)
        return document

    def render_text(self) -> str:
        header = f"{'layer':>6} {'tensors':>8} {'mismatch':>8} {'fp8 values':>12} {'exact':>12} {'inexact':>9} {'violations':>10} {'max rel err':>11}"
        lines = [f"verify {self.out} against {self.source} ({self.source_format or 'unknown'})", header]
        for row in self.rows:
            lines.append(
                f"{row.layer:>6} {row.tensors:>8} {row.tensor_mismatches:>8} {row.values:>12} {row.exact:>12} "
                f"{row.inexact:>9} {row.violations:>10} {row.max_rel_error:>11.3g}"
            )
        lines.append(f"bound: {self.bound}")
        lines += [f"  problem: {message}" for message in self.problems]
        hidden = self.violations - len(self.problems)
        if not self.ok and hidden > 0:
            lines.append(f"  … and {hidden} more violating values or tensors")
        lines.append("OK: every value within its bound" if self.ok else f"FAILED: {self.violations} violations")
        return "\n".join(lines)


# --------------------------------------------------------------------------- references


def reference_gate_up(rows: torch.Tensor, padded_h: int, padded_i: int) -> torch.Tensor:
    """Source gate_up rows [2I, H] (even = gate, odd = up) → [H', 2I'] the NxDI way."""
    gate, up = rows[0::2], rows[1::2]
    out = torch.zeros((padded_h, 2 * padded_i), dtype=rows.dtype)
    out[: gate.shape[1], : gate.shape[0]] = gate.t()
    out[: up.shape[1], padded_i : padded_i + up.shape[0]] = up.t()
    return out


def reference_down(rows: torch.Tensor, padded_h: int, padded_i: int) -> torch.Tensor:
    """Source down rows [H, I] → [I', H']."""
    out = torch.zeros((padded_i, padded_h), dtype=rows.dtype)
    out[: rows.shape[1], : rows.shape[0]] = rows.t()
    return out


def _source_expert(reader: SourceReader, source: Source, layer: int, proj: str, expert: int,
                   layout: fmt.Layout) -> torch.Tensor:
    """The expected dequantized expert [in', out'] (float32), decoded and laid out independently."""
    hp, ip = layout.padded_hidden_size, layout.padded_intermediate_size
    short = "gate_up_proj" if proj == fmt.GATE_UP else "down_proj"
    if source.kind == SOURCE_MXFP4:
        blocks = reader.slice(expert_source_name(layer, f"{short}_blocks"))[expert]
        scales = reader.slice(expert_source_name(layer, f"{short}_scales"))[expert]
        rows = mxfp4.decode(blocks, scales)  # [2I, H] or [H, I]
    else:
        dense = reader.slice(expert_source_name(layer, short))[expert].float()  # [H, 2I] or [I, H]
        rows = dense.t()
    return reference_gate_up(rows, hp, ip) if proj == fmt.GATE_UP else reference_down(rows, hp, ip)


# --------------------------------------------------------------------------- comparisons


def _compare_expert(expected: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, row: LayerRow,
                    report: VerificationReport, where: str) -> int:
    """Check one expert; returns the number of inexact values (within the bound)."""
    inexact_total = 0
    scale64 = scale.double()
    for start in range(0, expected.shape[0], _ROWS_PER_CHUNK):
        want = expected[start:start + _ROWS_PER_CHUNK].double()
        stored = q[start:start + _ROWS_PER_CHUNK].float()
        got = stored.double() * scale64
        y = want / scale64
        representable = (y.float().clamp(-fmt.FP8_MAX, fmt.FP8_MAX).to(FP8_DTYPE).double() == y) & (y * scale64 == want)
        error = (got - want).abs()
        bound = torch.maximum(RELATIVE_STEP * want.abs(), SUBNORMAL_STEP * scale64.expand_as(want)) * SLACK
        in_range = stored.abs() <= fmt.FP8_MAX  # False for NaN too
        exact = error == 0
        bad = ~in_range | (representable & ~exact) | ~(error <= bound)
        inexact = int((~exact & ~bad).sum())
        inexact_total += inexact
        row.values += want.numel()
        row.exact += int((exact & ~bad).sum())
        row.inexact += inexact
        nonzero = want != 0
        if bool(nonzero.any()):
            rel = (error[nonzero] / want.abs()[nonzero]).max()
            row.max_rel_error = max(row.max_rel_error, float(rel))
        violations = int(bad.sum())
        if violations:
            row.violations += violations
            r, c = (int(v) for v in bad.nonzero()[0])
            report.note(
                f"{where}[{start + r}, {c}]: stored {float(stored[r, c])} × scale {float(scale64[c])} = "
                f"{float(got[r, c])}, source {float(want[r, c])} ({violations} values of this expert violate)",
                counts=False,
            )
    return inexact_total


def _compare_tensor(expected: torch.Tensor, got: torch.Tensor, row: LayerRow, report: VerificationReport,
                    name: str, offset: int = 0) -> bool:
    if offset == 0:
        row.tensors += 1
    if got.shape == expected.shape and torch.equal(got.view(torch.int16), expected.view(torch.int16)):
        return True
    if got.shape != expected.shape:
        report.note(f"{name}: stored shape {list(got.shape)}, expected {list(expected.shape)}", counts=False)
    else:
        index = int((got.view(torch.int16) != expected.view(torch.int16)).reshape(-1).nonzero()[0])
        report.note(f"{name}: element {offset + index} is {float(got.reshape(-1)[index])}, expected "
                    f"{float(expected.reshape(-1)[index])} (not bit-exact)", counts=False)
    return False


def _check_non_expert(src: SourceReader, out: SourceReader, hf_name: str, name: str, shape: tuple[int, ...],
                      row: LayerRow, report: VerificationReport) -> None:
    source_shape = src.source.tensors[hf_name][1].shape
    if len(shape) == 1:
        expected = torch.zeros(shape, dtype=torch.bfloat16)
        expected[: source_shape[0]] = src.get(hf_name).to(torch.bfloat16)
        if not _compare_tensor(expected, out.get(name), row, report, name):
            row.tensor_mismatches += 1
        return
    rows, cols = shape
    step = max(1, (16 << 20) // (2 * cols))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        expected = torch.zeros((stop - start, cols), dtype=torch.bfloat16)
        if start < source_shape[0]:
            part = src.slice(hf_name)[start:min(stop, source_shape[0])]
            expected[: part.shape[0], : part.shape[1]] = part
            del part
        same = _compare_tensor(expected, out.slice(name)[start:stop], row, report, name, offset=start * cols)
        src.release()  # keeps RSS flat on large tensors: see SourceReader.release
        out.release()
        if not same:
            row.tensor_mismatches += 1
            return


def _check_biases(src: SourceReader, out: SourceReader, layer: int, layout: fmt.Layout, row: LayerRow,
                  report: VerificationReport) -> None:
    prefix = fmt.layer_prefix(layer)
    ip, hp = layout.padded_intermediate_size, layout.padded_hidden_size
    gate_up = src.get(expert_source_name(layer, "gate_up_proj_bias")).to(torch.bfloat16)
    expected = torch.zeros((gate_up.shape[0], 2 * ip), dtype=torch.bfloat16)
    half = gate_up.shape[1] // 2
    expected[:, :half] = gate_up[:, 0::2]
    expected[:, ip:ip + half] = gate_up[:, 1::2]
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.GATE_UP}.bias"), row, report, f"{prefix}{fmt.GATE_UP}.bias"):
        row.tensor_mismatches += 1
    down = src.get(expert_source_name(layer, "down_proj_bias")).to(torch.bfloat16)
    expected = torch.zeros((down.shape[0], hp), dtype=torch.bfloat16)
    expected[:, : down.shape[1]] = down
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.DOWN}.bias"), row, report, f"{prefix}{fmt.DOWN}.bias"):
        row.tensor_mismatches += 1


def _output_source(out: str, report_view: Any) -> Source:
    tensors = {}
    for name in report_view.weight_map:
        shard, info = report_view.tensor(name)
        tensors[name] = (os.path.join(out, shard), info)
    return Source(root=out, kind="normalized", config=report_view.config, dims=report_view.dims, tensors=tensors)


def verify_conversion(out: str | os.PathLike[str], source: str | os.PathLike[str], *,
                      progress: bool = False) -> VerificationReport:
    """Compare the converted checkpoint ``out`` with its ``source``, value by value.

    Returns a ``VerificationReport`` (``report.ok`` is the verdict, ``render_text()`` the
    per-layer table). Raises ``ConversionError`` when ``source`` is not an HF GPT-OSS
    checkpoint. Example::

        report = verify_conversion("gpt-oss-120b-fp8", "gpt-oss-120b")
        print(report.render_text())
    """
    out_path = os.path.abspath(os.fspath(out))
    src = open_source(source)
    report = VerificationReport(out=out_path, source=src.root, source_format=src.kind)
    checked = preflight(out_path, allow_custom_model=True)
    if not checked.ok:
        for finding in checked.errors:
            report.note(f"preflight: {finding.code}: {finding.message}")
        return report
    view = checked.view
    layout = view.layout
    if view.dims != src.dims:
        report.note(f"dimensions differ: output {view.dims}, source {src.dims}: not a conversion of this source")
        return report
    namespace = fmt.expected_namespace(layout)
    renames = non_expert_names(src.dims)
    recorded = (view.metadata.get("source") or {}).get("exactness") if isinstance(view.metadata.get("source"), dict) else None
    inexact_total = 0
    from tqdm import tqdm

    bar = tqdm(total=src.dims.num_hidden_layers, unit="layer", desc="verify", file=sys.stderr,
               disable=not (progress and sys.stderr.isatty()))
    with bar, SourceReader(src) as src_reader, SourceReader(_output_source(out_path, view)) as out_reader:
        global_row = LayerRow("global")
        for hf_name, name in renames.items():
            if not name.startswith("layers."):
                _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, global_row, report)
        report.rows.append(global_row)
        for layer in range(src.dims.num_hidden_layers):
            row = LayerRow(str(layer))
            prefix = fmt.layer_prefix(layer)
            for hf_name, name in renames.items():
                if name.startswith(prefix):
                    _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, row, report)
            _check_biases(src_reader, out_reader, layer, layout, row, report)
            for proj in (fmt.GATE_UP, fmt.DOWN):
                scales = out_reader.get(f"{prefix}{proj}.scale").clone()
                row.tensors += 2
                for expert in range(src.dims.num_local_experts):
                    expected = _source_expert(src_reader, src, layer, proj, expert, layout)
                    stored = out_reader.slice(f"{prefix}{proj}.weight")[expert]
                    inexact_total += _compare_expert(expected, stored, scales[expert, 0], row, report,
                                                     f"{prefix}{proj}.weight[{expert}]")
                    del expected, stored
                    src_reader.release()  # keeps RSS flat: see SourceReader.release
                    out_reader.release()
            report.rows.append(row)
            bar.update(1)
    if src.kind == SOURCE_MXFP4 and isinstance(recorded, dict) and recorded.get("inexact_values") != inexact_total:
        report.note(f"the converter recorded {recorded.get('inexact_values')} inexact values in the index, "
                    f"verification found {inexact_total}")
    return report
