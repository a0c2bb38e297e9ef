"""``selfcheck``: does this package work with the NxDI installed here?

One tiny GPT-OSS weight set is written three ways: an HF MXFP4 source, its conversion to the
normalized FP8 format (our converter and writer; exact for these values), and NxDI's legacy FP8
layout of the same FP8 weights. NxDI's real model runs in CPU mode from each (the normalized one
through our hook), and transformers' ``GptOssForCausalLM`` runs on the source's decoded weights
(the same values the FP8 checkpoints hold). Checked:

* normalized vs legacy FP8 through NxDI: bit-identical logits (our hook gives NxDI exactly what
  its own FP8 route gives it);
* normalized, legacy and HF through NxDI vs transformers: max |Δlogit| ≤ 1e-5 and the same top-1
  token at every position.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .._version import __version__
from ..support import EnvironmentReport, environment_report, from_source
from ..units import plural

__all__ = [
    "STEPS", "TOKENS", "TRANSFORMERS_TOLERANCE", "Comparison", "SelfcheckReport", "package_identity", "selfcheck",
]

TRANSFORMERS_TOLERANCE = 1e-5
TOKENS, STEPS = 12, 6


@dataclass(frozen=True)
class Comparison:
    """One comparison: its name, the measured max |Δlogit|, the bound, and the verdict."""

    name: str
    max_abs_diff: float
    bound: float
    top1_agree: int
    positions: int
    ok: bool


@dataclass
class SelfcheckReport:
    """Versions, where things were imported from, each comparison, the verdict."""

    tp: int
    package: dict[str, str]
    environment: dict[str, dict[str, str]]
    model: dict[str, Any]
    comparisons: list[Comparison] = field(default_factory=list)
    conversion_exact: bool = False
    elapsed_s: float = 0.0
    support: EnvironmentReport | None = None  # the `env` header: where this host stands in the tested matrix

    @property
    def ok(self) -> bool:
        return bool(self.comparisons) and self.conversion_exact and all(c.ok for c in self.comparisons)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tp": self.tp, "package": self.package, "environment": self.environment,
                "model": self.model, "conversion_exact": self.conversion_exact,
                "comparisons": [asdict(c) for c in self.comparisons], "elapsed_s": round(self.elapsed_s, 2),
                "support": self.support.to_dict() if self.support is not None else None}

    def render_text(self) -> str:
        names = {"neuronx_distributed_inference": "NxDI", "neuronx_distributed": "NxD"}
        header = [self.support.render_text()] if self.support is not None else []
        lines = [*header, f"nxdi-gptoss-fp8 selfcheck (tp {self.tp})",
                 f"  package       {self.package['version']} at {self.package['path']} (files sha256 {self.package['files_sha256'][:16]})"]
        for module, info in self.environment.items():
            lines.append(f"  {names.get(module, module):<13} {info['version']} at {info['path']}")
        m = self.model
        lines.append(f"  model         tiny GPT-OSS: {plural(m['layers'], 'layer')}, {plural(m['experts'], 'expert')} (top {m['top_k']}), "
                     f"H {m['hidden_size']}, I {m['intermediate_size']}, vocab {m['vocab_size']}; {plural(m['tokens'], 'token')}: "
                     f"context {m['context']} + {plural(m['tokens'] - m['context'], 'token step')}")
        lines.append(f"  conversion    MXFP4 → FP8 {'exact' if self.conversion_exact else 'NOT exact'}")
        for c in self.comparisons:
            rule = "bit-identical" if c.bound == 0 else f"≤ {c.bound:g}"
            lines.append(f"  {c.name:<42} max |Δlogit| {c.max_abs_diff:.3e} ({rule}), top-1 {c.top1_agree}/{c.positions}  "
                         f"{'ok' if c.ok else 'MISMATCH'}")
        verdict = ("PASS: normalized FP8 checkpoints load through this package into the NxDI here and compute "
                   "what NxDI's own FP8 route and transformers compute" if self.ok
                   else "FAIL: a comparison above does not hold with the NxDI here")
        lines.append(f"  time          {self.elapsed_s:.1f} s")
        lines.append(f"selfcheck: {verdict}")
        return "\n".join(lines)


def package_identity() -> dict[str, str]:
    """This package's version, where it is imported from, and a SHA-256 over its files."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, not forward/
    digest = hashlib.sha256()
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(directory, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
    return {"version": __version__, "path": root, "files_sha256": digest.hexdigest()}


def _compare(name: str, checked: Any, reference: Any, bound: float) -> Comparison:
    import torch

    diff = float((checked - reference).abs().max())
    top1 = int((checked.argmax(-1) == reference.argmax(-1)).sum())
    positions = checked.shape[0]
    ok = bool(torch.equal(checked, reference)) if bound == 0 else diff <= bound and top1 == positions
    return Comparison(name, diff, bound, top1, positions, ok)


def selfcheck(tp: int = 1) -> SelfcheckReport:
    """Write the three checkpoints, run NxDI's model from each and transformers, compare.

    Raises ``CpuModelError`` when NxDI, NxD or transformers cannot be imported or NxDI's run
    fails. Example::

        report = selfcheck()
        print(report.render_text())
    """
    from ..convert import convert
    from ..synthetic.sources import SOURCE_DIMS, SOURCE_MXFP4, make_source, write_legacy_fp8
    from . import cpu_model
    from .reference import reference_logits

    cpu_model.require_nxdi()
    started = time.perf_counter()
    dims = SOURCE_DIMS
    plan = cpu_model.fixed_plan(dims.vocab_size, TOKENS, STEPS)
    model = {"layers": dims.num_hidden_layers, "experts": dims.num_local_experts, "top_k": dims.num_experts_per_tok,
             "hidden_size": dims.hidden_size, "intermediate_size": dims.intermediate_size,
             "vocab_size": dims.vocab_size, "tokens": len(plan.tokens), "context": plan.context}
    imported = cpu_model.environment()
    support = environment_report()
    for component, module in (("NxDI", cpu_model.NXDI), ("NxD", cpu_model.NXD)):  # a source tree on sys.path
        version = imported[module]["version"]
        from_source(support, component, None if version == "unknown" else version, imported[module]["path"])
    report = SelfcheckReport(tp, package_identity(), imported, model, support=support)
    with tempfile.TemporaryDirectory(prefix="nxdi-gptoss-fp8-selfcheck-") as work:
        hf = str(make_source(os.path.join(work, "hf"), SOURCE_MXFP4, dims=dims, original=False))
        normalized = os.path.join(work, "normalized")
        report.conversion_exact = convert(hf, normalized, max_shard_size="64KB", progress=False).exact
        legacy = str(write_legacy_fp8(os.path.join(work, "legacy"), normalized))
        specs = [cpu_model.RunSpec(normalized, cpu_model.ROUTE_NORMALIZED, allow_custom_model=True),
                 cpu_model.RunSpec(legacy, cpu_model.ROUTE_LEGACY),
                 cpu_model.RunSpec(hf, cpu_model.ROUTE_HF)]
        ours, theirs, hf_route = cpu_model.run_forwards(specs, plan, tp=tp)
        reference = reference_logits(hf, plan.tokens, plan.positions)
    report.comparisons = [
        _compare("NxDI normalized (hook) vs NxDI legacy FP8", ours, theirs, 0.0),
        _compare("NxDI normalized (hook) vs transformers", ours, reference, TRANSFORMERS_TOLERANCE),
        _compare("NxDI legacy FP8 vs transformers", theirs, reference, TRANSFORMERS_TOLERANCE),
        _compare("NxDI HF (MXFP4) vs transformers", hf_route, reference, TRANSFORMERS_TOLERANCE),
    ]
    report.elapsed_s = time.perf_counter() - started
    return report

