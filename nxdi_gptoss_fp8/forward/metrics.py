"""Per-position comparison of two sets of logits, and the bounds a forward check applies.

Two bounds, by what the checkpoint's weights are relative to the reference's:

* ``exact`` (an MXFP4 source converted by this package; selfcheck's identical weights): both
  sides compute the same function of the same float32 weights and differ only by the order of
  float32 operations. A reduction of n terms in float32 rounds to about sqrt(n)·u relative
  (u = 2^-24, rounding errors behave like a random walk); each decoder layer feeds its output
  through a chain of such reductions over the hidden size H (norm, attention, router, experts,
  residual) and the head adds one more. Allowing 16 roundings of that size per stage:

      max |Δlogit| ≤ 16 · u · (K + 1) · sqrt(H) · max(1, max |reference logit|)

  (tiny model H = 64, K = 2: 2.3e-5; H = 2880, K = 2: 1.5e-4). The top-1 token must also agree
  wherever the reference's best two logits are further apart than twice that bound. A swapped,
  transposed or mis-scaled expert moves logits by orders of magnitude more.
* ``quantized`` (a BF16 source: FP8-E4M3 keeps 3 mantissa bits): round-to-nearest leaves each
  expert weight a relative error uniform in ±2^-4 (RMS 2^-4/sqrt(3) ≈ 3.6 %), so each layer's
  expert output moves by about that much relative; after K layers the logit vector's relative
  error δ stays below 2·K·2^-4/sqrt(3) (a factor 2 of margin), i.e. a cosine similarity of at
  least 1 − δ²/2, floored at 0.9 (K = 1: 0.9974, K = 2: 0.9896). KL and top-1 agreement are
  reported, not bounded: FP8 may flip near-ties.

Requires torch (imported by the functions).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "E4M3_RELATIVE_RMS", "EXACT", "MIN_QUANTIZED_COSINE", "QUANTIZED", "ROUNDINGS_PER_STAGE", "UNIT_ROUNDOFF",
    "Bound", "PositionMetrics", "bound_for", "compare", "exact_tolerance", "quantized_min_cosine", "summarize",
]

EXACT, QUANTIZED = "exact", "quantized"
UNIT_ROUNDOFF = 2.0 ** -24  # float32
ROUNDINGS_PER_STAGE = 16
E4M3_RELATIVE_RMS = 2.0 ** -4 / math.sqrt(3.0)
MIN_QUANTIZED_COSINE = 0.9


@dataclass(frozen=True)
class PositionMetrics:
    """How one position's logits compare with the reference's."""

    position: int
    max_abs_diff: float
    cosine: float
    top1_agree: bool
    kl: float  # KL(reference ‖ checked) of the softmax distributions, in nats
    ok: bool


@dataclass(frozen=True)
class Bound:
    """The bound applied, with the reason it has this value."""

    kind: str
    max_abs_diff: float | None
    min_cosine: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exact_tolerance(hidden_size: int, layers: int, reference_scale: float) -> float:
    """The float32-rounding bound on |Δlogit| for ``layers`` decoder layers of width ``hidden_size``."""
    return ROUNDINGS_PER_STAGE * UNIT_ROUNDOFF * (layers + 1) * math.sqrt(hidden_size) * max(1.0, reference_scale)


def quantized_min_cosine(layers: int) -> float:
    """The smallest cosine similarity FP8-E4M3 rounding of the experts of ``layers`` layers explains."""
    delta = 2.0 * layers * E4M3_RELATIVE_RMS
    return max(MIN_QUANTIZED_COSINE, 1.0 - delta * delta / 2.0)


def bound_for(kind: str, *, hidden_size: int, layers: int, reference: Any) -> Bound:
    """The bound of ``kind`` (``exact`` or ``quantized``) for a K-layer model and its reference logits."""
    if kind == EXACT:
        scale = float(reference.abs().max())
        tol = exact_tolerance(hidden_size, layers, scale)
        return Bound(EXACT, tol, None, f"float32 rounding: 16·2^-24·(K+1)·sqrt(H)·max(1, max|logit|) with K={layers}, "
                                       f"H={hidden_size}, max|logit|={scale:.3g}")
    if kind == QUANTIZED:
        cos = quantized_min_cosine(layers)
        return Bound(QUANTIZED, None, cos, f"FP8-E4M3 rounding of BF16 experts: cosine ≥ 1 − (2·K·2^-4/√3)²/2 "
                                           f"(floor {MIN_QUANTIZED_COSINE}) with K={layers}")
    raise ValueError(f"unknown bound kind {kind!r}")


def compare(checked: Any, reference: Any, positions: range, bound: Bound) -> list[PositionMetrics]:
    """Per-position metrics of ``checked`` against ``reference`` (both float [P, V]) under ``bound``."""
    import torch

    if checked.shape != reference.shape:
        raise ValueError(f"logits shapes differ: {list(checked.shape)} vs {list(reference.shape)}")
    a, b = checked.double(), reference.double()
    out = []
    for row, position in enumerate(positions):
        x, y = a[row], b[row]
        diff = float((x - y).abs().max())
        cosine = float(torch.nn.functional.cosine_similarity(x, y, dim=0))
        top1 = bool(int(x.argmax()) == int(y.argmax()))
        log_p, log_q = torch.log_softmax(y, dim=0), torch.log_softmax(x, dim=0)
        kl = float((log_p.exp() * (log_p - log_q)).sum().clamp_min(0.0))
        if bound.kind == EXACT:
            assert bound.max_abs_diff is not None
            best = torch.topk(y, 2).values if y.numel() > 1 else y
            decisive = y.numel() < 2 or float(best[0] - best[1]) > 2 * bound.max_abs_diff
            ok = diff <= bound.max_abs_diff and (top1 or not decisive)
        else:
            assert bound.min_cosine is not None
            ok = cosine >= bound.min_cosine
        ok = ok and math.isfinite(diff)
        out.append(PositionMetrics(position, diff, cosine, top1, kl, ok))
    return out


def summarize(metrics: list[PositionMetrics]) -> dict[str, Any]:
    """Worst values over the positions: max diff, min cosine, top-1 agreement rate, max KL."""
    return {
        "positions": len(metrics),
        "max_abs_diff": max((m.max_abs_diff for m in metrics), default=0.0),
        "min_cosine": min((m.cosine for m in metrics), default=1.0),
        "top1_agreement": sum(m.top1_agree for m in metrics) / len(metrics) if metrics else 1.0,
        "max_kl": max((m.kl for m in metrics), default=0.0),
        "violations": sum(not m.ok for m in metrics),
    }
