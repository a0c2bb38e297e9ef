"""Pre-sharded weights bound to the compile and checkpoint they came from: the manifest
(``presharded_manifest``), the check against the files (``validate.presharded``) as a load, and
``validate`` / ``inspect`` of a compiled directory see it, against the stand-in of NxDI. The
compile-and-load scenarios run against the stand-in and NxDI's real methods alike in
``test_nxdi_presharded.py``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import presharded_cases as cases
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import IntegrityError
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.validate import presharded as sm
from nxdi_gptoss_fp8.validate import presharded_manifest as pm

pytestmark = pytest.mark.filterwarnings("ignore:stand-in cast rule keeps scale")


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    with cases.standin(monkeypatch) as modules:
        yield modules


@pytest.fixture
def scene(nxdi: SimpleNamespace, tiny_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> cases.Scene:
    """A normalized checkpoint compiled (tp=2, pre-sharded) through the hook."""
    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    ckpt = Path(shutil.copytree(tiny_template, tmp_path / "ckpt"))
    compiled = tmp_path / "compiled"
    cases.compile_shards(nxdi.modeling_gpt_oss, ckpt, compiled)
    return cases.Scene(nxdi.modeling_gpt_oss, ckpt, compiled, tmp_path)


# --------------------------------------------------------------------------- compile, then load


def test_compile_writes_a_manifest_of_exactly_the_written_rank_files(scene: cases.Scene) -> None:
    manifest = pm.read_manifest(str(scene.compiled))
    assert sorted(manifest.ranks) == [0, 1] and manifest.tp_degree == cases.TP == manifest.world_size
    for rank, entry in manifest.ranks.items():
        path = scene.rank(rank)
        assert entry.size == path.stat().st_size
        assert entry.sha256 == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    assert manifest.ranks[0].header_sha256 == manifest.ranks[1].header_sha256  # every rank's header alike
    assert manifest.ranks[0].sample_sha256 != manifest.ranks[1].sample_sha256  # the sampled data are not
    assert [s.path for s in manifest.sources] == [str(scene.ckpt.resolve())]
    assert manifest.sources[0].fingerprint == pm.checkpoint_identity(str(scene.ckpt))
    assert manifest.settings["tp_degree"] == 2 and manifest.settings["torch_dtype"] == "bfloat16"
    assert manifest.settings["modules_to_not_convert"] == ["lm_head", "self_attn"]
    assert not [p for p in scene.weights.iterdir() if p.name.startswith(".")]  # no temporary left


def test_stale_source_message_says_how_to_reshard(scene: cases.Scene) -> None:
    cases.TAMPERINGS["source-reconverted"][0](scene)
    with pytest.raises(sm.ShardedWeightsError) as caught:
        cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled)
    message = str(caught.value)
    assert "stale" in message and "recompile" in message and f"shard_weights({str(scene.compiled)!r})" in message
    assert f"{fmt.INDEX_FILE}, the digests of 4 shards" in message


def test_source_gone_is_logged_and_loads(scene: cases.Scene, caplog: pytest.LogCaptureFixture) -> None:
    shutil.rmtree(scene.ckpt)
    with caplog.at_level("INFO", logger="nxdi_gptoss_fp8"):
        assert cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled) is not None
    assert any("not on this host" in record.getMessage() for record in caplog.records)


def test_opt_in_from_the_compiled_config_alone_checks_the_shards(scene: cases.Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    """No environment variable: the opt-in kept in neuron_config.json selects the check."""
    cases.compile_shards(scene.modeling, scene.ckpt, scene.compiled, checkpoint_format=nxdi_hook.NORMALIZED_FP8)
    monkeypatch.delenv(nxdi_hook.ENV_VAR)
    scene.rank(1).unlink()
    app = cases.load_app(scene.modeling, scene.compiled, scene.ckpt)
    assert app.neuron_config.checkpoint_format == nxdi_hook.NORMALIZED_FP8
    with pytest.raises(sm.ShardedWeightsError, match=r"missing|does not exist"):
        cases.load(app, scene.compiled)


def test_verification_reads_the_choice_with_the_loaders_parser(scene: cases.Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fmt.VERIFY_AT_LOAD_ENV, "maybe")
    with pytest.raises(Exception, match="is not on or off"):
        cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled)
    monkeypatch.setenv(fmt.VERIFY_AT_LOAD_ENV, "1")
    cases._data_byte_unverified(scene)
    with pytest.raises(sm.ShardedWeightsError, match="digest_mismatch"):
        cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled)


def test_a_rank_file_swapped_while_nxdi_reads_it_is_refused(scene: cases.Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    app = cases.load_app(scene.modeling, scene.compiled, scene.ckpt)
    original = app.traced_model.nxd_model.initialize

    def initialize_then_replace(weights: Any, start: Any) -> None:
        original(weights, start)
        data = scene.rank(0).read_bytes()
        scene.rank(0).unlink()
        scene.rank(0).write_bytes(data)  # a new inode: what a copy over the file leaves

    app.traced_model.nxd_model.initialize = initialize_then_replace
    with pytest.raises(IntegrityError, match="changed while NxDI read them"):
        cases.load(app, scene.compiled)


def test_resharding_through_the_hook_writes_a_new_manifest(scene: cases.Scene) -> None:
    """The fix the messages give: NxDI's shard_weights on the compiled model, no recompile."""
    cases.TAMPERINGS["source-reconverted"][0](scene)
    app = cases.load_app(scene.modeling, scene.compiled, scene.ckpt)
    app.shard_weights(str(scene.compiled))
    assert cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled) is not None


@pytest.mark.parametrize("overrides", [{"save_sharded_checkpoint": False}, {"skip_sharding": True}])
def test_no_shards_written_means_no_manifest_and_nxdis_behaviour(nxdi: SimpleNamespace, tiny_template: Path,
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 overrides: dict[str, Any]) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    cases.compile_shards(nxdi.modeling_gpt_oss, tiny_template, tmp_path / "compiled", **overrides)
    assert not (tmp_path / "compiled" / "weights").exists()


def test_register_refuses_an_nxdi_whose_load_weights_differs(nxdi: SimpleNamespace) -> None:
    base = nxdi.application_base.NeuronApplicationBase
    base.load_weights = lambda self, path, ranks: None  # type: ignore[method-assign]
    with pytest.raises(Exception, match="load_weights"):
        nxdi_hook.register()
    assert not nxdi_hook.is_registered()


# --------------------------------------------------------------------------- the manifest itself


@given(st.binary(max_size=300))
def test_read_manifest_never_raises_anything_but_manifest_error(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    compiled = tmp_path_factory.mktemp("c")
    (compiled / "weights").mkdir()
    (compiled / "weights" / pm.MANIFEST_FILE).write_bytes(data)
    with pytest.raises(pm.ManifestError):
        pm.read_manifest(str(compiled))


def _valid_manifest(scene: cases.Scene) -> dict[str, Any]:
    return json.loads((scene.weights / pm.MANIFEST_FILE).read_text())


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: m.update(format_version=2), "format_version"),
    (lambda m: m["ranks"][0].update(file="../x"), "names the file"),
    (lambda m: m["ranks"][0].update(size=-1), "size"),
    (lambda m: m["ranks"][0].update(sha256="0" * 63), "sha256"),
    (lambda m: m["ranks"].append(dict(m["ranks"][0])), "listed twice"),
    (lambda m: m.update(tp_degree="2"), "tp_degree"),
    (lambda m: m["sample"].update(blocks=1.5), "blocks"),
    (lambda m: m.update(tp_degree=0), "do not describe a compile"),
    (lambda m: m.update(world_size=m["tp_degree"] - 1), "do not describe a compile"),
    (lambda m: m.update(tp_degree=m["tp_degree"] * 2, world_size=m["world_size"] * 2), "contradicts itself"),
    (lambda m: m["ranks"][0].update(rank=m["world_size"], file=f"tp{m['world_size']}_sharded_checkpoint.safetensors"),
     "outside world_size"),
])
def test_a_malformed_manifest_names_the_field(scene: cases.Scene, edit: Any, words: str) -> None:
    manifest = _valid_manifest(scene)
    edit(manifest)
    (scene.weights / pm.MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(pm.ManifestError, match=words) as caught:
        pm.read_manifest(str(scene.compiled))
    assert caught.value.code == "bad_manifest"


@given(st.integers(0, 1 << 20), st.integers(8, 4096), st.integers(1, 64), st.sampled_from([512, 4096]))
def test_sample_offsets_stay_in_the_data_section(size: int, data_offset: int, blocks: int, block: int) -> None:
    spots = pm.sample_offsets(size, data_offset, blocks, block)
    for start, count in spots:
        assert data_offset <= start and start + count <= size and count > 0
    assert len(spots) <= blocks


def test_samples_are_doubled_until_they_tell_ranks_apart(tmp_path: Path) -> None:
    """Two rank files that differ only outside the first sampled blocks still get different samples."""
    import torch
    from safetensors.torch import save_file

    compiled = tmp_path / "c"
    (compiled / "weights").mkdir(parents=True)
    base = torch.zeros(1 << 16, dtype=torch.uint8)
    for rank in range(2):
        data = base.clone()
        path = compiled / "weights" / pm.rank_file(rank)
        save_file({"w": data}, str(path))
    # rank 1 differs at a byte the 8 default blocks miss
    offset = cases.unsampled_data_offset_for(compiled / "weights" / pm.rank_file(1), pm.SAMPLE_BLOCKS)
    cases._flip(compiled / "weights" / pm.rank_file(1), offset)
    manifest = pm.write_manifest(str(compiled), ranks=range(2), config={"tp_degree": 2}, sources=[], progress=False)
    assert manifest.sample_blocks > pm.SAMPLE_BLOCKS
    assert manifest.ranks[0].sample_sha256 != manifest.ranks[1].sample_sha256


# --------------------------------------------------------------------------- command line


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_compiled_is_valid_then_names_each_problem(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "validate", str(scene.compiled))
    assert code == 0 and "VALID" in out and "2 ranks checked" in out
    code, out, _ = run(capsys, "validate", str(scene.compiled), "--verify-checksums", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["bytes_hashed"] > 0
    assert any(f["code"] == "presharded.verified" for f in report["findings"])
    cases._data_byte_unverified(scene)
    assert run(capsys, "validate", str(scene.compiled))[0] == 0  # outside the samples
    code, out, _ = run(capsys, "validate", str(scene.compiled), "--verify-checksums")
    assert code == 1 and "presharded.digest_mismatch" in out and "tp1_sharded_checkpoint" in out


@pytest.mark.parametrize("name", list(cases.TAMPERINGS))
def test_validate_and_inspect_compiled_agree_with_the_load(scene: cases.Scene, capsys: pytest.CaptureFixture,
                                                            name: str) -> None:
    """The one verdict: ``validate COMPILED`` (with the loading NeuronConfig as --neuron-config and
    the ranks it loads as --ranks) refuses exactly what the load refuses, with the same codes and a
    hint; ``inspect COMPILED`` (its own neuron_config.json) exits non-zero exactly then."""
    tamper, refused = cases.TAMPERINGS[name]
    overrides = tamper(scene)
    args = ["validate", str(scene.compiled), "--json"]
    verify = overrides.pop(fmt.VERIFY_AT_LOAD_ATTR, False)
    if verify:
        args.append("--verify-checksums")
    if "local_ranks_size" in overrides:
        start = overrides["start_rank_id"]
        args += ["--ranks", f"{start}-{start + overrides['local_ranks_size'] - 1}"]
    if overrides:
        config = json.loads((scene.compiled / "neuron_config.json").read_text())
        config["neuron_config"].update(overrides)
        (scene.tmp / "loading.json").write_text(json.dumps(config))
        args += ["--neuron-config", str(scene.tmp / "loading.json")]
    code, out, _ = run(capsys, *args)
    report = json.loads(out)
    errors = {f["code"] for f in report["findings"] if f["severity"] == "error"}
    warnings = {f["code"] for f in report["findings"] if f["severity"] == "warning"}
    assert (code, errors) == ((0, set()) if refused is None else (1, refused))
    assert warnings == cases.WARNED.get(name, set())
    assert isinstance(report["hint"], str) and str(scene.compiled) in report["hint"]
    assert ("refused" in report["hint"]) == (refused is not None)
    if not overrides and not verify:  # inspect reads what the default load reads (no whole-file hashing)
        inspect_code, inspect_out, _ = run(capsys, "inspect", str(scene.compiled), "--json")
        assert (inspect_code == 0) == (refused is None)
        assert json.loads(inspect_out)["compiled"]["hint"] == report["hint"]


def test_a_temporary_file_beside_the_ranks_is_a_warning_naming_it(scene: cases.Scene, capsys: pytest.CaptureFixture,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    cases.TAMPERINGS["rsync-temp-beside"][0](scene)
    temp = f".{pm.rank_file(0)}.AbCdEf"
    code, out, _ = run(capsys, "validate", str(scene.compiled))
    assert code == 0 and "WARNING presharded.partial_file" in out and temp in out and "1 warning" in out
    with caplog.at_level("WARNING", logger="nxdi_gptoss_fp8"):
        assert cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt), scene.compiled) is not None
    assert any(temp in record.getMessage() for record in caplog.records if record.levelname == "WARNING")


def test_another_checkpoint_is_refused_naming_both_and_the_fix(scene: cases.Scene) -> None:
    written = str(scene.ckpt.resolve())
    overrides = cases.TAMPERINGS["another-checkpoint"][0](scene)
    with pytest.raises(sm.ShardedWeightsError) as caught:
        cases.load(cases.load_app(scene.modeling, scene.compiled, scene.ckpt, **overrides), scene.compiled)
    message = str(caught.value)
    assert not isinstance(caught.value, (ValueError, OSError))
    assert str(scene.ckpt) in message and written in message and str(scene.compiled) in message
    assert "build the model from" in message and "shard_weights(" in message


@pytest.mark.parametrize(("spec", "ranks"), [("0-1", [0, 1]), ("1", [1]), ("0,1", [0, 1]), (" 1 , 0-0", [0, 1])])
def test_ranks_option_checks_only_the_named_ranks(scene: cases.Scene, capsys: pytest.CaptureFixture, spec: str,
                                                  ranks: list[int]) -> None:
    code, out, _ = run(capsys, "validate", str(scene.compiled), "--ranks", spec, "--json")
    assert code == 0 and json.loads(out)["ranks_checked"] == ranks


@pytest.mark.parametrize("spec", ["", "a", "1-0", "-1", "0-65536", "0--1", "1.5"])
def test_ranks_option_refuses_what_is_not_ranks(scene: cases.Scene, capsys: pytest.CaptureFixture, spec: str) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["validate", str(scene.compiled), "--ranks", spec])
    assert caught.value.code == 2 and "--ranks" in capsys.readouterr().err


@given(st.text(alphabet="0123456789-, x", max_size=30))
def test_ranks_parser_gives_bounded_sorted_ranks_or_a_usage_error(text: str) -> None:
    import argparse

    from nxdi_gptoss_fp8.cli.validate import MAX_RANK, _rank_list

    try:
        ranks = _rank_list(text)
    except argparse.ArgumentTypeError as exc:
        assert "rank" in str(exc)
        return
    assert ranks == sorted(set(ranks)) and ranks and all(0 <= r < MAX_RANK for r in ranks)


def test_a_dangling_rank_link_says_it_is_a_link(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    cases.TAMPERINGS["dangling-rank-link"][0](scene)
    code, out, _ = run(capsys, "validate", str(scene.compiled))
    assert code == 1 and "a symbolic link to" in out and "which does not exist" in out


@pytest.mark.parametrize(("config", "model_path", "expected"), [
    ({"neuron_config": {"quantized": True, "quantized_checkpoints_path": "/q"}, "_name_or_path": "/n"}, "/m", "/q"),
    ({"quantized": True, "quantized_checkpoints_path": "/q"}, None, "/q"),
    ({"neuron_config": {"quantized": False, "quantized_checkpoints_path": "/q"}, "_name_or_path": "/n"}, "/m", "/m"),
    ({"neuron_config": {"quantized": False}, "_name_or_path": "/n"}, None, "/n"),
    ({"neuron_config": {"quantized": False}, "_name_or_path": "HERE"}, "/m", "HERE"),
    ({"neuron_config": {"quantized": True, "quantized_checkpoints_path": None}}, None, None),
])
def test_loader_source_is_nxdis_checkpoint_loader_choice(tmp_path: Path, config: dict[str, Any], model_path: str | None,
                                                         expected: str | None) -> None:
    """quantized_checkpoints_path when quantized, else _name_or_path when it exists, else the model path."""
    here = str(tmp_path)
    config = json.loads(json.dumps(config).replace("HERE", here))
    assert sm.loader_source(config, model_path) == (here if expected == "HERE" else expected)


def test_ranks_option_is_for_compiled_directories(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "validate", str(scene.ckpt), "--ranks", "0")
    assert code == 2 and "--ranks applies to a compiled" in err


def test_nxdis_own_neuron_config_with_infinity_is_read_as_nxdi_writes_it(scene: cases.Scene,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """InferenceConfig.save writes quantize_clamp_bound=inf as Infinity: validate, inspect and
    --neuron-config read it; the checkpoint's own config.json stays strict."""
    saved = scene.compiled / "neuron_config.json"
    assert '"quantize_clamp_bound": Infinity' in saved.read_text()
    assert run(capsys, "validate", str(scene.compiled))[0] == 0
    code, out, _ = run(capsys, "inspect", str(scene.compiled))
    assert code == 0 and "non-standard constant" not in out and "save_sharded_checkpoint=True" in out
    code, out, _ = run(capsys, "validate", str(scene.ckpt), "--neuron-config", str(saved))
    assert code == 0 and "VALID" in out
    config = scene.ckpt / fmt.CONFIG_FILE
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": Infinity'))
    code, out, _ = run(capsys, "validate", str(scene.ckpt), "--json")
    assert code == 1 and "non-standard constant Infinity" in out


def test_validate_compiled_compares_with_its_neuron_config(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    config = json.loads((scene.compiled / "neuron_config.json").read_text())
    config["neuron_config"]["padded_hidden_size"] = 96
    (scene.compiled / "neuron_config.json").write_text(json.dumps(config))
    code, out, _ = run(capsys, "validate", str(scene.compiled))
    assert code == 1 and "settings.padded_hidden_size" in out


def test_validate_compiled_without_presharded_weights_says_so(nxdi: SimpleNamespace, tiny_template: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(nxdi_hook.ENV_VAR, nxdi_hook.NORMALIZED_FP8)
    nxdi_hook.register()
    cases.compile_shards(nxdi.modeling_gpt_oss, tiny_template, tmp_path / "c", save_sharded_checkpoint=False)
    code, out, _ = run(capsys, "validate", str(tmp_path / "c"))
    assert code == 0 and "sharded at load" in out


def test_inspect_compiled_shows_the_manifest_or_how_to_write_one(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "inspect", str(scene.compiled))
    assert code == 0 and "manifest" in out and "tp_degree 2" in out and str(scene.ckpt.resolve()) in out
    assert f"do          check it with `nxdi-gptoss-fp8 validate {scene.compiled}`" in out  # as docs/loading.md says
    assert "not a checkpoint to validate" not in out and "verdict     VALID" in out
    code, out, _ = run(capsys, "inspect", str(scene.compiled), "--json")
    assert json.loads(out)["presharded"]["manifest"]["tp_degree"] == 2 and json.loads(out)["compiled"]["ok"]
    (scene.weights / pm.MANIFEST_FILE).unlink()
    code, out, _ = run(capsys, "inspect", str(scene.compiled))
    assert code == 1 and "without a manifest" in out and "shard_weights(" in out and "refused at load" in out
    assert "verdict     INVALID" in out and "presharded.no_manifest" in out


@pytest.mark.parametrize("damage", ["{", '{"neuron_config": {"a": 1, "a": 2}}', "[]"])
def test_inspect_compiled_with_an_unreadable_neuron_config_fails_as_validate_does(
        scene: cases.Scene, capsys: pytest.CaptureFixture, damage: str) -> None:
    (scene.compiled / "neuron_config.json").write_text(damage)
    assert run(capsys, "validate", str(scene.compiled))[0] == 2
    code, out, _ = run(capsys, "inspect", str(scene.compiled), "--json")
    assert code == 1 and json.loads(out)["compiled"]["codes"] == ["neuron_config.unreadable"]


def test_inspect_of_a_directory_with_only_weights_is_one_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A copy of only weights/ (no neuron_config.json): pre-sharded weights, not "unknown"."""
    import torch
    from safetensors.torch import save_file

    (tmp_path / "d" / "weights").mkdir(parents=True)
    save_file({"w": torch.zeros(4)}, str(tmp_path / "d" / "weights" / pm.rank_file(0)))
    _, out, _ = run(capsys, "inspect", str(tmp_path / "d"))
    assert "unknown" not in out and "not a GPT-OSS checkpoint" not in out
    assert "pre-sharded" in out and "neuron_config.json" in out


def test_validate_of_the_weights_folder_checks_its_compiled_directory(scene: cases.Scene, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "validate", str(scene.weights))
    assert code == 0 and f"VALID: {scene.compiled}" in out
    scene.rank(0).unlink()
    code, out, _ = run(capsys, "validate", str(scene.weights))
    assert code == 1 and "presharded.missing_rank_file" in out
