"""The README's first command: a tiny checkpoint made, validated, broken three realistic
ways and validated again, so a new user sees what the preflight catches; then the valid one
is loaded through the zero-copy loader. Needs only the standard library: the checkpoint is
written without torch (``tiny_stdlib``), and the load step runs only when torch is installed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable

from . import format as fmt
from .deps import CPU_TORCH, available
from .validate.findings import PreflightReport
from .validate.pipeline import preflight

__all__ = ["CORRUPTIONS", "run_demo"]


def _truncate_last_shard(path: str) -> str:
    shards = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    target = os.path.join(path, shards[-1])
    os.truncate(target, os.path.getsize(target) // 2)
    return f"{shards[-1]} cut to half its size (an interrupted copy)"


def _misassign_scale(path: str) -> str:
    index_path = os.path.join(path, fmt.INDEX_FILE)
    with open(index_path) as handle:
        index = json.load(handle)
    weight_map = index["weight_map"]
    key = next(k for k in weight_map if fmt.is_expert_scale(k))
    other = next(s for s in sorted(set(weight_map.values())) if s != weight_map[key])
    weight_map[key] = other
    with open(index_path, "w") as handle:
        json.dump(index, handle, indent=2)
    return f"index entry of {key} pointed at {other} (a hand-edited index)"


def _mxfp4_config(path: str) -> str:
    config_path = os.path.join(path, fmt.CONFIG_FILE)
    with open(config_path) as handle:
        config = json.load(handle)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    with open(config_path, "w") as handle:
        json.dump(config, handle, indent=2)
    return "config.json replaced by the HF MXFP4 one (quant_method mxfp4)"


CORRUPTIONS: tuple[Callable[[str], str], ...] = (_truncate_last_shard, _misassign_scale, _mxfp4_config)


def run_demo(print_: Callable[[str], None] = print, *, workdir: str | None = None,
             load: bool | None = None) -> bool:
    """Run the demo; True when the valid checkpoint passed and every corruption was caught.

    ``load=None`` loads the valid checkpoint when torch is installed (and says so in one line
    when it is not); False skips that step."""
    from .synthetic.tiny_stdlib import make_tiny_stdlib

    if load is None:
        load = available("torch")
    owned = workdir is None
    base = tempfile.mkdtemp(prefix="nxdi-gptoss-fp8-demo-") if owned else workdir
    assert base is not None
    try:
        valid = make_tiny_stdlib(os.path.join(base, "tiny-normalized-fp8"))
        print_(f"1. wrote a tiny normalized FP8 checkpoint to {valid}")
        report = preflight(valid, allow_custom_model=True)
        print_(_indent(report.render_text()))
        all_as_expected = report.ok
        for number, corrupt in enumerate(CORRUPTIONS, start=2):
            copy = os.path.join(base, f"corrupted-{number}")
            shutil.copytree(valid, copy)
            what = corrupt(copy)
            broken: PreflightReport = preflight(copy, allow_custom_model=True)
            print_(f"{number}. corrupted a copy: {what}")
            print_(_indent(broken.render_text(limit=6)))
            all_as_expected = all_as_expected and not broken.ok
        step = len(CORRUPTIONS) + 2
        if load:
            from .loader import describe_load

            print_(f"{step}. loaded the valid checkpoint through the loader (NxDI's defaults: tp 1, BF16)")
            print_(_indent(describe_load(valid)))
        else:
            print_(f"{step}. skipped the zero-copy load: it needs torch, which is not installed ({CPU_TORCH})")
        print_("demo " + ("succeeded: the valid checkpoint passed and every corruption was refused" if all_as_expected else "FAILED"))
        return all_as_expected
    finally:
        if owned:
            shutil.rmtree(base, ignore_errors=True)


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.splitlines())
