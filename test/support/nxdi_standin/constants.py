"""Stand-in of ``utils/constants.py``: the model table vllm-neuron looks up at call time."""

from __future__ import annotations

from .modeling_gpt_oss import NeuronGptOssForCausalLM

MODEL_TYPES = {
    "gpt_oss": {"causal-lm": NeuronGptOssForCausalLM},
}
