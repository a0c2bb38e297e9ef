"""One recipe per client, as data: the NeuronConfig keys a normalized checkpoint needs, and how
each client (vLLM's NxDI-backed ``vllm-neuron``, NxDI's ``inference_demo``, the Python API) is
given them. The recipes of docs/serving.md, the model card, the serving-host lint (``serving_host``) and
the hint on a refused vLLM start all read them from here. Stdlib only.

vLLM builds the NeuronConfig from its own defaults (``quantized: False``) updated with the JSON
object under ``override_neuron_config`` in ``--additional-config``; when that object has
``quantized`` but not ``quantization_type`` / ``quantization_dtype``, vllm-neuron fills in
``per_tensor_symmetric`` / ``int8`` (``_get_neuron_config_after_override``, 0.2.0). So the vLLM
recipe spells every FP8 key out.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from .. import format as fmt
from ..validate.vllm_config import VLLM_OVERRIDE_KEY

__all__ = [
    "ACCURACY_PROMPT", "ACCURACY_TOKENS", "DEFAULT_VLLM_SETTINGS", "HARMONY_VOCABULARY", "HARMONY_VOCABULARY_URL",
    "MODULES_TO_NOT_CONVERT", "O200K_BASE_SHA256", "QUANTIZATION_KEYS", "SOURCE_REFERENCE_DIVERGENCE_TOL", "SOURCE_REFERENCE_TOL_MAP",
    "VLLM_ADDITIONAL_CONFIG_FLAG", "VLLM_OVERRIDE_KEY", "accuracy_demo_argv", "goldens_argv", "inference_demo_argv",
    "modules_file", "neuron_config_keys", "vllm_command", "vllm_hint", "vllm_override",
]

MODULES_TO_NOT_CONVERT = ("lm_head", "self_attn")  # NxD's substring rule: attention and lm_head stay BF16
VLLM_ADDITIONAL_CONFIG_FLAG = "--additional-config"
# the NeuronConfig keys that say "this checkpoint is normalized FP8"; vLLM's defaults lack all of them
QUANTIZATION_KEYS = ("quantized", "quantized_checkpoints_path", "quantization_type", "quantization_dtype",
                     "modules_to_not_convert", "padded_hidden_size", "padded_intermediate_size")
# where Harmony (tiktoken's public encodings) downloads o200k_base.tiktoken when TIKTOKEN_ENCODINGS_BASE is unset
HARMONY_VOCABULARY_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
HARMONY_VOCABULARY = "o200k_base.tiktoken"
# The SHA-256 openai-harmony expects of o200k_base.tiktoken (openai/harmony,
# src/tiktoken_ext/public_encodings.rs, Encoding::expected_hash; tiktoken's openai_public.py agrees)
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# the vLLM settings of the vLLM recipe (docs/serving.md) besides the override (what one host serves)
DEFAULT_VLLM_SETTINGS = {"tensor_parallel_size": 64, "max_model_len": 8192, "max_num_seqs": 4}


def neuron_config_keys(checkpoint: str, padded_hidden_size: int, padded_intermediate_size: int) -> dict[str, Any]:
    """The NeuronConfig attributes that load ``checkpoint`` (a local directory) through the hook."""
    return {
        "quantized": True,
        "quantized_checkpoints_path": checkpoint,
        "quantization_type": fmt.QUANTIZATION_TYPE,
        "quantization_dtype": fmt.QUANTIZATION_DTYPE,
        "modules_to_not_convert": list(MODULES_TO_NOT_CONVERT),
        "padded_hidden_size": padded_hidden_size,
        "padded_intermediate_size": padded_intermediate_size,
    }


def vllm_override(checkpoint: str, padded_hidden_size: int, padded_intermediate_size: int) -> dict[str, Any]:
    """``--additional-config``'s JSON for vLLM: every FP8 key explicit under ``override_neuron_config``."""
    return {VLLM_OVERRIDE_KEY: neuron_config_keys(checkpoint, padded_hidden_size, padded_intermediate_size)}


def vllm_command(checkpoint: str, compiled: str, tiktoken_dir: str, padded_hidden_size: int,
                 padded_intermediate_size: int, *, tensor_parallel_size: int = DEFAULT_VLLM_SETTINGS["tensor_parallel_size"],
                 max_model_len: int = DEFAULT_VLLM_SETTINGS["max_model_len"],
                 max_num_seqs: int = DEFAULT_VLLM_SETTINGS["max_num_seqs"]) -> str:
    """The vLLM recipe as shell lines: the three environment variables (Harmony's vocabulary
    directory with where the file comes from and its SHA-256), then ``vllm serve`` with the full
    ``--additional-config`` (the block of docs/serving.md and the card's are this text)."""
    override = json.dumps(vllm_override(checkpoint, padded_hidden_size, padded_intermediate_size))
    return "\n".join([
        "export CHECKPOINT_FORMAT=normalized_fp8",
        f"export NEURON_COMPILED_ARTIFACTS={shlex.quote(compiled)}",
        f"export TIKTOKEN_ENCODINGS_BASE={shlex.quote(tiktoken_dir)}  # holds {HARMONY_VOCABULARY} from "
        f"{HARMONY_VOCABULARY_URL} (SHA-256 {O200K_BASE_SHA256})",
        f"vllm serve {shlex.quote(checkpoint)} \\",
        f"  --tensor-parallel-size {tensor_parallel_size} --max-model-len {max_model_len} --max-num-seqs {max_num_seqs} "
        "--no-enable-prefix-caching \\",
        f"  {VLLM_ADDITIONAL_CONFIG_FLAG} {shlex.quote(override)}",
    ])


def modules_file() -> dict[str, Any]:
    """The contents of ``inference_demo``'s ``--modules-to-not-convert-file`` (NxDI reads this key)."""
    return {"modules_to_not_convert": list(MODULES_TO_NOT_CONVERT)}


def inference_demo_argv(checkpoint: str, compiled: str, modules_path: str, *,
                        tp_degree: int = DEFAULT_VLLM_SETTINGS["tensor_parallel_size"],
                        seq_len: int = DEFAULT_VLLM_SETTINGS["max_model_len"],
                        prompt: str = "I believe the meaning of life is") -> list[str]:
    """``nxdi-gptoss-fp8 inference-demo``'s arguments (NxDI's own flags) for a normalized checkpoint.

    NxDI 0.9's demo has no flag for the padded sizes, so it serves checkpoints converted without
    padding (the converter's default; the NeuronConfig's padded sizes stay unset = H and I)."""
    return ["--model-type", "gpt_oss", "--task-type", "causal-lm", "run",
            "--model-path", checkpoint, "--compiled-model-path", compiled,
            "--torch-dtype", "bfloat16", "--tp-degree", str(tp_degree), "--batch-size", "1",
            "--max-context-length", str(seq_len), "--seq-len", str(seq_len),
            "--quantized", "--quantized-checkpoints-path", checkpoint,
            "--quantization-type", fmt.QUANTIZATION_TYPE, "--quantization-dtype", fmt.QUANTIZATION_DTYPE,
            "--modules-to-not-convert-file", modules_path, "--save-sharded-checkpoint", "--prompt", prompt]


# NxDI's accuracy check against the HF source the checkpoint was converted from (docs/accuracy.md):
# FP8's rounding adds to the device's, so the top tiers get NxDI's default rtol (0.01 / 0.02) plus
# twice the largest FP8 need measured on the CPU (test/test_accuracy_nxdi_cpu.py: 0.016 at top-5
# on a tiny BF16-sourced model, 0.0025 / 0.007 at top-5 / top-50 on a gpt-oss-20b-shaped layer),
# rounded up; the tail tiers (1000, all) are left out: relative errors of near-zero logits measure
# nothing there. Against the dequantized reference NxDI's defaults apply unchanged.
SOURCE_REFERENCE_TOL_MAP: dict[str, tuple[float, float]] = {"5": (1e-5, 0.05), "50": (1e-5, 0.05)}
SOURCE_REFERENCE_DIVERGENCE_TOL = 0.05
ACCURACY_TOKENS = 64
ACCURACY_PROMPT = "I believe the meaning of life is"


def goldens_argv(checkpoint: str, reference: str, output: str, *, prompt: str = ACCURACY_PROMPT,
                 num_tokens: int = ACCURACY_TOKENS) -> list[str]:
    """``nxdi-gptoss-fp8 goldens``'s arguments: the expected outputs of ``reference`` for ``prompt``."""
    return [checkpoint, "--reference", reference, "--prompt", prompt, "--num-tokens", str(num_tokens), "--output", output]


def accuracy_demo_argv(checkpoint: str, compiled: str, modules_path: str, goldens: str, *, against_source: bool,
                       num_tokens: int = ACCURACY_TOKENS, prompt: str = ACCURACY_PROMPT, **demo: Any) -> list[str]:
    """The demo recipe with NxDI's logit-matching check against ``goldens`` (written by ``goldens``
    for the same prompt); ``against_source`` adds the tolerances FP8 needs against the HF source."""
    argv = [*inference_demo_argv(checkpoint, compiled, modules_path, prompt=prompt, **demo),
            "--check-accuracy-mode", "logit-matching", "--expected-outputs-path", goldens,
            "--num-tokens-to-check", str(num_tokens)]
    if against_source:
        argv += ["--tol-map", json.dumps(SOURCE_REFERENCE_TOL_MAP).replace("[", "(").replace("]", ")"),
                 "--divergence-difference-tol", str(SOURCE_REFERENCE_DIVERGENCE_TOL)]
    return argv


def _keys_for(codes: Iterable[str]) -> list[str]:
    keys: list[str] = []
    for code in codes:
        reason = code.removeprefix("neuron_config.")
        if reason == "not_quantized":
            keys += ["quantized", "quantized_checkpoints_path", "quantization_type", "quantization_dtype"]
        elif reason in ("wrong_quantization_dtype", "wrong_quantization_type"):
            keys.append(reason.removeprefix("wrong_"))
        elif reason in ("attention_not_excluded", "lm_head_not_excluded", "experts_excluded"):
            keys.append("modules_to_not_convert")
    return list(dict.fromkeys(keys))


def vllm_hint(report: Any, checkpoint: str, modules: Mapping[str, Any] | None = None) -> str | None:
    """When vllm-neuron is loaded in this process and the preflight refused NxDI's config for want of
    the FP8 keys: one line naming vLLM's key and the JSON to add; None otherwise."""
    loaded = sys.modules if modules is None else modules
    if "vllm_neuron" not in loaded:
        return None
    keys = _keys_for(finding.code for finding in report.errors)
    if not keys:
        return None
    wanted = {key: value for key, value in neuron_config_keys(checkpoint, 0, 0).items() if key in keys}
    return (f"vLLM builds this NeuronConfig from its defaults (not quantized; int8 / per_tensor_symmetric filled in "
            f"when quantized is given alone) and {VLLM_ADDITIONAL_CONFIG_FLAG}'s \"{VLLM_OVERRIDE_KEY}\" (spelled with "
            f"underscores): add {json.dumps(wanted)} to it, e.g. {VLLM_ADDITIONAL_CONFIG_FLAG} "
            f"{shlex.quote(json.dumps({VLLM_OVERRIDE_KEY: wanted}))}, with padded_hidden_size and "
            "padded_intermediate_size as the checkpoint's index records them (docs/serving.md#vllm-the-nxdi-backed-vllm-neuron)")
