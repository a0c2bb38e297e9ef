"""Pre-sharded weights through the hook's ``shard_weights`` and ``load_weights``: each scenario
runs against the stand-in of NxDI always, and against NxDI's REAL methods (from ``NXDI_SRC``, the
Neuron packages stood in by ``neuron_stubs``; NxD's ``ModelBuilder`` replaced by the stand-in
builder, the traced model by one that records ``nxd_model.initialize``) when NxDI is importable
or ``NXDI_SRC`` is set (those are marked ``nxdi``). The manifest, the check and the commands on
a compiled directory are ``test_validate_presharded.py``'s.

Run: ``NXDI_SRC=/path/to/neuronx-distributed-inference python3 -m pytest -q -m nxdi test/test_nxdi_presharded.py``
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import presharded_cases as cases
import pytest
from nxdi_standin import neuron_stubs
from real_nxdi import real_modeling

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_MXFP4, make_source, write_legacy_fp8
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS
from nxdi_gptoss_fp8.validate import presharded as sm
from nxdi_gptoss_fp8.validate import presharded_manifest as pm

HLO_UTILS = "neuronx_distributed.trace.hlo_utils"
STANDIN_WARNINGS = pytest.mark.filterwarnings("ignore:stand-in cast rule keeps scale")
REAL = [pytest.mark.nxdi, pytest.mark.filterwarnings("ignore")]


@dataclass
class Backend:
    """The NxDI a scenario runs against: its ``modeling_gpt_oss`` and ``NeuronApplicationBase``."""

    name: str
    modeling: ModuleType
    base: type


@pytest.fixture(scope="module")
def modeling() -> Iterator[ModuleType]:
    """NxDI's real ``modeling_gpt_oss`` (skips without NxDI or ``NXDI_SRC``)."""
    with real_modeling(unset=(fmt.VERIFY_AT_LOAD_ENV,)) as module:
        hlo = sys.modules.get(HLO_UTILS)
        if isinstance(hlo, neuron_stubs._StubModule):
            # shard_weights tests this NxD constant against os.environ: give the stub NxD's value
            hlo.NXD_LAYOUT_TRANSFORMATION_OPTIONS = "NXD_LAYOUT_TRANSFORMATION_OPTIONS"
        yield module


@pytest.fixture(params=[pytest.param("stand-in", marks=STANDIN_WARNINGS), pytest.param("nxdi", marks=REAL)])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """The stand-in NxDI, or the real one; no format chosen and nothing registered at the start."""
    if request.param == "nxdi":
        module = request.getfixturevalue("modeling")
        monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
        monkeypatch.delenv(fmt.VERIFY_AT_LOAD_ENV, raising=False)
        base = sys.modules[f"{nxdi_hook.NXDI_PACKAGE}.models.application_base"].NeuronApplicationBase
        yield Backend("nxdi", module, base)
        nxdi_hook.unregister()
        return
    with cases.standin(monkeypatch) as modules:
        yield Backend("stand-in", modules.modeling_gpt_oss, modules.application_base.NeuronApplicationBase)


@pytest.fixture
def mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The normalized format chosen and the hook registered (unregistered afterwards)."""
    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    yield
    nxdi_hook.unregister()


@pytest.fixture
def scene(backend: Backend, mode: None, tiny_template: Path, tmp_path: Path) -> cases.Scene:
    """A normalized checkpoint compiled (tp=2, pre-sharded) through the hook."""
    ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
    compiled = tmp_path / "compiled"
    cases.compile_shards(backend.modeling, ckpt, compiled)
    return cases.Scene(backend.modeling, ckpt, compiled, tmp_path)


# --------------------------------------------------------------------------- on either NxDI


def test_clean_compile_then_load_hands_nxdi_exactly_the_written_shards(scene: cases.Scene) -> None:
    manifest = pm.read_manifest(str(scene.compiled))
    assert sorted(manifest.ranks) == list(range(cases.TP)) and manifest.sources[0].path == str(scene.ckpt.resolve())
    app = cases.load_app(scene.modeling, scene.compiled, scene.ckpt)
    loaded = cases.load(app, scene.compiled)
    assert loaded is not None and loaded.start_rank.tolist() == [0]
    assert cases.same_weights(loaded.weights, cases.files_on_disk(scene.compiled))
    assert app._builder.loader_calls == 0  # NxDI never calls the checkpoint loader here
    # and the files are the cut of the hooked loader's output
    expected = [app._builder.shard_rank(app.checkpoint_loader_fn(), rank) for rank in range(cases.TP)]
    assert cases.same_weights(loaded.weights, expected)
    print(f"presharded: {len(loaded.weights)} ranks, {len(loaded.weights[0])} tensors each, as written")


@pytest.mark.parametrize("name", list(cases.TAMPERINGS))
def test_each_tampering_gets_its_outcome_before_initialize(scene: cases.Scene, name: str) -> None:
    message = cases.tampered_load(scene, name)
    assert (message is None) == (cases.TAMPERINGS[name][1] is None)
    if message is not None:
        assert str(scene.compiled) in message and "nothing was handed to NxDI" in message


def test_an_interrupted_shard_step_leaves_no_manifest(scene: cases.Scene) -> None:
    with pytest.raises(RuntimeError, match="interrupted"):
        cases.compile_shards(scene.modeling, scene.ckpt, scene.compiled, fail_after_rank=0)
    assert not (scene.weights / pm.MANIFEST_FILE).exists()  # the earlier one was removed first
    with pytest.raises(sm.ShardedWeightsError) as caught:
        cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled)
    assert caught.value.codes == ["presharded.no_manifest"]
    assert "shard_weights(" in str(caught.value) and "no recompile" in str(caught.value)


def test_shard_on_load_reaches_nxdi_unchanged(backend: Backend, mode: None, tiny_template: Path, tmp_path: Path) -> None:
    """save_sharded_checkpoint=False: the builder shards at load (through our preflighted loader)."""
    compiled = tmp_path / "compiled"
    cases.compile_shards(backend.modeling, tiny_template, compiled, save_sharded_checkpoint=False)
    assert not (compiled / "weights").exists()
    app = cases.load_app(backend.modeling, compiled, tiny_template)
    loaded = cases.load(app, compiled)
    assert loaded is not None and app._builder.loader_calls == 1
    expected = [app._builder.shard_rank(app.checkpoint_loader_fn(), rank) for rank in range(cases.TP)]
    assert cases.same_weights(loaded.weights, expected)


@pytest.mark.parametrize("kind", ["hf", "legacy"])
def test_hf_and_legacy_compile_and_load_are_nxdis_bit_for_bit(backend: Backend, tiny_template: Path, tmp_path: Path,
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
            cases.compile_shards(backend.modeling, source, compiled)
            loaded = cases.load(cases.load_app(backend.modeling, compiled, source), compiled)
            assert loaded is not None
            results[hooked] = (sorted(p.name for p in (compiled / "weights").iterdir()),
                               [(compiled / "weights" / pm.rank_file(r)).read_bytes() for r in range(cases.TP)], loaded)
    finally:
        nxdi_hook.unregister()
    assert results[True][0] == results[False][0] == [pm.rank_file(r) for r in range(cases.TP)]  # no manifest
    assert results[True][1] == results[False][1]
    assert cases.same_weights(results[True][2].weights, results[False][2].weights)


def test_unregister_restores_shard_and_load_weights(backend: Backend) -> None:
    app_cls, base = backend.modeling.NeuronGptOssForCausalLM, backend.base
    before = {name: vars(app_cls).get(name) for name in ("shard_weights", "load_weights")}
    inherited = {name: getattr(app_cls, name) for name in before}
    assert "shard_weights" not in vars(app_cls) and "load_weights" not in vars(app_cls)
    nxdi_hook.register()
    assert all(vars(app_cls)[name] is not inherited[name] for name in before)
    assert vars(app_cls)["shard_weights"] is not base.shard_weights and vars(app_cls)["load_weights"] is not base.load_weights
    nxdi_hook.unregister()
    assert {name: vars(app_cls).get(name) for name in before} == before
    assert all(getattr(app_cls, name) is inherited[name] for name in before)
    assert app_cls.shard_weights is base.shard_weights and app_cls.load_weights is base.load_weights


# --------------------------------------------------------------------------- NxDI's real code only


@pytest.mark.nxdi
@pytest.mark.filterwarnings("ignore")
def test_real_methods_are_the_ones_driven(modeling: ModuleType, mode: None) -> None:
    base = sys.modules[f"{nxdi_hook.NXDI_PACKAGE}.models.application_base"].NeuronApplicationBase
    assert "neuron_stubs" not in repr(base) and base.__module__.startswith(nxdi_hook.NXDI_PACKAGE)
    wrapped = vars(modeling.NeuronGptOssForCausalLM)["load_weights"]
    assert wrapped.__wrapped__ is base.load_weights and vars(modeling.NeuronGptOssForCausalLM)["shard_weights"].__wrapped__ is base.shard_weights


@pytest.mark.nxdi
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("backend", ["nxdi"], indirect=True)
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


@pytest.mark.nxdi
@pytest.mark.filterwarnings("ignore")
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
