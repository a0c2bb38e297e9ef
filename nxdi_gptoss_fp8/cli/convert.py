"""``convert``: a GPT-OSS checkpoint (HF MXFP4, HF BF16, compressed-tensors FP8; a directory or a Hub id) to normalized FP8 (needs torch)."""

from __future__ import annotations

import argparse
from typing import Any

from ._errors import PARTIAL_OUTPUT_REMOVED, UsageError, usage_error
from ._help import Example
from ._options import _add_output_options, _add_split_option, _add_workers_option, _needs, _resolve, _size, _workers
from ._output import print_result

__all__ = ["CONVERT_EXAMPLES", "add_convert_command"]


CONVERT_EXAMPLES = (
    Example("the plan first: the files read, the shards written, the free space and the peak memory",
            "nxdi-gptoss-fp8 convert openai/gpt-oss-120b /data/models/gpt-oss-120b-fp8 --dry-run"),
    Example("convert from the Hub (only the files needed are fetched), then compare the result with its source",
            "nxdi-gptoss-fp8 convert openai/gpt-oss-120b /data/models/gpt-oss-120b-fp8 && \\\n"
            "  nxdi-gptoss-fp8 verify-conversion /data/models/gpt-oss-120b-fp8 --source openai/gpt-oss-120b"),
    Example("a local HF checkpoint, padded for a tensor-parallel degree that needs it",
            "nxdi-gptoss-fp8 convert /data/models/gpt-oss-20b /data/models/gpt-oss-20b-fp8-i3072 "
            "--padded-intermediate-size 3072"),
    Example("for the vLLM Neuron plugin's geometry (SDK >= 2.32): padded to 3072, the target recorded in the index",
            "nxdi-gptoss-fp8 convert /data/models/gpt-oss-120b /data/models/gpt-oss-120b-fp8-nki --target nki-moe"),
    Example("an llm-compressor FP8_DYNAMIC checkpoint made by llm-compressor 0.12 (when the converter asks)",
            "nxdi-gptoss-fp8 convert /data/models/gpt-oss-120b-FP8-Dynamic /data/models/gpt-oss-120b-fp8 "
            "--ct-gate-up-split halves"),
    Example("replace an earlier output of this converter, with 8 workers, the report as JSON",
            "nxdi-gptoss-fp8 convert /data/models/gpt-oss-120b /data/models/gpt-oss-120b-fp8 --overwrite "
            "--workers 8 --json"),
)


def _plan_or_refuse(args: argparse.Namespace, plan: Any) -> None:
    """``--dry-run`` prints the plan (and stops the command); a real run refuses a plan that does not fit."""
    if args.dry_run:
        raise _PlanShown(plan)
    plan.check()  # one line with the numbers when it does not fit


class _PlanShown(Exception):
    def __init__(self, plan: Any) -> None:
        super().__init__()
        self.plan = plan


def _cmd_convert(args: argparse.Namespace) -> int:
    _needs("", "torch", "safetensors")
    from ..convert import convert, plan, plan_from_hub
    from ..convert.pipeline import target_sizes
    from ..errors import ConversionError
    from ..hub import companion_files

    try:  # a target and padded sizes that contradict it: refused before anything is fetched
        target_sizes(args.target, args.padded_hidden_size, args.padded_intermediate_size)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None

    max_shard_size = _size(args.max_shard_size, "--max-shard-size")
    workers = _workers(args.workers)
    sizes = {"padded_hidden_size": args.padded_hidden_size, "padded_intermediate_size": args.padded_intermediate_size,
             "max_shard_size": max_shard_size, "target": args.target}
    try:
        source = _resolve(args.src, args.revision, before_shards=lambda fetch: _plan_or_refuse(
            args, plan_from_hub(fetch, args.out, overwrite=args.overwrite, **sizes)))
        options = {**sizes, "overwrite": args.overwrite, "provenance": source.provenance(),
                   "extra_files": companion_files(source.path), "gate_up_split": args.ct_gate_up_split}
        if args.dry_run:
            raise _PlanShown(plan(source.path, args.out, **options))
        # convert() makes the same plan first and refuses at once when it does not fit
        report = convert(source.path, args.out, progress=True, workers=workers, **options)
    except ConversionError as exc:  # a source or output we cannot use, or a write that failed
        raise usage_error(exc) from None
    except _PlanShown as shown:
        return print_result(shown.plan, args.json)
    return print_result(report, args.json)


def add_convert_command(commands: Any) -> None:
    """The ``convert`` command's parser, beside its handler."""
    convert = commands.add_parser(
        "convert", help="convert a GPT-OSS checkpoint (HF MXFP4, HF BF16 or compressed-tensors FP8) to normalized FP8 "
                        "(needs torch)",
        description="Convert the HF set of openai/gpt-oss-120b or -20b (MXFP4), an HF BF16 GPT-OSS checkpoint "
                    "or an llm-compressor FP8_DYNAMIC (compressed-tensors) one into the normalized FP8 format, "
                    "streaming one expert at a time. MXFP4 and FP8 values stay exact wherever Neuron's "
                    "E4M3 can hold them (the report counts the rest); a NaN or inf anywhere in SRC is refused.\n\n"
                    "From a Hub repo id only config, index, the listed shards, tokenizer and generation config are "
                    "fetched (never original/ or metal/), through huggingface_hub's cache (HF_HOME, HF_HUB_OFFLINE, "
                    "HF_TOKEN apply); they are copied into OUT with the commit recorded.\n\n"
                    "Every run is planned first and refused when OUT's filesystem (or the Hub cache) lacks the "
                    "space. The output appears only when complete; an existing OUT directory (e.g. a mount point) "
                    "is written inside; --overwrite replaces only an earlier output of this converter, recognized "
                    "by its content (anything else is refused, exit 2). Ctrl-C, SIGTERM, SIGHUP and a disk that "
                    "fills remove the partial output. SRC is never modified.",
        examples=CONVERT_EXAMPLES,
    )
    convert.add_argument("src", metavar="SRC", help="the HF checkpoint directory (config.json + model.safetensors.index.json), "
                                                    "or a Hub repo id such as openai/gpt-oss-120b (an existing local path wins)")
    convert.add_argument("out", metavar="OUT", help="output directory (must be empty or absent)")
    convert.add_argument("--revision", metavar="R", help="Hub branch, tag or commit of a repo-id SRC (default main)")
    _add_output_options(convert, max_shard_size="5GB")
    _add_split_option(convert)
    _add_target_option(convert)
    convert.add_argument("--dry-run", action="store_true",
                         help="print the plan and stop: the files read (for a Hub id, only those fetched, with their "
                              "sizes from the cache or the Hub's metadata), the shards written and their bytes, the "
                              "free space where they go and the expected peak memory; every real run makes the same "
                              "plan first and refuses at once (exit 2) when it does not fit; a dry run that does not fit exits 1. "
                              "The free space is compared with what the files occupy on disk (whole blocks, plus two "
                              "for the directories): an output that exactly fills the filesystem fits. An OUT that "
                              "cannot be written (read-only filesystem, no permission) or must not be replaced is "
                              "refused in one line (exit 2) by a dry run exactly as by a real run")
    _add_workers_option(convert, "encoded")
    convert.add_argument("--json", action="store_true", help="print the conversion report (or the plan, or the error) as JSON")
    convert.set_defaults(handler=_cmd_convert, interrupted=PARTIAL_OUTPUT_REMOVED)


def _add_target_option(command: argparse.ArgumentParser) -> None:
    """``--target NAME``: a named geometry, a preset over the padded sizes (``format.TARGETS``)."""
    from ..padding import TARGETS

    described = "; ".join(f"{t.name}: padded sizes {t.padded_hidden_size}/{t.padded_intermediate_size}, {t.purpose} "
                          f"({t.status})" for t in TARGETS.values())
    command.add_argument("--target", choices=tuple(TARGETS), default=None,
                         help=f"convert for a named geometry and record it in the index (metadata.target), which "
                              f"inspect and validate name. {described}. --padded-hidden-size/--padded-intermediate-size "
                              "may be given too only with the target's values (others are refused)")
