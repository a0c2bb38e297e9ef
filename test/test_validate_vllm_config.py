"""The package's model of vllm-neuron (a host without it): the NeuronConfig it builds and what each
release refuses in it (the real functions are held to it by ``test_client_start_plan``)."""

from __future__ import annotations

from typing import Any

import pytest

from nxdi_gptoss_fp8.validate.vllm_config import CLIENT_RELEASES, RELEASE_DIFFERENCES, VllmSettings, client_refusals

PREFIX = VllmSettings(tensor_parallel_size=2, max_model_len=100, max_num_seqs=1, block_size=32, enable_prefix_caching=True)
NO_PREFIX = VllmSettings(tensor_parallel_size=2, max_model_len=100, max_num_seqs=1, block_size=100,
                         enable_prefix_caching=False)

# (settings, override) → the words of each release's refusal (None: accepted)
CASES: dict[str, tuple[VllmSettings, dict[str, Any], dict[str, str | None]]] = {
    "too few blocks (the issue's command)": (PREFIX, {}, {"0.1.0": None, "0.2.0": "At least 4 blocks are required"}),
    "enough blocks": (VllmSettings(max_model_len=128, max_num_seqs=2, block_size=32), {}, {"0.1.0": None, "0.2.0": None}),
    "prefix caching off": (NO_PREFIX, {}, {"0.1.0": None, "0.2.0": None}),
    "pa_num_blocks alone": (PREFIX, {"pa_num_blocks": 8}, {"0.1.0": None, "0.2.0": "--num-gpu-blocks-override"}),
    "pa_num_blocks not the override's": (VllmSettings(max_model_len=128, max_num_seqs=1, num_gpu_blocks_override=8),
                                         {"pa_num_blocks": 7}, {"0.1.0": None, "0.2.0": "must equal"}),
    "is_prefix_caching off with prefix caching": (PREFIX, {"is_prefix_caching": False},
                                                  {"0.1.0": "is_prefix_caching", "0.2.0": "is_prefix_caching"}),
    "lora_modules": (NO_PREFIX, {"lora_modules": []}, {"0.1.0": "lora_modules", "0.2.0": None}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("release", CLIENT_RELEASES)
def test_each_release_refuses_what_it_refuses(case: str, release: str) -> None:
    settings, override, expected = CASES[case]
    refusals = client_refusals(settings, override, release)
    if expected[release] is None:
        assert refusals == []
    else:
        assert len(refusals) >= 1 and expected[release] in refusals[0] and "\n" not in refusals[0]


def test_every_difference_is_named() -> None:
    assert set(RELEASE_DIFFERENCES) == {"model lookup", "blocks", "quantization", "lora"}
    assert all("0.1.0" in text or "0.2.0" in text for text in RELEASE_DIFFERENCES.values())
