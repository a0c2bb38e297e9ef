"""The one overwrite rule (``output_target``): every command and API that writes a directory
replaces only an earlier output of the same kind, recognized by content; anything else is
refused with one line naming what it found, and no other module removes or renames a path."""

from __future__ import annotations

import ast
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filesystems import IS_ROOT, needs_root, tmpfs

import nxdi_gptoss_fp8
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.errors import ConversionError, OutputWriteError
from nxdi_gptoss_fp8.output_target.install import is_write_error, remove_work_dir, staged_output
from nxdi_gptoss_fp8.output_target.rule import SOURCE, OutputTarget, check_writable, output_target
from nxdi_gptoss_fp8.recognize import NORMALIZED
from nxdi_gptoss_fp8.synthetic import sources
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, make_source
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS, make_tiny, tiny_tensors
from nxdi_gptoss_fp8.synthetic.tiny_stdlib import make_tiny_stdlib
from nxdi_gptoss_fp8.writer import CheckpointWriter

USER_FILE = "thesis.txt"


@pytest.fixture(scope="module")
def mxfp4_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src") / "hf", SOURCE_MXFP4, original=False)


def _user_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / USER_FILE).write_text("precious")
    return path


def _tiny_writer(out: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    with CheckpointWriter(out, layout, fmt.PROFILE_CUSTOM, fmt.hf_config(TINY_DIMS), overwrite=True) as writer:
        for name, tensor in tiny_tensors(layout).items():
            writer.put(name, tensor)
        writer.commit()


def _small_tensors() -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}


# every entry point that writes a directory, called with overwrite on
API_WRITERS: dict[str, Callable[[Path, Path], object]] = {
    "make_tiny": lambda out, _src: make_tiny(out, overwrite=True),
    "make_tiny_stdlib": lambda out, _src: make_tiny_stdlib(out, overwrite=True),
    "CheckpointWriter": lambda out, _src: _tiny_writer(out),
    "convert": lambda out, src: convert(src, out, overwrite=True, progress=False),
    "make_source-mxfp4": lambda out, _src: make_source(out, SOURCE_MXFP4, overwrite=True),
    "make_source-bf16": lambda out, _src: make_source(out, SOURCE_BF16, overwrite=True),
    "make_source-ct": lambda out, _src: make_source(out, SOURCE_COMPRESSED_TENSORS, overwrite=True),
    "make_compressed_tensors_source": lambda out, _src: sources.make_compressed_tensors_source(out, overwrite=True),
    "write_indexed": lambda out, _src: sources.write_indexed(out, _small_tensors(), {}, overwrite=True),
    "write_source": lambda out, _src: sources.write_source(out, _small_tensors(), {}, overwrite=True),
    "write_transformers_shards": lambda out, _src: sources.write_transformers_shards(out, _small_tensors(), {},
                                                                                    overwrite=True),
    "write_legacy_fp8": lambda out, _src: sources.write_legacy_fp8(out, make_tiny(out.parent / "n"), overwrite=True),
}
CLI_WRITERS = {
    "make-tiny": ["make-tiny"], "make-tiny --hf-mxfp4": ["make-tiny", "--hf-mxfp4"],
    "make-tiny --hf-bf16": ["make-tiny", "--hf-bf16"], "make-tiny --ct-fp8": ["make-tiny", "--ct-fp8"],
    "convert": ["convert", "SRC"],
}


@pytest.mark.parametrize("writer", sorted(API_WRITERS))
def test_no_api_writer_replaces_a_directory_holding_a_user_file(writer: str, tmp_path: Path, mxfp4_source: Path) -> None:
    out = _user_dir(tmp_path / "mydir")
    with pytest.raises(ConversionError, match=rf"{out}.*does not look like an earlier output.*it holds {USER_FILE}\b"):
        API_WRITERS[writer](out, mxfp4_source)
    assert sorted(os.listdir(out)) == [USER_FILE] and (out / USER_FILE).read_text() == "precious"


@pytest.mark.parametrize("entries", [
    {"config.json": "{}"}, {"config.json": "{}", "README.md": "# my project"},
    {"model-00001-of-00001.safetensors": "x", "config.json": "{}"},
])
def test_our_file_names_without_our_index_are_not_taken_for_an_earlier_output(entries: dict[str, str],
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "project"
    out.mkdir()
    for name, text in entries.items():
        (out / name).write_text(text)
    with pytest.raises(ConversionError, match=f"it holds no {fmt.INDEX_FILE}"):
        make_tiny(out, overwrite=True)
    assert {p.name: p.read_text() for p in out.iterdir()} == entries


def test_a_directory_named_like_our_file_is_not_ours(tmp_path: Path) -> None:
    out = make_tiny(tmp_path / "n")
    Path(out, "README.md").mkdir()  # a card's name, but a directory
    Path(out, "README.md", "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match=r"it holds README\.md"):
        make_tiny(out, overwrite=True)
    assert Path(out, "README.md", "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", sorted(CLI_WRITERS))
def test_no_command_replaces_a_directory_holding_a_user_file(command: str, tmp_path: Path, mxfp4_source: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = _user_dir(tmp_path / "mydir")
    argv = [str(mxfp4_source) if arg == "SRC" else arg for arg in CLI_WRITERS[command]]
    assert main([*argv, str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and USER_FILE in err and str(out) in err and "Traceback" not in err
    assert sorted(os.listdir(out)) == [USER_FILE] and (out / USER_FILE).read_text() == "precious"
    assert main([*argv, str(out)]) == 2 and "is not empty" in capsys.readouterr().err  # without --overwrite


@pytest.mark.parametrize("command", sorted(CLI_WRITERS))
def test_no_command_replaces_the_current_directory(command: str, tmp_path: Path, mxfp4_source: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(mxfp4_source) if arg == "SRC" else arg for arg in CLI_WRITERS[command]]
    out = tmp_path / "earlier"
    assert main([*argv, str(out)]) == 0  # an earlier output of the same kind...
    before = sorted(os.listdir(out))
    capsys.readouterr()
    monkeypatch.chdir(out)  # ...but the directory the user works in
    assert main([*argv, ".", "--overwrite"]) == 2
    assert "current directory" in capsys.readouterr().err and sorted(os.listdir(out)) == before


SOURCE_OPTIONS = {"hf-mxfp4": "--hf-mxfp4", "hf-bf16": "--hf-bf16", "compressed-tensors-fp8": "--ct-fp8"}


@pytest.mark.parametrize("earlier", sorted(SOURCE_OPTIONS))
@pytest.mark.parametrize("later", sorted(SOURCE_OPTIONS))
def test_a_source_replaces_only_an_earlier_source_of_its_own_kind(earlier: str, later: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "src"
    assert main(["make-tiny", SOURCE_OPTIONS[earlier], str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    capsys.readouterr()
    code = main(["make-tiny", SOURCE_OPTIONS[later], str(out), "--overwrite", "--seed", "7"])
    if earlier == later:
        assert code == 0 and {name: (out / name).read_bytes() for name in os.listdir(out)} != before
    else:
        assert code == 2 and ", not " in capsys.readouterr().err
        assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def test_a_normalized_output_and_a_source_never_replace_each_other(tmp_path: Path, mxfp4_source: Path) -> None:
    normalized = make_tiny(tmp_path / "n")
    with pytest.raises(ConversionError, match="not an HF MXFP4"):
        make_source(normalized, SOURCE_MXFP4, overwrite=True)
    source = make_source(tmp_path / "s", SOURCE_MXFP4)
    with pytest.raises(ConversionError, match="does not look like an earlier output of this converter"):
        make_tiny(source, overwrite=True)
    assert make_source(source, SOURCE_MXFP4, overwrite=True, seed=3) == source  # its own kind: replaced


@pytest.mark.parametrize("foreign", ["notes.md", "original/notes.md", ".git/HEAD", "weights/x.safetensors"])
def test_a_source_with_anything_else_inside_is_refused(foreign: str, tmp_path: Path) -> None:
    out = make_source(tmp_path / "s", SOURCE_BF16)
    (out / foreign).parent.mkdir(parents=True, exist_ok=True)
    (out / foreign).write_text("mine")
    with pytest.raises(ConversionError, match=f"it holds {foreign.split('/')[0]}"):
        make_source(out, SOURCE_BF16, overwrite=True)
    assert (out / foreign).read_text() == "mine"


def test_a_symlinked_source_file_is_not_taken_for_ours(tmp_path: Path) -> None:
    out = make_source(tmp_path / "s", SOURCE_BF16, original=False)
    elsewhere = tmp_path / "precious.json"
    elsewhere.write_text("{}")
    (out / fmt.CONFIG_FILE).unlink()
    (out / fmt.CONFIG_FILE).symlink_to(elsewhere)
    with pytest.raises(ConversionError, match=f"it holds {fmt.CONFIG_FILE}"):
        output_target(out, overwrite=True, kind=SOURCE_BF16)
    assert elsewhere.read_text() == "{}"


def test_staged_output_leaves_nothing_when_the_writing_fails(tmp_path: Path) -> None:
    out = make_source(tmp_path / "s", SOURCE_BF16, original=False)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    with pytest.raises(RuntimeError), staged_output(out, overwrite=True, kind=SOURCE_BF16) as work:
        Path(work, fmt.CONFIG_FILE).write_text("{}")
        raise RuntimeError("boom")
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def test_staged_output_turns_an_os_error_into_one_line_naming_the_path(tmp_path: Path) -> None:
    out = tmp_path / "new"
    with pytest.raises(OutputWriteError, match="no space left on the device") as caught, \
            staged_output(out, overwrite=False, kind=SOURCE) as work:
        raise OSError(28, "No space left on device", os.path.join(work, "model-00001-of-00002.safetensors"))
    assert caught.value.errno_name == "ENOSPC" and caught.value.path.endswith("model-00001-of-00002.safetensors")
    assert "partial output was removed" in str(caught.value) and not out.exists() and not os.listdir(tmp_path)


@pytest.mark.parametrize("error, inside, expected", [
    (OSError(28, "No space left on device"), False, True),
    (OSError(122, "Disk quota exceeded"), False, True),
    (OSError(5, "Input/output error", "WORK/model-00001-of-00001.safetensors"), True, True),
    (OSError(5, "Input/output error", "/elsewhere/source.safetensors"), False, False),
    (PermissionError(13, "Permission denied", "/elsewhere/config.json"), False, False),
    (ConversionError("not an OSError"), False, False),
])
def test_is_write_error_tells_the_output_from_the_source(error: BaseException, inside: bool, expected: bool,
                                                         tmp_path: Path) -> None:
    if isinstance(error, OSError) and error.filename and inside:
        error.filename = str(tmp_path / os.path.basename(error.filename))
    assert is_write_error(error, str(tmp_path)) is expected


@pytest.mark.parametrize("name", ["out", "..", ".out.partial", ".other.partial-host-1-ab", "src"])
def test_remove_work_dir_removes_only_a_work_folder_of_that_output(name: str, tmp_path: Path) -> None:
    victim = tmp_path / name
    victim.mkdir(exist_ok=True)
    with pytest.raises(ValueError, match="not removed"):
        remove_work_dir(str(victim), str(tmp_path / "out"))
    assert victim.is_dir()


@needs_root
@pytest.mark.parametrize("inside", [False, True])
def test_check_writable_refuses_a_read_only_filesystem(inside: bool, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as mounted:
        out = mounted if inside else mounted / "sub" / "out"
        with pytest.raises(ConversionError, match="read-only file system"):
            output_target(out, overwrite=False)


def test_check_writable_refuses_an_out_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConversionError, match="is not a directory"):
        output_target(tmp_path / "file" / "out", overwrite=False, kind=NORMALIZED)


@pytest.mark.skipif(IS_ROOT, reason="root may write any directory")
def test_check_writable_refuses_a_directory_without_write_permission(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        with pytest.raises(ConversionError, match="not writable by this user"):
            check_writable(OutputTarget(str(locked / "out"), inside=False))
    finally:
        locked.chmod(0o755)


# --------------------------------------------------------------------------- no removal outside the rule

# modules that may remove or rename a path, and why that is not replacing an output
ALLOWED_REMOVERS = {
    "nxdi_gptoss_fp8/output_target/install.py": "the overwrite rule's installer: the only module that replaces outputs "
                                                "or removes a work folder",
    "nxdi_gptoss_fp8/output_target/work_dirs.py": "the unfinished outputs a dead run left (its own hidden work folders)",
    "nxdi_gptoss_fp8/demo.py": "the temporary directory it made itself with tempfile.mkdtemp",
    "nxdi_gptoss_fp8/validate/presharded_manifest.py": "its own manifest file (a file, written atomically)",
    "nxdi_gptoss_fp8/safeio/files.py": "write_atomically: one file (a manifest, a goldens file) replaced by the "
                                       "temporary file it made itself beside it",
}
_REMOVING = {("shutil", "rmtree"), ("shutil", "move"), ("os", "remove"), ("os", "unlink"), ("os", "rmdir"),
             ("os", "removedirs"), ("os", "rename"), ("os", "renames"), ("os", "replace")}
_PATH_METHODS = {"unlink", "rmdir", "rename"}  # pathlib.Path's; ``replace`` with one argument too


def removal_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of every call in ``source`` that removes or renames a path."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name):  # imported by name: ``from shutil import rmtree``
            if node.func.id in {name for _owner, name in _REMOVING} - {"replace", "move", "remove"}:
                found.append((node.lineno, node.func.id))
            continue
        if not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        if (owner, name) in _REMOVING or name in _PATH_METHODS or name == "rmtree" \
                or (name == "replace" and len(node.args) == 1):
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_no_module_removes_or_renames_a_path_outside_the_rule() -> None:
    root = Path(nxdi_gptoss_fp8.__file__).resolve().parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        relative = f"nxdi_gptoss_fp8/{path.relative_to(root).as_posix()}"
        if relative in ALLOWED_REMOVERS:
            continue
        offenders += [f"{relative}:{line}: {call}" for line, call in removal_calls(path.read_text(encoding="utf-8"))]
    assert not offenders, ("remove or replace an output only through output_target (install, staged_output, "
                           "remove_work_dir), or list the module in ALLOWED_REMOVERS with the reason: "
                           + "; ".join(offenders))


@pytest.mark.parametrize("snippet", [
    "import shutil\nshutil.rmtree(out)", "import os\nos.rename(a, b)", "import os\nos.replace(a, b)",
    "import os\nos.unlink(p)", "Path(out).unlink()", "Path(out).rmdir()", "Path(a).replace(b)",
    "import shutil as s\ns.rmtree(out)", "from shutil import rmtree\nrmtree(out)", "from os import unlink\nunlink(p)",
])
def test_the_scan_sees_each_way_of_removing(snippet: str) -> None:
    assert removal_calls(snippet)


def test_the_scan_ignores_string_replace() -> None:
    assert not removal_calls("name = text.replace('a', 'b')")


def test_every_allowed_remover_still_exists_and_removes() -> None:
    root = Path(nxdi_gptoss_fp8.__file__).resolve().parent.parent
    for relative in ALLOWED_REMOVERS:
        assert removal_calls((root / relative).read_text(encoding="utf-8")), f"{relative} no longer needs its place"


def test_the_demo_removes_only_what_it_made(tmp_path: Path) -> None:
    from nxdi_gptoss_fp8.demo import run_demo

    keep = _user_dir(tmp_path / "work")
    run_demo(lambda _line: None, workdir=str(keep), load=False)
    assert (keep / USER_FILE).read_text() == "precious"
    shutil.rmtree(keep)


# --------------------------------------------------------------------------- make-tiny on a full disk, its size cap


@needs_root
@pytest.mark.parametrize("variant", [[], ["--hf-mxfp4"], ["--hf-bf16"], ["--ct-fp8"]], ids=lambda v: v[0] if v else "normalized")
@pytest.mark.parametrize("existing", [False, True], ids=["absent-out", "earlier-output"])
def test_make_tiny_on_a_full_disk_is_one_line_and_leaves_nothing(variant: list[str], existing: bool, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    earlier = tmp_path / "earlier"
    assert main(["make-tiny", *variant, str(earlier)]) == 0
    size = sum(p.stat().st_blocks * 512 for p in earlier.iterdir())
    with tmpfs(tmp_path / "small", str(size + size // 2 if existing else 48 * 1024)) as small:
        out = small / "out"
        if existing:  # an earlier output of the same kind, which a failed --overwrite must leave as it was
            shutil.copytree(earlier, out)
        before = {p.relative_to(small): p.read_bytes() for p in small.rglob("*") if p.is_file()}
        capsys.readouterr()
        assert main(["make-tiny", *variant, str(out), *(["--overwrite"] if existing else [])]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and str(out) in err
        assert ("no space left on the device" in err and "partial output was removed" in err) or "free" in err
        assert {p.relative_to(small): p.read_bytes() for p in small.rglob("*") if p.is_file()} == before
        assert not [p for p in small.rglob(".*")]


@pytest.mark.parametrize("kind, refused", [(SOURCE_BF16, True), (SOURCE_COMPRESSED_TENSORS, True),
                                           (SOURCE_MXFP4, False)])
def test_the_size_cap_of_a_source_counts_the_source_it_writes(kind: str, refused: bool) -> None:
    """2 layers of 32 experts at H = I = 1024: the normalized checkpoint (FP8) is under the byte
    cap, its BF16 source (two bytes a value) over it, the MXFP4 source (half a byte) under it; at
    600 small experts, the compressed-tensors source (nine tensors an expert) has more tensors
    than the cap, the normalized checkpoint 41."""
    from nxdi_gptoss_fp8.synthetic.sources import check_source_dims
    from nxdi_gptoss_fp8.synthetic.tiny_stdlib import tiny_layout

    dims = fmt.ModelDims(num_hidden_layers=2, num_local_experts=32, hidden_size=1024, intermediate_size=1024,
                         head_dim=64, num_attention_heads=16, num_key_value_heads=8, vocab_size=64,
                         num_experts_per_tok=4, sliding_window=8)
    if kind == SOURCE_COMPRESSED_TENSORS:
        dims = fmt.ModelDims(**{**TINY_DIMS.__dict__, "num_local_experts": 600})
    tiny_layout(dims, None, None)  # the normalized checkpoint would be tiny enough
    if refused:
        with pytest.raises(ValueError, match="a tiny source"):
            check_source_dims(dims, kind)
    else:
        check_source_dims(dims, kind)


def test_make_tiny_refuses_a_source_over_the_cap_before_writing(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = ["make-tiny", "--hf-bf16", str(tmp_path / "big"), "--layers", "2", "--experts", "32", "--hidden-size", "1024",
            "--intermediate-size", "1024", "--head-dim", "64", "--heads", "16", "--kv-heads", "8"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "a tiny source" in err and len(err.strip().splitlines()) == 1 and not os.listdir(tmp_path)
