"""The ``goldens`` command: the file NxDI's ``--expected-outputs-path`` reads, computed on a CPU host.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import format as fmt
from ._errors import UsageError
from ._help import Example
from ._options import _allow_custom, _checkpoint_dir, _needs
from ._output import print_result

__all__ = ["GOLDENS_EXAMPLES", "add_goldens_command"]


GOLDENS_EXAMPLES = (
    Example("the numbers the device holds: a reference dequantized from the checkpoint itself",
            "nxdi-gptoss-fp8 goldens /data/models/gpt-oss-120b-fp8 --reference dequantized "
            "--prompt 'I believe the meaning of life is' --num-tokens 64 --output /data/goldens/dequantized.pt"),
    Example("quantization and device together: the HF source it was converted from (its fingerprint is checked)",
            "nxdi-gptoss-fp8 goldens /data/models/gpt-oss-120b-fp8 --reference /data/models/gpt-oss-120b "
            "--prompt 'I believe the meaning of life is' --num-tokens 64 --output /data/goldens/source.pt"),
    Example("a float32 reference, the tokenizer from elsewhere, the report as JSON",
            "nxdi-gptoss-fp8 goldens /data/models/gpt-oss-20b-fp8 --reference dequantized --prompt 'Hello' "
            "--num-tokens 16 --output goldens.pt --dtype float32 --tokenizer /data/models/gpt-oss-20b --json"),
)


def _cmd_goldens(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.path)
    if args.reference.strip().lower() != fmt.REFERENCE_DEQUANTIZED:
        _checkpoint_dir(args.reference, f"--reference: {fmt.REFERENCE_DEQUANTIZED}, or the HF checkpoint directory it was converted from")
    if args.tokenizer is not None:
        _checkpoint_dir(args.tokenizer, "--tokenizer, a directory holding tokenizer.json / tokenizer_config.json")
    if args.num_tokens < 1 or args.batch_size < 1:
        raise UsageError(f"--num-tokens and --batch-size must be at least 1, not {args.num_tokens} and {args.batch_size}")
    _needs("goldens", "torch", "transformers")
    from ..errors import ConversionError, CpuModelError
    from ..forward.goldens import check_output, make_goldens

    try:  # an output path that cannot be written is a path error (exit 2), not a refused checkpoint
        check_output(args.output)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None

    reference = fmt.REFERENCE_DEQUANTIZED if args.reference.strip().lower() == fmt.REFERENCE_DEQUANTIZED else args.reference
    try:
        report = make_goldens(
            args.path, reference, prompt=args.prompt, num_tokens=args.num_tokens, output=args.output,
            tokenizer=args.tokenizer, dtype=args.dtype, batch_size=args.batch_size,
            allow_custom_model=_allow_custom(args), progress=None,
            say=lambda line: print(f"nxdi-gptoss-fp8 goldens: {line}", file=sys.stderr, flush=True))
    except CpuModelError as exc:  # the host cannot hold the reference: an environment problem (exit 2)
        raise UsageError(str(exc)) from None
    return print_result(report, args.json)


def add_goldens_command(commands: Any) -> None:
    """The ``goldens`` command's parser, beside its handler."""
    goldens = commands.add_parser(
        "goldens", help="write the expected outputs NxDI's accuracy check reads (--expected-outputs-path), on any CPU host",
        description="Build transformers' GptOssForCausalLM from CKPT dequantized (--reference dequantized: the numbers "
                    "the device holds) or from the HF source CKPT was converted from (--reference SRC, checked against "
                    "the source fingerprint CKPT's index records), generate --num-tokens tokens greedily from --prompt, "
                    "and write FILE: what inference_demo's --expected-outputs-path reads for token matching and logit "
                    "matching. Needs torch and transformers, not NxDI. States the memory it needs first and refuses a "
                    "host without it (exit 2); exit 1 on a refused checkpoint or source. See docs/accuracy.md.",
        examples=GOLDENS_EXAMPLES,
    )
    goldens.add_argument("path", metavar="CKPT", help="the normalized checkpoint directory")
    goldens.add_argument("--reference", required=True, metavar="dequantized|SRC",
                         help="'dequantized', or the HF checkpoint directory (MXFP4 or BF16) CKPT was converted from")
    goldens.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt the accuracy check will be run with")
    goldens.add_argument("--num-tokens", required=True, type=int, metavar="N", help="tokens to generate (pass the same "
                         "--num-tokens-to-check to inference_demo)")
    goldens.add_argument("--output", required=True, metavar="FILE", help="the file to write (replaced atomically)")
    goldens.add_argument("--tokenizer", metavar="DIR", help="where the tokenizer is (default: CKPT)")
    goldens.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                         help="the reference's dtype (default bfloat16: about twice the FP8 bytes; float32 twice that)")
    goldens.add_argument("--batch-size", type=int, default=1, metavar="B", help="the NeuronConfig's batch_size (default 1)")
    goldens.add_argument("--allow-custom-model", action="store_true",
                         help=f"accept model_profile 'custom' (tiny test models); also {fmt.ALLOW_CUSTOM_ENV}=1")
    goldens.add_argument("--json", action="store_true", help="print the report as JSON")
    goldens.set_defaults(handler=_cmd_goldens, interrupted="FILE was not written")
