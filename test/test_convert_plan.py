"""The conversion plan against the real run: on every source kind the plan lists every file the
run writes (exact, or at a stated bound), its totals agree with its list and with the report,
the free-space check compares what those files occupy on disk (an output that exactly fills the
filesystem fits, one block less is refused), an OUT that cannot be written is refused the same
way by a dry run and a real run, and a disk that fills during the run is one line."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
from filesystems import IS_ROOT, needs_root, tmpfs

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import convert, plan
from nxdi_gptoss_fp8.convert.card import CARD_FILE
from nxdi_gptoss_fp8.output_target.space import DIRECTORY_BLOCKS, block_size, space_needed
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, make_source
from nxdi_gptoss_fp8.writer import INDEX_SLACK

KINDS = (SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS)
_PLAN = importlib.import_module("nxdi_gptoss_fp8.convert.plan")  # the package's ``plan`` is the function
_TARGET = importlib.import_module("nxdi_gptoss_fp8.output_target.space")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {kind: make_source(root / kind, kind, original=False) for kind in KINDS}


def _on_disk(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.iterdir())


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """Every free-space figure (the plan's and the writer's) reads ``free`` bytes."""
    monkeypatch.setattr(_PLAN, "free_bytes", lambda _path: free)
    monkeypatch.setattr(_TARGET, "free_bytes", lambda _path: free)


@pytest.mark.parametrize("existing", [False, True], ids=["absent-out", "empty-out"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_plan_lists_every_file_the_run_writes(kind: str, existing: bool, sources: dict[str, Path],
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    args = ["convert", str(sources[kind]), str(out), "--max-shard-size", "60KB"]
    assert main([*args, "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main([*args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    listed = {f["name"]: f for f in planned["shards"] + planned["files"]}
    assert planned["write_bytes"] == sum(f["bytes"] for f in listed.values())
    assert f"({planned['write_bytes']:,} bytes) in all" in text and f"{len(listed)} files" in text
    assert f"({planned['space'][0]['needed']:,} bytes) on disk" in text
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    written = {p.name: p.stat().st_size for p in out.iterdir()}
    assert set(written) == set(listed) and report["files"] == len(listed)
    assert report["files_bytes"] == sum(written.values()) <= planned["write_bytes"]
    for name, size in written.items():
        if listed[name]["exact"]:
            assert size == listed[name]["bytes"], name
        else:  # the index (its exactness summary comes last) and the card (its figures)
            assert name in (fmt.INDEX_FILE, CARD_FILE) and size <= listed[name]["bytes"], name
    assert listed[fmt.INDEX_FILE]["bytes"] - written[fmt.INDEX_FILE] <= INDEX_SLACK
    assert _on_disk(out) <= planned["space"][0]["needed"]


def test_space_needed_counts_whole_blocks_and_the_directories(tmp_path: Path) -> None:
    block = block_size(str(tmp_path))
    assert space_needed([], str(tmp_path)) == DIRECTORY_BLOCKS * block
    assert space_needed([1, block, block + 1], str(tmp_path)) == (1 + 1 + 2 + DIRECTORY_BLOCKS) * block


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_that_exactly_fits_is_converted_and_one_byte_short_is_refused(
        kind: str, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    needed = plan(sources[kind], tmp_path / "out").space[0].needed
    _free(monkeypatch, needed - 1)
    args = ["convert", str(sources[kind]), str(tmp_path / "out")]
    assert main([*args, "--dry-run"]) == 1 and "REFUSED" in capsys.readouterr().out
    assert main(args) == 2 and f"{needed:,} bytes" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
    _free(monkeypatch, needed)
    assert main([*args, "--dry-run"]) == 0 and "OK: the conversion fits" in capsys.readouterr().out
    assert main(args) == 0 and (tmp_path / "out" / fmt.INDEX_FILE).is_file()


@needs_root
@pytest.mark.parametrize("kind", KINDS)
def test_a_filesystem_of_exactly_the_planned_size_holds_the_output(kind: str, sources: dict[str, Path],
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    needed = plan(sources[kind], tmp_path / "probe").space[0].needed
    with tmpfs(tmp_path / "exact", str(needed)) as exact:
        args = ["convert", str(sources[kind]), str(exact / "out")]
        assert main([*args, "--dry-run"]) == 0
        assert main(args) == 0, capsys.readouterr().err
    with tmpfs(tmp_path / "short", str(needed - block_size(str(tmp_path)))) as short:
        args = ["convert", str(sources[kind]), str(short / "out")]
        assert main([*args, "--dry-run"]) == 1
        assert main(args) == 2 and not os.listdir(short)


def _read_only(tmp_path: Path) -> Path:
    if not IS_ROOT:
        pytest.skip("mounts a tmpfs: needs root")
    return tmp_path / "ro"


UNWRITABLE = {
    "below-a-file": ("file/out", "is not a directory"),
    "read-only-filesystem": ("ro/out", "read-only file system"),
    "read-only-filesystem-existing-out": ("ro", "read-only file system"),
    "read-only-filesystem-deep": ("ro/a/b/out", "read-only file system"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_a_dry_run_refuses_what_the_real_run_refuses(case: str, kind: str, sources: dict[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    relative, reason = UNWRITABLE[case]
    (tmp_path / "file").write_text("x")
    mounted = tmpfs(_read_only(tmp_path), "1m", read_only=True) if relative.startswith("ro") else None
    with mounted or contextlib.nullcontext():
        out = tmp_path / relative
        answers = []
        for extra in (["--dry-run"], ["--dry-run", "--json"], []):
            code = main(["convert", str(sources[kind]), str(out), *extra])
            captured = capsys.readouterr()
            answers.append((code, captured.err.strip()))
            assert code == 2 and reason in captured.err and "OK: the conversion fits" not in captured.out
            assert len(captured.err.strip().splitlines()) == 1
        assert len({err for _code, err in answers}) == 1  # the same line, dry run or not
        assert (tmp_path / "file").read_text() == "x"
        assert out == tmp_path / "ro" or not out.exists()


NOBODY = 65534


def _run_without_root(argv: list[str], home: Path) -> tuple[int, str, str]:
    """``main(argv)`` in a forked child without root's rights (root: the user nobody; anyone
    else: as they are), as (exit code, stdout, stderr). The child runs the modules this process
    has already imported, so it needs no read access to the package, its interpreter or its
    site-packages: a clone in a private home (0700, as root's is) works as well as any."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(out_r)
            os.close(err_r)
            if IS_ROOT:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
            os.environ["HOME"] = str(home)
            sys.stdout = io.TextIOWrapper(io.FileIO(out_w, "w"), encoding="utf-8", write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(err_w, "w"), encoding="utf-8", write_through=True)
            code = main(argv)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        except BaseException:  # a bug shows as its traceback on the child's stderr
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as err_file, concurrent.futures.ThreadPoolExecutor(1) as reader:
        err = reader.submit(err_file.read)
        with os.fdopen(out_r, "rb") as out_file:
            out = out_file.read()
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), out.decode(), err.result().decode()


def test_a_dry_run_refuses_a_directory_without_write_permission(sources: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A run without write permission on OUT's parent (root's rights dropped): the dry run, its
    JSON and a real run refuse it in the same one line, and nothing is written. One source kind,
    as the refusal comes from the output's check alone (the read-only cases above run every kind)."""
    kind = SOURCE_MXFP4
    base = Path(tempfile.mkdtemp(prefix="nxdi-gptoss-fp8-locked-"))  # outside pytest's 0700 tree
    try:
        base.chmod(0o755)
        src = Path(shutil.copytree(sources[kind], base / "src"))
        for path in (src, *src.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        locked = base / "locked"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        runs = (["--dry-run"], ["--dry-run", "--json"], [])
        for extra in runs:  # the same commands where they may write: every module they use is imported
            assert main(["convert", str(src), str(tmp_path / "warm" / "out"), "--overwrite", *extra]) == 0
        capsys.readouterr()
        lines = []
        for extra in runs:
            code, out, err = _run_without_root(["convert", str(src), str(locked / "out"), *extra], base)
            assert code == 2 and "not writable by this user" in err, err
            assert "OK: the conversion fits" not in out
            lines.append(err.strip())
        assert len(set(lines)) == 1 and len(lines[0].splitlines()) == 1 and not os.listdir(locked)
    finally:
        shutil.rmtree(base)


@needs_root
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("existing", [False, True], ids=["absent-out", "earlier-output"])
def test_a_disk_that_fills_during_the_run_is_one_line_and_leaves_out_as_it_was(
        kind: str, existing: bool, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    needed = plan(sources[kind], tmp_path / "probe").space[0].needed
    with tmpfs(tmp_path / "small", str(needed // 2 + (needed if existing else 0))) as small:
        out = small / "out"
        if existing:
            convert(sources[kind], out, progress=False)
        before = {p.name: p.read_bytes() for p in out.iterdir()} if existing else None
        _free(monkeypatch, 10**15)  # the plan believes it fits: the disk fills part way
        args = ["convert", str(sources[kind]), str(out), *(["--overwrite"] if existing else [])]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "no space left on the device" in err and "the partial output was removed" in err
        assert re.search(r"\(writing /\S+\)", err)
        assert (f"{out} is as it was" in err) if existing else ("nothing is left" in err)
        assert main([*args, "--json"]) == 2
        document = json.loads(capsys.readouterr().out)
        error = document["error"]
        assert error["type"] == "OutputWriteError" and error["errno"] == "ENOSPC" and error["kind"] == "io"
        assert error["path"].startswith(str(small)) and document["exit_code"] == 2
        if existing:
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        else:
            assert not os.listdir(small)
