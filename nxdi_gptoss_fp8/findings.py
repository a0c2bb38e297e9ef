"""Findings as data: what a check found, where, how bad, and how to fix it.

A ``PreflightReport`` accumulates every finding of one run and derives success from them; the
text and JSON renderings are two views of the same report (the CLI and the NxDI hook both use
them). Stdlib only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .errors import PreflightError

if TYPE_CHECKING:
    from .binding import CheckedCheckpoint
    from .checks import CheckpointView


class Severity(str, Enum):
    """How a finding affects the verdict: only errors make a checkpoint invalid."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


# The check categories of the format's §6, in the order the preflight runs them.
CHECKS = (
    "filesystem",
    "index",
    "header",
    "ownership",
    "collision",
    "namespace",
    "dtype_shape",
    "sidecar",
    "values",
    "config",
    "neuron_config",
    "integrity",
)


@dataclass(frozen=True)
class Finding:
    """One problem (or note): ``code`` is stable (``check.reason``), ``message`` is for people."""

    check: str
    code: str
    severity: Severity
    message: str
    file: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"unknown check category {self.check!r}")
        if not self.code.startswith(self.check + "."):
            raise ValueError(f"finding code {self.code!r} must start with {self.check!r}.")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    def render(self) -> str:
        where = ":".join(part for part in (self.file, self.key) if part)
        location = f" [{where}]" if where else ""
        return f"{self.severity.value.upper()} {self.code}{location}: {self.message}"


@dataclass
class PreflightReport:
    """Every finding of one preflight run, plus what the run measured."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    profile: str | None = None
    bytes_read: int = 0
    elapsed_s: float = 0.0
    shards: int = 0
    tensors: int = 0
    # What was deliberately left unchecked (e.g. "scale values" with headers only): a partial verdict.
    not_checked: list[str] = field(default_factory=list)
    # What the checks learned, bound to the directory, options, config and files they checked;
    # set only by preflight(), and the only thing the loader maps from.
    checked: CheckedCheckpoint | None = field(default=None, repr=False, compare=False)

    @property
    def view(self) -> CheckpointView | None:
        """The preflight's view of the checkpoint (None for a report not made by ``preflight()``)."""
        return self.checked.view if self.checked is not None else None

    def add(
        self,
        check: str,
        reason: str,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        severity: Severity = Severity.ERROR,
    ) -> None:
        self.findings.append(Finding(check, f"{check}.{reason}", severity, message, file, key))

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    @property
    def clean(self) -> bool:
        """No errors in what was checked."""
        return not self.errors

    @property
    def complete(self) -> bool:
        """Everything a verdict covers was checked (not a headers-only run)."""
        return not self.not_checked

    @property
    def ok(self) -> bool:
        """The verdict: complete and clean. A partial run is never ok, however clean."""
        return self.clean and self.complete

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def summary(self) -> dict[str, Any]:
        by_check = Counter(f.check for f in self.errors)
        return {
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "info": len(self.findings) - len(self.errors) - len(self.warnings),
            "errors_by_check": {check: by_check[check] for check in CHECKS if by_check[check]},
            "shards": self.shards,
            "tensors": self.tensors,
            "profile": self.profile,
            "bytes_read": self.bytes_read,
            "elapsed_s": round(self.elapsed_s, 6),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "complete": self.complete,
            "not_checked": list(self.not_checked),
            "path": self.path,
            "summary": self.summary(),
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render_text(self, *, limit: int | None = None) -> str:
        """A readable verdict: one line per finding (errors first), then a summary line."""
        ordered = sorted(self.findings, key=lambda f: (list(Severity).index(f.severity), CHECKS.index(f.check)))
        shown = ordered if limit is None else ordered[:limit]
        lines = [f.render() for f in shown]
        if len(shown) < len(ordered):
            lines.append(f"... and {len(ordered) - len(shown)} more findings (use --json for all)")
        if not self.clean:
            verdict = "INVALID:"
        elif not self.complete:
            verdict = f"PARTIAL (headers only): no errors in what was checked; not checked: {', '.join(self.not_checked)};"
        else:
            verdict = "VALID:"
        lines.append(
            f"{verdict} {self.path}: {len(self.errors)} errors, {len(self.warnings)} warnings; "
            f"{self.shards} shards, {self.tensors} tensors, profile {self.profile or 'unknown'}; "
            f"read {self.bytes_read:,} bytes in {self.elapsed_s * 1000:.1f} ms"
        )
        return "\n".join(lines)

    def raise_if_failed(self) -> PreflightReport:
        """Raise ``PreflightError`` listing every finding when the run found errors.

        A clean partial report does not raise (it found nothing wrong), but it is not ``ok``
        and the loader refuses it."""
        if not self.clean:
            raise PreflightError(self)
        return self
