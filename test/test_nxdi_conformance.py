"""Conformance against the real NxDI: runs when NxDI is importable, or when ``NXDI_SRC`` points
to an NxDI source checkout (the Neuron-only packages are then stubbed so the pure-torch
conversion code runs on CPU); skipped otherwise.

* With the hook registered, NxDI's HF and legacy paths return exactly what they return without
  it (same keys, dtypes, bit-identical values), through NxDI's own ``checkpoint_loader_fn``.
* The normalized path returns, for the same FP8 weights, exactly what NxDI's legacy path returns
  for an FP8 legacy checkpoint (``mlp1_scale``/``mlp2_scale`` per (expert, row)) on every
  shared key; the keys that differ are exactly the documented ones.

Run: ``NXDI_SRC=/path/to/neuronx-distributed-inference python3 -m pytest -s test/test_nxdi_conformance.py``
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from real_nxdi import gptoss_app, real_modeling

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.errors import PreflightError
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_MXFP4, make_source, write_legacy_fp8
from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS

pytestmark = [pytest.mark.nxdi, pytest.mark.filterwarnings("ignore")]

DIMS = TINY_DIMS
LAYERS = DIMS.num_hidden_layers


@pytest.fixture(scope="module")
def modeling() -> Iterator[ModuleType]:
    """NxDI's real ``modeling_gpt_oss`` module (imported for this test module only)."""
    with real_modeling() as module:
        yield module


@contextlib.contextmanager
def checkpoint_format(value: str | None, *, hooked: bool) -> Iterator[None]:
    previous = os.environ.get(nxdi_hook.ENV_VAR)
    if value is None:
        os.environ.pop(nxdi_hook.ENV_VAR, None)
    else:
        os.environ[nxdi_hook.ENV_VAR] = value
    if hooked:
        nxdi_hook.register()
    try:
        yield
    finally:
        nxdi_hook.unregister()
        if previous is None:
            os.environ.pop(nxdi_hook.ENV_VAR, None)
        else:
            os.environ[nxdi_hook.ENV_VAR] = previous


def loader_output(modeling: ModuleType, ckpt: Path, neuron_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """NxDI's ``checkpoint_loader_fn`` output for ``ckpt`` with a GPT-OSS config built like NxDI's drivers do."""
    layers = [f"layers.{i}.self_attn" for i in range(LAYERS)]
    kwargs = {"quantized": True, "quantized_checkpoints_path": str(ckpt), "quantization_type": fmt.QUANTIZATION_TYPE,
              "quantization_dtype": fmt.QUANTIZATION_DTYPE, "modules_to_not_convert": ["lm_head", *layers],
              "logical_nc_config": 1, **neuron_kwargs}
    app = gptoss_app(modeling, ckpt, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return app.checkpoint_loader_fn()


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: set[str]) -> None:
    for key in sorted(keys):
        assert a[key].dtype == b[key].dtype, f"{key}: {a[key].dtype} != {b[key].dtype}"
        assert a[key].shape == b[key].shape, f"{key}: {tuple(a[key].shape)} != {tuple(b[key].shape)}"
        assert raw(a[key]) == raw(b[key]), f"{key}: values differ"


# --------------------------------------------------------------------------- tiny source checkpoints


def write_hf_mxfp4(out: Path, seed: int = 0) -> Path:
    """A tiny checkpoint in the published HF MXFP4 layout, with block-scale exponents NxDI decodes."""
    return make_source(out, SOURCE_MXFP4, dims=DIMS, seed=seed, scale_range=REALISTIC_SCALE_RANGE, original=False)


# --------------------------------------------------------------------------- the checks


VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tp2-fused-vocab-dp-padlm": {"tp_degree": 2, "fused_qkv": True, "vocab_parallel": True, "attention_dp_degree": 2,
                                 "batch_size": 2, "is_continuous_batching": True, "lm_head_pad": True,
                                 "lm_head_pad_alignment_size": 3},
    "float32": {"torch_dtype": "float32", "lm_head_pad": True, "lm_head_pad_alignment_size": 3},
}


def assert_hook_is_transparent(modeling: ModuleType, source: Path, value: str | None,
                               neuron_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """NxDI's output for ``source`` under ``CHECKPOINT_FORMAT=value`` is the same (same keys in the same
    order, bit-identical values) with and without the hook registered; returns it."""
    with checkpoint_format(value, hooked=False):
        plain = loader_output(modeling, source, neuron_kwargs)
    with checkpoint_format(value, hooked=True):
        hooked = loader_output(modeling, source, neuron_kwargs)
    assert list(hooked) == list(plain)
    assert_identical(hooked, plain, set(plain))
    return plain


@pytest.mark.parametrize("value", [None, "hf", "HF"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hf_path_is_untouched_by_the_hook(modeling: ModuleType, tmp_path: Path, value: str | None, variant: str) -> None:
    plain = assert_hook_is_transparent(modeling, write_hf_mxfp4(tmp_path / "hf"), value, VARIANTS[variant])
    assert f"layers.0.{fmt.GATE_UP}.weight" in plain and plain[f"layers.0.{fmt.GATE_UP}.weight"].dtype == torch.bfloat16
    print(f"conformance hf[{value}] {variant}: {len(plain)} keys identical with and without the hook")


@pytest.mark.parametrize("value", ["legacy", "neuron", ""])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_legacy_path_is_untouched_by_the_hook(modeling: ModuleType, tiny_template: Path, tmp_path: Path,
                                              value: str, variant: str) -> None:
    plain = assert_hook_is_transparent(modeling, write_legacy_fp8(tmp_path / "legacy", tiny_template), value,
                                       VARIANTS[variant])
    print(f"conformance legacy[{value!r}] {variant}: {len(plain)} keys identical with and without the hook")


NORMALIZED_VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    **{name: (kwargs, "tiny_template") for name, kwargs in VARIANTS.items()},
    "padded-96-128": ({"padded_hidden_size": 96, "padded_intermediate_size": 128}, "tiny_padded_template"),
    # the load-time choices change where the bytes live, never what they are
    "private-memory-verified": ({fmt.LOAD_MODE_ATTR: fmt.LOAD_MODE_PRIVATE, fmt.VERIFY_AT_LOAD_ATTR: True}, "tiny_template"),
}


@pytest.mark.parametrize("variant", list(NORMALIZED_VARIANTS))
def test_normalized_equals_nxdi_legacy_fp8_on_every_shared_key(modeling: ModuleType, tmp_path: Path, variant: str,
                                                              request: pytest.FixtureRequest) -> None:
    kwargs, template = NORMALIZED_VARIANTS[variant]
    normalized = request.getfixturevalue(template)
    legacy = write_legacy_fp8(tmp_path / "legacy", normalized)
    with checkpoint_format("legacy", hooked=True):
        expected = loader_output(modeling, legacy, kwargs)
    with checkpoint_format("normalized_fp8", hooked=True):
        ours = loader_output(modeling, normalized, kwargs)
    shared = set(ours) & set(expected)
    assert_identical(ours, expected, shared)
    # what differs is exactly what the contract documents (b.2): the legacy branch keeps its
    # source scale keys and adds neither post-attention nor final-norm unpadded weights
    leftovers = {f"block.{i}.mlp.{w}_scale" for i in range(LAYERS) for w in ("mlp1", "mlp2")}
    unpadded = {"norm.weight_unpadded"} | {f"layers.{i}.post_attention_layernorm.weight_unpadded" for i in range(LAYERS)}
    assert set(expected) - set(ours) == leftovers
    assert set(ours) - set(expected) == unpadded
    for key in unpadded:
        weight = ours[key.replace("weight_unpadded", "weight")]
        assert raw(ours[key]) == raw(weight[: DIMS.hidden_size])
    assert ours[f"layers.0.{fmt.GATE_UP}.weight"].dtype == torch.float8_e4m3fn
    assert ours[f"layers.0.{fmt.GATE_UP}.scale"].shape == (DIMS.num_local_experts, 1, 2 * (kwargs.get("padded_intermediate_size") or DIMS.intermediate_size))
    print(f"conformance normalized vs legacy FP8 {variant}: {len(shared)} shared keys bit-identical "
          f"(legacy-only: {len(set(expected) - set(ours))} source scales; ours-only: {len(unpadded)} unpadded norms)")


def test_normalized_mode_on_an_hf_checkpoint_says_what_it_is(modeling: ModuleType, tmp_path: Path) -> None:
    """Through NxDI's own loader entry point: the refusal names the HF set and both ways out."""
    source = write_hf_mxfp4(tmp_path / "hf")
    with checkpoint_format("normalized_fp8", hooked=True), pytest.raises(PreflightError) as caught:
        loader_output(modeling, source, {})
    first = str(caught.value).splitlines()[0]
    assert "is an HF MXFP4 checkpoint" in first and "unset CHECKPOINT_FORMAT" in first
    assert f"nxdi-gptoss-fp8 convert {source} OUT" in first


def test_config_opt_in_survives_nxdi_json_round_trip(modeling: ModuleType, tiny_template: Path) -> None:
    with checkpoint_format(None, hooked=True):
        neuron_config = modeling.GptOssNeuronConfig(checkpoint_format="normalized_fp8", logical_nc_config=1)
        config = modeling.GptOssInferenceConfig(neuron_config, load_config=lambda c: c.__dict__.update(
            {k: v for k, v in json.loads((tiny_template / fmt.CONFIG_FILE).read_text()).items() if k != "torch_dtype"}))
        reloaded = modeling.GptOssInferenceConfig.from_json_string(config.to_json_string())
        assert reloaded.neuron_config.checkpoint_format == "normalized_fp8"
        assert nxdi_hook.normalized_mode(reloaded, {}) is True


@pytest.mark.parametrize(("attr", "value"), [(fmt.VERIFY_AT_LOAD_ATTR, True), (fmt.LOAD_MODE_ATTR, fmt.LOAD_MODE_PRIVATE)])
def test_load_choices_survive_nxdi_json_round_trip(modeling: ModuleType, tiny_template: Path, attr: str, value: Any) -> None:
    from nxdi_gptoss_fp8.loader import LoadPolicy

    with checkpoint_format(None, hooked=True):
        neuron_config = modeling.GptOssNeuronConfig(logical_nc_config=1, **{attr: value})
        config = modeling.GptOssInferenceConfig(neuron_config, load_config=lambda c: c.__dict__.update(
            {k: v for k, v in json.loads((tiny_template / fmt.CONFIG_FILE).read_text()).items() if k != "torch_dtype"}))
        reloaded = modeling.GptOssInferenceConfig.from_json_string(config.to_json_string())
        assert getattr(reloaded.neuron_config, attr) == value
        assert LoadPolicy.resolve(reloaded, {}) == LoadPolicy.resolve(config, {}) != LoadPolicy()


def test_cli_inference_demo_accepts_gpt_oss_in_nxdi_demo(modeling: ModuleType, capsys: pytest.CaptureFixture) -> None:
    """NxDI's inference_demo has no gpt_oss model type; after our CLI registers, it accepts it."""
    from nxdi_gptoss_fp8 import cli

    rng = torch.random.get_rng_state()  # importing inference_demo reseeds torch's global RNG
    try:
        with checkpoint_format(None, hooked=False), pytest.raises(SystemExit) as exited:
            cli.main(["inference-demo", "--model-type", "gpt_oss", "--task-type", "causal-lm", "run", "--help"])
    finally:
        torch.random.set_rng_state(rng)
    assert exited.value.code == 0, capsys.readouterr().err
    assert "--quantized-checkpoints-path" in capsys.readouterr().out
    demo = sys.modules[nxdi_hook.DEMO_MODULE]
    assert "gpt_oss" not in demo.MODEL_TYPES  # unregister removed the entry it added
