"""Hub repo ids as conversion sources: local paths win, only what the conversion reads is
fetched (never original/ or metal/), the resolved commit is recorded, tokenizer and generation
config land in the output. No network: a fake resolver, and huggingface_hub's own
``snapshot_download`` over a local cache laid out as it lays it out, offline."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import hub
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.synthetic.sources import make_source
from nxdi_gptoss_fp8.validate.pipeline import preflight

REPO = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "openai-test/gpt-oss-tiny"
COMPANIONS = {"tokenizer.json": '{"version": "1.0"}', "tokenizer_config.json": "{}",
              "generation_config.json": '{"eos_token_id": 38}', "chat_template.jinja": "{{ messages }}"}


def make_repo(root: Path) -> Path:
    """A published-style repo: the HF set, its companions, and the original/ and metal/ sets."""
    make_source(root)  # with the original/ decoy
    for name, text in COMPANIONS.items():
        (root / name).write_text(text)
    (root / "metal").mkdir()
    (root / "metal" / "model.bin").write_bytes(b"\0" * 64)
    (root / "README.md").write_text("# model card")
    return root


def repo_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class FakeHub:
    """``snapshot_download`` stand-in serving ``repo``: copies the files the patterns select
    (huggingface_hub's rule: fnmatch on the repo path, allow then ignore) into a snapshot."""

    def __init__(self, repo: Path, cache: Path) -> None:
        self.repo, self.cache, self.calls = repo, cache, []  # type: ignore[var-annotated]

    def __call__(self, *, repo_id: str, revision: str | None, allow_patterns: list[str],
                 ignore_patterns: list[str], **_: Any) -> str:
        self.calls.append({"repo_id": repo_id, "revision": revision, "allow": list(allow_patterns),
                           "ignore": list(ignore_patterns)})
        snapshot = self.cache / COMMIT
        for path in repo_files(self.repo):
            if any(fnmatch.fnmatch(path, p) for p in allow_patterns) and not any(fnmatch.fnmatch(path, p) for p in ignore_patterns):
                (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.repo / path, snapshot / path)
        return str(snapshot)


def test_fetches_config_and_index_first_then_only_the_listed_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    fake = FakeHub(repo, tmp_path / "cache")
    resolved = hub.resolve_source(REPO_ID, download=fake)
    assert resolved.from_hub and resolved.commit == COMMIT and resolved.path == str(tmp_path / "cache" / COMMIT)
    first, second = fake.calls
    assert first["revision"] is None and second["revision"] == COMMIT  # pinned to what the first resolved
    assert set(first["allow"]) == {fmt.CONFIG_FILE, fmt.INDEX_FILE, hub.SOURCE_CARD, *hub.COMPANION_FILES}
    shards = sorted(set(json.loads((repo / fmt.INDEX_FILE).read_text())["weight_map"].values()))
    assert set(second["allow"]) == set(first["allow"]) | set(shards)
    for call in fake.calls:
        assert set(call["ignore"]) >= {"original/*", "metal/*"}
        for path in repo_files(repo):
            if path.startswith(("original/", "metal/")):
                assert not any(fnmatch.fnmatch(path, p) for p in call["allow"]), path
    fetched = repo_files(Path(resolved.path))
    assert fetched == sorted([fmt.CONFIG_FILE, fmt.INDEX_FILE, hub.SOURCE_CARD, *shards, *COMPANIONS])
    assert resolved.provenance() == {"repo": REPO_ID, "revision": COMMIT}
    assert "Hub repo" in resolved.describe() and COMMIT in resolved.describe()
    assert hub.resolve_source(REPO_ID, revision="v1", download=fake).provenance()["requested_revision"] == "v1"


@pytest.mark.parametrize("shard", ["../escape.safetensors", "original/model.safetensors", "*.safetensors",
                                   "model.bin", "[ab].safetensors", 3])
def test_an_index_naming_anything_but_a_plain_shard_fetches_nothing_more(tmp_path: Path, shard: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    index = json.loads((repo / fmt.INDEX_FILE).read_text())
    index["weight_map"]["lm_head.weight"] = shard
    (repo / fmt.INDEX_FILE).write_text(json.dumps(index))
    monkeypatch.chdir(tmp_path)
    fake = FakeHub(repo, tmp_path / "cache")
    with pytest.raises(ConversionError, match=r"lm_head\.weight"):
        hub.resolve_source(REPO_ID, download=fake)
    assert len(fake.calls) == 1


def test_single_file_repo_fetches_model_safetensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / fmt.INDEX_FILE).unlink()
    monkeypatch.chdir(tmp_path)
    fake = FakeHub(repo, tmp_path / "cache")
    hub.resolve_source(REPO_ID, download=fake)
    assert hub.SINGLE_FILE in fake.calls[1]["allow"]


def test_an_existing_local_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_source(tmp_path / REPO_ID, original=False)

    def never(**_: Any) -> str:
        raise AssertionError("the Hub was asked for a local path")

    resolved = hub.resolve_source(REPO_ID, download=never)
    assert not resolved.from_hub and resolved.path == REPO_ID and resolved.provenance() == {}
    assert resolved.describe() == f"{REPO_ID}: local directory"
    with pytest.raises(ConversionError, match="--revision applies to a Hub repo id"):
        hub.resolve_source(REPO_ID, revision="main", download=never)
    with pytest.raises(ConversionError, match="does not exist: it is not a directory, nor a Hub repo id"):
        hub.resolve_source("./no/such/dir", download=never)


@pytest.mark.parametrize(("text", "expected"), [
    ("openai/gpt-oss-120b", True), ("org/name.v2", True), ("a/b", True),
    ("gpt-oss-120b", False), ("/abs/path", False), ("./rel/x", False), ("a/b/c", False), ("../x", False),
    ("org/..", False), ("org/name/", False), ("~/models", False), ("org/na me", False), ("", False),
])
def test_repo_id_shape(text: str, expected: bool) -> None:
    assert hub.is_repo_id(text) is expected


def _hub_error(kind: str) -> BaseException:
    """The error huggingface_hub's ``snapshot_download`` raises in each situation (its own
    classes, chained the way it chains them)."""
    import requests
    from huggingface_hub import errors
    from huggingface_hub.errors import LocalEntryNotFoundError

    response = requests.Response()
    if kind == "offline":  # HF_HUB_OFFLINE set, not in the cache
        exc = LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder for the specified revision on "
                                      "the local disk and outgoing traffic has been disabled. To enable repo look-ups "
                                      "and downloads online, set 'HF_HUB_OFFLINE=0' as environment variable.")
        exc.__cause__ = errors.OfflineModeIsEnabled("offline")
        return exc
    if kind == "no_network":
        exc = LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub and we cannot find "
                                      "the appropriate snapshot folder\nPlease check your internet connection")
        exc.__cause__ = requests.exceptions.ConnectionError("Max retries exceeded")
        return exc
    if kind == "local_files_only":
        return LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder for the specified revision on "
                                       "the local disk and outgoing traffic has been disabled. To enable repo look-ups "
                                       "and downloads online, pass 'local_files_only=False' as input.")
    if kind == "gated":
        response.status_code = 401
        return errors.GatedRepoError("Access to model is restricted", response=response)
    if kind == "not_found":
        response.status_code = 401
        return errors.RepositoryNotFoundError("Repository Not Found", response=response)
    if kind == "revision":
        response.status_code = 404
        return errors.RevisionNotFoundError("Invalid rev id: nope", response=response)
    raise AssertionError(kind)


@pytest.mark.parametrize(("kind", "offline_env", "says", "never"), [
    ("offline", "1", ["downloads are off (HF_HUB_OFFLINE=1)", "not in the local Hub cache"], []),
    ("no_network", None, ["could not be reached", "ConnectionError", "not in the local Hub cache"], ["HF_HUB_OFFLINE"]),
    ("local_files_only", None, ["not in the local Hub cache", "local files only"], ["HF_HUB_OFFLINE"]),
    ("gated", None, ["gated repo", "hf auth login"], ["HF_HUB_OFFLINE"]),
    ("not_found", None, ["does not exist on the Hub, or is private"], ["HF_HUB_OFFLINE"]),
    ("revision", None, ["has no revision 'nope'", "--revision"], ["HF_HUB_OFFLINE"]),
])
def test_hub_errors_say_what_actually_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                                             offline_env: str | None, says: list[str], never: list[str]) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline_env is not None)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    if offline_env is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline_env)

    def failing(**_: Any) -> str:
        raise _hub_error(kind)

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConversionError) as caught:
        hub.resolve_source(REPO_ID, revision="nope" if kind == "revision" else None, download=failing)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot fetch {REPO_ID}@")
    for text in says:
        assert text in message, message
    for text in never:
        assert text not in message, message


def test_a_cached_repo_without_the_revision_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub" / f"models--{REPO_ID.replace('/', '--')}").mkdir(parents=True)
    message = hub.explain_hub_error(_hub_error("local_files_only"), REPO_ID, "v2")
    assert "revision v2 of it is not in the local Hub cache" in message and "holds other revisions" in message


def test_missing_huggingface_hub_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    code = main(["convert", REPO_ID, str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "needs huggingface_hub" in err and len(err.strip().splitlines()) == 1


def test_companion_files_skip_special_files(tmp_path: Path) -> None:
    for name, text in COMPANIONS.items():
        (tmp_path / name).write_text(text)
    os.mkfifo(tmp_path / "vocab.json")
    (tmp_path / "merges.txt").mkdir()
    assert sorted(hub.companion_files(tmp_path)) == sorted(COMPANIONS)


# --------------------------------------------------------------------------- huggingface_hub's own cache, offline


def lay_out_cache(hf_home: Path, repo: Path, repo_id: str, commit: str) -> Path:
    """``HF_HOME/hub/models--org--name`` as huggingface_hub writes it: content-addressed blobs,
    ``snapshots/<commit>/`` of relative links to them, ``refs/main`` holding the commit. The
    original/ and metal/ sets are not there: a conversion must not need them."""
    storage = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (storage / "blobs").mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    snapshot = storage / "snapshots" / commit
    for path in repo_files(repo):
        if path.startswith(("original/", "metal/")):
            continue
        data = (repo / path).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def cli(args: list[str], cwd: Path, hf_home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL="1")
    return subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_convert_and_verify_a_repo_id_from_the_offline_cache(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    repo = make_repo(tmp_path / "repo")
    snapshot = lay_out_cache(tmp_path / "hf", repo, REPO_ID, COMMIT)
    out = tmp_path / "out"
    done = cli(["convert", REPO_ID, str(out), "--json"], tmp_path, tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert f"source {REPO_ID}: Hub repo" in done.stderr and COMMIT in done.stderr
    assert json.loads(done.stdout)["source"] == str(snapshot)
    source = json.loads((out / fmt.INDEX_FILE).read_text())["metadata"]["source"]
    assert source["repo"] == REPO_ID and source["revision"] == COMMIT and "requested_revision" not in source
    for name, text in COMPANIONS.items():
        assert (out / name).read_text() == text and not (out / name).is_symlink()
    assert not (out / "original").exists() and not (out / "metal").exists()
    assert preflight(out, allow_custom_model=True).ok

    verified = cli(["verify-conversion", str(out), "--source", REPO_ID], tmp_path, tmp_path / "hf")
    assert verified.returncode == 0, verified.stderr + verified.stdout
    assert f"-> commit {COMMIT}" in verified.stderr and f"revision {COMMIT}" in verified.stderr  # the recorded commit



def test_real_snapshot_download_resolves_branches_and_commits_from_the_cache(tmp_path: Path) -> None:
    """huggingface_hub's own offline lookup (refs/main → snapshot), through our two fetches."""
    snapshot_download = pytest.importorskip("huggingface_hub").snapshot_download

    lay_out_cache(tmp_path / "hf", make_repo(tmp_path / "repo"), REPO_ID, COMMIT)
    download = functools.partial(snapshot_download, cache_dir=str(tmp_path / "hf" / "hub"), local_files_only=True)
    for revision in (None, "main", COMMIT):
        resolved = hub.resolve_source(REPO_ID, revision=revision, download=download)
        assert resolved.commit == COMMIT and (Path(resolved.path) / fmt.INDEX_FILE).is_file()
    assert hub.resolve_source(REPO_ID, revision="main", download=download).provenance() == {
        "repo": REPO_ID, "revision": COMMIT, "requested_revision": "main"}
    for repo_id, revision in (("openai-test/absent", None), (REPO_ID, "no-such-branch")):
        with pytest.raises(ConversionError) as caught:
            hub.resolve_source(repo_id, revision=revision, download=download)
        assert "\n" not in str(caught.value) and "not in the local Hub cache" in str(caught.value)


def test_local_conversion_copies_the_companions_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_repo(tmp_path / "repo")
    assert main(["convert", str(source), str(tmp_path / "out")]) == 0
    assert "source" not in capsys.readouterr().err  # a plain path: nothing to disambiguate
    assert sorted(hub.companion_files(tmp_path / "out")) == sorted(COMPANIONS)
    assert "repo" not in json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())["metadata"]["source"]
