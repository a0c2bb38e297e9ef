"""The converter fails closed: non-finite values and unusable scales, configs that claim more
than the files hold, unbounded options, signals, OUT on a mount point or under a read-only
parent, --overwrite of what is not ours, and the plan (--dry-run) with its free-space refusal."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from filesystems import needs_root, tmpfs
from safetensors.torch import load_file, save_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import hub
from nxdi_gptoss_fp8 import progress as progress_module
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import KINDS, SOURCE_COMPRESSED_TENSORS, convert, plan
from nxdi_gptoss_fp8.convert.fp8 import MIN_NORMAL_SCALE
from nxdi_gptoss_fp8.convert.verify import verify_conversion
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.safeio.json_file import MAX_JSON_FILE_BYTES
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_DIMS, SOURCE_MXFP4, make_source
from nxdi_gptoss_fp8.validate.pipeline import preflight

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {kind: make_source(root / kind, kind, original=False)
            for kind in (SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS)}


def copy_source(sources: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sources[kind], tmp_path / "src"))


def edit_tensor(src: Path, name: str, edit: Any) -> None:
    """Change tensor ``name`` in whichever shard holds it (``edit(tensor)`` in place)."""
    index = json.loads((src / fmt.INDEX_FILE).read_text())
    shard = src / index["weight_map"][name]
    tensors = dict(load_file(str(shard)))
    edit(tensors[name])
    save_file(tensors, str(shard))


def edit_config(src: Path, **changes: Any) -> None:
    config = json.loads((src / fmt.CONFIG_FILE).read_text())
    config.update(changes)
    (src / fmt.CONFIG_FILE).write_text(json.dumps(config))


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def hidden_leftovers(*directories: Path) -> list[Path]:
    return [p for d in directories if d.is_dir() for p in d.iterdir() if p.name.startswith(".")]


# --------------------------------------------------------------------------- non-finite values


CT_EXPERT = "model.layers.0.mlp.experts.0.gate_proj"
NON_EXPERT = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.1.self_attn.q_proj.weight",
              "model.layers.0.self_attn.o_proj.bias", "model.layers.0.input_layernorm.weight",
              "model.layers.0.self_attn.sinks", "model.layers.1.mlp.router.weight", "model.layers.0.mlp.router.bias"]
NON_FINITE_CASES = (
    [pytest.param(kind, name, value, id=f"{kind}-{name}-{value}") for kind in (SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS)
     for name in NON_EXPERT for value in ("nan",)]
    + [pytest.param(SOURCE_BF16, name, value, id=f"bf16-{name}-{value}") for value in ("nan", "inf", "-inf")
       for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
                    "model.layers.0.mlp.experts.gate_up_proj_bias")]
    + [pytest.param(SOURCE_MXFP4, "model.layers.1.mlp.experts.down_proj_bias", v, id=f"mxfp4-bias-{v}") for v in ("inf", "nan")]
    + [pytest.param(SOURCE_COMPRESSED_TENSORS, f"{CT_EXPERT}.{suffix}", v, id=f"ct-{suffix}-{v}")
       for suffix in ("bias", "weight_scale") for v in ("nan", "inf", "-inf")]
)


@pytest.mark.parametrize(("kind", "name", "value"), NON_FINITE_CASES)
def test_a_non_finite_value_anywhere_is_refused_and_nothing_is_written(sources: dict[str, Path], tmp_path: Path,
                                                                        kind: str, name: str, value: str) -> None:
    src = copy_source(sources, kind, tmp_path)

    def poison(tensor: torch.Tensor) -> None:
        tensor.view(-1)[tensor.numel() // 2 if tensor.numel() > 4 else 0] = float(value)

    edit_tensor(src, name, poison)
    with pytest.raises(ConversionError) as caught:
        convert(src, tmp_path / "out", progress=False)
    message = str(caught.value)
    assert "\n" not in message and name.split(".")[-1] in message
    assert not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)


def test_a_refused_source_leaves_an_earlier_output_untouched(sources: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_BF16], out, progress=False)
    before = tree_digest(out)
    src = copy_source(sources, SOURCE_BF16, tmp_path)
    edit_tensor(src, "model.layers.1.mlp.experts.down_proj", lambda t: t.view(-1).__setitem__(7, float("nan")))
    code = main(["convert", str(src), str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "non-finite" in err and len(err.strip().splitlines()) == 1
    assert tree_digest(out) == before and not hidden_leftovers(out, tmp_path)


def test_a_bf16_channel_of_subnormal_values_gets_a_normal_scale(sources: dict[str, Path], tmp_path: Path) -> None:
    src = copy_source(sources, SOURCE_BF16, tmp_path)
    tiny = 2.0**-130  # a BF16 subnormal: amax / 240 would be far below float32's normal range

    def subnormal_channel(tensor: torch.Tensor) -> None:  # [E, H, 2I]: output channel 5 of expert 1
        tensor[1, :, 5] = torch.linspace(-tiny, tiny, tensor.shape[1]).to(tensor.dtype)

    edit_tensor(src, "model.layers.0.mlp.experts.gate_up_proj", subnormal_channel)
    convert(src, tmp_path / "out", progress=False)
    index = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())
    scales = load_file(str(tmp_path / "out" / index["weight_map"][f"layers.0.{fmt.GATE_UP}.scale"]))
    scale = scales[f"layers.0.{fmt.GATE_UP}.scale"]
    assert bool((scale >= MIN_NORMAL_SCALE).all() & torch.isfinite(scale).all())
    assert float(scale[1, 0, SOURCE_DIMS.intermediate_size + 2]) == MIN_NORMAL_SCALE  # channel 5: up 2, floored
    assert preflight(tmp_path / "out", allow_custom_model=True, deep=True).ok
    assert verify_conversion(tmp_path / "out", src).ok


@pytest.mark.parametrize(("scale", "refused"), [(2.0**-130, True), (0.0, True), (-1.0, True), (2.0**-126, False)])
def test_compressed_tensors_scales_must_be_normal_floats(sources: dict[str, Path], tmp_path: Path,
                                                        scale: float, refused: bool) -> None:
    src = copy_source(sources, SOURCE_COMPRESSED_TENSORS, tmp_path)
    edit_tensor(src, f"{CT_EXPERT}.weight_scale", lambda t: t.view(-1).__setitem__(3, scale))
    if refused:
        with pytest.raises(ConversionError, match=r"gate_proj\.weight row 3 has weight_scale"):
            convert(src, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
    else:
        convert(src, tmp_path / "out", progress=False)
        assert preflight(tmp_path / "out", allow_custom_model=True, deep=True).ok


def test_a_zero_row_with_a_subnormal_scale_gets_scale_one(sources: dict[str, Path], tmp_path: Path) -> None:
    src = copy_source(sources, SOURCE_COMPRESSED_TENSORS, tmp_path)
    edit_tensor(src, f"{CT_EXPERT}.weight_scale", lambda t: t.view(-1).__setitem__(3, 2.0**-130))
    edit_tensor(src, f"{CT_EXPERT}.weight", lambda t: t.view(torch.uint8)[3].zero_())
    convert(src, tmp_path / "out", progress=False)
    index = json.loads((tmp_path / "out" / fmt.INDEX_FILE).read_text())
    name = f"layers.0.{fmt.GATE_UP}.scale"
    scale = load_file(str(tmp_path / "out" / index["weight_map"][name]))[name]
    assert bool((scale >= MIN_NORMAL_SCALE).all())
    assert float(scale[0, 0, 3]) == 1.0  # interleaved split: gate row 3 is the fused gate channel 3


# --------------------------------------------------------------------------- claimed dimensions


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_hidden_layers", 10**6, "num_hidden_layers is 1,000,000 but the index and shard headers hold tensors for 2"),
    ("num_local_experts", 10**6, "num_local_experts is 1,000,000 but"),
    ("vocab_size", 2**31, "vocab_size is 2,147,483,648 but"),
    ("num_attention_heads", 2**20, "num_attention_heads"),
])
@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_COMPRESSED_TENSORS])
def test_a_config_claiming_more_than_the_files_hold_is_refused_before_any_planning(
        sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, field: str,
        value: int, message: str) -> None:
    src = copy_source(sources, kind, tmp_path)
    edit_config(src, **{field: value})
    for source_kind in KINDS.values():  # nothing sized by the claim may run
        monkeypatch.setattr(type(source_kind), "specs", lambda *a, **k: pytest.fail("specs planned from the claim"))
    with pytest.raises(ConversionError, match=message):
        convert(src, tmp_path / "out", progress=False)
    with pytest.raises(ConversionError, match=message):
        verify_conversion(tmp_path / "out", src)


@pytest.mark.parametrize("name", [fmt.CONFIG_FILE, fmt.INDEX_FILE])
def test_a_source_json_file_above_64_mib_is_not_read(sources: dict[str, Path], tmp_path: Path, name: str) -> None:
    src = copy_source(sources, SOURCE_MXFP4, tmp_path)
    os.truncate(src / name, MAX_JSON_FILE_BYTES + 1)  # sparse: nothing on disk
    with pytest.raises(ConversionError, match=f"{name} is larger than {MAX_JSON_FILE_BYTES:,} bytes"):
        convert(src, tmp_path / "out", progress=False)


@pytest.mark.parametrize(("changes", "code"), [
    ({"rms_norm_eps": 1e-6}, "hard_coded_mismatch"),
    ({"tie_word_embeddings": True}, "hard_coded_mismatch"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types_mismatch"),
    ({"rope_scaling": None}, "bad_rope"),
])
def test_a_source_config_the_output_could_not_pass_validate_with_is_refused(
        sources: dict[str, Path], tmp_path: Path, changes: dict[str, Any], code: str) -> None:
    """A source config NxDI would compute differently from is refused in the plan (dry run and
    real run alike), not converted into an output that ``validate`` rejects."""
    src = copy_source(sources, SOURCE_MXFP4, tmp_path)
    edit_config(src, **changes)
    field = next(iter(changes))
    with pytest.raises(ConversionError, match=f"{field}.*{code}|{code}.*{field}") as refused:
        plan(src, tmp_path / "out")
    assert "validate" in str(refused.value)
    with pytest.raises(ConversionError):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)


# --------------------------------------------------------------------------- numeric options


@pytest.mark.parametrize(("argv", "message"), [
    (["--padded-hidden-size", "2147483712"], "--padded-hidden-size: must be a whole number up to 2^31"),
    (["--padded-intermediate-size", "1" * 30], "a number of 30 characters"),
    (["--padded-hidden-size", "-64"], "must be a whole number"),
    (["--padded-hidden-size", "0"], "padded_hidden_size must be an integer in 64"),
    (["--max-shard-size", "1e999"], "--max-shard-size: cannot read a size"),
    (["--max-shard-size", "nan"], "cannot read a size"),
    (["--max-shard-size", "0"], "cannot read a size"),
    (["--max-shard-size", "9" * 30], "outside 1 B … 2^53 bytes"),
    (["--max-shard-size", "0.1B"], "outside 1 B"),
])
def test_numeric_options_are_bounded_before_anything_runs(sources: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str], argv: list[str],
                                                          message: str) -> None:
    with contextlib.suppress(SystemExit):
        code = main(["convert", str(sources[SOURCE_MXFP4]), str(tmp_path / "out"), *argv])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "OverflowError" not in err
    assert not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)


@pytest.mark.parametrize("value", [2**31 + 64, True, 96.0, -32])
def test_the_library_bounds_padded_sizes_too(sources: dict[str, Path], tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConversionError, match="padded_hidden_size must be an integer"):
        convert(sources[SOURCE_MXFP4], tmp_path / "out", padded_hidden_size=value, progress=False)


def test_a_padded_size_within_bounds_but_beyond_the_disk_is_refused_at_once(sources: dict[str, Path], tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", str(sources[SOURCE_MXFP4]), str(tmp_path / "out"), "--padded-hidden-size", str(2**31)])
    err = capsys.readouterr().err
    assert code == 2 and "needs" in err and "free" in err and str(tmp_path / "out") in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)


# --------------------------------------------------------------------------- signals


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_sigterm_and_sighup_clean_up_like_ctrl_c(sources: dict[str, Path], tmp_path: Path, signum: int,
                                                 as_json: bool) -> None:
    child = _slow_convert(sources[SOURCE_MXFP4], tmp_path / "out", *(["--json"] if as_json else []))
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]  # mid-way
    child.send_signal(signum)
    _out, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signum, err
    name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    sentence = (f"interrupted by {name}: the partial output was removed and OUT is as it was before the run "
                f"(exit {128 + signum})")
    assert err == f"nxdi-gptoss-fp8 convert: {sentence}\n", err  # the same full sentence for every signal
    assert list(tmp_path.iterdir()) == []
    if as_json:  # the error as JSON on stdout, whichever signal
        document = json.loads(_out)
        assert document == {"ok": False, "command": "convert", "exit_code": child.returncode,
                            "error": {"kind": "interrupted", "type": "Interrupted", "message": sentence}}


def _slow_convert(src: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    """A conversion in a child process that prints "converting" once its work folder exists and
    then sleeps in its first expert (until a signal ends it)."""
    script = textwrap.dedent(f"""
        import sys, time
        from nxdi_gptoss_fp8.convert.kinds import hf_mxfp4
        from nxdi_gptoss_fp8.cli import main
        real = hf_mxfp4._projection
        def slow(*args, **kwargs):
            print("converting", flush=True)
            time.sleep(60)
            return real(*args, **kwargs)
        hf_mxfp4._projection = slow
        sys.exit(main(["convert", {str(src)!r}, {str(out)!r}, *{list(extra)!r}]))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "converting"
    return child


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("out_exists", [False, True])
def test_a_second_run_to_the_same_out_refuses_while_the_first_writes(
        sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], out_exists: bool,
        overwrite: bool) -> None:
    """Two conversions to one OUT: the second refuses in one line naming the first's work folder
    (with or without --overwrite, OUT absent or an existing directory); the first is untouched
    and, ended by SIGTERM, leaves nothing."""
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
    flags = ["--overwrite"] if overwrite else []
    first = _slow_convert(sources[SOURCE_MXFP4], out, *flags)
    try:
        code = main(["convert", str(sources[SOURCE_MXFP4]), str(out), *flags])
        err = capsys.readouterr().err
        assert code == 2 and "is being written by another run" in err and ".out.partial-" in err, err
        assert len(err.strip().splitlines()) == 1
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if out_exists else [])
    assert not out_exists or list(out.iterdir()) == []


# --------------------------------------------------------------------------- where OUT is written


def test_an_existing_out_is_written_inside_never_renamed(sources: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What a mount point does to rename(2) (EBUSY), without root: OUT itself must never move."""
    out = tmp_path / "out"
    out.mkdir()
    real_rename = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.abspath(src) == str(out) or os.path.abspath(dst) == str(out):
            raise OSError(16, "Device or resource busy", str(src))
        real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    convert(sources[SOURCE_MXFP4], out, progress=False)
    convert(sources[SOURCE_MXFP4], out, overwrite=True, progress=False, max_shard_size="40KB")
    assert preflight(out, allow_custom_model=True).ok
    assert not hidden_leftovers(out, tmp_path)


@needs_root
def test_out_a_mount_point_empty_and_overwritten(sources: dict[str, Path], tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt") as out:
        convert(sources[SOURCE_MXFP4], out, progress=False)
        assert preflight(out, allow_custom_model=True).ok and os.path.ismount(out)
        first = tree_digest(out)
        convert(sources[SOURCE_MXFP4], out, overwrite=True, progress=False, max_shard_size="40KB")
        assert preflight(out, allow_custom_model=True).ok and tree_digest(out) != first
        assert not hidden_leftovers(out, tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
        assert os.path.ismount(out)


@needs_root
def test_a_writable_empty_out_under_a_read_only_parent(sources: dict[str, Path], tmp_path: Path) -> None:
    with tmpfs(tmp_path / "parent", "4m") as parent:
        (parent / "out").mkdir()
        with tmpfs(parent / "out") as out:
            subprocess.run(["mount", "-o", "remount,ro", str(parent)], check=True)
            with pytest.raises(OSError):
                (parent / "probe").mkdir()  # the parent really is read-only, even for root
            convert(sources[SOURCE_MXFP4], out, progress=False)
            assert preflight(out, allow_custom_model=True).ok and not hidden_leftovers(out)


@needs_root
def test_a_read_only_out_is_refused_naming_it_before_the_first_byte(sources: dict[str, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with tmpfs(tmp_path / "ro", "4m") as out:
        subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
        code = main(["convert", str(sources[SOURCE_MXFP4]), str(out)])
        err = capsys.readouterr().err
        assert code == 2 and str(out) in err and "read-only file system" in err.lower() and "Traceback" not in err
        assert main(["convert", str(sources[SOURCE_MXFP4]), str(out), "--json"]) == 2
        error = json.loads(capsys.readouterr().out)["error"]  # the filesystem refused the write: io, as a full disk
        assert error["kind"] == "io" and error["errno"] == "EROFS" and error["type"] == "OutputWriteError"


@pytest.mark.parametrize("target", ["real-out", "/nonexistent/x"])
def test_out_a_symbolic_link_is_refused_naming_the_link(sources: dict[str, Path], tmp_path: Path,
                                                        target: str) -> None:
    (tmp_path / "real-out").mkdir()
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(ConversionError, match=f"out is a symbolic link \\(to {target}\\).*pass the directory"):
        convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False)
    assert list((tmp_path / "real-out").iterdir()) == []


def test_overwrite_refuses_the_current_directory(sources: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], out, progress=False)
    before = tree_digest(out)
    monkeypatch.chdir(out)
    code = main(["convert", str(sources[SOURCE_MXFP4]), ".", "--overwrite"])
    assert code == 2 and "is the current directory" in capsys.readouterr().err
    (out / "sub").mkdir()
    monkeypatch.chdir(out / "sub")
    with pytest.raises(ConversionError, match="current directory or holds it"):
        convert(sources[SOURCE_MXFP4], out, overwrite=True, progress=False)
    (out / "sub").rmdir()
    assert tree_digest(out) == before


@pytest.mark.parametrize("foreign", ["notes.txt", "pytorch_model.bin", "original"])
def test_overwrite_refuses_a_directory_that_is_not_an_earlier_output(sources: dict[str, Path], tmp_path: Path,
                                                                     foreign: str) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], out, progress=False)
    (out / foreign).mkdir() if foreign == "original" else (out / foreign).write_text("mine")
    with pytest.raises(ConversionError, match=f"does not look like an earlier output.*{foreign}"):
        convert(sources[SOURCE_MXFP4], out, overwrite=True, progress=False)
    assert (out / foreign).exists()


def test_overwrite_refuses_an_hf_source_directory(sources: dict[str, Path], tmp_path: Path) -> None:
    out = Path(shutil.copytree(sources[SOURCE_BF16], tmp_path / "bf16"))
    with pytest.raises(ConversionError, match="not a nxdi_gptoss_normalized_fp8 index"):
        convert(sources[SOURCE_MXFP4], out, overwrite=True, progress=False)


# --------------------------------------------------------------------------- the plan


def test_dry_run_predicts_exactly_what_is_written(sources: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, out = sources[SOURCE_MXFP4], tmp_path / "out"
    args = ["convert", str(src), str(out), "--max-shard-size", "40KB", "--padded-hidden-size", "96"]
    assert main([*args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists() and not hidden_leftovers(tmp_path)
    assert "expected peak memory" in text and "free space" in text and "OK: the conversion fits" in text
    assert main([*args, "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["ok"] and planned["peak_memory"] > 0 and planned["space"][0]["free"] > planned["write_bytes"]
    read = {f["name"]: f["bytes"] for f in planned["reads"]}
    assert read == {p.name: p.stat().st_size for p in src.iterdir() if p.is_file()}
    assert main(args) == 0
    capsys.readouterr()
    written = {p.name: p.stat().st_size for p in out.iterdir() if p.suffix == ".safetensors"}
    assert {f["name"]: f["bytes"] for f in planned["shards"]} == written and len(written) > 1
    total = sum(p.stat().st_size for p in out.iterdir())
    assert sum(written.values()) <= total <= planned["write_bytes"]
    assert str(tmp_path) == planned["written_in"]


def test_the_plan_of_an_existing_out_is_made_inside_it(sources: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert plan(sources[SOURCE_MXFP4], tmp_path / "out").written_in == str(tmp_path / "out")


@needs_root
def test_free_space_short_on_a_small_filesystem(sources: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    needed = plan(sources[SOURCE_BF16], tmp_path / "probe", padded_hidden_size=256).space[0].needed
    with tmpfs(tmp_path / "small", f"{max(needed // 2, 4096 * 8)}") as small:
        out = small / "out"
        args = ["convert", str(sources[SOURCE_BF16]), str(out), "--padded-hidden-size", "256"]
        started = time.monotonic()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - started < 30
        assert str(out) in err and "needs" in err and f"{needed:,}"[:3] in err and "free" in err
        assert list(small.iterdir()) == []  # not a byte: no work folder, no OUT
        assert main([*args, "--dry-run"]) == 1
        text = capsys.readouterr().out
        assert "SHORT" in text and "REFUSED" in text
        assert main([*args, "--dry-run", "--json"]) == 1
        planned = json.loads(capsys.readouterr().out)
        assert not planned["ok"] and planned["space"][0]["short"] and planned["problems"]
        (small / "inside").mkdir()
        assert main(["convert", str(sources[SOURCE_BF16]), str(small / "inside"), "--padded-hidden-size", "256"]) == 2
        assert list((small / "inside").iterdir()) == []


def _hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drop: int = 0) -> tuple[str, list[str], Path]:
    """A Hub cache laid out as huggingface_hub lays it out, offline; ``drop`` shards missing from it."""
    constants = pytest.importorskip("huggingface_hub.constants")
    from test_hub import COMMIT, REPO_ID, lay_out_cache, make_repo

    repo = make_repo(tmp_path / "repo")
    snapshot = lay_out_cache(tmp_path / "hf", repo, REPO_ID, COMMIT)
    shards = sorted({*json.loads((repo / fmt.INDEX_FILE).read_text())["weight_map"].values()})
    for shard in shards[:drop]:
        (snapshot / shard).unlink()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return REPO_ID, shards, repo


def test_dry_run_of_a_hub_id_lists_only_what_would_be_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo_id, shards, repo = _hub_cache(tmp_path, monkeypatch, drop=1)
    asked: list[list[str]] = []

    def metadata_api(repo: str, revision: str | None, paths: list[str]) -> dict[str, int]:
        asked.append(list(paths))
        return {path: (tmp_path / "repo" / path).stat().st_size for path in paths}

    monkeypatch.setattr(hub, "hub_file_sizes", metadata_api)
    assert main(["convert", repo_id, str(tmp_path / "out"), "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert asked == [shards[:1]]  # only the shard the cache lacks
    reads = {f["name"]: f for f in planned["reads"]}
    assert set(reads) == {fmt.CONFIG_FILE, fmt.INDEX_FILE, *shards, "tokenizer.json", "tokenizer_config.json",
                          "generation_config.json", "chat_template.jinja"}
    assert not any(name.startswith(("original", "metal")) or name == "README.md" for name in reads)
    assert reads[shards[0]]["cached"] is False and all(reads[s]["cached"] for s in shards[1:])
    assert planned["download_bytes"] == (repo / shards[0]).stat().st_size
    assert {f["name"]: f["bytes"] for f in planned["reads"]} == {n: (repo / n).stat().st_size for n in reads}
    assert not (tmp_path / "out").exists()
    assert main(["convert", repo_id, str(tmp_path / "out"), "--dry-run"]) == 0
    assert "(to download)" in capsys.readouterr().out


@needs_root
def test_a_hub_conversion_that_does_not_fit_is_refused_before_the_shards_move(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo_id, _shards, _repo = _hub_cache(tmp_path, monkeypatch)
    calls: list[list[str]] = []
    real = hub._snapshot_download()

    def counting(**kwargs: Any) -> str:
        calls.append(kwargs["allow_patterns"])
        return real(**kwargs)

    monkeypatch.setattr(hub, "_snapshot_download", lambda: counting)
    with tmpfs(tmp_path / "small", "64k") as small:
        assert main(["convert", repo_id, str(small / "out")]) == 2
        err = capsys.readouterr().err
        assert "needs" in err and "free" in err and list(small.iterdir()) == []
    assert len(calls) == 1  # config, index and companions only


# --------------------------------------------------------------------------- what a stranger meets


def test_convert_json_errors_are_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    code = main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert code == 2 and document["ok"] is False and document["exit_code"] == 2
    assert "has no config.json" in document["error"]["message"] and "has no config.json" in captured.err


def test_convert_json_success_has_ok(sources: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``ok`` in every --json document of convert: the error, the plan and the report."""
    code = main(["convert", str(sources[SOURCE_MXFP4]), str(tmp_path / "out"), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["ok"] is True and document["tensors"] > 0


def test_verify_conversion_json_errors_are_json(sources: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False)
    code = main(["verify-conversion", str(sources[SOURCE_MXFP4]), "--source", str(tmp_path / "out"), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 2 and not document["ok"] and "arguments look swapped" in document["error"]["message"]


def test_swapped_verify_arguments_get_a_hint(sources: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], out, progress=False)
    code = main(["verify-conversion", str(sources[SOURCE_MXFP4]), "--source", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "arguments look swapped" in err
    assert f"verify-conversion {out} --source {sources[SOURCE_MXFP4]}" in err and len(err.strip().splitlines()) == 1


def _compiled_dir(root: Path) -> Path:
    """A compiled NxDI model directory as NxDI writes it (``neuron_config.json``, ``model.pt``, ``weights/``)."""
    (root / "weights").mkdir(parents=True)
    (root / "neuron_config.json").write_text(json.dumps({"neuron_config": {"tp_degree": 2, "save_sharded_checkpoint": True}}))
    (root / "model.pt").write_bytes(b"not a real archive")
    return root


@pytest.mark.parametrize("where", ["compiled", "compiled/weights"])
def test_convert_names_a_compiled_directory_and_points_at_validate(where: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``convert COMPILED OUT`` (or its ``weights/``): what it is and ``validate COMPILED``, not
    only "no config.json"; nothing written."""
    compiled = _compiled_dir(tmp_path / "compiled")
    assert main(["convert", str(tmp_path / where), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "a compiled NxDI model directory" in err and "no config.json" not in err
    assert f"`nxdi-gptoss-fp8 validate {compiled}`" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["converted", "hf"])
def test_verify_a_compiled_directory_is_named_never_called_swapped(source: str, sources: dict[str, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``verify-conversion COMPILED --source X``: COMPILED named as a compiled NxDI directory with
    ``validate COMPILED``, never "swapped" with a command that would fail."""
    compiled = _compiled_dir(tmp_path / "compiled")
    given = sources[SOURCE_MXFP4] if source == "hf" else convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False).out
    assert main(["verify-conversion", str(compiled), "--source", str(given)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "swapped" not in err and "a compiled NxDI model directory" in err
    assert f"`nxdi-gptoss-fp8 validate {compiled}`" in err


@pytest.mark.parametrize("out_kind", ["empty", "bf16-converted-by-hand"])
def test_a_converted_source_beside_an_out_that_is_no_source_is_not_called_swapped(
        out_kind: str, sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--source a converted checkpoint and OUT something the converter does not read: the hint says
    --source takes the checkpoint it was converted from, and never prints a command that fails."""
    converted = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], converted, progress=False)
    other = tmp_path / "other"
    other.mkdir()
    if out_kind != "empty":
        (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["verify-conversion", str(other), "--source", str(converted)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "swapped" not in err
    assert f"verify-conversion {converted} --source SOURCE" in err and "--source takes the checkpoint" in err


def test_the_swapped_hints_command_runs(sources: dict[str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], out, progress=False)
    assert main(["verify-conversion", str(sources[SOURCE_MXFP4]), "--source", str(out)]) == 2
    command = capsys.readouterr().err.split("run: nxdi-gptoss-fp8 ", 1)[1].split()
    assert main(command) == 0


def test_a_mismatched_verify_source_names_the_recorded_one(sources: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_MXFP4], out, progress=False)
    report = verify_conversion(out, sources[SOURCE_BF16])
    assert not report.ok
    assert report.problems[0].startswith("hint: OUT records that it was converted from format hf-mxfp4")
    moved = Path(shutil.copytree(sources[SOURCE_MXFP4], tmp_path / "moved"))
    assert verify_conversion(out, moved).ok  # a moved copy of the right source still verifies
    assert main(["verify-conversion", str(out), "--source", str(sources[SOURCE_BF16])]) == 1
    assert "hint: OUT records" in capsys.readouterr().out


SOURCE_KINDS = (SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS)


@pytest.mark.parametrize("wrong", [*SOURCE_KINDS, "same kind, other weights"])
@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_a_wrong_verify_source_gets_the_recorded_source_hint(
        sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, wrong: str) -> None:
    """Whatever OUT records (a compressed-tensors split included) and whatever wrong source is
    given, the answer is the documented "OUT records …" hint first, never a refusal of an option
    the user did not pass; the right source verifies."""
    out = tmp_path / "out"
    convert(sources[kind], out, progress=False)
    if wrong == kind:
        return  # the right source: covered below
    given = make_source(tmp_path / "other", kind, seed=7, original=False) if wrong.startswith("same") else sources[wrong]
    code = main(["verify-conversion", str(out), "--source", str(given)])
    captured = capsys.readouterr()
    assert code == 1 and "--ct-gate-up-split" not in captured.err + captured.out, captured.err
    problems = [line.strip() for line in captured.out.splitlines() if line.strip().startswith("problem:")]
    assert problems[0].startswith("problem: hint: OUT records that it was converted from"), problems[:2]
    assert main(["verify-conversion", str(out), "--source", str(sources[kind])]) == 0


def test_progress_lines_off_a_terminal(sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress_module, "INTERVAL_S", 0.0)
    convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "convert 0/2 layers:" in err and "convert 1/2 layers:" in err and "(100%)" in err and "sha256 shards:" in err
    verify_conversion(tmp_path / "out", sources[SOURCE_MXFP4], progress=True)
    err = capsys.readouterr().err
    assert "verify 0/2 layers:" in err and "(100%)" in err
    convert(sources[SOURCE_MXFP4], tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16])
@pytest.mark.parametrize("command", ["convert", "verify-conversion"])
def test_the_compressed_tensors_split_option_is_refused_for_other_sources(
        sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, command: str) -> None:
    """``--ct-gate-up-split`` means something only for compressed-tensors: elsewhere it is a
    mistake (a wrong SRC, say), refused in one line instead of silently ignored."""
    if command == "convert":
        argv = ["convert", str(sources[kind]), str(tmp_path / "out")]
    else:
        convert(sources[kind], tmp_path / "out")
        argv = ["verify-conversion", str(tmp_path / "out"), "--source", str(sources[kind])]
    code = main([*argv, "--ct-gate-up-split", "halves"])
    err = capsys.readouterr().err
    assert code == 2 and "--ct-gate-up-split is for compressed-tensors FP8 sources only" in err, err
    assert len(err.strip().splitlines()) == 1
    if command == "convert":
        assert not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)
