"""``inspect``: which checkpoint a directory is (``recognize``) and, for a normalized one, a
readable summary (shards, tensors, bytes by dtype, profile, padding) built from the same
preflight run that ``validate`` uses, with the first findings when it is invalid. Stdlib only."""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import format as fmt
from . import recognize as rz
from .padding import TARGETS
from .safeio.reader import CheckpointReader
from .units import format_bytes, plural, printable
from .validate.findings import PreflightReport
from .validate.pipeline import preflight
from .validate.view import CheckpointView

__all__ = [
    "COMPANIONS", "INSPECT_FINDINGS_LIMIT", "CheckpointSummary", "Companion", "Inspection", "ShardSummary",
    "companion_groups", "compiled_verdict_summary", "custom_profile_action", "inspect_checkpoint", "inspect_directory", "validate_command",
]

INSPECT_FINDINGS_LIMIT = 10


@dataclass
class ShardSummary:
    name: str
    file_size: int
    tensors: int
    tensor_bytes: int


# the files beside the weights, in groups: (what, file names, need). Any one file of a group is enough;
# the chat template may also live in tokenizer_config.json's "chat_template".
COMPANIONS = (
    ("tokenizer", ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"),
     "required: a server (vLLM, NxDI's demo) loads the tokenizer from the model directory"),
    ("chat template", ("chat_template.jinja", "chat_template.json"),
     "required for chat requests (vLLM's /v1/chat/completions): GPT-OSS expects its harmony template"),
    ("generation config", ("generation_config.json",),
     "recommended: stop tokens and sampling defaults (the end-of-turn tokens of the chat format)"),
    ("model card", ("README.md",), "not needed to serve: what the Hub shows (written by convert)"),
)


@dataclass
class Companion:
    """One group of companion files: which of its files are present, and whether a server needs it."""

    what: str
    present: list[str]
    need: str

    @property
    def required(self) -> bool:
        return self.need.startswith("required")


def companion_groups(root: str | os.PathLike[str] | CheckpointReader) -> list[Companion]:
    """Which tokenizer, chat-template, generation-config and card files ``root`` holds (regular
    files only; a remote reader's by its listing), by group, for the ``inspect`` summary
    (``hub.companion_files`` is the name → path map of what a conversion copies)."""
    if isinstance(root, CheckpointReader) and not root.local:
        listed = set(root.listing())
        return [Companion(what, [name for name in names if name in listed], need) for what, names, need in COMPANIONS]
    directory = os.fspath(root.root if isinstance(root, CheckpointReader) else root)

    def regular(name: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(os.path.join(directory, name)).st_mode)
        except OSError:
            return False

    found = []
    for what, names, need in COMPANIONS:
        present = [name for name in names if regular(name)]
        if what == "chat template" and not present and _has_chat_template(os.path.join(directory, "tokenizer_config.json")):
            present = ["tokenizer_config.json (chat_template)"]
        found.append(Companion(what, present, need))
    return found


def _has_chat_template(path: str) -> bool:
    from .safeio.json_file import JsonFileError, read_json_file

    try:
        document = read_json_file(path, what="tokenizer_config.json", max_bytes=8 << 20)
    except (JsonFileError, ValueError):  # absent, not a regular file, above 8 MiB, not JSON, a NUL in the path: no template
        return False
    return isinstance(document, dict) and isinstance(document.get("chat_template"), (str, list))


@dataclass
class CheckpointSummary:
    report: PreflightReport
    allow_custom_model: bool = False
    shards: list[ShardSummary] = field(default_factory=list)
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    tensors_by_dtype: dict[str, int] = field(default_factory=dict)
    dims: dict[str, int] | None = None
    padding: dict[str, list[int]] | None = None
    target: str | None = None  # the conversion target the index records (metadata.target), if any
    companions: list[Companion] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "companions": [{**vars(c), "required": c.required} for c in self.companions],
            "path": self.report.path,
            "ok": self.report.ok,
            "profile": self.report.profile,
            "dims": self.dims,
            "padding": self.padding,
            "target": self.target,
            "shards": [vars(s) for s in self.shards],
            "tensors_by_dtype": self.tensors_by_dtype,
            "bytes_by_dtype": self.bytes_by_dtype,
            "total_tensor_bytes": sum(self.bytes_by_dtype.values()),
            "summary": self.report.summary(),
        }

    def render_text(self) -> str:
        lines = [f"checkpoint  {self.report.path}", f"profile     {self.report.profile or 'unknown'}"]
        if self.dims:
            lines.append("dims        " + ", ".join(f"{k}={v}" for k, v in self.dims.items()))
        if self.padding:
            lines.append("padding     " + ", ".join(
                f"{name} {base} -> {padded}" + ("" if base == padded else f" (+{padded - base})")
                for name, (base, padded) in self.padding.items()))
        if self.target is not None:
            known = TARGETS.get(self.target)
            lines.append(f"target      {self.target}" + ("" if known else " (unknown to this package)"))
        total_file = sum(s.file_size for s in self.shards)
        lines.append(f"shards      {plural(len(self.shards), 'file')}, {_human(total_file)} on disk")
        for shard in self.shards:
            lines.append(f"  {shard.name:<40} {shard.tensors:>6} tensor{'s' if shard.tensors != 1 else ' '} {_human(shard.tensor_bytes):>11}")
        lines.append(f"tensors     {sum(self.tensors_by_dtype.values())}")
        for dtype, size in sorted(self.bytes_by_dtype.items(), key=lambda item: -item[1]):
            lines.append(f"  {dtype:<8} {self.tensors_by_dtype[dtype]:>6} tensor{'s' if self.tensors_by_dtype[dtype] != 1 else ' '} {_human(size):>11}")
        if self.companions:
            lines.append("companions")
            for c in self.companions:
                state = ", ".join(c.present) if c.present else ("MISSING" if c.required else "absent")
                lines.append(f"  {c.what:<18} {state}  ({c.need})")
        lines.append(f"verdict     {'VALID' if self.report.ok else 'INVALID'}")
        if not self.report.ok:
            lines.extend(self.report.render_text(limit=INSPECT_FINDINGS_LIMIT).split("\n"))
            lines.append(f"run `{validate_command(self.report.path, self.report.profile)}` for every finding and its fix")
        return "\n".join(map(printable, lines))


def validate_command(path: str, profile: str | None) -> str:
    """The ``validate`` command that checks ``path`` as it is: with ``--allow-custom-model``
    for a custom profile (without it, such a checkpoint is refused by design)."""
    return f"nxdi-gptoss-fp8 validate {path}" + (" --allow-custom-model" if profile == fmt.PROFILE_CUSTOM else "")


def custom_profile_action(path: str) -> str:
    """What to do with a valid custom-profile checkpoint: every command needs the opt-in."""
    return (f"CHECKPOINT_FORMAT=normalized_fp8 with {fmt.ALLOW_CUSTOM_ENV}=1 loads it (a custom profile is loaded "
            f"only on request; check it first: `{validate_command(path, fmt.PROFILE_CUSTOM)}`)")


def _human(size: int) -> str:
    return format_bytes(size)  # decimal, as everywhere in the CLI


def inspect_checkpoint(path: str | os.PathLike[str] | CheckpointReader, *,
                       allow_custom_model: bool = False) -> CheckpointSummary:
    """Summarize ``path`` from one preflight run; works on invalid checkpoints too.

    ``allow_custom_model`` is the same opt-in as ``preflight``'s (so the verdict is ``validate``'s).
    """
    report = preflight(path, allow_custom_model=allow_custom_model)
    view: CheckpointView = report.view
    summary = CheckpointSummary(report=report, allow_custom_model=allow_custom_model)
    by_bytes: Counter[str] = Counter()
    by_count: Counter[str] = Counter()
    for name, header in sorted(view.headers.items()):
        tensor_bytes = sum(info.nbytes for info in header.tensors.values())
        summary.shards.append(ShardSummary(name, header.identity.size, len(header.tensors), tensor_bytes))
        for info in header.tensors.values():
            by_bytes[info.dtype] += info.nbytes
            by_count[info.dtype] += 1
    summary.bytes_by_dtype, summary.tensors_by_dtype = dict(by_bytes), dict(by_count)
    summary.companions = companion_groups(path)
    target = view.metadata.get("target") if isinstance(view.metadata, dict) else None
    summary.target = target if isinstance(target, str) else None
    if view.dims is not None:
        summary.dims = view.dims.as_dict()
    if view.layout is not None:
        summary.padding = {
            "hidden": [view.dims.hidden_size, view.layout.padded_hidden_size],  # type: ignore[union-attr]
            "intermediate": [view.dims.intermediate_size, view.layout.padded_intermediate_size],  # type: ignore[union-attr]
        }
    return summary


@dataclass
class Inspection:
    """What ``inspect`` found: the recognition, and the summary when the directory is normalized."""

    recognition: rz.Recognition
    summary: CheckpointSummary | None = None
    presharded: dict[str, Any] | None = None  # a compiled directory's pre-sharded weights (manifest)
    compiled: dict[str, Any] | None = None  # a compiled directory's verdict: validate COMPILED's (ok, hint, codes)

    @property
    def ok(self) -> bool:
        """What ``validate``'s ``ok`` says: a valid normalized checkpoint (False for any other kind)."""
        return self.summary is not None and self.summary.report.ok

    @property
    def known(self) -> bool:
        """A directory of a kind this tool recognizes, with nothing refused (what ``ok`` meant
        in 0.2: an HF checkpoint is known, not ok)."""
        return self.recognition.known and not self.recognition.refused

    @property
    def succeeded(self) -> bool:
        """The exit status of ``inspect``: a known directory, and a valid one if it is normalized
        or compiled (then exactly when ``validate COMPILED`` passes)."""
        if self.compiled is not None and not self.compiled["ok"]:
            return False
        return self.known and (self.ok if self.recognition.kind == rz.NORMALIZED else True)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"path": self.recognition.path, "ok": self.ok, "known": self.known,
                                "recognized": self.recognition.to_dict()}
        if self.summary is not None:
            data.update(self.summary.to_dict())
            data["ok"] = self.ok
            data["findings"] = [finding.to_dict() for finding in self.summary.report.findings]
        if self.presharded is not None:
            data["presharded"] = self.presharded
        if self.compiled is not None:
            data["compiled"] = self.compiled
        return data

    def render_text(self) -> str:
        text = self.recognition.render_text()
        if self.presharded is not None:
            text = "\n".join([text, *map(printable, _presharded_lines(self.recognition.path, self.presharded))])
        if self.compiled is not None:
            text = "\n".join([text, printable(f"verdict     {'VALID' if self.compiled['ok'] else 'INVALID'}: {self.compiled['hint']}")])
        if self.summary is None:
            return text
        lines = self.summary.render_text().splitlines()
        return "\n".join([text, *lines[1:]])  # the path is already on the first line


def _presharded_lines(path: str, presharded: dict[str, Any]) -> list[str]:
    manifest = presharded["manifest"]
    if manifest is None:
        return [f"weights     {presharded['problem']}"]
    settings = ", ".join(f"{key}={value}" for key, value in manifest["settings"].items()
                         if key not in ("tp_degree", "world_size"))
    return [
        f"weights     {rz.PRESHARDED_DIR}/: {plural(presharded['rank_files'], 'rank file')}, manifest written {manifest['written_at']} "
        f"by nxdi-gptoss-fp8 {manifest['package_version']}",
        f"            tp_degree {manifest['tp_degree']}, world_size {manifest['world_size']}, ranks {manifest['ranks']}, "
        f"{_human(manifest['bytes'])}",
        *(f"source      {source}" for source in manifest["sources"]),
        f"settings    {settings}",
        f"check       nxdi-gptoss-fp8 validate {path} (--verify-checksums hashes every rank file)",
    ]


def inspect_directory(path: str | os.PathLike[str] | CheckpointReader, *, allow_custom_model: bool = False) -> Inspection:
    """Recognize ``path``; for a normalized checkpoint also run the preflight and summarize it.

    Neither step blocks: both refuse a FIFO, socket, device or directory where config, index or
    a listed shard should be before opening it (the preflight reports it as a finding). A remote
    reader (a Hub repo) is summarized from the preflight alone (recognizing other kinds of
    checkpoint reads a directory on this machine).
    """
    if isinstance(path, CheckpointReader) and not path.local:
        return _inspect_remote(path, allow_custom_model=allow_custom_model)
    if isinstance(path, CheckpointReader):
        path = path.root
    recognition = rz.recognize(path)
    inspection = Inspection(recognition)
    if recognition.kind == rz.NORMALIZED:
        inspection.summary = inspect_checkpoint(path, allow_custom_model=allow_custom_model)
        if inspection.summary.report.profile == fmt.PROFILE_CUSTOM and recognition.actions:
            recognition.actions[0] = custom_profile_action(recognition.path)  # the command it names must pass
    elif recognition.kind == rz.COMPILED:
        from .validate.presharded import describe_presharded

        inspection.presharded = describe_presharded(os.fspath(path))
        inspection.compiled = compiled_verdict_summary(os.fspath(path))
    return inspection


def _inspect_remote(reader: CheckpointReader, *, allow_custom_model: bool) -> Inspection:
    """A remote checkpoint's summary, recognized as normalized by its index's ``format`` (else unknown)."""
    summary = inspect_checkpoint(reader, allow_custom_model=allow_custom_model)
    view = summary.report.view
    metadata = view.metadata if view is not None else {}
    normalized = metadata.get("format") == fmt.FORMAT_NAME
    recognition = rz.Recognition(path=reader.root, kind=rz.NORMALIZED if normalized else rz.UNKNOWN)
    if normalized:
        version = metadata.get("format_version")
        recognition.format_version = version if type(version) is int else None
        recognition.checkpoint_format = rz.CHECKPOINT_FORMATS[rz.NORMALIZED]
        recognition.evidence.append(f"{fmt.INDEX_FILE}: metadata.format = {fmt.FORMAT_NAME!r}, format_version = {version!r}")
        recognition.actions.append(f"download it, then CHECKPOINT_FORMAT=normalized_fp8 loads it "
                                   f"(`{validate_command(reader.root, summary.report.profile)}` checked it here)")
        return Inspection(recognition, summary)
    recognition.looked_for = list(rz.LOOKED_FOR[:1])
    recognition.notes.append("read over the Hub: only a normalized FP8 checkpoint is recognized without a download")
    return Inspection(recognition)


def compiled_verdict_summary(path: str) -> dict[str, Any]:
    """``validate COMPILED``'s verdict on ``path`` (its own ``neuron_config.json``): ``ok``,
    ``hint`` and the error ``codes``; a ``neuron_config.json`` that cannot be read is refused."""
    from .errors import ConfigError
    from .validate.nxdi_config import read_config_file
    from .validate.presharded import compiled_verdict, verdict_hint

    try:
        config = read_config_file(os.path.join(path, rz.NEURON_CONFIG_FILE), rz.NEURON_CONFIG_FILE)
    except ConfigError as exc:
        return {"ok": False, "hint": f"{path}: {exc}", "codes": ["neuron_config.unreadable"]}
    check = compiled_verdict(path, config)
    return {"ok": check is None or check.ok, "hint": verdict_hint(path, check),
            "codes": [] if check is None else [f.code for f in check.report.errors]}
