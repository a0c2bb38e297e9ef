"""Fuzz targets and their invariants, shared by ``test_fuzz.py`` (bounded, in CI) and
``scripts/fuzz_preflight.py`` (long campaigns).

A target takes one mutated file of a small valid checkpoint, runs the header reader or the
whole preflight on it, and raises ``InvariantViolation`` when the result breaks a promise:

1. only our outcomes: ``read_header`` returns a header or raises ``HeaderError``; ``preflight``
   never raises and every finding has a known check, code and severity;
2. termination and bounded memory are enforced by the caller (deadline, rlimit);
3. never ``ok`` for a semantic change: if the preflight reports ok, then
   - with ``verify_checksums``, every shard is byte-identical to the original;
   - without it, every shard's header, re-read, declares the same tensor names with the same
     dtypes and shapes. What may differ: JSON spelling (whitespace, key order, escapes), the
     free-form ``__metadata__``, and which byte range each tensor owns (ranges of equal-size
     tensors swapped, or a shard laid out in another order): no header-only check can see
     that, the digests can;
   - the index parses to the original document, except ``metadata.source`` (informational)
     and, without ``verify_checksums``, the digest values of ``metadata.shard_sha256``;
   - ``config.json`` has the original model type, architecture, quant method (or none: the
     format allows leaving ``quantization_config`` out) and the
     dimensions that shape a tensor (in a custom profile, experts per token and the sliding
     window shape none and nothing else records them: another value is another valid model).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.safeio.safetensors_header import HeaderError, SafetensorsHeader, read_header
from nxdi_gptoss_fp8.validate.findings import CHECKS, Severity
from nxdi_gptoss_fp8.validate.pipeline import preflight

# Small enough that a shard is a few kilobytes (the mutations land in headers often).
MICRO_DIMS = fmt.ModelDims(
    num_hidden_layers=1, num_local_experts=2, hidden_size=32, intermediate_size=32,
    head_dim=8, num_attention_heads=2, num_key_value_heads=1, vocab_size=16,
    num_experts_per_tok=1, sliding_window=4,
)
MICRO_MAX_SHARD_SIZE = 4_000
CONFIG_FIELDS = ("model_type", "architectures")
# ModelDims fields that no tensor shape depends on (free in a custom profile)
SHAPELESS_DIMS = ("num_experts_per_tok", "sliding_window")


class InvariantViolation(AssertionError):
    """A fuzz input broke one of the promises listed in this module's docstring."""


def header_semantics(header: SafetensorsHeader) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What a header declares that a header-only check can verify: each tensor's dtype and
    shape (spelling, ``__metadata__`` and the byte ranges aside: see the module docstring)."""
    return {name: (t.dtype, t.shape) for name, t in header.tensors.items()}


def _index_semantics(document: Any, *, with_digests: bool) -> Any:
    if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
        return document
    metadata = dict(document["metadata"])
    metadata.pop("source", None)
    if not with_digests and isinstance(metadata.get("shard_sha256"), dict):
        metadata["shard_sha256"] = sorted(metadata["shard_sha256"])
    return {**document, "metadata": metadata}


def _config_semantics(document: Any) -> Any:
    if not isinstance(document, dict):
        return document
    try:
        dims: Any = fmt.dims_from_config(document).as_dict()
        for name in SHAPELESS_DIMS:
            dims.pop(name)
    except fmt.ConfigFieldError as exc:
        dims = str(exc)
    quant = document.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if "quantization_config" not in document:  # the format allows leaving it out
        method = fmt.QUANT_METHOD
    return dims, [document.get(name) for name in CONFIG_FIELDS], method


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


@dataclass
class FuzzBase:
    """A pristine small checkpoint, its files' bytes, and a work copy the targets mutate."""

    pristine: Path
    work: Path
    files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = field(default_factory=dict)

    @classmethod
    def create(cls, root: str | os.PathLike[str]) -> FuzzBase:
        """Write the micro checkpoint under ``root`` (needs torch) and a work copy beside it."""
        from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

        root = Path(root)
        pristine = Path(make_tiny(root / "pristine", dims=MICRO_DIMS, max_shard_size=MICRO_MAX_SHARD_SIZE))
        return cls.from_checkpoint(pristine, root / "work")

    @classmethod
    def from_checkpoint(cls, pristine: Path, work: Path) -> FuzzBase:
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(pristine, work)
        base = cls(pristine=pristine, work=work)
        for entry in sorted(os.listdir(pristine)):
            base.files[entry] = (pristine / entry).read_bytes()
            if entry.endswith(".safetensors"):
                base.headers[entry] = header_semantics(read_header(pristine / entry))
        report = preflight(work, allow_custom_model=True, verify_checksums=True)
        if not report.ok:
            raise RuntimeError(f"the fuzz base checkpoint is invalid:\n{report.render_text()}")
        return base

    @property
    def scratch(self) -> Path:
        """A directory beside the work copy for inputs that are not part of the checkpoint."""
        path = self.work.parent / "scratch"
        path.mkdir(exist_ok=True)
        return path

    @property
    def names(self) -> list[str]:
        return sorted(self.files)

    @property
    def shards(self) -> list[str]:
        return sorted(self.headers)

    def put(self, name: str, content: bytes) -> Path:
        path = self.work / name
        path.write_bytes(content)
        return path

    def restore(self, name: str) -> None:
        (self.work / name).write_bytes(self.files[name])


def run_header_reader(path: Path) -> str:
    """Read one (mutated) shard header; return the outcome code."""
    try:
        header = read_header(path)
    except HeaderError as exc:
        if not isinstance(exc.code, str) or not exc.code:
            raise InvariantViolation(f"HeaderError without a code: {exc!r}") from None
        return exc.code
    size = os.path.getsize(path)
    position = 0
    for info in sorted(header.tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position or info.dtype not in fmt.DTYPE_BITS:
            raise InvariantViolation(f"accepted header with a gap/overlap or bad dtype at {info.name!r}")
        position = info.end
    if header.data_offset + position != size:
        raise InvariantViolation(f"accepted header that covers {position} of {size - header.data_offset} data bytes")
    return "ok"


def run_preflight(base: FuzzBase, name: str, content: bytes, *, deep: bool = False,
                  verify_checksums: bool = False) -> str:
    """Replace file ``name`` of the work copy by ``content``, run the whole preflight, check
    the invariants, restore the file. Returns ``"ok"`` or the first error code."""
    base.put(name, content)
    try:
        try:
            report = preflight(base.work, allow_custom_model=True, deep=deep, verify_checksums=verify_checksums)
        except Exception as exc:
            raise InvariantViolation(f"preflight raised {type(exc).__name__}: {exc}") from exc
        for finding in report.findings:
            if finding.check not in CHECKS or not isinstance(finding.severity, Severity):
                raise InvariantViolation(f"malformed finding {finding!r}")
            finding.render()
        report.render_text()
        report.to_json()
        if report.ok:
            _check_ok_is_semantic_noop(base, name, content, verify_checksums=verify_checksums)
            return "ok"
        return report.errors[0].code
    finally:
        base.restore(name)


def _check_ok_is_semantic_noop(base: FuzzBase, name: str, content: bytes, *, verify_checksums: bool) -> None:
    original = base.files[name]
    if content == original:
        return
    if name in base.headers:
        if verify_checksums:
            raise InvariantViolation(f"{name} changed but passed --verify-checksums")
        try:
            mutated = header_semantics(read_header(base.work / name))
        except HeaderError as exc:
            raise InvariantViolation(f"preflight ok but {name}'s header does not parse: {exc}") from None
        if mutated != base.headers[name]:
            raise InvariantViolation(f"preflight ok although {name}'s header means something else")
    elif name == fmt.INDEX_FILE:
        before = _index_semantics(_loads(original), with_digests=verify_checksums)
        after = _index_semantics(_loads(content), with_digests=verify_checksums)
        if before != after:
            raise InvariantViolation("preflight ok although the index means something else")
    elif name == fmt.CONFIG_FILE and _config_semantics(_loads(original)) != _config_semantics(_loads(content)):
        raise InvariantViolation("preflight ok although config.json's checked fields changed")


# ----------------------------------------------------------------------------- mutations


def flip_bit(data: bytes, bit: int) -> bytes:
    if not data:
        return data
    bit %= 8 * len(data)
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def truncate(data: bytes, length: int) -> bytes:
    return data[: max(0, min(length, len(data) - 1))]


def insert(data: bytes, position: int, chunk: bytes) -> bytes:
    position = min(max(position, 0), len(data))
    return data[:position] + chunk + data[position:]


def overwrite(data: bytes, position: int, chunk: bytes) -> bytes:
    position = min(max(position, 0), len(data))
    return data[:position] + chunk + data[position + len(chunk):]


def header_end(data: bytes) -> int:
    """End of the header in a shard's bytes (prefix + JSON), or the file length if unreadable."""
    if len(data) < 8:
        return len(data)
    return min(len(data), 8 + int.from_bytes(data[:8], "little"))
