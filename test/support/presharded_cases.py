"""The pre-sharded weights scenarios, shared by the stand-in tests (``test_validate_presharded.py``)
and the ones driving NxDI's real ``shard_weights`` / ``load_weights`` (``test_nxdi_presharded.py``).

``modeling`` is either module (stand-in or real ``modeling_gpt_oss``); both build the app the
same way (``standin`` installs the stand-in the way every stand-in test sees it). The compile step is ``app.shard_weights(COMPILED)`` after ``app.config.save(COMPILED)``
(what NxDI's ``compile()`` does around tracing); the load step is ``load_weights`` on an app
built from ``COMPILED/neuron_config.json`` (or from a changed NeuronConfig), whose
``traced_model`` records what ``nxd_model.initialize`` received.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import nxdi_standin
import pytest
import torch
from nxdi_standin.model_builder import RecordingTracedModel, ShardingBuilder
from real_nxdi import gptoss_app
from safetensors.torch import load_file

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.synthetic.tiny import make_tiny
from nxdi_gptoss_fp8.validate import presharded as sm
from nxdi_gptoss_fp8.validate import presharded_manifest as pm

TP = 2
FP8_NEURON_CONFIG: dict[str, Any] = {
    "quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE, "quantization_dtype": fmt.QUANTIZATION_DTYPE,
    "modules_to_not_convert": ["lm_head", "self_attn"], "logical_nc_config": 1, "tp_degree": TP,
    "save_sharded_checkpoint": True,
}


@contextlib.contextmanager
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The stand-in NxDI installed, no checkpoint format chosen, verification at load unset and
    custom models allowed (the stand-in's config is a custom one)."""
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    monkeypatch.delenv(fmt.VERIFY_AT_LOAD_ENV, raising=False)
    monkeypatch.setenv(fmt.ALLOW_CUSTOM_ENV, "1")
    with nxdi_standin.installed() as modules:
        yield modules


def make_app(modeling: ModuleType, ckpt: Path, **overrides: Any) -> Any:
    """NxDI's GPT-OSS application for ``ckpt``, with the stand-in builder and traced model."""
    kwargs = {**FP8_NEURON_CONFIG, "quantized_checkpoints_path": str(ckpt), **overrides}
    return _equipped(gptoss_app(modeling, ckpt, kwargs))


def _equipped(app: Any, **builder: Any) -> Any:
    app._builder = ShardingBuilder.for_app(app, **builder)
    app.traced_model = RecordingTracedModel()
    return app


def compile_shards(modeling: ModuleType, ckpt: Path, compiled: Path, *, fail_after_rank: int | None = None,
                   **overrides: Any) -> Any:
    """What NxDI's ``compile()`` does around tracing: save the config, then ``shard_weights``."""
    app = make_app(modeling, ckpt, **overrides)
    if fail_after_rank is not None:
        _equipped(app, fail_after_rank=fail_after_rank)
    app.config.save(str(compiled))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app.shard_weights(str(compiled))
    return app


def load_app(modeling: ModuleType, compiled: Path, ckpt: Path, **overrides: Any) -> Any:
    """The app a host builds to load ``compiled``: from its ``neuron_config.json``, or with a
    NeuronConfig changed by ``overrides``."""
    if overrides:
        return make_app(modeling, ckpt, **overrides)
    return _equipped(modeling.NeuronGptOssForCausalLM(str(ckpt), modeling.GptOssInferenceConfig.load(str(compiled))))


@dataclass
class Loaded:
    weights: list[dict[str, torch.Tensor]]
    start_rank: torch.Tensor


def load(app: Any, compiled: Path) -> Loaded | None:
    """``load_weights`` (raising what the hook raises); what ``initialize`` received, or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            app.load_weights(str(compiled))
        finally:
            calls = app.traced_model.nxd_model.calls
    assert len(calls) <= 1
    return Loaded(*calls[0]) if calls else None


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same_weights(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        sorted(x) == sorted(y) and all(x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and raw(x[k]) == raw(y[k]) for k in x)
        for x, y in zip(a, b, strict=True))


def files_on_disk(compiled: Path, ranks: range | list[int] = range(TP)) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(compiled / "weights" / pm.rank_file(rank))) for rank in ranks]


# --------------------------------------------------------------------------- tamperings


@dataclass
class Scene:
    """One compiled directory and what a tampering may use."""

    modeling: ModuleType
    ckpt: Path
    compiled: Path
    tmp: Path

    @property
    def weights(self) -> Path:
        return self.compiled / "weights"

    def rank(self, rank: int) -> Path:
        return self.weights / pm.rank_file(rank)


def _truncate(scene: Scene) -> dict[str, Any]:
    path = scene.rank(1)
    os.truncate(path, path.stat().st_size - 1)
    return {}


def _missing(scene: Scene) -> dict[str, Any]:
    scene.rank(1).unlink()
    return {}


def _extra_rank(scene: Scene) -> dict[str, Any]:
    shutil.copyfile(scene.rank(0), scene.rank(TP))
    return {}


def _other_ranks_file(scene: Scene) -> dict[str, Any]:
    shutil.copyfile(scene.rank(0), scene.rank(1))
    return {}


def _header_byte(scene: Scene) -> dict[str, Any]:
    data = bytearray(scene.rank(1).read_bytes())
    at = data.index(b"layers.0.")
    data[at + 7] = ord("9")  # one character of a tensor name: same size, same data
    scene.rank(1).write_bytes(bytes(data))
    return {}


def unsampled_data_offset(path: Path) -> int:
    """A data byte of the rank file that the default check's sampled blocks do not cover."""
    manifest = pm.read_manifest(str(path.parent.parent))
    return unsampled_data_offset_for(path, manifest.sample_blocks, manifest.sample_block_size)


def unsampled_data_offset_for(path: Path, blocks: int, block_size: int = pm.SAMPLE_BLOCK) -> int:
    size = path.stat().st_size
    data_offset = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    covered = pm.sample_offsets(size, data_offset, blocks, block_size)
    return next(o for o in range(data_offset, size) if not any(start <= o < start + count for start, count in covered))


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def _data_byte_verified(scene: Scene) -> dict[str, Any]:
    _flip(scene.rank(1), unsampled_data_offset(scene.rank(1)))
    return {fmt.VERIFY_AT_LOAD_ATTR: True}


def _data_byte_unverified(scene: Scene) -> dict[str, Any]:
    _flip(scene.rank(1), unsampled_data_offset(scene.rank(1)))
    return {}


def _sampled_data_byte(scene: Scene) -> dict[str, Any]:
    manifest = pm.read_manifest(str(scene.compiled))
    path = scene.rank(1)
    data_offset = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    offset, _ = pm.sample_offsets(path.stat().st_size, data_offset, manifest.sample_blocks, manifest.sample_block_size)[0]
    _flip(path, offset)
    return {}


def _manifest_missing(scene: Scene) -> dict[str, Any]:
    (scene.weights / pm.MANIFEST_FILE).unlink()
    return {}


def _manifest_corrupt(scene: Scene) -> dict[str, Any]:
    (scene.weights / pm.MANIFEST_FILE).write_text('{"format": 1, "format": 2}')
    return {}


def _manifest_of_another_compile(scene: Scene) -> dict[str, Any]:
    other_ckpt = Path(make_tiny(scene.tmp / "other-ckpt", seed=7))
    compile_shards(scene.modeling, other_ckpt, scene.tmp / "other-compiled")
    shutil.copyfile(scene.tmp / "other-compiled" / "weights" / pm.MANIFEST_FILE, scene.weights / pm.MANIFEST_FILE)
    return {}


def _weights_of_another_compile(scene: Scene) -> dict[str, Any]:
    """A whole weights/ folder (with its manifest) of a tp=1 compile dropped next to this one's config."""
    other = scene.tmp / "other-compiled"
    compile_shards(scene.modeling, scene.ckpt, other, tp_degree=1)
    shutil.rmtree(scene.weights)
    shutil.copytree(other / "weights", scene.weights)
    return {}


def _tp_changed(scene: Scene) -> dict[str, Any]:
    return {"tp_degree": 1}


def _padding_changed(scene: Scene) -> dict[str, Any]:
    return {"padded_hidden_size": 96}


def _source_reconverted(scene: Scene) -> dict[str, Any]:
    shutil.rmtree(scene.ckpt)
    make_tiny(scene.ckpt, seed=3)
    return {}


def _source_deleted(scene: Scene) -> dict[str, Any]:
    shutil.rmtree(scene.ckpt)
    return {}


def _rank_of_another_compile(scene: Scene) -> dict[str, Any]:
    other_ckpt = Path(make_tiny(scene.tmp / "other-ckpt", seed=7))
    compile_shards(scene.modeling, other_ckpt, scene.tmp / "other-compiled")
    shutil.copyfile(scene.tmp / "other-compiled" / "weights" / pm.rank_file(1), scene.rank(1))
    return {}


def _another_checkpoint(scene: Scene) -> dict[str, Any]:
    """The model built from another checkpoint B (its own path) with A's compiled directory."""
    scene.ckpt = Path(make_tiny(scene.tmp / "other-ckpt", seed=7))
    return {"quantized_checkpoints_path": str(scene.ckpt)}


def _source_moved(scene: Scene) -> dict[str, Any]:
    """The same checkpoint at another path (moved): the same fingerprint."""
    scene.ckpt = Path(shutil.move(scene.ckpt, scene.tmp / "moved-ckpt"))
    return {"quantized_checkpoints_path": str(scene.ckpt)}


def _source_copied_and_reconverted(scene: Scene) -> dict[str, Any]:
    """A copy of the checkpoint named by the model, the original re-converted: the copy is still it."""
    copy = Path(shutil.copytree(scene.ckpt, scene.tmp / "copied-ckpt"))
    _source_reconverted(scene)
    scene.ckpt = copy
    return {"quantized_checkpoints_path": str(copy)}


def _compiled_moved(scene: Scene) -> dict[str, Any]:
    scene.compiled = Path(shutil.move(scene.compiled, scene.tmp / "moved-compiled"))
    return {}


def _relink(path: Path, store: Path) -> None:
    store.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, store)
    path.symlink_to(store)


def _rank_link_inside(scene: Scene) -> dict[str, Any]:
    _relink(scene.rank(1), scene.compiled / "store" / pm.rank_file(1))
    return {}


def _rank_link_outside(scene: Scene) -> dict[str, Any]:
    _relink(scene.rank(1), scene.tmp / "elsewhere" / pm.rank_file(1))
    return {}


def _weights_link_outside(scene: Scene) -> dict[str, Any]:
    _relink(scene.weights, scene.tmp / "weights-store")
    return {}


def _dangling_rank_link(scene: Scene) -> dict[str, Any]:
    scene.rank(1).unlink()
    scene.rank(1).symlink_to(scene.tmp / "gone" / pm.rank_file(1))
    return {}


def _rank_link_to_another_rank(scene: Scene) -> dict[str, Any]:
    scene.rank(1).unlink()
    scene.rank(1).symlink_to(scene.rank(0))
    return {}


def _rsync_temp_beside(scene: Scene) -> dict[str, Any]:
    (scene.weights / f".{pm.rank_file(0)}.AbCdEf").write_bytes(scene.rank(0).read_bytes()[:100])
    return {}


def _odd_files_beside(scene: Scene) -> dict[str, Any]:
    (scene.weights / "README.txt").write_text("notes")
    (scene.weights / ".DS_Store").write_bytes(b"\0")
    (scene.weights / "cache").mkdir()
    return {}


def _rank_file_is_a_directory(scene: Scene) -> dict[str, Any]:
    scene.rank(1).unlink()
    scene.rank(1).mkdir()
    return {}


def _this_host_holds_rank_0(scene: Scene) -> dict[str, Any]:
    """A multi-host deployment: this host holds and loads only rank 0."""
    scene.rank(1).unlink()
    return {"start_rank_id": 0, "local_ranks_size": 1}


def _this_host_lacks_its_rank(scene: Scene) -> dict[str, Any]:
    scene.rank(1).unlink()
    return {"start_rank_id": 1, "local_ranks_size": 1}


def _manifest_write_interrupted(scene: Scene) -> dict[str, Any]:
    """A shard step stopped while the manifest was written: the old one removed, our temporary left."""
    manifest = scene.weights / pm.MANIFEST_FILE
    manifest.rename(scene.weights / f".{pm.MANIFEST_FILE}.tmp-12345")
    return {}


def _weights_is_a_file(scene: Scene) -> dict[str, Any]:
    shutil.rmtree(scene.weights)
    scene.weights.write_bytes(b"not a folder")
    return {}


def _manifest_edit(scene: Scene, text: str) -> dict[str, Any]:
    (scene.weights / pm.MANIFEST_FILE).write_text(text)
    return {}


def _manifest_huge(scene: Scene) -> dict[str, Any]:
    manifest = (scene.weights / pm.MANIFEST_FILE).read_text()
    return _manifest_edit(scene, manifest[:-2] + ', "padding": "' + "x" * pm.MAX_MANIFEST_BYTES + '"}')


def _manifest_nested(scene: Scene) -> dict[str, Any]:
    manifest = (scene.weights / pm.MANIFEST_FILE).read_text()
    return _manifest_edit(scene, manifest[:-2] + ', "deep": ' + "[" * 10_000 + "]" * 10_000 + "}")


def _manifest_duplicate_key(scene: Scene) -> dict[str, Any]:
    manifest = (scene.weights / pm.MANIFEST_FILE).read_text()
    return _manifest_edit(scene, manifest.replace('"tp_degree": 2,', '"tp_degree": 2, "tp_degree": 2,', 1))


def _manifest_inconsistent(scene: Scene) -> dict[str, Any]:
    manifest = (scene.weights / pm.MANIFEST_FILE).read_text()
    return _manifest_edit(scene, manifest.replace('"world_size": 2,', '"world_size": 1,', 1))


# name → (tampering returning NeuronConfig overrides for the load, the codes refused with; None: it loads)
TAMPERINGS: dict[str, tuple[Callable[[Scene], dict[str, Any]], set[str] | None]] = {
    "truncated": (_truncate, {"presharded.size_mismatch"}),
    "missing": (_missing, {"presharded.missing_rank_file"}),
    "extra-rank": (_extra_rank, {"presharded.unlisted_rank_file"}),
    "other-rank's-file": (_other_ranks_file, {"presharded.data_mismatch"}),
    "header-byte": (_header_byte, {"presharded.header_mismatch"}),
    "sampled-data-byte": (_sampled_data_byte, {"presharded.data_mismatch"}),
    "data-byte-verified": (_data_byte_verified, {"presharded.digest_mismatch"}),
    "data-byte-unverified": (_data_byte_unverified, None),  # outside the samples: only verification sees it
    "manifest-missing": (_manifest_missing, {"presharded.no_manifest"}),
    "manifest-corrupt": (_manifest_corrupt, {"presharded.bad_manifest"}),
    "manifest-of-another-compile": (_manifest_of_another_compile, {"presharded.data_mismatch", "presharded.other_checkpoint"}),
    "rank-of-another-compile": (_rank_of_another_compile, {"presharded.data_mismatch"}),
    "weights-of-another-compile": (_weights_of_another_compile, {"presharded.settings_mismatch", "presharded.rank_not_in_manifest"}),
    "tp-degree-changed": (_tp_changed, {"presharded.settings_mismatch"}),
    "padded-size-changed": (_padding_changed, {"presharded.settings_mismatch"}),
    "source-reconverted": (_source_reconverted, {"presharded.stale_source"}),
    "source-deleted": (_source_deleted, None),
    "another-checkpoint": (_another_checkpoint, {"presharded.other_checkpoint"}),
    "source-moved": (_source_moved, None),  # moved but identical: the same checkpoint
    "source-copied-then-reconverted": (_source_copied_and_reconverted, None),
    "compiled-moved": (_compiled_moved, None),
    "rank-link-inside": (_rank_link_inside, None),
    "rank-link-outside": (_rank_link_outside, None),
    "weights-link-outside": (_weights_link_outside, None),
    "dangling-rank-link": (_dangling_rank_link, {"presharded.missing_rank_file"}),
    "rank-link-to-another-rank": (_rank_link_to_another_rank, {"presharded.data_mismatch"}),
    "rsync-temp-beside": (_rsync_temp_beside, None),  # a warning naming it
    "odd-files-beside": (_odd_files_beside, None),
    "rank-file-is-a-directory": (_rank_file_is_a_directory, {"presharded.not_a_file"}),
    "host-holds-only-its-ranks": (_this_host_holds_rank_0, None),
    "host-lacks-its-rank": (_this_host_lacks_its_rank, {"presharded.missing_rank_file"}),
    "manifest-huge": (_manifest_huge, {"presharded.bad_manifest"}),
    "manifest-nested": (_manifest_nested, {"presharded.bad_manifest"}),
    "manifest-duplicate-key": (_manifest_duplicate_key, {"presharded.bad_manifest"}),
    "manifest-inconsistent": (_manifest_inconsistent, {"presharded.bad_manifest"}),
    "manifest-write-interrupted": (_manifest_write_interrupted, {"presharded.no_manifest"}),
    "weights-is-a-file": (_weights_is_a_file, {"presharded.bad_manifest"}),
}
# the warnings a loading tampering leaves (every other one loads without any)
WARNED = {"rsync-temp-beside": {"presharded.partial_file"}}


def loaded_ranks(app: Any) -> list[int]:
    start, count = int(app.neuron_config.start_rank_id), int(app.neuron_config.local_ranks_size)
    return list(range(start, start + count))


def tampered_load(scene: Scene, name: str) -> str | None:
    """Applies the tampering ``name`` and loads: None when it loads (and NxDI was handed exactly the
    files), else the refusal's message (refused before ``nxd_model.initialize``, with exactly the
    tampering's codes)."""
    tamper, refused = TAMPERINGS[name]
    overrides = tamper(scene)  # may move the compiled directory or name another checkpoint
    app = load_app(scene.modeling, scene.compiled, scene.ckpt, **overrides)
    if refused is None:
        loaded = load(app, scene.compiled)
        ranks = loaded_ranks(app)
        assert loaded is not None and same_weights(loaded.weights, files_on_disk(scene.compiled, ranks))
        assert loaded.start_rank.tolist() == [ranks[0]]
        return None
    with pytest.raises(sm.ShardedWeightsError) as caught:
        load(app, scene.compiled)
    assert app.traced_model.nxd_model.calls == []
    assert set(caught.value.codes) == refused, str(caught.value)
    return str(caught.value)
