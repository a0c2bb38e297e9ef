"""The streaming writer: plan, headers the safetensors library reads, atomic placement."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nxdi_gptoss_fp8 import ConversionError, preflight
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.output_target.work_dirs import host_tag, stale_partials
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS, make_tiny, tiny_tensors
from nxdi_gptoss_fp8.writer import CheckpointWriter, build_header, plan_shards


def test_tiny_checkpoint_reads_back_exactly_with_safetensors(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    expected = tiny_tensors(layout, seed=3)
    out = make_tiny(tmp_path / "t", seed=3)
    index = preflight(out, allow_custom_model=True).view.weight_map
    for name, tensor in expected.items():
        with safe_open(os.path.join(out, index[name]), "pt") as handle:
            loaded = handle.get_tensor(name)
        assert loaded.dtype == tensor.dtype and torch.equal(loaded.view(torch.uint8), tensor.contiguous().view(torch.uint8))


def test_plan_keeps_weight_scale_bias_together_and_respects_size() -> None:
    layout = fmt.Layout.unpadded(fmt.PROFILES[fmt.PROFILE_120B])
    plan = plan_shards(layout, 5_000_000_000)
    where = {spec.name: number for number, shard in enumerate(plan) for spec in shard}
    assert len(where) == 687
    scales = [name for name in where if fmt.is_expert_scale(name)]
    assert len(scales) == 2 * 36
    for scale in scales:
        assert where[fmt.weight_key_for(scale)] == where[scale] == where[scale.replace(".scale", ".bias")]
    for shard in plan:
        size = sum(spec.nbytes for spec in shard)
        assert size <= 5_000_000_000 or len({spec.name.rsplit(".", 1)[0] for spec in shard}) == 1


def test_header_alignment() -> None:
    specs = [fmt.TensorSpec("a", (3,), "BF16"), fmt.TensorSpec("b", (5,), "F32"), fmt.TensorSpec("c", (7,), "F8_E4M3")]
    header, offsets = build_header(specs)
    assert len(header) % 8 == 0
    assert offsets["b"] % 4 == 0 and offsets["a"] % 2 == 0


def test_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), CheckpointWriter(out, layout, "custom", fmt.hf_config(TINY_DIMS)) as writer:
        writer.put("norm.weight", torch.ones(64, dtype=torch.bfloat16))
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_incomplete_write_is_refused(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    with CheckpointWriter(tmp_path / "out", layout, "custom", fmt.hf_config(TINY_DIMS)) as writer:
        writer.put("norm.weight", torch.ones(64, dtype=torch.bfloat16))
        with pytest.raises(ConversionError, match="not written completely"):
            writer.commit()
    assert not (tmp_path / "out").exists()


def test_put_rejects_unknown_names_and_overflows(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    with CheckpointWriter(tmp_path / "out", layout, "custom", fmt.hf_config(TINY_DIMS)) as writer:
        with pytest.raises(ConversionError, match="not a tensor"):
            writer.put("model.norm.weight", b"\0\0")
        with pytest.raises(ConversionError, match="exceed"):
            writer.put("norm.weight", bytes(130))


def _write_all(writer: CheckpointWriter) -> None:
    for name in writer.planned:
        writer.put_zeros(name)


def test_extra_files_are_copied_inside_the_atomic_write(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    (tmp_path / "tok.json").write_text('{"v": 1}')
    link = tmp_path / "gen.json"
    link.symlink_to(tmp_path / "tok.json")
    extra = {"tokenizer.json": str(tmp_path / "tok.json"), "generation_config.json": str(link)}
    out = tmp_path / "out"
    with CheckpointWriter(out, layout, "custom", fmt.hf_config(TINY_DIMS), extra_files=extra) as writer:
        _write_all(writer)
        assert not out.exists()
        writer.commit()
    assert (out / "tokenizer.json").read_text() == '{"v": 1}' and not (out / "generation_config.json").is_symlink()
    assert (out / fmt.INDEX_FILE).is_file() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_text_files_are_written_at_commit_and_count_as_ours(tmp_path: Path) -> None:
    layout = fmt.Layout.unpadded(TINY_DIMS)
    out = tmp_path / "out"
    for _ in range(2):  # the second run overwrites the first, card included
        with CheckpointWriter(out, layout, "custom", fmt.hf_config(TINY_DIMS), overwrite=True) as writer:
            _write_all(writer)
            writer.text_files["README.md"] = "---\nbase_model: x\n---\n"
            writer.commit()
    assert (out / "README.md").read_text().startswith("---") and (out / fmt.INDEX_FILE).is_file()
    assert not any(p.name.startswith(".") for p in [*tmp_path.iterdir(), *out.iterdir()])


@pytest.mark.parametrize("name", ["config.json", fmt.INDEX_FILE, "sub/tokenizer.json", "..", "x.safetensors", "w.bin"])
def test_extra_files_cannot_shadow_the_checkpoint(tmp_path: Path, name: str) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConversionError, match="plain file name"):
        CheckpointWriter(tmp_path / "out", fmt.Layout.unpadded(TINY_DIMS), "custom", fmt.hf_config(TINY_DIMS),
                         extra_files={name: str(tmp_path / "f")})


def test_an_extra_file_that_is_a_fifo_is_refused_and_nothing_appears(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    out = tmp_path / "out"
    with CheckpointWriter(out, fmt.Layout.unpadded(TINY_DIMS), "custom", fmt.hf_config(TINY_DIMS),
                          extra_files={"tokenizer.json": str(tmp_path / "fifo")}) as writer:
        _write_all(writer)
        with pytest.raises(ConversionError, match="FIFO"):
            writer.commit()
    assert not out.exists()


def test_refuses_non_empty_output_without_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="--overwrite"):
        make_tiny(out)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ConversionError, match=r"does not look like an earlier output.*keep\.txt"):
        make_tiny(out, overwrite=True)  # user files are never deleted
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    (out / "keep.txt").unlink()
    make_tiny(out, seed=1)
    make_tiny(out, overwrite=True)  # an earlier output of ours is replaced
    assert preflight(out, allow_custom_model=True).ok and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_same_inputs_give_identical_bytes(tmp_path: Path) -> None:
    a, b = make_tiny(tmp_path / "a", seed=1), make_tiny(tmp_path / "b", seed=1)
    for name in sorted(os.listdir(a)):
        assert Path(a, name).read_bytes() == Path(b, name).read_bytes(), name


def _killed_writer(out: Path) -> Path:
    """Start a write of ``out`` in another process, SIGKILL it mid-way; the partial directory it left."""
    code = (
        "import sys, time\n"
        "from nxdi_gptoss_fp8 import format as fmt\n"
        "from nxdi_gptoss_fp8.synthetic.tiny_stdlib import TINY_DIMS\n"
        "from nxdi_gptoss_fp8.writer import CheckpointWriter\n"
        "layout = fmt.Layout.unpadded(TINY_DIMS)\n"
        f"with CheckpointWriter({str(out)!r}, layout, 'custom', fmt.hf_config(TINY_DIMS)) as writer:\n"
        "    writer.put('norm.weight', bytes(2 * TINY_DIMS.hidden_size))\n"
        "    print(writer.tmp, flush=True)\n"
        "    time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    partial = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL and partial.is_dir()
    return partial


def test_a_killed_runs_partial_directory_is_named_and_removed_by_the_next_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    partial = _killed_writer(out)
    assert partial.name.startswith(".out.partial-") and not out.exists()
    assert stale_partials(out) == [str(partial)]
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        make_tiny(out)
    assert not partial.exists() and preflight(out, allow_custom_model=True).ok
    (message,) = [r.getMessage() for r in caplog.records if "interrupted run" in r.getMessage()]
    assert str(partial) in message and "removed" in message and " kB" in message
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_live_runs_partial_directory_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with CheckpointWriter(out, fmt.Layout.unpadded(TINY_DIMS), "custom", fmt.hf_config(TINY_DIMS)) as writer:
        assert writer.tmp is not None
        assert stale_partials(out) == []  # our own (alive) process
        (tmp_path / ".out.partial-otherhost-1-00ff").mkdir()  # another host's run: cannot tell, keep it
        dead_here = tmp_path / f".out.partial-{host_tag()}-999999999-00ff"
        dead_here.mkdir()
        assert stale_partials(out) == [str(dead_here)]


def test_an_interrupted_overwrite_names_the_previous_output_and_keeps_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    old = tmp_path / f".out.old-{host_tag()}-999999999-00ff"
    (old / "old").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        make_tiny(out)
    assert (old / "old").is_dir()
    assert f"{old} holds the previous out" in caplog.text and "move" in caplog.text


def test_output_directory_follows_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        out = make_tiny(tmp_path / "t")
    finally:
        os.umask(previous)
    assert os.stat(out).st_mode & 0o777 == 0o750


def test_each_shard_is_hashed_once_complete_and_its_digest_recorded(tmp_path: Path) -> None:
    import hashlib
    import json

    from nxdi_gptoss_fp8 import writer as writer_module

    layout = fmt.Layout.unpadded(TINY_DIMS)
    submitted: list[str] = []
    real = writer_module.BackgroundHasher

    class Watching(real):  # type: ignore[misc, valid-type]
        def submit(self, name: str, path: str) -> None:
            submitted.append(name)
            super().submit(name, path)

    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer_module, "BackgroundHasher", Watching)
        with CheckpointWriter(out, layout, "custom", fmt.hf_config(TINY_DIMS), max_shard_size=20_000) as writer:
            _write_all(writer)
            assert sorted(submitted) == sorted(writer.shard_names)  # all handed over before commit
            writer.commit(show_progress=False)
    assert len(submitted) == len(writer.shard_names) > 1
    digests = json.loads((out / fmt.INDEX_FILE).read_text())["metadata"]["shard_sha256"]
    assert list(digests) == writer.shard_names
    assert digests == {shard: hashlib.sha256((out / shard).read_bytes()).hexdigest() for shard in writer.shard_names}


@pytest.mark.parametrize("window", [4096, 65536, 1 << 24])
def test_mapped_hashing_equals_hashlib_over_any_window(tmp_path: Path, window: int) -> None:
    import hashlib

    from nxdi_gptoss_fp8.safeio.hashing import sha256_mapped

    for size in (0, 1, 4095, 4096, 100_003):
        path = tmp_path / f"f{size}"
        path.write_bytes(os.urandom(size))
        seen: list[int] = []
        assert sha256_mapped(str(path), window=window, progress=seen.append) == hashlib.sha256(path.read_bytes()).hexdigest()
        assert sum(seen) == size
