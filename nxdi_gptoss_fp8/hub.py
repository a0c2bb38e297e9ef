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
from .errors import ConversionError
from .recognize import SINGLE_FILE
from .safeio.files import not_regular_reason
from .safeio.json_file import MAX_JSON_FILE_BYTES, JsonFileError, read_json_file
from .units import plural

# the files beside the weights that NxDI's demo and tokenizers read; copied into the output
COMPANION_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
    "added_tokens.json",
)
SOURCE_CARD = "README.md"  # read for its license (the output gets its own card), never copied
METADATA_FILES = (fmt.CONFIG_FILE, fmt.INDEX_FILE, SOURCE_CARD, *COMPANION_FILES)
NEVER_FETCHED = ("original/*", "metal/*")
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


def _offline_setting() -> str | None:
    """``HF_HUB_OFFLINE``'s value when it turns downloads off, else None (huggingface_hub's own reading)."""
    try:
        from huggingface_hub import constants

        on = bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - huggingface_hub is there when this runs
        on = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return os.environ.get("HF_HUB_OFFLINE", "1") if on else None


def _cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover
        return "the Hub cache"


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def explain_hub_error(exc: BaseException, repo_id: str, revision: str | None) -> str:
    """What actually failed, from a huggingface_hub error and the cause it chains: downloads
    turned off (and by what), no network, not in the cache, a gated or private repo, a wrong
    revision, or an HTTP status. ``HF_HUB_OFFLINE`` is named only when it is set."""
    name = type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    cause_name = type(cause).__name__ if cause is not None else ""
    text = str(exc)
    asked = revision or "main"
    cache = _cache_dir()
    storage = os.path.join(cache, f"models--{repo_id.replace('/', '--')}")
    not_cached = (f"revision {asked} of it is not in the local Hub cache ({cache}), which holds other revisions"
                  if os.path.isdir(storage) else f"it is not in the local Hub cache ({cache})")
    offline = _offline_setting()
    if "Gated" in name or "Gated" in cause_name:
        return (f"{repo_id} is a gated repo: accept its terms on https://huggingface.co/{repo_id}, then log in "
                "(`hf auth login`) or set HF_TOKEN")
    if "RevisionNotFound" in name:
        return f"{repo_id} has no revision {asked!r}: check --revision (a branch, tag or full commit)"
    if "RepositoryNotFound" in name or "RepositoryNotFound" in cause_name:
        return (f"{repo_id} does not exist on the Hub, or is private and this token cannot see it: check the repo id; "
                "for a private repo log in (`hf auth login`) or set HF_TOKEN")
    status = _status(exc) or (_status(cause) if cause is not None else None)
    if status in (401, 403):
        return f"the Hub refused access to {repo_id} (HTTP {status}): log in (`hf auth login`) or set HF_TOKEN"
    if "LocalEntryNotFound" in name or "Offline" in name:
        if "OfflineModeIsEnabled" in cause_name or ("HF_HUB_OFFLINE" in text and offline is not None):
            return f"downloads are off (HF_HUB_OFFLINE={offline or '1'}) and {not_cached}: unset HF_HUB_OFFLINE to fetch it"
        if "local_files_only" in text or "outgoing traffic has been disabled" in text:
            if offline is not None:
                return f"downloads are off (HF_HUB_OFFLINE={offline}) and {not_cached}: unset HF_HUB_OFFLINE to fetch it"
            return f"{not_cached}, and this look-up was asked to use local files only"
        if status is not None and status >= 500:
            return f"the Hub answered HTTP {status} (try again later) and {not_cached}"
        reason = f" ({cause_name})" if cause_name else ""
        return f"the Hub could not be reached{reason}: no network, a proxy or a firewall; and {not_cached}"
    if "ConnectionError" in name or "Timeout" in name or "SSLError" in name or "ProxyError" in name:
        return f"the Hub could not be reached ({name}): check the network, proxy (HTTPS_PROXY) and certificates"
    if status is not None:
        return f"the Hub answered HTTP {status}"
    first = text.strip().splitlines()[0] if text.strip() else name
    return f"{name}: {first}"


def _fetch(download: Downloader, repo_id: str, revision: str | None, allow: list[str]) -> str:
    try:
        return os.fspath(download(repo_id=repo_id, revision=revision, allow_patterns=allow,
                                  ignore_patterns=list(NEVER_FETCHED)))
    except (OSError, ValueError) as exc:  # every huggingface_hub error (offline, not found, gated, HTTP) is one
        raise ConversionError(f"cannot fetch {repo_id}@{revision or 'main'} from the Hub: "
                              f"{explain_hub_error(exc, repo_id, revision)}") from None


def _read_index(root: str) -> Any:
    path = os.path.join(root, fmt.INDEX_FILE)
    try:
        return read_json_file(path, what=fmt.INDEX_FILE)
    except JsonFileError as exc:
        if isinstance(exc.cause, FileNotFoundError):
            return None
        if exc.not_read:
            raise ConversionError(f"cannot read {path}: {exc.cause}") from None
        if exc.oversized:
            raise ConversionError(f"{path} is larger than {MAX_JSON_FILE_BYTES:,} bytes: not a GPT-OSS index") from None
        raise ConversionError(f"{path} is not valid JSON ({exc.cause})") from None


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


FileSizes = Callable[[str, str | None, list[str]], dict[str, int]]


@dataclass(frozen=True)
class FetchPlan:
    """A repo id's small files fetched (config, index, companions) and what the second fetch
    would bring: the shards the index lists, each with its size and whether the local cache
    already holds it."""

    spec: str
    repo_id: str
    revision: str | None
    commit: str | None
    metadata_path: str  # the snapshot holding config.json and the index
    shards: tuple[str, ...]
    sizes: Mapping[str, int | None]  # shard → bytes (None: unknown)
    cached: Mapping[str, bool]  # shard → already in the local cache

    @property
    def download_dir(self) -> str:
        """Where the shards land: the repo's blob store in the cache (beside ``snapshots/``)."""
        storage = os.path.dirname(os.path.dirname(os.path.normpath(self.metadata_path)))
        blobs = os.path.join(storage, "blobs")
        return blobs if os.path.isdir(blobs) else self.metadata_path


def hub_file_sizes(repo_id: str, revision: str | None, paths: list[str]) -> dict[str, int]:
    """Sizes of ``paths`` in the repo from the Hub's metadata API (no download)."""
    from huggingface_hub import HfApi

    try:
        infos = HfApi().get_paths_info(repo_id, paths, revision=revision)
    except (OSError, ValueError) as exc:
        raise ConversionError(f"cannot read the file sizes of {repo_id} from the Hub: "
                              f"{explain_hub_error(exc, repo_id, revision)}") from None
    return {info.path: int(info.size) for info in infos if isinstance(getattr(info, "size", None), int)}


def plan_fetch(spec: str, *, revision: str | None = None, download: Downloader | None = None,
               file_sizes: FileSizes | None = None) -> FetchPlan:
    """Fetch a repo id's config, index and companions (small) and plan the shard fetch: the
    listed shards, their sizes from the local cache or, for those it lacks, the Hub's metadata
    (``file_sizes``, default ``hub_file_sizes``; unknown when that fails, e.g. offline)."""
    download = download or _snapshot_download()
    first = _fetch(download, spec, revision, list(METADATA_FILES))
    commit = os.path.basename(os.path.normpath(first))
    commit = commit if _COMMIT.match(commit) else None
    shards = tuple(listed_shards(first) or [SINGLE_FILE])
    sizes: dict[str, int | None] = {}
    cached: dict[str, bool] = {}
    for shard in shards:
        path = os.path.join(first, shard)
        cached[shard] = os.path.isfile(path)
        sizes[shard] = os.stat(path).st_size if cached[shard] else None
    missing = [shard for shard in shards if not cached[shard]]
    if missing:
        try:
            known = (file_sizes or hub_file_sizes)(spec, commit or revision, missing)
        except ConversionError:
            known = {}
        sizes.update({shard: known.get(shard) for shard in missing})
    return FetchPlan(spec=spec, repo_id=spec, revision=revision, commit=commit, metadata_path=first,
                     shards=shards, sizes=sizes, cached=cached)


def fetch_planned(plan: FetchPlan, *, download: Downloader | None = None) -> ResolvedSource:
    """The second fetch of ``plan`` (pinned to the commit the first resolved)."""
    download = download or _snapshot_download()
    snapshot = _fetch(download, plan.repo_id, plan.commit or plan.revision, [*METADATA_FILES, *plan.shards])
    return ResolvedSource(spec=plan.spec, path=snapshot, repo_id=plan.repo_id, revision=plan.revision,
                          commit=plan.commit)


def resolve_source(spec: str | os.PathLike[str], *, revision: str | None = None,
                   download: Downloader | None = None,
                   before_shards: Callable[[FetchPlan], None] | None = None,
                   file_sizes: FileSizes | None = None) -> ResolvedSource:
    """A local directory as is, or a Hub repo id fetched (config and index first, then the
    listed shards) into huggingface_hub's cache.

    ``download`` replaces ``huggingface_hub.snapshot_download`` (same keyword arguments);
    ``before_shards`` sees the ``FetchPlan`` between the two fetches (and may raise to stop
    before the shards move); raises ``ConversionError`` with one line for anything that cannot be used.
    """
    text = os.fspath(spec)
    if os.path.lexists(text):
        if revision is not None:
            raise ConversionError(f"--revision applies to a Hub repo id, but {text} is a local path")
        return ResolvedSource(spec=text, path=text)
    if not is_repo_id(text):
        raise ConversionError(f"{text} does not exist: it is not a directory, nor a Hub repo id like openai/gpt-oss-120b")
    download = download or _snapshot_download()
    plan = plan_fetch(text, revision=revision, download=download,
                      file_sizes=file_sizes if before_shards is not None else (lambda *_: {}))
    if before_shards is not None:
        before_shards(plan)
    return fetch_planned(plan, download=download)


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


__all__ = ["COMPANION_FILES", "NEVER_FETCHED", "FetchPlan", "ResolvedSource", "companion_files", "explain_hub_error",
           "explain_read_error", "fetch_planned", "hub_checkpoint", "hub_file_sizes", "is_repo_id", "listed_shards",
           "plan_fetch", "recorded_revision", "resolve_source", "split_revision"]


# --------------------------------------------------------------------------- a checkpoint judged on the Hub

_REPO_AT = re.compile(r"^(?P<repo>[^@\s]+)@(?P<revision>[^@\s]+)$")


def split_revision(spec: str, revision: str | None) -> tuple[str, str | None]:
    """``REPO_ID@REVISION`` split in two (``--revision`` may not name another one); other text as it is."""
    match = _REPO_AT.match(spec)
    if match is None or not is_repo_id(match["repo"]):
        return spec, revision
    if revision is not None and revision != match["revision"]:
        raise ConversionError(f"{spec} names revision {match['revision']} and --revision names {revision}: give one")
    return match["repo"], match["revision"]


def explain_read_error(exc: BaseException, repo_id: str, revision: str | None) -> str:
    """``explain_hub_error``, plus what reading a repo without downloading it meets: a timeout,
    rate limiting (429, with the retry time), a file missing at the commit, and huggingface_hub
    2.x's transport errors (httpx's, not ``OSError``)."""
    name = type(exc).__name__
    status = _status(exc)
    if status == 429:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        retry = headers.get("Retry-After") or headers.get("RateLimit-Reset")
        when = f"retry after {retry} s" if retry else "retry later"
        return f"the Hub is rate-limiting this client (HTTP 429): {when}; a token (HF_TOKEN) gets a higher limit"
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return f"the Hub did not answer in time ({name}): check the network and proxy (HTTPS_PROXY), then retry"
    if "EntryNotFound" in name or (status == 404 and "RepositoryNotFound" not in name and "RevisionNotFound" not in name):
        return f"a file is not in {repo_id} at revision {revision or 'main'} (HTTP 404): check the repo id and revision"
    if name in ("ConnectError", "NetworkError", "ProxyError", "RemoteProtocolError", "ReadError", "WriteError"):
        return f"the Hub could not be reached ({name}): check the network, proxy (HTTPS_PROXY) and certificates"
    return explain_hub_error(exc, repo_id, revision)


def hub_checkpoint(repo_id: str, revision: str | None = None, *, timeout: float | None = None) -> Any:
    """A ``CheckpointReader`` of the Hub repo ``repo_id`` at ``revision`` (default ``main``), for
    the preflight: the revision resolved to its commit once, the file listing of that commit read,
    no weight downloaded (``safeio.hub_reader.HubReader``). With ``HF_HUB_OFFLINE`` set, the local
    Hub cache's snapshot of that revision when it holds every shard (a ``LocalReader``).

    Raises ``HubAccessError`` (one line) when the repo cannot be read, ``MissingDependencyError``
    without huggingface_hub."""
    from .deps import missing
    from .errors import HubAccessError
    from .safeio.hub_reader import HUB_TIMEOUT_S, HubEntry, HubReader, bounded_call, hub_errors

    try:
        from huggingface_hub import HfApi, constants
    except ImportError:
        raise missing("huggingface_hub", "reading a Hub repo id (pip install 'nxdi-gptoss-fp8[hub]')") from None
    limit = HUB_TIMEOUT_S if timeout is None else timeout
    if _offline_setting() is not None:
        return _cached_checkpoint(repo_id, revision)
    api = HfApi(endpoint=constants.ENDPOINT)
    asked = revision or "main"

    def explain(exc: BaseException) -> str:
        return explain_read_error(exc, repo_id, revision)

    try:
        commit = bounded_call(lambda: api.model_info(repo_id, revision=asked, timeout=limit).sha, limit,
                              "the revision look-up")
        if not isinstance(commit, str) or not _COMMIT.match(commit):
            raise HubAccessError(f"cannot read {repo_id}@{asked} from the Hub: it named no commit for the revision")
        tree = bounded_call(lambda: list(api.list_repo_tree(repo_id, revision=commit, recursive=True)), limit,
                            "the file listing")
    except hub_errors() as exc:
        raise HubAccessError(f"cannot read {repo_id}@{asked} from the Hub: {explain(exc)}") from None
    entries = [HubEntry(item.path, int(getattr(item, "size", 0) or 0), not hasattr(item, "size")) for item in tree]
    return HubReader(repo_id, commit, entries, endpoint=constants.ENDPOINT, explain=explain, revision=revision,
                     timeout=limit)


def _cached_checkpoint(repo_id: str, revision: str | None) -> Any:
    """The local Hub cache's snapshot of ``repo_id`` at ``revision`` when downloads are off, as a
    ``LocalReader`` (its files are links into the repo's ``blobs/``); ``HubAccessError`` when the
    cache does not hold that revision or lacks a shard its index lists."""
    from .errors import HubAccessError
    from .safeio.reader import LocalReader

    asked = revision or "main"
    off = f"downloads are off (HF_HUB_OFFLINE={_offline_setting()})"
    try:
        snapshot = _snapshot_download()(repo_id=repo_id, revision=revision, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise HubAccessError(f"cannot read {repo_id}@{asked}: {explain_hub_error(exc, repo_id, revision)}") from None
    except ConversionError as exc:
        raise HubAccessError(str(exc)) from None
    snapshot = os.fspath(snapshot)
    try:
        shards = listed_shards(snapshot)
    except ConversionError:
        shards = None  # the preflight's index findings say why
    absent = [shard for shard in shards or [] if not os.path.exists(os.path.join(snapshot, shard))]
    if absent or not os.path.exists(os.path.join(snapshot, fmt.CONFIG_FILE)):
        what = f"{len(absent)} of its {plural(len(shards or []), 'shard')} ({absent[0]}, …)" if absent else fmt.CONFIG_FILE
        raise HubAccessError(f"cannot read {repo_id}@{asked}: {off} and the local Hub cache lacks {what} of it: "
                             "unset HF_HUB_OFFLINE to judge it on the Hub")
    storage = os.path.dirname(os.path.dirname(os.path.normpath(snapshot)))
    return LocalReader(snapshot, links_into=os.path.join(storage, "blobs"))
