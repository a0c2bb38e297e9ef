"""Stand-in of ``inference_demo.py``: its own MODEL_TYPES without ``gpt_oss``, ``--model-type``
choices computed from it, and ``run_inference`` calling ``save_quantized_state_dict`` whenever
``--quantized`` is given before the weights are loaded. ``RUNS`` records each run's state dict."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .modeling_gpt_oss import NeuronGptOssForCausalLM  # noqa: F401  (imported by the real demo too)

MODEL_TYPES: dict[str, dict[str, Any]] = {"llama": {"causal-lm": object}}
RUNS: list[dict[str, Any]] = []


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stand-in inference_demo")
    # the choices are read from MODEL_TYPES when the arguments are parsed, as in NxDI's demo
    parser.add_argument("--model-type", required=True, choices=sorted(MODEL_TYPES))
    parser.add_argument("--task-type", required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp-degree", type=int, default=1)
    parser.add_argument("--quantized", action="store_true")
    parser.add_argument("--quantized-checkpoints-path")
    parser.add_argument("--quantization-type")
    parser.add_argument("--quantization-dtype")
    parser.add_argument("--modules-to-not-convert", nargs="*")
    return parser.parse_args()


def _load_config(path: str) -> Any:
    def load(config: Any) -> None:
        with open(os.path.join(path, "config.json")) as handle:
            for key, value in json.load(handle).items():
                setattr(config, key, value)
        config._name_or_path = path

    return load


def run_inference(model_cls: Any, args: argparse.Namespace) -> None:
    kwargs = {k: v for k, v in vars(args).items() if v is not None}
    neuron_config = model_cls.get_config_cls().get_neuron_config_cls()(**kwargs)
    config = model_cls.get_config_cls()(neuron_config, load_config=_load_config(args.model_path))
    model = model_cls(args.model_path, config)
    if neuron_config.quantized:
        model_cls.save_quantized_state_dict(args.model_path, config)
    RUNS.append(model.checkpoint_loader_fn())


def main() -> None:
    args = parse_args()
    assert args.task_type in MODEL_TYPES[args.model_type], f"Unsupported task: {args.model_type}/{args.task_type}"
    run_inference(MODEL_TYPES[args.model_type][args.task_type], args)
