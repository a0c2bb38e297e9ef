"""Full-size checkpoints (sparse files: real headers and scales, data holes) pass the
preflight, which reads only a sliver of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sparse_checkpoint

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8 import preflight


@pytest.mark.parametrize(("profile", "tensors"), [(fmt.PROFILE_120B, 687), (fmt.PROFILE_20B, 459)])
def test_full_size_sparse_checkpoint_passes(tmp_path: Path, profile: str, tensors: int) -> None:
    ckpt = sparse_checkpoint.build_sparse_checkpoint(str(tmp_path / profile), profile)
    apparent, allocated = sparse_checkpoint.disk_usage(ckpt)
    report = preflight(ckpt)
    assert report.ok, report.render_text()
    assert report.profile == profile and report.tensors == tensors
    assert report.bytes_read < 0.002 * apparent
    assert allocated < 0.01 * apparent  # the holes really are holes


def test_full_size_padded_120b_passes_with_matching_neuron_config(tmp_path: Path) -> None:
    ckpt = sparse_checkpoint.build_sparse_checkpoint(str(tmp_path / "p"), fmt.PROFILE_120B, padded_hidden_size=3072, padded_intermediate_size=3072)
    neuron_config = {
        "tp_degree": 64, "quantized": True, "quantization_type": fmt.QUANTIZATION_TYPE,
        "quantization_dtype": fmt.QUANTIZATION_DTYPE, "modules_to_not_convert": ["self_attn", "lm_head"],
        "padded_hidden_size": 3072, "padded_intermediate_size": 3072,
    }
    assert preflight(ckpt, neuron_config=neuron_config).ok
    report = preflight(ckpt, neuron_config={**neuron_config, "padded_intermediate_size": 8192})
    assert [f.code for f in report.errors] == ["neuron_config.padding_mismatch"]
