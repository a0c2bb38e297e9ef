"""Pre-sharded weights through NxDI's REAL ``shard_weights`` and ``load_weights`` (from
``NXDI_SRC``, the Neuron packages stood in by ``neuron_stubs``; NxD's ``ModelBuilder`` replaced by
the stand-in builder, the traced model by one that records ``nxd_model.initialize``): the same
scenarios as ``test_validate_presharded.py``. Skipped unless NxDI is importable or ``NXDI_SRC`` is set.

Run: ``NXDI_SRC=/path/to/neuronx-distributed-inference python3 -m pytest -q -m nxdi test/test_nxdi_presharded.py``
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))

import presharded_cases as cases
from nxdi_standin import neuron_stubs
from real_nxdi import real_modeling

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_MXFP4, make_source, write_legacy_fp8
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS
from nxdi_gptoss_fp8.validate import presharded_manifest as pm

pytestmark = [pytest.mark.nxdi, pytest.mark.filterwarnings("ignore")]

HLO_UTILS = "neuronx_distributed.trace.hlo_utils"


@pytest.fixture(scope="module")
def modeling() -> Iterator[ModuleType]:
    with real_modeling(unset=(fmt.VERIFY_AT_LOAD_ENV,)) as module:
        hlo = sys.modules.get(HLO_UTILS)
        if isinstance(hlo, neuron_stubs._StubModule):
            # shard_weights tests this NxD constant against os.environ: give the stub NxD's value
            hlo.NXD_LAYOUT_TRANSFORMATION_OPTIONS = "NXD_LAYOUT_TRANSFORMATION_OPTIONS"
        yield module


@pytest.fixture
def mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    yield
    nxdi_hook.unregister()


@pytest.fixture
def scene(modeling: ModuleType, mode: None, tiny_template: Path, tmp_path: Path) -> cases.Scene:
    ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
    compiled = tmp_path / "compiled"
    cases.compile_shards(modeling, ckpt, compiled)
    return cases.Scene(modeling, ckpt, compiled, tmp_path)


def test_real_methods_are_the_ones_driven(modeling: ModuleType, mode: None) -> None:
    base = sys.modules[f"{nxdi_hook.NXDI_PACKAGE}.models.application_base"].NeuronApplicationBase
    assert "neuron_stubs" not in repr(base) and base.__module__.startswith(nxdi_hook.NXDI_PACKAGE)
    wrapped = vars(modeling.NeuronGptOssForCausalLM)["load_weights"]
    assert wrapped.__wrapped__ is base.load_weights and vars(modeling.NeuronGptOssForCausalLM)["shard_weights"].__wrapped__ is base.shard_weights


def test_clean_compile_then_load_hands_nxdi_exactly_the_written_shards(scene: cases.Scene) -> None:
    manifest = pm.read_manifest(str(scene.compiled))
    assert sorted(manifest.ranks) == list(range(cases.TP)) and manifest.sources[0].path == str(scene.ckpt.resolve())
    app = cases.load_app(scene.modeling, scene.compiled, scene.ckpt)
    loaded = cases.load(app, scene.compiled)
    assert loaded is not None and loaded.start_rank.tolist() == [0]
    assert cases.same_weights(loaded.weights, cases.files_on_disk(scene.compiled))
    assert app._builder.loader_calls == 0
    expected = [app._builder.shard_rank(app.checkpoint_loader_fn(), rank) for rank in range(cases.TP)]
    assert cases.same_weights(loaded.weights, expected)
    print(f"nxdi presharded: {len(loaded.weights)} ranks, {len(loaded.weights[0])} tensors each, as written")


def test_a_directory_written_by_nxdis_own_save_passes_validate_and_inspect(scene: cases.Scene,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """NxDI's real InferenceConfig.save (json.dumps: quantize_clamp_bound is Infinity)."""
    from nxdi_gptoss_fp8 import cli

    saved = scene.compiled / "neuron_config.json"
    assert '"quantize_clamp_bound": Infinity' in saved.read_text()
    for args in (["validate", str(scene.compiled)], ["inspect", str(scene.compiled)],
                 ["validate", str(scene.ckpt), "--neuron-config", str(saved)]):
        code = cli.main(args)
        out = capsys.readouterr().out
        assert code == 0 and "non-standard constant" not in out, (args, out)
        assert "VALID" in out or "manifest written" in out
        assert "0 errors, 0 warnings" in out or args[0] == "inspect"  # every key of NxDI's file is known


def test_a_padded_compile_by_nxdi_passes_validate_with_its_neuron_config(
        modeling: ModuleType, mode: None, tiny_padded_template: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """NxDI keeps H'/I' in hidden/intermediate_size and H/I in original_*: its saved file still checks clean."""
    from nxdi_gptoss_fp8 import cli

    compiled = tmp_path / "compiled"
    cases.compile_shards(modeling, tiny_padded_template, compiled, padded_hidden_size=96, padded_intermediate_size=128)
    saved = compiled / "neuron_config.json"
    assert '"original_hidden_size": 64' in saved.read_text() and '"hidden_size": 96' in saved.read_text()
    for args in (["validate", str(compiled)], ["validate", str(tiny_padded_template), "--neuron-config", str(saved)]):
        assert cli.main(args) == 0
        assert "0 errors, 0 warnings" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(cases.TAMPERINGS))
def test_each_tampering_gets_its_outcome_before_initialize(scene: cases.Scene, name: str) -> None:
    message = cases.tampered_load(scene, name)
    assert (message is None) == (cases.TAMPERINGS[name][1] is None)


def test_an_interrupted_shard_step_leaves_no_manifest(scene: cases.Scene) -> None:
    with pytest.raises(RuntimeError, match="interrupted"):
        cases.compile_shards(scene.modeling, scene.ckpt, scene.compiled, fail_after_rank=0)
    assert not (scene.weights / pm.MANIFEST_FILE).exists()


def test_shard_on_load_reaches_nxdi_unchanged(modeling: ModuleType, mode: None, tiny_template: Path, tmp_path: Path) -> None:
    compiled = tmp_path / "compiled"
    cases.compile_shards(modeling, tiny_template, compiled, save_sharded_checkpoint=False)
    assert not (compiled / "weights").exists()
    app = cases.load_app(modeling, compiled, tiny_template)
    loaded = cases.load(app, compiled)
    assert loaded is not None and app._builder.loader_calls == 1


@pytest.mark.parametrize("kind", ["hf", "legacy"])
def test_hf_and_legacy_compile_and_load_are_nxdis_bit_for_bit(modeling: ModuleType, tiny_template: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, kind)
    source = (make_source(tmp_path / "hf", SOURCE_MXFP4, dims=TINY_DIMS, scale_range=REALISTIC_SCALE_RANGE, original=False)
              if kind == "hf" else write_legacy_fp8(tmp_path / "legacy", tiny_template))
    results = {}
    try:
        for hooked in (False, True):
            if hooked:
                nxdi_hook.register()
            compiled = tmp_path / f"compiled-{hooked}"
            cases.compile_shards(modeling, source, compiled)
            loaded = cases.load(cases.load_app(modeling, compiled, source), compiled)
            assert loaded is not None
            results[hooked] = (sorted(p.name for p in (compiled / "weights").iterdir()),
                               [(compiled / "weights" / pm.rank_file(r)).read_bytes() for r in range(cases.TP)], loaded)
    finally:
        nxdi_hook.unregister()
    assert results[True][0] == results[False][0] == [pm.rank_file(r) for r in range(cases.TP)]
    assert results[True][1] == results[False][1]
    assert cases.same_weights(results[True][2].weights, results[False][2].weights)


def test_unregister_restores_both_methods(modeling: ModuleType) -> None:
    app_cls = modeling.NeuronGptOssForCausalLM
    before = {name: vars(app_cls).get(name) for name in ("shard_weights", "load_weights")}
    inherited = {name: getattr(app_cls, name) for name in before}
    nxdi_hook.register()
    assert all(vars(app_cls)[name] is not inherited[name] for name in before)
    nxdi_hook.unregister()
    assert {name: vars(app_cls).get(name) for name in before} == before
    assert all(getattr(app_cls, name) is inherited[name] for name in before)
