"""Conversion sources named by a Hugging Face Hub repo id (``openai/gpt-oss-120b``).

``resolve_source`` tells a local path from a repo id (an existing path always wins; an
``org/name`` that does not exist locally is a repo id) and, for a repo id, fetches through
``huggingface_hub.snapshot_download`` only what the conversion reads: ``config.json``, the
index, then exactly the shards that index lists, plus the tokenizer and generation-config files
that make the output a complete model directory. Never ``original/`` or ``metal/`` (the
published 120b repo is 196 GB; its HF set about 65 GB). The cache, ``HF_HOME``,
``HF_HUB_OFFLINE`` and tokens are huggingface_hub's own business: nothing here overrides them.
The second fetch pins the commit the first one resolved, so a branch that moves in between
cannot mix two revisions; that commit is recorded in the output's ``source`` provenance.

huggingface_hub is imported only when a repo id is resolved. Stdlib otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import format as fmt
from .errors import ConversionError, NotRegularFileError
from .files import not_regular_reason, open_regular
from .strict_json import JsonError, parse_json_strict

# the files beside the weights that NxDI's demo and tokenizers read; copied into the output
COMPANION_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
    "added_tokens.json",
)
SINGLE_FILE = "model.safetensors"
SOURCE_CARD = "README.md"  # read for its license (the output gets its own card), never copied
METADATA_FILES = (fmt.CONFIG_FILE, fmt.INDEX_FILE, SOURCE_CARD, *COMPANION_FILES)
NEVER_FETCHED = ("original/*", "metal/*")
MAX_INDEX_BYTES = 64 * 1024 * 1024
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHARD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors$")

Downloader = Callable[..., str]


@dataclass(frozen=True)
class ResolvedSource:
    """Where a conversion source is on disk, and which Hub repo and commit it came from."""

    spec: str  # what the user gave
    path: str  # the local directory to read
    repo_id: str | None = None  # None: a local path
    revision: str | None = None  # the revision asked for (None: the default branch)
    commit: str | None = None  # the commit the Hub (or the offline cache) resolved it to

    @property
    def from_hub(self) -> bool:
        return self.repo_id is not None

    def describe(self) -> str:
        """One line saying which was used: the local directory, or the repo, revision and snapshot."""
        if not self.from_hub:
            return f"{self.spec}: local directory"
        asked = self.revision or "main (default branch)"
        return f"{self.spec}: Hub repo (no such local path), revision {asked} -> commit {self.commit or 'unknown'}; snapshot {self.path}"

    def provenance(self) -> dict[str, Any]:
        """What the output index's ``source`` metadata records about the Hub origin (empty if local)."""
        if not self.from_hub:
            return {}
        record: dict[str, Any] = {"repo": self.repo_id}
        if self.commit:
            record["revision"] = self.commit
        if self.revision and self.revision != self.commit:
            record["requested_revision"] = self.revision
        return record


def is_repo_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub repo id (``org/name``: one slash, no path syntax)."""
    return bool(_REPO_ID.match(text)) and ".." not in text and not text.endswith((".", "-"))


def _snapshot_download() -> Downloader:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConversionError(
            "a Hub repo id needs huggingface_hub: `pip install huggingface_hub`, or pass a local directory"
        ) from None
    return snapshot_download  # type: ignore[no-any-return]


def _fetch(download: Downloader, repo_id: str, revision: str | None, allow: list[str]) -> str:
    try:
        return os.fspath(download(repo_id=repo_id, revision=revision, allow_patterns=allow,
                                  ignore_patterns=list(NEVER_FETCHED)))
    except (OSError, ValueError) as exc:  # every huggingface_hub error (offline, not found, gated, HTTP) is one
        name = type(exc).__name__
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else name
        hint = ""
        if "Offline" in name or "LocalEntryNotFound" in name or "outgoing traffic" in message:
            hint = ": it is not in the local Hub cache (HF_HOME / HF_HUB_CACHE) and downloads are off (HF_HUB_OFFLINE)"
        elif "Gated" in name or "401" in message or "403" in message:
            hint = ": log in (`hf auth login`) or set HF_TOKEN with access to the repo"
        elif "RepositoryNotFound" in name or "RevisionNotFound" in name:
            hint = ": check the repo id and --revision"
        raise ConversionError(f"cannot fetch {repo_id}@{revision or 'main'} from the Hub ({name}: {message}){hint}") from None


def _read_index(root: str) -> Any:
    path = os.path.join(root, fmt.INDEX_FILE)
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_INDEX_BYTES + 1)
    except FileNotFoundError:
        return None
    except (NotRegularFileError, OSError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from None
    if len(raw) > MAX_INDEX_BYTES:
        raise ConversionError(f"{path} is larger than {MAX_INDEX_BYTES:,} bytes: not a GPT-OSS index")
    try:
        return parse_json_strict(raw.decode("utf-8"), what=fmt.INDEX_FILE)
    except (UnicodeDecodeError, JsonError) as exc:
        raise ConversionError(f"{path} is not valid JSON ({exc})") from None


def listed_shards(root: str) -> list[str] | None:
    """The shard files the top-level index of ``root`` lists (None when there is no index).

    Only plain ``*.safetensors`` names beside the index are accepted: a name with a path, a
    pattern character or another suffix would fetch or read something else.
    """
    index = _read_index(root)
    if index is None:
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(f"{os.path.join(root, fmt.INDEX_FILE)}: weight_map is missing or empty")
    shards = set()
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not _SHARD.match(shard):
            raise ConversionError(
                f"{os.path.join(root, fmt.INDEX_FILE)}: weight_map[{key!r}] is {shard!r}; only plain "
                "*.safetensors names beside the index are fetched"
            )
        shards.add(shard)
    return sorted(shards)


def resolve_source(spec: str | os.PathLike[str], *, revision: str | None = None,
                   download: Downloader | None = None) -> ResolvedSource:
    """A local directory as is, or a Hub repo id fetched (config and index first, then the
    listed shards) into huggingface_hub's cache.

    ``download`` replaces ``huggingface_hub.snapshot_download`` (same keyword arguments);
    raises ``ConversionError`` with one line for anything that cannot be used.
    """
    text = os.fspath(spec)
    if os.path.lexists(text):
        if revision is not None:
            raise ConversionError(f"--revision applies to a Hub repo id, but {text} is a local path")
        return ResolvedSource(spec=text, path=text)
    if not is_repo_id(text):
        raise ConversionError(f"{text} does not exist: it is not a directory, nor a Hub repo id like openai/gpt-oss-120b")
    download = download or _snapshot_download()
    first = _fetch(download, text, revision, list(METADATA_FILES))
    commit = os.path.basename(os.path.normpath(first))
    commit = commit if _COMMIT.match(commit) else None
    shards = listed_shards(first)
    snapshot = _fetch(download, text, commit or revision, [*METADATA_FILES, *(shards or [SINGLE_FILE])])
    return ResolvedSource(spec=text, path=snapshot, repo_id=text, revision=revision, commit=commit)


def companion_files(root: str | os.PathLike[str]) -> dict[str, str]:
    """Name → path of the tokenizer and generation-config files present (as regular files) in
    ``root``: what the conversion copies so its output is a complete model directory."""
    found = {}
    for name in COMPANION_FILES:
        path = os.path.join(os.fspath(root), name)
        try:
            if not_regular_reason(path) is None:
                found[name] = path
        except OSError:
            continue
    return found


def recorded_revision(checkpoint: str | os.PathLike[str], repo_id: str) -> str | None:
    """The commit a converted checkpoint's index records for ``repo_id`` (its ``source``), if any."""
    try:
        index = _read_index(os.fspath(checkpoint))
    except ConversionError:
        return None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    source = metadata.get("source") if isinstance(metadata, dict) else None
    if not isinstance(source, Mapping) or source.get("repo") != repo_id:
        return None
    revision = source.get("revision")
    return revision if isinstance(revision, str) and _COMMIT.match(revision) else None


__all__ = ["COMPANION_FILES", "NEVER_FETCHED", "ResolvedSource", "companion_files", "is_repo_id", "listed_shards",
           "recorded_revision", "resolve_source"]
