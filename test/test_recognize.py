"""The format doctor: every known kind recognized from its files, with the CHECKPOINT_FORMAT or
command that applies and the evidence; unknown directories say what was looked for; bounded,
never blocking, never raising."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import other_formats
from nxdi_gptoss_fp8 import recognize as rz
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_MXFP4, make_source, write_legacy_fp8
from nxdi_gptoss_fp8.writer import build_header

CT_FP8_CONFIG = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True},
    }},
    "ignore": ["lm_head", "model.layers.0.self_attn.q_proj"],
}


def write_headers(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A valid safetensors file with these entries and zero data (sparse)."""
    header, _ = build_header(fmt.TensorSpec(name, shape, dtype) for name, (dtype, shape) in tensors.items())
    size = len(header) + sum(fmt.TensorSpec(n, s, d).nbytes for n, (d, s) in tensors.items())
    with open(path, "wb") as handle:
        handle.write(header)
        handle.truncate(size)


def write_checkpoint(root: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], *, config: dict | None = None,
                     index: bool = True, metadata: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shard = "model-00001-of-00001.safetensors" if index else "model.safetensors"
    write_headers(root / shard, tensors)
    if config is not None:
        (root / fmt.CONFIG_FILE).write_text(json.dumps(config))
    if index:
        (root / fmt.INDEX_FILE).write_text(json.dumps({"metadata": metadata or {"total_size": 0},
                                                       "weight_map": dict.fromkeys(tensors, shard)}))
    return root


def per_expert(layers: int = 1, experts: int = 2, *, dtype: str = "F8_E4M3", infix: str = "") -> dict[str, tuple[str, tuple[int, ...]]]:
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {
        "model.embed_tokens.weight": ("BF16", (8, 4)), "lm_head.weight": ("BF16", (8, 4)),
    }
    for layer in range(layers):
        for expert in range(experts):
            for proj, shape in (("gate_proj", (6, 4)), ("up_proj", (6, 4)), ("down_proj", (4, 6))):
                base = f"model.layers.{layer}.mlp.experts.{infix}{expert}.{proj}"
                tensors[f"{base}.weight"] = (dtype, shape)
                tensors[f"{base}.weight_scale"] = ("BF16", (shape[0], 1))
                tensors[f"{base}.bias"] = ("BF16", (shape[0],))
    return tensors


def ct_config(**changes: Any) -> dict:
    quant = json.loads(json.dumps(CT_FP8_CONFIG))
    for path, value in changes.items():
        target = quant
        *parents, last = path.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return {"model_type": "gpt_oss", "quantization_config": quant}


LEGACY_BF16 = {"embedding.weight": ("BF16", (8, 4)), "block.0.mlp.mlp1_weight": ("BF16", (2, 12, 4)),
               "block.0.mlp.mlp2_weight": ("BF16", (2, 4, 6))}


def make_compiled(root: Path, *, ranks: int = 2, checkpoint_format: str | None = None) -> Path:
    root.mkdir(parents=True)
    neuron_config: dict[str, Any] = {"tp_degree": ranks, "save_sharded_checkpoint": True}
    if checkpoint_format:
        neuron_config["checkpoint_format"] = checkpoint_format
    (root / rz.NEURON_CONFIG_FILE).write_text(json.dumps({"neuron_config": neuron_config, "hidden_size": 64}))
    (root / rz.COMPILED_MODEL_FILE).write_bytes(b"not a real torchscript archive")
    (root / "weights").mkdir()
    for rank in range(ranks):
        write_headers(root / "weights" / f"tp{rank}_sharded_checkpoint.safetensors", {"x": ("BF16", (2,))})
    return root


# kind → (builder(tmp, tiny normalized template) → directory, CHECKPOINT_FORMAT, words the actions hold, evidence words)
CASES: dict[str, tuple[Callable[[Path, Path], Path], str | None, tuple[str, ...], tuple[str, ...]]] = {
    rz.HF_MXFP4: (lambda t, _: make_source(t / "mx", SOURCE_MXFP4), "hf",
                  ("unset CHECKPOINT_FORMAT", "nxdi-gptoss-fp8 convert"), ("_blocks", "'mxfp4'")),
    rz.HF_BF16: (lambda t, _: make_source(t / "bf", SOURCE_BF16, original=False), None,
                 ("nxdi-gptoss-fp8 convert",), ("mlp.experts.", "dense")),
    rz.COMPRESSED_TENSORS_FP8: (lambda t, _: write_checkpoint(t / "ct", per_expert(), config=ct_config()), None,
                                ("nxdi-gptoss-fp8 convert",), ("compressed-tensors", "experts.0.")),
    rz.COMPRESSED_TENSORS: (lambda t, _: write_checkpoint(
        t / "int8", per_expert(dtype="I8"), config=ct_config(format="int-quantized", config_groups__group_0__weights__type="int")),
        None, ("FP8_DYNAMIC",), ("int-quantized", "8-bit int")),
    rz.LEGACY_BF16: (lambda t, _: write_checkpoint(t / "legacy-bf16", LEGACY_BF16, index=False), "legacy",
                     ("CHECKPOINT_FORMAT=legacy",), ("block.0.", "BF16")),
    rz.LEGACY_FP8: (lambda t, tiny: write_legacy_fp8(t / "legacy-fp8", tiny), "legacy",
                    ("CHECKPOINT_FORMAT=legacy",), ("block.0.", "F8_E4M3", "mlp1_scale")),
    rz.OPENAI_ORIGINAL: (lambda t, _: make_source(t / "repo") / "original", None, ("HF set at",), ("mlp1_weight.blocks",)),
    rz.NORMALIZED: (lambda _, tiny: tiny, "normalized_fp8", ("validate",), ("format_version = 1",)),
    rz.PRESHARDED: (lambda t, _: make_compiled(t / "compiled") / "weights", None, ("compiled",), ("tpN_sharded",)),
    rz.COMPILED: (lambda t, _: make_compiled(t / "compiled"), None, ("compiled model path",),
                  ("neuron_config.json", "tp_degree=2", "2 ranks")),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_every_kind_is_recognized_with_its_fix_and_evidence(kind: str, tmp_path: Path, tiny_template: Path) -> None:
    build, checkpoint_format, actions, evidence = CASES[kind]
    directory = build(tmp_path, tiny_template)
    found = rz.recognize(directory)
    assert found.kind == kind, found.render_text()
    assert found.checkpoint_format == checkpoint_format
    assert all(any(word in action for action in found.actions) for word in actions), found.actions
    assert all(any(word in item for item in found.evidence) for word in evidence), found.evidence
    assert not found.refused and not found.looked_for
    text = found.render_text()
    assert str(directory) in text and found.title in text
    data = found.to_dict()
    assert data["kind"] == kind and json.loads(json.dumps(data)) == data
    if checkpoint_format:
        assert f"CHECKPOINT_FORMAT={checkpoint_format}" in text


def test_hf_kinds_match_the_converter_source_kinds() -> None:
    assert (rz.HF_MXFP4, rz.HF_BF16) == (SOURCE_MXFP4, SOURCE_BF16)


def test_hint_is_one_line_naming_kind_and_fixes(tmp_path: Path) -> None:
    source = make_source(tmp_path / "hf", original=False)
    hint = rz.recognize(source).hint()
    assert "\n" not in hint
    assert hint == (f"{source} is an HF MXFP4 checkpoint (openai layout): {other_formats.ADVICE_HF_LOAD}, "
                    f"or convert it with `nxdi-gptoss-fp8 convert {source} OUT`")


def test_original_set_and_compiled_notes(tmp_path: Path) -> None:
    found = rz.recognize(make_source(tmp_path / "repo"))
    assert any("original/" in note for note in found.notes)
    compiled = make_compiled(tmp_path / "c", ranks=1, checkpoint_format="normalized_fp8")
    (compiled / "weights" / "tp0_sharded_checkpoint.safetensors").unlink()
    found = rz.recognize(compiled)
    assert found.kind == rz.COMPILED and any("checkpoint_format='normalized_fp8'" in e for e in found.evidence)
    assert any("CHECKPOINT_FORMAT=normalized_fp8" in action for action in found.actions)


def test_the_weights_folder_of_a_compiled_directory_is_presharded_whatever_its_tensor_names(tmp_path: Path) -> None:
    """NxDI's rank files hold its own namespace (the normalized names): with no index or config
    beside them they are pre-sharded weights, never "a normalized FP8 checkpoint"."""
    compiled = make_compiled(tmp_path / "c")
    for rank in range(2):
        write_headers(compiled / "weights" / f"tp{rank}_sharded_checkpoint.safetensors",
                      {"layers.0.feed_forward.moe.expert_mlps.mlp_op.down_proj.scale": ("F32", (2, 4))})
    found = rz.recognize(compiled / "weights")
    assert found.kind == rz.PRESHARDED and found.checkpoint_format is None
    assert any(str(compiled) in action for action in found.actions)


def test_normalized_names_without_metadata_and_other_versions(tmp_path: Path, tiny_template: Path) -> None:
    index = json.loads((tiny_template / fmt.INDEX_FILE).read_text())
    bare = write_checkpoint(tmp_path / "bare", {f"layers.0.{fmt.GATE_UP}.weight": ("F8_E4M3", (2, 4, 8))})
    found = rz.recognize(bare)
    assert found.kind == rz.NORMALIZED and found.format_version is None
    assert any("no normalized metadata" in e for e in found.evidence)
    future = write_checkpoint(tmp_path / "v2", {"norm.weight": ("BF16", (4,))},
                              metadata={**index["metadata"], "format_version": 2})
    found = rz.recognize(future)
    assert found.kind == rz.NORMALIZED and found.format_version == 2
    assert any("version 2 will be refused" in note for note in found.notes)


@pytest.mark.parametrize(("changes", "tensors", "reason"), [
    ({"config_groups__group_0__weights__strategy": "block"}, per_expert(), "block-strategy"),
    ({"config_groups__group_0__weights__strategy": "group"}, per_expert(), "group-strategy"),
    ({"config_groups__group_0__input_activations__dynamic": False}, per_expert(), "static input activations"),
    ({"format": "pack-quantized"}, per_expert(), "'pack-quantized'"),
    ({"config_groups": {}}, per_expert(), "no config_groups"),
    ({}, {"model.layers.0.mlp.experts.gate_up_proj": ("BF16", (2, 4, 12))}, "not per-expert"),
])
def test_compressed_tensors_other_schemes_say_why(tmp_path: Path, changes: dict, tensors: dict, reason: str) -> None:
    found = rz.recognize(write_checkpoint(tmp_path / "ct", tensors, config=ct_config(**changes)))
    assert found.kind == rz.COMPRESSED_TENSORS and any(reason in e for e in found.evidence), found.evidence
    assert found.checkpoint_format is None


def test_compressed_tensors_llm_compressor_010_names(tmp_path: Path) -> None:
    """llm-compressor 0.10/0.11 saved ``mlp.experts.experts.E.*``: still per-expert FP8."""
    found = rz.recognize(write_checkpoint(tmp_path / "ct", per_expert(infix="experts."), config=ct_config()))
    assert found.kind == rz.COMPRESSED_TENSORS_FP8


@pytest.mark.parametrize("build", [
    lambda root: root.mkdir(),
    lambda root: (root.mkdir(), (root / "notes.txt").write_text("hello")),
    lambda root: write_checkpoint(root, {"transformer.h.0.attn.weight": ("F32", (2, 2))}, config={"model_type": "gpt2"}),
    lambda root: write_checkpoint(root, per_expert(), config={"model_type": "gpt_oss"}),  # per-expert, no CT config
])
def test_unknown_directories_say_what_was_looked_for(tmp_path: Path, build: Callable[[Path], Any]) -> None:
    build(tmp_path / "d")
    found = rz.recognize(tmp_path / "d")
    assert found.kind == rz.UNKNOWN and found.looked_for == list(rz.LOOKED_FOR)
    assert found.evidence and not found.actions
    assert "looked for" in found.render_text()


def test_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for path, words in ((tmp_path / "absent", "No such file"), (tmp_path / "file", "a regular file")):
        found = rz.recognize(path)
        assert found.kind == rz.NOT_A_DIRECTORY and words in found.evidence[0]


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail instead of hanging if anything blocks on a FIFO."""
    def fail(*_: Any) -> None:
        raise AssertionError("blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", [fmt.CONFIG_FILE, fmt.INDEX_FILE, "model.safetensors", rz.NEURON_CONFIG_FILE])
@pytest.mark.parametrize("special", ["fifo", "socket", "directory"])
def test_special_files_are_refused_before_opening(tmp_path: Path, name: str, special: str, alarm: None) -> None:
    root = tmp_path / "d"
    root.mkdir()
    target = root / name
    if special == "fifo":
        os.mkfifo(target)
    elif special == "directory":
        target.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
    found = rz.recognize(root)
    if special == "directory" and name == "model.safetensors":
        assert not found.refused  # a directory called *.safetensors is an entry, not a shard candidate
    else:
        assert any(name in item for item in found.refused), found.refused


def test_listed_shard_that_is_a_fifo_is_refused(tiny_checkpoint: Path, alarm: None) -> None:
    shard = sorted(tiny_checkpoint.glob("*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)
    found = rz.recognize(tiny_checkpoint)
    assert found.kind == rz.NORMALIZED and any(shard.name in item and "FIFO" in item for item in found.refused)


@pytest.mark.parametrize("name", ["model\u0000.safetensors", "model-\udc80.safetensors"])
def test_a_listed_shard_no_file_can_be_named_is_refused_not_raised(tiny_checkpoint: Path, name: str) -> None:
    """A shard name the OS cannot stat (a NUL, a lone surrogate) in the index: the recognizer, the
    preflight's JSON report (whose hint asks it) and ``validate --json`` answer, never raise."""
    from nxdi_gptoss_fp8.cli import main
    from nxdi_gptoss_fp8.validate.pipeline import preflight

    index_path = tiny_checkpoint / fmt.INDEX_FILE
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = name
    index_path.write_text(json.dumps(index))
    found = rz.recognize(tiny_checkpoint)
    assert found.kind == rz.NORMALIZED
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert not report.ok and json.loads(report.to_json())["ok"] is False
    assert main(["validate", str(tiny_checkpoint), "--allow-custom-model", "--json"]) == 1


def test_inspect_of_a_normalized_checkpoint_with_a_fifo_shard_is_invalid(tiny_checkpoint: Path, alarm: None) -> None:
    from nxdi_gptoss_fp8.cli import main
    from nxdi_gptoss_fp8.inspection import inspect_directory

    shard = sorted(tiny_checkpoint.glob("*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)
    inspection = inspect_directory(tiny_checkpoint, allow_custom_model=True)
    assert not inspection.ok
    assert inspection.summary is not None and "filesystem.not_a_file" in inspection.summary.report.codes()
    assert main(["inspect", str(tiny_checkpoint), "--allow-custom-model"]) == 1


def test_bounded_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for number in range(rz.MAX_HEADERS + 5):
        write_headers(root / f"part-{number:03d}.safetensors", {f"t{number}": ("BF16", (2,))})
    found = rz.recognize(root)
    assert found.headers_read == rz.MAX_HEADERS and found.kind == rz.UNKNOWN
    assert any(f"of {rz.MAX_HEADERS + 5} .safetensors files" in e for e in found.evidence)
    monkeypatch.setattr(rz, "MAX_ENTRIES", 3)
    assert any("only the first 3" in note for note in rz.recognize(root).notes)
    monkeypatch.setattr(rz, "MAX_NAMES", 2)
    index_dir = write_checkpoint(tmp_path / "ix", per_expert(), config=ct_config())
    found = rz.recognize(index_dir)
    assert found.names_examined == 2 and any("more than 2" in note for note in found.notes)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
NAMES = st.sampled_from(["model.layers.0.mlp.experts.gate_up_proj_blocks", "model.layers.0.mlp.experts.gate_up_proj",
                         "model.layers.0.mlp.experts.0.up_proj.weight", "block.0.mlp.mlp1_weight", "block.0.x.blocks",
                         "layers.0.feed_forward.moe.x", "lm_head.weight", "", "../escape"])


@given(config=JSON, quant=JSON, metadata=JSON, weight_map=st.dictionaries(NAMES, JSON | st.just("missing.safetensors"), max_size=5))
def test_recognize_never_raises(tmp_path_factory: pytest.TempPathFactory, config: Any, quant: Any, metadata: Any,
                                weight_map: dict) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    if isinstance(config, dict):
        config["quantization_config"] = quant
    (root / fmt.CONFIG_FILE).write_text(json.dumps(config))
    (root / fmt.INDEX_FILE).write_text(json.dumps({"metadata": metadata, "weight_map": weight_map}))
    found = rz.recognize(root)
    assert found.kind in rz.TITLES
    json.dumps(found.to_dict())
    assert found.render_text()


def test_mxfp4_tensors_beside_another_config_are_noted(tmp_path: Path) -> None:
    source = make_source(tmp_path / "hf", original=False)
    config = json.loads((source / fmt.CONFIG_FILE).read_text())
    del config["quantization_config"]
    (source / fmt.CONFIG_FILE).write_text(json.dumps(config))
    found = rz.recognize(source)
    assert found.kind == rz.HF_MXFP4 and any("different sets" in note for note in found.notes)


def test_an_index_pointing_outside_is_not_followed(tmp_path: Path) -> None:
    write_headers(tmp_path / "outside.safetensors", {"block.0.mlp.mlp1_weight": ("F8_E4M3", (2, 4, 4))})
    root = tmp_path / "d"
    root.mkdir()
    (root / fmt.INDEX_FILE).write_text(json.dumps({"weight_map": {"block.0.mlp.mlp1_weight": "../outside.safetensors"}}))
    found = rz.recognize(root)
    assert found.kind == rz.LEGACY_BF16 and found.headers_read == 0
    assert any("dtype not read" in e for e in found.evidence)


@pytest.mark.parametrize(("version", "infix", "needs_split"), [
    ("5.0.0", "", True), ("5.2.1", "", True), (None, "", True), ("4.57.1", "", False), ("5.0.0", "experts.", False),
])
def test_compressed_tensors_ambiguous_split_names_the_option(tmp_path: Path, version: str | None, infix: str,
                                                             needs_split: bool) -> None:
    """transformers ≥ 5 with ``experts.E`` names: the files cannot tell the gate/up split, so the
    advice names --ct-gate-up-split and how to decide, in the converter's own words."""
    config = ct_config()
    if version is not None:
        config["transformers_version"] = version
    found = rz.recognize(write_checkpoint(tmp_path / "ct", per_expert(infix=infix), config=config))
    assert found.kind == rz.COMPRESSED_TENSORS_FP8, found.render_text()
    action = " ".join(found.actions)
    assert ("--ct-gate-up-split interleaved|halves" in action) is needs_split
    assert (other_formats.CT_SPLIT_HELP in action) is needs_split
    assert "nxdi-gptoss-fp8 convert" in action
    if not needs_split:
        assert any("gate/up split interleaved" in item for item in found.evidence), found.evidence


@pytest.mark.parametrize("kind", list(CASES))
def test_a_folder_holding_a_checkpoint_one_level_down_names_it_and_its_command(
        kind: str, tmp_path: Path, tiny_template: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DIR that is no checkpoint but holds one (any kind) a level down: ``recognize``, hence
    ``inspect`` and ``validate``, say "DIR holds NAME/, WHAT: the command for DIR/NAME" instead of
    "copy a config.json into DIR"."""
    from nxdi_gptoss_fp8.cli import main

    built = CASES[kind][0](tmp_path / "built", tiny_template)
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "notes").mkdir()  # a folder that is no checkpoint beside it changes nothing
    inner = Path(shutil.copytree(built, holder / "gpt-oss-model"))
    found = rz.recognize(holder)
    title = rz.recognize(inner).title
    command = "validate" if kind in (rz.NORMALIZED, rz.COMPILED) else "inspect"
    expected = f"{holder} holds gpt-oss-model/, {title}: nxdi-gptoss-fp8 {command} {inner}"
    assert found.kind == rz.UNKNOWN and not found.known and found.hint() == expected
    assert found.inside == [("gpt-oss-model", title)] and not found.looked_for
    assert main(["validate", str(holder)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == expected
    assert f"config.json is missing: {expected}" in out and "copy the model's Hugging Face config" not in out
    assert main(["validate", str(holder), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["hint"] == expected


def test_only_one_level_down_is_looked_at_and_every_checkpoint_there_is_named(tmp_path: Path,
                                                                               tiny_template: Path) -> None:
    deeper = tmp_path / "deeper"
    shutil.copytree(tiny_template, deeper / "a" / "b")
    assert rz.recognize(deeper).inside == [] and rz.recognize(deeper).looked_for  # two levels down: not looked for
    two = tmp_path / "two"
    shutil.copytree(tiny_template, two / "first")
    shutil.copytree(tiny_template, two / "second")
    found = rz.recognize(two)
    assert [name for name, _ in found.inside] == ["first", "second"] and found.hint().count("holds") == 2
    assert rz.recognize(tiny_template).inside == []  # a checkpoint itself never looks inside
