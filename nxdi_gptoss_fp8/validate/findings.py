"""Findings as data: what a check found, where, how bad, and how to fix it.

A ``PreflightReport`` accumulates every finding of one run and derives success from them; the
text and JSON renderings are two views of the same report (the CLI and the NxDI hook both use
them). Stdlib only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import PreflightError
from ..units import format_duration, plural, printable

if TYPE_CHECKING:
    from .binding import CheckedCheckpoint
    from .view import CheckpointView

__all__ = [
    "CHECKS", "DAMAGE_CODES", "GROUP_AFTER", "MAX_FINDINGS_PER_CODE", "Finding", "PreflightReport", "Severity",
    "damaged_shards",
]


class Severity(str, Enum):
    """How a finding affects the verdict: only errors make a checkpoint invalid."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


# The check categories (docs/format.md, Findings by check), in the order the preflight runs them.
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
    "presharded",
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
        return printable(f"{self.severity.value.upper()} {self.code}{location}: {self.message}")


# Findings stored per code; beyond it they are only counted (``PreflightReport.omitted``), so
# an index of millions of phantom keys costs counters, not millions of objects.
MAX_FINDINGS_PER_CODE = 10_000


@dataclass
class PreflightReport:
    """Every finding of one preflight run, plus what the run measured.

    At most ``MAX_FINDINGS_PER_CODE`` findings of one code are stored; the rest are counted in
    ``omitted`` (code → count), and every count the report gives stays exact.
    """

    path: str
    findings: list[Finding] = field(default_factory=list)
    profile: str | None = None
    target: str | None = None  # the conversion target the index records (metadata.target), if any
    bytes_read: int = 0
    elapsed_s: float = 0.0
    shards: int = 0
    tensors: int = 0
    # What was deliberately left unchecked (e.g. "scale values" with headers only): a partial verdict.
    not_checked: list[str] = field(default_factory=list)
    # What the checks learned, bound to the directory, options, config and files they checked;
    # set only by preflight(), and the only thing the loader maps from.
    checked: CheckedCheckpoint | None = field(default=None, repr=False, compare=False)
    # code → findings beyond MAX_FINDINGS_PER_CODE, counted but not stored
    omitted: dict[str, int] = field(default_factory=dict)
    _stored: Counter[str] = field(default_factory=Counter, repr=False, compare=False)
    _omitted_errors: Counter[str] = field(default_factory=Counter, repr=False, compare=False)
    _omitted_warnings: int = field(default=0, repr=False, compare=False)

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
        code = f"{check}.{reason}"
        if self._stored[code] >= MAX_FINDINGS_PER_CODE:
            self.add_omitted(check, reason, 1, severity=severity)
            return
        self._stored[code] += 1
        self.findings.append(Finding(check, code, severity, message, file, key))

    def add_omitted(self, check: str, reason: str, count: int, *, severity: Severity = Severity.ERROR) -> None:
        """Count ``count`` more findings of this code without storing them (bulk checks)."""
        if count <= 0:
            return
        code = f"{check}.{reason}"
        self.omitted[code] = self.omitted.get(code, 0) + count
        if severity is Severity.ERROR:
            self._omitted_errors[code] += count
        elif severity is Severity.WARNING:
            self._omitted_warnings += count

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

    @property
    def hint(self) -> str | None:
        """For a refused directory that is another kind of checkpoint (HF, compressed-tensors,
        legacy, pre-sharded weights, a compiled NxDI model directory): ``inspect``'s one-line
        verdict and action, which ``validate`` and ``doctor`` print first; else None. The
        directory is recognized once, when first asked."""
        if self.ok or self.view is None:
            return None
        from .foreign import refused_recognition

        recognition = refused_recognition(self.view)
        return recognition.hint() if recognition is not None else None

    def codes(self) -> list[str]:
        """The codes of the stored findings (see ``omitted`` for those only counted)."""
        return [f.code for f in self.findings]

    @property
    def error_count(self) -> int:
        """Every error found, stored or only counted."""
        return len(self.errors) + sum(self._omitted_errors.values())

    @property
    def warning_count(self) -> int:
        """Every warning found, stored or only counted."""
        return len(self.warnings) + self._omitted_warnings

    def summary(self) -> dict[str, Any]:
        by_check = Counter(f.check for f in self.errors)
        for code, count in self._omitted_errors.items():
            by_check[code.split(".", 1)[0]] += count
        return {
            "errors": self.error_count,
            "warnings": self.warning_count,
            "info": len(self.findings) + sum(self.omitted.values()) - self.error_count - self.warning_count,
            "errors_by_check": {check: by_check[check] for check in CHECKS if by_check[check]},
            "shards": self.shards,
            "tensors": self.tensors,
            "profile": self.profile,
            **({"target": self.target} if self.target is not None else {}),
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
            # code → findings beyond MAX_FINDINGS_PER_CODE, counted not stored (only when any)
            **({"omitted": dict(self.omitted)} if self.omitted else {}),
            "hint": self.hint,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render_text(self, *, limit: int | None = None, summarize: bool = True) -> str:
        """A readable verdict: the findings (errors first), then a summary line.

        With ``summarize`` (the default), a shard that looks damaged gets one line instead of
        the findings that follow from it (``damaged_shards``), and more than ``GROUP_AFTER``
        findings of one code in one file become one line with their count and the first keys.
        ``limit`` caps the lines shown; the cap line names ``--all``, which shows everything.
        """
        ordered = sorted(self.findings, key=lambda f: (list(Severity).index(f.severity), CHECKS.index(f.check)))
        lines = _summarized_lines(ordered, damaged_shards(self.findings)) if summarize else [f.render() for f in ordered]
        shown = lines if limit is None else lines[:limit]
        hidden = len(lines) - len(shown)
        if hidden:
            shown.append(f"... and {plural(hidden, 'more line')} (--all lists every finding, --json gives them as data)")
        elif summarize and len(lines) < len(ordered):
            shown.append("(similar findings summarized: --all lists every one)")
        shown.extend(f"... and {plural(count, 'more ' + code + ' finding')} (counted, not stored)" for code, count in sorted(self.omitted.items()))
        if not self.clean:
            verdict = "INVALID:"
        elif not self.complete:
            verdict = f"PARTIAL (headers only): no errors in what was checked; not checked: {', '.join(self.not_checked)};"
        else:
            verdict = "VALID:"
        shown.append(
            f"{verdict} {self.path}: {plural(self.error_count, 'error')}, {plural(self.warning_count, 'warning')}; "
            f"{plural(self.shards, 'shard')}, {plural(self.tensors, 'tensor')}, profile {self.profile or 'unknown'}"
            f"{f', target {self.target}' if self.target is not None else ''}; "
            f"read {plural(self.bytes_read, 'byte')} in {format_duration(self.elapsed_s)}"
        )
        return "\n".join(map(printable, shown))

    def raise_if_failed(self) -> PreflightReport:
        """Raise ``PreflightError`` listing every finding when the run found errors.

        A clean partial report does not raise (it found nothing wrong), but it is not ``ok``
        and the loader refuses it."""
        if not self.clean:
            raise PreflightError(self)
        return self


# Header findings that mean the bytes of a shard are not what was written: a damaged or
# half-copied file rather than a writer's mistake.
DAMAGE_CODES = frozenset({
    "header.not_utf8", "header.invalid_json", "header.too_short", "header.header_beyond_file",
    "header.data_beyond_file", "header.bad_offsets",
})
# More findings than this of one code in one file are summarized in one line.
GROUP_AFTER = 3
_EXAMPLES = 3


def damaged_shards(findings: Sequence[Finding]) -> dict[str, Finding]:
    """Shards that look corrupted or half-copied, each with the finding that shows it: a header
    that is not UTF-8 JSON or does not fit the file, or tensor names that differ from the
    index's for that shard (names the index assigns to it missing, and names it holds unlisted)."""
    damaged: dict[str, Finding] = {}
    by_file: dict[str, set[str]] = {}
    for finding in findings:
        if finding.file is None:
            continue
        by_file.setdefault(finding.file, set()).add(finding.code)
        if finding.code in DAMAGE_CODES:
            damaged.setdefault(finding.file, finding)
    for file, codes in by_file.items():
        if file not in damaged and {"ownership.key_not_in_shard", "ownership.unlisted_key"} <= codes:
            damaged[file] = next(f for f in findings if f.file == file and f.code == "ownership.unlisted_key")
    return damaged


def _summarized_lines(ordered: Sequence[Finding], damaged: dict[str, Finding]) -> list[str]:
    groups: dict[tuple[Severity, str, str | None], list[Finding]] = {}
    lines: list[str] = []
    for finding in ordered:
        if finding.file in damaged and finding.severity is Severity.ERROR:
            groups.setdefault((Severity.ERROR, "damaged", finding.file), []).append(finding)
        else:
            groups.setdefault((finding.severity, finding.code, finding.file), []).append(finding)
    for (severity, code, file), members in groups.items():
        first = members[0]
        if code == "damaged" and file is not None:
            cause = damaged[file]
            why = "its tensor names differ from the index's" if cause.code.startswith("ownership.") else cause.message
            why = why.removeprefix(f"{file}: ").removesuffix(" (truncated or half-copied file)")
            count = f"; {plural(len(members), 'finding')} in this shard" if len(members) > 1 else ""
            lines.append(
                f"ERROR {cause.code} [{file}]: {file} looks corrupted or half-copied ({why}{count}): copy it "
                "again from the source, then run validate --verify-checksums"
            )
        elif len(members) > GROUP_AFTER:
            keys = [m.key for m in members if m.key]
            examples = ", ".join(keys[:_EXAMPLES]) + (", ..." if len(keys) > _EXAMPLES else "")
            where = f" [{file}]" if file else ""
            lines.append(
                f"{severity.value.upper()} {code}{where}: {len(members):,} times ({examples}); the first: {first.message}"
            )
        else:
            lines.extend(m.render() for m in members)
    return lines
