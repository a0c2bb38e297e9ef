"""What ``verify-conversion`` reports: a row per layer (values compared, exact, inexact, flushed,
violations, the worst relative error), the first problems found, the verdict, and the per-layer
table it prints (data: the checks that fill it are ``verify``, the bound it states ``verify_values``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..units import plural
from .verify_values import BOUND_TEXT

__all__ = ["MAX_PROBLEMS", "LayerRow", "VerificationReport"]

MAX_PROBLEMS = 20


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
    max_rel_error: float = 0.0  # among the inexact values stored non-zero
    flushed: int = 0  # inexact values stored as 0 (their relative error is 1 by definition)


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
        header = (f"{'layer':>6} {'tensors':>8} {'mismatch':>8} {'fp8 values':>12} {'exact':>12} {'inexact':>9} "
                  f"{'flushed':>8} {'violations':>10} {'max rel err':>11}")
        lines = [f"verify {self.out} against {self.source} ({self.source_format or 'unknown'})", header]
        for row in self.rows:
            lines.append(
                f"{row.layer:>6} {row.tensors:>8} {row.tensor_mismatches:>8} {row.values:>12} {row.exact:>12} "
                f"{row.inexact:>9} {row.flushed:>8} {row.violations:>10} {row.max_rel_error:>11.3g}"
            )
        lines.append(f"bound: {self.bound}")
        if any(row.flushed for row in self.rows):
            lines.append("flushed: inexact source values stored as 0 (too small for E4M3 at their channel's scale); "
                         "max rel err is over the other inexact values")
        lines += [f"  problem: {message}" for message in self.problems]
        hidden = self.violations - len(self.problems)
        if not self.ok and hidden > 0:
            lines.append(f"  … and {hidden} more violating values or tensors")
        lines.append("OK: every value within its bound" if self.ok else f"FAILED: {plural(self.violations, 'violation')}")
        return "\n".join(lines)
