"""A checkpoint judged on the Hub without downloading it: the same preflight as a local directory
(every corpus case gives the same codes), every read pinned to one commit, the index's digests
against the LFS records at zero bytes, and each way of failing to read the Hub one line, exit 2.

A real HTTP server on 127.0.0.1 (``hub_server``) speaks the Hub's protocol; the real
huggingface_hub client talks to it (``HF_ENDPOINT``), whichever major version is installed."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus import CASES, Options
from hub_server import Fault, HubServer, Repo, endpoint_settings

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.errors import HubAccessError
from nxdi_gptoss_fp8.safeio import hub_reader
from nxdi_gptoss_fp8.validate.pipeline import preflight

hub = pytest.importorskip("nxdi_gptoss_fp8.hub")
pytest.importorskip("huggingface_hub")

COMMIT = "c0ffee" + "0" * 34
REPO_ID = "test-org/gpt-oss-tiny-fp8"

# cases a Hub repo cannot hold: no directory, a link, a FIFO or a directory where a file should
# be, a file name that is not UTF-8; and the deep scan, which needs every weight byte
LOCAL_ONLY = {
    "missing_directory", "path_is_a_file", "symlinked_shard_outside", "shard_is_a_directory", "stray_pt_non_utf8_name",
    "config_link_outside_directory", "index_link_outside_directory", "config_dangling_link",
    "shard_is_a_link_to_another_listed_shard", "shard_is_a_link_into_a_subdirectory", "shard_is_a_link_to_dev_zero",
    "config_is_a_fifo", "index_is_a_fifo", "shard_is_a_fifo", "config_is_a_directory",
}
HUB_CASES = [entry.name for entry in CASES if entry.name not in LOCAL_ONLY and not entry.name.startswith("deep_")]


@pytest.fixture(scope="module")
def server() -> Iterator[HubServer]:
    with HubServer({}, max_requests=50_000) as running:
        yield running


@pytest.fixture(autouse=True)
def hub_endpoint(server: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HubServer:
    """huggingface_hub pointed at the test server (the environment, and the constants it read at
    import), a private cache, downloads on, no token."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-home"
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for target, name, value in endpoint_settings(server.endpoint):
        monkeypatch.setattr(target, name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True, raising=False)
    monkeypatch.setattr(hub_reader, "HUB_TIMEOUT_S", 3.0)
    server.fault = None
    server.reset_counts()
    return server


@pytest.fixture
def published(server: HubServer, tiny_template: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint published as ``REPO_ID`` (branch main and tag v1 at ``COMMIT``)."""
    root = Path(shutil.copytree(tiny_template, tmp_path / "repo"))
    server.repos[REPO_ID] = Repo(root, COMMIT, branches=("main", "v1"))
    return root


def _repo_requests(server: HubServer) -> list[tuple[str, str, str | None]]:
    """The requests about repos (huggingface_hub 2.x also asks the Hub about other things)."""
    return [request for request in server.requests if request[1].startswith("/api/models/") or "/resolve/" in request[1]]


def _codes(report: Any) -> list[tuple[str, str, str | None, str | None]]:
    """The findings as (code, severity, file without the repo prefix, key), sorted."""
    prefix = f"{report.path}:"
    return sorted((f.code, f.severity.value, f.file.removeprefix(prefix) if f.file else None, f.key)
                  for f in report.findings)


# --------------------------------------------------------------------------- the same preflight


@pytest.mark.parametrize("name", HUB_CASES)
def test_a_repo_gets_the_codes_its_directory_gets(built: Callable[[str], tuple[Path, Options]], server: HubServer,
                                                    name: str) -> None:
    """Every corpus case a Hub repo can hold (a corrupted header, a missing scale, an index naming
    a missing shard, a digest mismatch, ...): the repo's report has the local report's codes,
    severities, files, keys and verdict."""
    path, options = built(name)
    assert path.is_dir() and not any(p.is_symlink() or not (p.is_file() or p.is_dir()) for p in path.rglob("*"))
    server.repos[f"corpus/{name}"] = Repo(path, COMMIT)
    local = preflight(path, **options)
    remote = preflight(hub.hub_checkpoint(f"corpus/{name}"), **options)
    assert remote.path == f"corpus/{name}@{COMMIT}"
    assert _codes(remote) == _codes(local)
    assert (remote.ok, remote.complete, remote.error_count) == (local.ok, local.complete, local.error_count)
    assert all(f.file.startswith(f"corpus/{name}@{COMMIT}:") for f in remote.findings if f.file)


def test_the_corpus_cases_left_out_are_the_ones_a_repo_cannot_hold() -> None:
    names = {entry.name for entry in CASES}
    assert names >= LOCAL_ONLY
    assert len(HUB_CASES) > 230


# --------------------------------------------------------------------------- one commit, few bytes


def test_validate_repo_id_pins_every_read_to_the_commit(published: Path, server: HubServer,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", REPO_ID, "--json", "--allow-custom-model"])
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert code == 0 and document["ok"] and document["path"] == f"{REPO_ID}@{COMMIT}"
    assert f"commit {COMMIT}" in err and "no weights downloaded" in err
    first, *rest = _repo_requests(server)
    assert first[1] == f"/api/models/{REPO_ID}/revision/main"
    assert rest and all(COMMIT in path for _, path, _ in rest)
    shards = [p for p in published.glob("*.safetensors")]
    fetched = [(path, ranged) for method, path, ranged in rest if "/resolve/" in path]
    assert all(ranged and ranged.startswith("bytes=") for _, ranged in fetched)
    assert {Path(path).name for path, _ in fetched} >= {p.name for p in shards}
    # every shard's header first (from byte 0), then the scales
    reads = [ranged.startswith("bytes=0-") for path, ranged in fetched if path.endswith(".safetensors")]
    assert reads == [True] * len(shards) + [False] * (len(reads) - len(shards)) and len(reads) > len(shards)


def test_revision_and_the_at_form_name_the_same_commit(published: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["validate", f"{REPO_ID}@v1"], ["validate", REPO_ID, "--revision", "v1"]):
        assert main([*argv, "--json", "--allow-custom-model"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["path"] == f"{REPO_ID}@{COMMIT}" and "revision v1" in err
    assert main(["validate", f"{REPO_ID}@v1", "--revision", "main", "--allow-custom-model"]) == 2
    assert "give one" in capsys.readouterr().err


def test_bytes_read_are_the_headers_and_scales(published: Path, server: HubServer) -> None:
    reader = hub.hub_checkpoint(REPO_ID)
    report = preflight(reader, allow_custom_model=True)
    assert report.ok
    scale_bytes = sum(info.nbytes for header in report.view.headers.values() for key, info in header.tensors.items()
                      if fmt.is_expert_scale(key))
    header_bytes = sum(header.bytes_read for header in report.view.headers.values())
    json_bytes = sum(identity.size for identity, _ in report.view.json_files.values())
    assert report.bytes_read == header_bytes + scale_bytes + json_bytes
    # what the reader counts is what the server sent for its range requests
    assert reader.requests == sum("/resolve/" in path for _, path, _ in _repo_requests(server))
    assert report.bytes_read <= reader.bytes_fetched <= server.bytes_sent


def test_a_moved_branch_cannot_mix_two_revisions(published: Path, server: HubServer) -> None:
    """Once resolved, the reader reads the commit, not the branch: moving main changes nothing."""
    reader = hub.hub_checkpoint(REPO_ID)
    server.repos[REPO_ID] = Repo(published, "f" * 40, branches=("main",))  # main moved; the old commit is gone
    with pytest.raises(HubAccessError, match="revision"):
        preflight(reader, allow_custom_model=True)
    assert not any("/resolve/main/" in path for _, path, _ in _repo_requests(server))


# --------------------------------------------------------------------------- digests at zero bytes


def test_verify_checksums_compares_the_lfs_records_without_reading_a_shard(published: Path, server: HubServer) -> None:
    index = json.loads((published / fmt.INDEX_FILE).read_text())
    shard = sorted(index["metadata"]["shard_sha256"])[1]
    index["metadata"]["shard_sha256"][shard] = "0" * 64
    (published / fmt.INDEX_FILE).write_text(json.dumps(index))
    report = preflight(hub.hub_checkpoint(REPO_ID), allow_custom_model=True, verify_checksums=True)
    (mismatch,) = [f for f in report.errors if f.code == "integrity.digest_mismatch"]
    assert mismatch.file == f"{REPO_ID}@{COMMIT}:{shard}" and shard in mismatch.message
    assert any("paths-info" in path for _, path, _ in _repo_requests(server))
    largest = max(p.stat().st_size for p in published.glob("*.safetensors"))
    assert all(not ranged or int(ranged.split("-")[1]) < largest for _, _, ranged in _repo_requests(server))


def test_deep_on_a_repo_id_says_it_needs_the_weights(published: Path, server: HubServer,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", REPO_ID, "--deep", "--allow-custom-model"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "download" in err and "--deep" in err
    assert _repo_requests(server) == []
    with pytest.raises(HubAccessError, match="download"):
        preflight(hub.hub_checkpoint(REPO_ID), deep=True, allow_custom_model=True)


# --------------------------------------------------------------------------- which checkpoint


def test_a_local_directory_of_the_same_name_wins(published: Path, server: HubServer, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(published, tmp_path / REPO_ID)
    assert main(["validate", REPO_ID, "--json", "--allow-custom-model"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["path"] == REPO_ID and "the local directory" in err
    assert _repo_requests(server) == []


def test_inspect_a_repo_id(published: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", REPO_ID, "--json", "--allow-custom-model"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] and document["path"] == f"{REPO_ID}@{COMMIT}" and len(document["shards"]) == 4


# --------------------------------------------------------------------------- failing to read the Hub


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    before = set(Path.cwd().iterdir())
    code = main(argv)
    captured = capsys.readouterr()
    # the error is one line (after, at most, the line saying which checkpoint was asked for)
    lines = [line for line in captured.err.splitlines() if not line.startswith("validate ")]
    assert code == 2 and not captured.out, captured
    assert len(lines) == 1 and all(word in lines[0] for word in words), captured.err
    line = lines[0]
    assert set(Path.cwd().iterdir()) == before  # nothing written
    return line


@pytest.mark.parametrize(("fault", "words"), [
    (Fault("/api/models/", 401), ("hf auth login", "HF_TOKEN")),
    (Fault("/api/models/", 403, "GatedRepo"), ("gated", "hf auth login")),
    (Fault("/api/models/", 429, headers={"Retry-After": "37"}), ("429", "retry after 37 s")),
    (Fault("config.json", 404, "EntryNotFound"), ("404",)),
    (Fault("resolve", 403), ("403", "HF_TOKEN")),
    (Fault("resolve", 503), ("503",)),
], ids=["401", "403-gated", "429", "404-file", "403-file", "503"])
def test_a_refused_request_is_one_line_exit_2(published: Path, server: HubServer, fault: Fault,
                                              words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    server.fault = fault
    _fails(["validate", REPO_ID, "--allow-custom-model"], capsys, *words)


def test_a_missing_repo_or_revision_is_one_line_exit_2(published: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(["validate", "test-org/no-such-repo"], capsys, "does not exist")
    _fails(["validate", REPO_ID, "--revision", "no-such-branch"], capsys, "no-such-branch", "--revision")


def test_an_unreachable_hub_is_one_line_exit_2(published: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import socket


    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for target, name, value in endpoint_settings(closed):
        monkeypatch.setattr(target, name, value)
    _fails(["validate", REPO_ID], capsys, "could not be reached")


def test_a_hub_that_does_not_answer_times_out(published: Path, server: HubServer, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import time

    monkeypatch.setattr(hub_reader, "HUB_TIMEOUT_S", 0.5)
    server.fault = Fault("/tree/", delay=2.0)
    started = time.monotonic()
    _fails(["validate", REPO_ID], capsys, "did not answer in time")
    assert time.monotonic() - started < 2.0
    server.fault = Fault("safetensors", delay=2.0)  # a range request, under its own timeout
    _fails(["validate", REPO_ID, "--allow-custom-model"], capsys, "did not answer in time")


def _cache_snapshot(cache: Path, source: Path, *, shards: bool) -> None:
    """``source`` laid out in the Hub cache as huggingface_hub lays a download out: blobs, a
    snapshot of links to them, refs/main."""
    storage = cache / f"models--{REPO_ID.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(COMMIT)
    snapshot = storage / "snapshots" / COMMIT
    (storage / "blobs").mkdir()
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.suffix == ".safetensors" and not shards:
            continue
        blob = storage / "blobs" / f"blob-{path.name}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))


@pytest.mark.parametrize("shards", [True, False], ids=["cached", "metadata-only"])
def test_offline_judges_the_cache_or_says_it_cannot(published: Path, server: HubServer, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, shards: bool,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _cache_snapshot(tmp_path / "hf-home" / "hub", published, shards=shards)
    if shards:
        assert main(["validate", REPO_ID, "--json", "--allow-custom-model"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["ok"] and "HF_HUB_OFFLINE" in err and COMMIT in err
    else:
        _fails(["validate", REPO_ID, "--allow-custom-model"], capsys, "HF_HUB_OFFLINE", "lacks")
    _fails(["validate", "test-org/never-downloaded"], capsys, "HF_HUB_OFFLINE")
    assert _repo_requests(server) == []


def test_only_small_metadata_lands_in_the_hub_cache(published: Path, tmp_path: Path) -> None:
    preflight(hub.hub_checkpoint(REPO_ID), allow_custom_model=True, verify_checksums=True)
    cache = tmp_path / "hf-home"
    landed = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert sum(p.stat().st_size for p in landed) < 64 * 1024


def test_doctor_judges_the_repo_vllm_would_download(published: Path, server: HubServer,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``doctor -- vllm serve REPO_ID``: the start is refused (vLLM would re-save a Hub id), and
    the repo's checkpoint gets the preflight's findings, read on the Hub at vLLM's --revision."""
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "1")
    config = json.loads((published / fmt.CONFIG_FILE).read_text())
    (published / fmt.CONFIG_FILE).write_text(json.dumps({**config, "model_type": "llama"}))
    main(["doctor", "--json", "--", "vllm", "serve", REPO_ID, "--revision", "v1"])
    document = json.loads(capsys.readouterr().out)
    codes = {finding["code"] for finding in document["findings"]}
    assert {"config.wrong_model_type"} <= codes and any("hub_id" in code for code in codes), codes
    assert any(path == f"/api/models/{REPO_ID}/revision/v1" for _, path, _ in _repo_requests(server))


def test_a_hub_error_is_the_json_error_document_with_json(published: Path, server: HubServer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    server.fault = Fault("/api/models/", 429, headers={"Retry-After": "5"})
    assert main(["validate", REPO_ID, "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["exit_code"] == 2
    assert document["error"]["kind"] == "hub" and "retry after 5 s" in document["error"]["message"]
