"""``check-forward`` decides before NxDI is imported: a source the reference cannot read, a
source of another model and a host without the memory are refused at once, in one line, with
JSON under ``--json``. These run without NxDI (the refusals come first)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.errors import ConversionError, CpuModelError
from nxdi_gptoss_fp8.forward.check import check_forward
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, make_source

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny MXFP4 source, a compressed-tensors source of the same dimensions, and the conversion of each."""
    root = tmp_path_factory.mktemp("check-forward")
    mxfp4 = make_source(root / "hf-mxfp4", SOURCE_MXFP4, original=False)
    ct = make_source(root / "ct", SOURCE_COMPRESSED_TENSORS)
    convert(mxfp4, root / "fp8", max_shard_size="64KB", progress=False)
    convert(ct, root / "fp8-from-ct", max_shard_size="64KB", progress=False)
    return {"mxfp4": mxfp4, "ct": ct, "fp8": root / "fp8", "fp8-from-ct": root / "fp8-from-ct"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(fmt.ALLOW_CUSTOM_ENV, None)
    return subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.mark.parametrize("ckpt", ["fp8-from-ct", "fp8"])
def test_a_compressed_tensors_source_is_refused_before_any_model(checkpoints: dict[str, Path], ckpt: str) -> None:
    with pytest.raises(ConversionError, match="is a compressed-tensors-fp8 source: the reference model reads only") as info:
        check_forward(checkpoints[ckpt], checkpoints["ct"], allow_custom_model=True)
    assert "\n" not in str(info.value) and "HF checkpoint it was quantized from" in str(info.value)


@pytest.mark.parametrize("json_flag", [False, True])
def test_the_cli_refuses_it_in_one_line_and_json(checkpoints: dict[str, Path], json_flag: bool) -> None:
    done = run_cli("check-forward", str(checkpoints["fp8-from-ct"]), "--source", str(checkpoints["ct"]),
                   "--allow-custom-model", *(["--json"] if json_flag else []))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "compressed-tensors-fp8 source" in done.stderr
    if json_flag:
        result = json.loads(done.stdout)
        assert result["ok"] is False and result["exit_code"] == 2 and "compressed-tensors" in result["error"]["message"]
    else:
        assert done.stdout == ""


@pytest.mark.parametrize(("offered", "where"), [(10 << 20, "MemAvailable"), (1 << 30, "under the memory cgroup's limit")])
def test_a_host_without_the_memory_is_refused_before_nxdi(checkpoints: dict[str, Path], offered: int, where: str) -> None:
    with pytest.raises(CpuModelError, match=rf"needs about .* GB for 2 layers .*, and {where} offers") as info:
        check_forward(checkpoints["fp8"], checkpoints["mxfp4"], allow_custom_model=True,
                      available_memory=(offered, where))
    assert "--layers" in str(info.value) and "\n" not in str(info.value)


def test_the_need_is_said_before_the_run(checkpoints: dict[str, Path]) -> None:
    said: list[str] = []
    with contextlib.suppress(CpuModelError):  # NxDI missing here: the line came first
        check_forward(checkpoints["fp8"], checkpoints["mxfp4"], allow_custom_model=True, say=said.append,
                      available_memory=(1 << 40, "MemAvailable"))
    assert len(said) == 1 and said[0].startswith("needs about ") and "MemAvailable offers" in said[0]


@pytest.mark.parametrize(("layers", "message"), [(0, "--layers must be 1..2 or all, not 0"),
                                                 (3, "--layers must be 1..2 or all, not 3")])
def test_layer_counts_outside_the_model_are_refused(checkpoints: dict[str, Path], layers: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_forward(checkpoints["fp8"], checkpoints["mxfp4"], layers=layers, allow_custom_model=True)


@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_the_layers_option_takes_a_count_or_all(checkpoints: dict[str, Path], value: str) -> None:
    done = run_cli("check-forward", str(checkpoints["fp8"]), "--source", str(checkpoints["mxfp4"]), "--layers", value)
    assert done.returncode == 2 and "whole number from 1, or 'all'" in done.stderr
