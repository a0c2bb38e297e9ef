"""What the preflight learned about a directory, shared by the check families (and the loader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import format as fmt
from ..safeio.files import FileIdentity
from ..safeio.reader import CheckpointReader, LocalReader
from ..safeio.safetensors_header import SafetensorsHeader, TensorInfo

__all__ = ["CheckpointView"]


@dataclass
class CheckpointView:
    """What the preflight learned about a directory, shared by the checks (and the loader)."""

    root: str
    config: dict[str, Any] | None = None
    index: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_map: dict[str, str] = field(default_factory=dict)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    broken_shards: set[str] = field(default_factory=set)
    dims: fmt.ModelDims | None = None
    layout: fmt.Layout | None = None
    # tensor name → the shards whose headers hold it (more than one is a collision)
    locations: dict[str, list[str]] = field(default_factory=dict)
    # config.json / index → (identity of the file read, SHA-256 of its bytes): bound into the report
    json_files: dict[str, tuple[FileIdentity, str]] = field(default_factory=dict)
    # what ``recognize`` says the directory is, once asked (``foreign_recognition``)
    recognition: Any = None
    _namespace: tuple[fmt.Layout, dict[str, fmt.TensorSpec]] | None = field(default=None, repr=False, compare=False)
    # where the files are read from: the directory ``root`` on disk unless given (a Hub repo)
    reader: CheckpointReader = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = LocalReader(self.root)

    def expected(self) -> dict[str, fmt.TensorSpec] | None:
        """``fmt.expected_namespace(self.layout)``, derived once per layout (several checks and the
        deep scan walk it; do not modify it), or None without a layout."""
        if self.layout is None:
            return None
        if self._namespace is None or self._namespace[0] is not self.layout:
            self._namespace = (self.layout, fmt.expected_namespace(self.layout))
        return self._namespace[1]

    def tensor(self, key: str) -> tuple[str, TensorInfo] | None:
        """Where ``key`` physically is: the shard the index names if it holds it, else any."""
        shards = self.locations.get(key, [])
        if not shards:
            return None
        shard = self.weight_map.get(key)
        if shard not in shards:
            shard = shards[0]
        return shard, self.headers[shard].tensors[key]
