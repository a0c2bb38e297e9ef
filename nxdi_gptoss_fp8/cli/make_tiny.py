"""``make-tiny``: a tiny valid normalized checkpoint, or a tiny synthetic source to convert."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import format as fmt
from ..errors import NxdiGptossFp8Error
from ..validate.pipeline import preflight
from ._errors import PARTIAL_OUTPUT_REMOVED, UsageError, usage_error
from ._help import Example
from ._options import _add_output_options, _needs, _size
from ._output import EXIT_FINDINGS, EXIT_OK

__all__ = ["MAKE_TINY_EXAMPLES", "add_make_tiny_command"]


MAKE_TINY_EXAMPLES = (
    Example("a tiny valid checkpoint (custom profile: validate it with --allow-custom-model)",
            "nxdi-gptoss-fp8 make-tiny tiny-fp8 && nxdi-gptoss-fp8 validate tiny-fp8 --allow-custom-model"),
    Example("a tiny HF MXFP4 source, then the conversion path on it",
            "nxdi-gptoss-fp8 make-tiny tiny-src --hf-mxfp4 && nxdi-gptoss-fp8 convert tiny-src tiny-src-fp8"),
    Example("a tiny compressed-tensors FP8 (llm-compressor FP8_DYNAMIC) source",
            "nxdi-gptoss-fp8 make-tiny tiny-ct --ct-fp8"),
    Example("other dimensions, padded, written again over an earlier tiny checkpoint",
            "nxdi-gptoss-fp8 make-tiny tiny-fp8 --layers 4 --experts 8 --padded-hidden-size 96 --overwrite"),
)


def _dims(args: argparse.Namespace, defaults: fmt.ModelDims) -> fmt.ModelDims:
    return fmt.ModelDims(**{
        field: getattr(args, field) if getattr(args, field) is not None else getattr(defaults, field)
        for field in fmt.ModelDims.__dataclass_fields__
    })


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    if args.hf is not None:
        return _make_tiny_source(args)
    from ..output_target.rule import output_target
    from ..synthetic.tiny_stdlib import TINY_DIMS, check_seed, tiny_layout

    dims = _dims(args, TINY_DIMS)
    max_shard_size = _size(args.max_shard_size)
    try:  # every argument and OUT (the overwrite rule) checked before torch is imported or anything is written
        tiny_layout(dims, args.padded_hidden_size, args.padded_intermediate_size)
        check_seed(args.seed)
        output_target(args.out, overwrite=args.overwrite)
    except (ValueError, NxdiGptossFp8Error) as exc:
        raise UsageError(str(exc)) from None
    _needs("", "torch")
    from ..synthetic.tiny import make_tiny

    try:
        out = make_tiny(
            args.out, dims=dims, padded_hidden_size=args.padded_hidden_size,
            padded_intermediate_size=args.padded_intermediate_size,
            max_shard_size=max_shard_size, seed=args.seed, overwrite=args.overwrite,
        )
    except NxdiGptossFp8Error as exc:  # OUT changed meanwhile, or the disk filled: one line, exit 2
        raise usage_error(exc) from None
    custom = fmt.profile_for_dims(dims) == fmt.PROFILE_CUSTOM
    report = preflight(out, allow_custom_model=custom)
    print(f"wrote {out}")
    print(report.render_text())
    if custom and report.ok:
        print(f"a custom profile: valid with the opt-in only (--allow-custom-model, or {fmt.ALLOW_CUSTOM_ENV}=1 "
              "for loading with NxDI); without it every command refuses it by design")
    flag = " --allow-custom-model" if custom else ""
    print(f"next: nxdi-gptoss-fp8 validate {out}{flag}   or   nxdi-gptoss-fp8 inspect {out}{flag}")
    return EXIT_OK if report.ok else EXIT_FINDINGS


def add_make_tiny_command(commands: Any) -> None:
    """The ``make-tiny`` command's parser, beside its handler."""
    tiny = commands.add_parser(
        "make-tiny", help="write a valid tiny custom-profile checkpoint, or a tiny HF source for convert (needs torch)",
        description="Write a tiny, valid normalized checkpoint with random values, for tests and demos. "
                    "Dimensions default to a 2-layer, 4-expert, 64-wide model; a custom profile like that is "
                    "valid with --allow-custom-model (or NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL=1) only. With "
                    "--hf-mxfp4, --hf-bf16 or --ct-fp8, write a tiny synthetic source instead (2 layers, 3 experts, "
                    "H 64, I 96), to try convert and verify-conversion without downloading a published checkpoint."
                    "\n\n"
                    "The arguments are checked first, by the format's rules (each size 1 … 2^31, experts per "
                    "token at most the experts, query heads a multiple of key/value heads, MXFP4 sizes whole "
                    "32-blocks, at most 10,000 tensors and 256 MB, counted on what is written: the source for "
                    "--hf-mxfp4/--hf-bf16/--ct-fp8); OUT must be empty or absent (exit 2). --overwrite replaces only "
                    "an earlier output of the same kind, recognized by its content (a normalized checkpoint, or a "
                    "source of the same kind); a directory holding anything else, or the current directory, is "
                    "refused (exit 2), never emptied.",
        examples=MAKE_TINY_EXAMPLES,
    )
    source_kind = tiny.add_mutually_exclusive_group()
    source_kind.add_argument("--hf-mxfp4", dest="hf", action="store_const", const="mxfp4",
                             help="write an HF MXFP4 source (like openai/gpt-oss-*) instead")
    source_kind.add_argument("--hf-bf16", dest="hf", action="store_const", const="bf16",
                             help="write an HF BF16 source (dense experts) instead")
    source_kind.add_argument("--ct-fp8", dest="hf", action="store_const", const="ct-fp8",
                             help="write a compressed-tensors FP8 source (llm-compressor FP8_DYNAMIC, per-expert "
                                  "linear layers, even/odd gate/up split) instead")
    tiny.add_argument("out", metavar="OUT", help="output directory (must be empty or absent, or an earlier output of the same kind "
                                  "with --overwrite)")
    for field, flag, meaning in (
        ("num_hidden_layers", "--layers", "decoder layers"),
        ("num_local_experts", "--experts", "experts per layer"),
        ("hidden_size", "--hidden-size", "hidden size H"),
        ("intermediate_size", "--intermediate-size", "expert intermediate size I"),
        ("head_dim", "--head-dim", "attention head dim"),
        ("num_attention_heads", "--heads", "query heads"),
        ("num_key_value_heads", "--kv-heads", "key/value heads"),
        ("vocab_size", "--vocab-size", "vocabulary size"),
        ("num_experts_per_tok", "--experts-per-token", "experts per token"),
        ("sliding_window", "--sliding-window", "sliding window"),
    ):
        tiny.add_argument(flag, dest=field, type=int, metavar="N", help=meaning)
    _add_output_options(tiny, max_shard_size="64KB", why=", so even a tiny model has several")
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.set_defaults(handler=_cmd_make_tiny, interrupted=PARTIAL_OUTPUT_REMOVED)


_SOURCE_KINDS = {"mxfp4": "HF MXFP4", "bf16": "HF BF16", "ct-fp8": "compressed-tensors FP8 (llm-compressor FP8_DYNAMIC)"}
_SOURCE_RECOGNIZED = {"mxfp4": "hf-mxfp4", "bf16": "hf-bf16", "ct-fp8": "compressed-tensors-fp8"}  # recognize's kinds


def _make_tiny_source(args: argparse.Namespace) -> int:
    """``make-tiny --hf-mxfp4`` / ``--hf-bf16`` / ``--ct-fp8``: a tiny synthetic source to try
    ``convert`` on, checked first and written whole (``output_target.staged_output``: the overwrite rule)."""
    option = f"--{'ct-fp8' if args.hf == 'ct-fp8' else 'hf-' + args.hf}"
    if args.padded_hidden_size is not None or args.padded_intermediate_size is not None:
        raise UsageError("a source is never padded: pass --padded-hidden-size/--padded-intermediate-size to convert")
    from ..output_target.rule import output_target
    from ..synthetic.tiny_stdlib import SOURCE_DIMS, check_seed, dims_problems

    dims = _dims(args, SOURCE_DIMS)
    kind = _SOURCE_RECOGNIZED[args.hf]
    try:  # every argument and OUT (the overwrite rule) checked before torch is imported or anything is written
        problems = dims_problems(dims, block=32 if args.hf == "mxfp4" else None)  # 32: the MXFP4 block
        if problems:
            raise ValueError("; ".join(problems))
        check_seed(args.seed)
        output_target(args.out, overwrite=args.overwrite, kind=kind)
    except (ValueError, NxdiGptossFp8Error) as exc:
        raise UsageError(str(exc)) from None
    _needs(option, "torch", "safetensors")
    from ..synthetic.sources import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, make_source

    out = os.path.abspath(args.out)
    source_kind = {"mxfp4": SOURCE_MXFP4, "bf16": SOURCE_BF16, "ct-fp8": SOURCE_COMPRESSED_TENSORS}[args.hf]
    try:  # the size cap on the source itself; written whole, into place only when complete
        make_source(out, source_kind, dims=dims, seed=args.seed, original=False, overwrite=args.overwrite)
    except (ValueError, NxdiGptossFp8Error) as exc:
        raise usage_error(exc) from None
    print(f"wrote a tiny synthetic {_SOURCE_KINDS[args.hf]} GPT-OSS source to {out} (random values, the published "
          "repos' layout)")
    print(f"try: nxdi-gptoss-fp8 convert {out} {out}-fp8 && nxdi-gptoss-fp8 verify-conversion {out}-fp8 --source {out}")
    return EXIT_OK
