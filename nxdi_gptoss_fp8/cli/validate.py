"""``validate``: the fail-closed preflight of a checkpoint, or of a compiled directory's pre-sharded weights."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import format as fmt
from ..units import printable
from ..validate.verdict import checkpoint_verdict
from ._errors import UsageError
from ._help import Example
from ._options import _allow_custom, _checkpoint_dir, _checkpoint_source, _hub_spec, _load_neuron_config, _needs
from ._output import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, print_result

__all__ = ["MAX_RANK", "TEXT_FINDINGS_LIMIT", "VALIDATE_EXAMPLES", "add_validate_command"]


TEXT_FINDINGS_LIMIT = 50
VALIDATE_EXAMPLES = (
    Example("check a converted checkpoint before loading it (headers and scales; any host, no Neuron SDK)",
            "nxdi-gptoss-fp8 validate /data/models/gpt-oss-120b-fp8"),
    Example("also check that NxDI will run it with the NeuronConfig you will load it with",
            "nxdi-gptoss-fp8 validate /data/models/gpt-oss-120b-fp8 --neuron-config neuron_config.json"),
    Example("after a copy: hash every shard against the index and read every FP8 and BF16 value",
            "nxdi-gptoss-fp8 validate /data/models/gpt-oss-120b-fp8 --verify-checksums --deep"),
    Example("every finding, as JSON for a script",
            "nxdi-gptoss-fp8 validate /data/models/gpt-oss-120b-fp8 --json"),
    Example("a compiled NxDI model: the pre-sharded weights of the ranks this host loads",
            "nxdi-gptoss-fp8 validate /data/neuron-compiled/gpt-oss-120b-fp8-tp64 --ranks 0-31"),
    Example("a checkpoint on the Hugging Face Hub, before downloading it (config, index, headers and scales over "
            "HTTP ranges; --verify-checksums compares the index's digests with the Hub's LFS records)",
            "nxdi-gptoss-fp8 validate my-org/gpt-oss-120b-fp8 --verify-checksums"),
    Example("a tiny custom-profile checkpoint written by make-tiny",
            "nxdi-gptoss-fp8 validate tiny-fp8 --allow-custom-model"),
)


def _cmd_validate(args: argparse.Namespace) -> int:
    if _hub_spec(args.path):
        if args.deep:
            raise UsageError(f"--deep reads every weight byte, which a Hub repo does not give without a download: "
                             f"download {args.path} (hf download REPO_ID --local-dir DIR), then validate DIR --deep")
        if args.ranks is not None:
            raise UsageError(f"--ranks applies to a compiled NxDI model directory's pre-sharded weights; {args.path} "
                             "is a Hub repo id")
    target = _checkpoint_source(args.path, args.revision, "validate")
    if isinstance(target, str):
        _checkpoint_dir(args.path)
        from ..recognize import compiled_model_dir

        compiled = compiled_model_dir(args.path)
        if compiled is not None:
            return _validate_compiled(args, compiled)
    if args.ranks is not None:
        raise UsageError(f"--ranks applies to a compiled NxDI model directory's pre-sharded weights; {args.path} is not one")
    if args.deep:
        _needs("--deep", "numpy")
    neuron_config = _load_neuron_config(args.neuron_config)
    # another kind of checkpoint (HF, compressed-tensors, legacy), or pre-sharded weights copied
    # without their compiled directory: the report's hint, inspect's one-line verdict and action,
    # first (the one verdict doctor gives for a vllm serve command too)
    verdict = checkpoint_verdict(
        target,
        neuron_config=neuron_config,
        allow_custom_model=_allow_custom(args),
        read_scales=not args.headers_only,
        deep=args.deep,
        verify_checksums=args.verify_checksums,
        served=True,  # the start plan's rule: the NeuronConfig's quantized_checkpoints_path must be DIR
    )
    report = verdict.report
    code = EXIT_FINDINGS if not report.clean else EXIT_OK if report.complete else EXIT_PARTIAL
    if args.json:
        return print_result(report, True, exit_code=code)
    text = report.render_text(limit=None, summarize=False) if args.all else report.render_text(limit=TEXT_FINDINGS_LIMIT)
    return print_result(report, False, text=f"{printable(report.hint)}\n{text}" if report.hint else text, exit_code=code)


def add_validate_command(commands: Any) -> None:
    """The ``validate`` command's parser, beside its handler."""
    validate = commands.add_parser(
        "validate", help="check a checkpoint directory against the format (fail-closed preflight)",
        description=(
            "Run the preflight: config, index, every shard header, ownership, collisions, the "
            "exact namespace, dtypes and shapes, scale sidecars and scale values. Reads headers "
            "and scales only. Every finding is listed with its file, key and the fix."
        ),
        examples=VALIDATE_EXAMPLES,
    )
    validate.add_argument("path", metavar="DIR", help="the checkpoint directory (holds model.safetensors.index.json), a "
                                       "Hub repo id (REPO_ID or REPO_ID@REVISION: judged over HTTP without downloading "
                                       "its weights; a local directory of that name wins), or a compiled "
                                       "NxDI model directory: its pre-sharded weights/ are checked against their "
                                       "manifest, its neuron_config.json (NxDI's own file, Infinity included), the "
                                       "checkpoint that config names (its fingerprint must be the one the shards "
                                       "were written from) and, when present, the source checkpoint")
    validate.add_argument("--json", action="store_true", help="print the report as JSON (ok, summary, findings)")
    validate.add_argument("--revision", metavar="REV",
                          help="a Hub repo id only: the branch, tag or commit to judge (default main); resolved to "
                               "its commit once, and every read is pinned to it")
    validate.add_argument("--all", action="store_true",
                          help=f"list every finding, one line each (text output otherwise summarizes repeated "
                               f"findings and shows at most {TEXT_FINDINGS_LIMIT} lines)")
    validate.add_argument("--neuron-config", metavar="FILE.json",
                          help="NxDI NeuronConfig attributes as JSON (flat, nested under \"neuron_config\" as NxDI "
                               "saves it, or vLLM's --additional-config object {\"override_neuron_config\": {...}}, "
                               "read over vLLM's default settings as vllm-neuron does): also check that NxDI will run "
                               "this checkpoint as configured")
    validate.add_argument("--allow-custom-model", action="store_true",
                          help=f"accept model_profile 'custom' (tiny test models); also {fmt.ALLOW_CUSTOM_ENV}=1")
    reads = validate.add_mutually_exclusive_group()  # a deep scan reads the tensor data headers-only skips
    reads.add_argument("--headers-only", action="store_true",
                       help="read no tensor data at all: skip the scale-value check. A partial verdict, never "
                            "VALID: PARTIAL and exit 3 when what was checked is clean (JSON: ok false, "
                            "complete false, not_checked)")
    reads.add_argument("--deep", action="store_true",
                       help="also read every FP8 expert byte once: values beyond ±240 or NaN, non-zero "
                            "padding, all-zero experts; and every BF16 tensor for ±inf and NaN (reads the whole "
                            "checkpoint; progress on a terminal; not on a Hub repo id: download it first)")
    validate.add_argument("--verify-checksums", action="store_true",
                          help="hash every shard (in parallel) against the index's shard_sha256; "
                               "a checkpoint without digests then fails (a Hub repo id: the digests against the "
                               "Hub's LFS SHA-256 records, no shard byte read; a compiled directory: every rank "
                               "file against its manifest)")
    validate.add_argument("--ranks", type=_rank_list, metavar="RANKS",
                          help="a compiled directory only: check only these ranks' pre-sharded weights (e.g. 0-31, or "
                               "0,2,4-7) — what a host of a multi-host deployment holds and loads (its start_rank_id … "
                               "+ local_ranks_size, the ranks the load checks); default every rank")
    validate.set_defaults(handler=_cmd_validate)


def _validate_compiled(args: argparse.Namespace, compiled: str) -> int:
    """``validate COMPILED``: its pre-sharded weights (the ranks ``--ranks`` names, else every
    rank) against their manifest, its ``neuron_config.json`` (or ``--neuron-config``), the
    checkpoint that config names and the source checkpoint when it is here — the verdict the
    load and ``inspect`` reach (``validate.presharded.compiled_verdict``)."""
    from ..recognize import NEURON_CONFIG_FILE
    from ..validate.presharded import NoShardedWeights, compiled_verdict, loader_source

    if args.deep or args.headers_only:
        raise UsageError(f"{compiled} is a compiled NxDI model directory: --deep and --headers-only apply to "
                         "checkpoints (validate the checkpoint it was compiled from)")
    try:
        config = _load_neuron_config(args.neuron_config or os.path.join(compiled, NEURON_CONFIG_FILE))
    except UsageError as exc:
        raise UsageError(str(exc) if args.neuron_config else str(exc).replace("--neuron-config ", "").replace(
            "--neuron-config: ", "")) from None
    assert config is not None
    check = compiled_verdict(compiled, config, ranks=args.ranks, verify=args.verify_checksums, progress=None)
    if check is None:
        return print_result(NoShardedWeights(compiled, loader_source(config) or "the checkpoint it was compiled from"),
                            args.json)
    return print_result(check, args.json, text=None if args.json else check.render_text(
        limit=None if args.all else TEXT_FINDINGS_LIMIT))


MAX_RANK = 1 << 16  # the manifest's bound on ranks


def _rank_list(text: str) -> list[int]:
    """``--ranks``: ranks and inclusive ranges, comma-separated (``0-31``, ``32-63``, ``0,2,4-7``)."""
    ranks: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            start, stop = int(low), int(high if sep else low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{printable(part.strip())[:40]!r} is not a rank or a range START-END "
                                             "(e.g. --ranks 0-31 or --ranks 0,2,4-7)") from None
        if not 0 <= start <= stop < MAX_RANK:
            raise argparse.ArgumentTypeError(f"{start}-{stop} is not a range of ranks in 0 … {MAX_RANK - 1} (START ≤ END)")
        ranks.update(range(start, stop + 1))
    return sorted(ranks)
