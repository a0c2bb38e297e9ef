"""``nxdi-gptoss-fp8``: validate, inspect, make and convert normalized FP8 GPT-OSS checkpoints.

A thin face over the library: each command parses its arguments, calls one library function
and renders the result. Data goes to stdout, messages to stderr. Exit codes: 0 success /
valid, 1 findings or a failed check, 2 usage error, unreadable input or a missing optional
dependency (torch, numpy, NxDI). Known errors print one line; set NXDI_GPTOSS_FP8_DEBUG=1 for
tracebacks. A closed stdout (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from . import format as fmt
from .checks import allow_custom_from_env, preflight
from .deps import OPTIONAL, missing, require
from .errors import MissingDependencyError, NxdiGptossFp8Error

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE
TEXT_FINDINGS_LIMIT = 50


class UsageError(Exception):
    """A command-line input that cannot be used (exit 2)."""


def _checkpoint_dir(path: str, what: str = "the checkpoint directory") -> str:
    """``path`` if it is a directory we can list; else a usage error (exit 2) saying why."""
    if not os.path.exists(path):
        raise UsageError(f"{path} does not exist: pass {what}")
    if not os.path.isdir(path):
        raise UsageError(f"{path} is a file, not a directory: pass {what} (the one holding {fmt.INDEX_FILE})")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"{path} cannot be listed (permissions): run as a user who can read it")
    return path


def _needs(purpose: str, *modules: str) -> None:
    """Fail at once, in one line, when a module is missing that the command (or its option
    ``purpose``, e.g. "--deep") needs (exit 2)."""
    for module in modules:
        require(module, purpose)


def _load_neuron_config(path: str | None) -> dict[str, Any] | None:
    """The ``--neuron-config`` JSON, read like every checkpoint JSON: regular file, strict, bounded."""
    if path is None:
        return None
    from .checks import MAX_JSON_FILE_SIZE
    from .errors import NotRegularFileError
    from .files import open_regular
    from .strict_json import JsonError, parse_json_strict

    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_JSON_FILE_SIZE + 1)
        document = parse_json_strict(raw.decode("utf-8"), what=f"--neuron-config {path}", max_bytes=MAX_JSON_FILE_SIZE)
    except NotRegularFileError as exc:
        raise UsageError(f"--neuron-config: {exc}; pass a JSON file") from None
    except OSError as exc:
        raise UsageError(f"cannot read --neuron-config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--neuron-config {path} is not UTF-8 text") from None
    except JsonError as exc:
        raise UsageError(f"--neuron-config {path}: {exc}") from None
    if not isinstance(document, dict):
        raise UsageError(f"--neuron-config {path} must hold a JSON object of NeuronConfig attributes")
    return document


def _cmd_validate(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.path)
    if args.deep:
        _needs("--deep", "numpy")
    neuron_config = _load_neuron_config(args.neuron_config)
    report = preflight(
        args.path,
        neuron_config=neuron_config,
        allow_custom_model=args.allow_custom_model or allow_custom_from_env(),
        read_scales=not args.headers_only,
        deep=args.deep,
        verify_checksums=args.verify_checksums,
    )
    if args.json:
        print(report.to_json())
    else:
        print(report.render_text(limit=None, summarize=False) if args.all else report.render_text(limit=TEXT_FINDINGS_LIMIT))
    if not report.clean:
        return EXIT_FINDINGS
    return EXIT_OK if report.complete else EXIT_PARTIAL


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .recognize import NOT_A_DIRECTORY
    from .summary import inspect_directory

    inspection = inspect_directory(args.path, allow_custom_model=args.allow_custom_model or allow_custom_from_env())
    if inspection.recognition.kind == NOT_A_DIRECTORY and not args.json:
        raise UsageError("; ".join(inspection.recognition.evidence))
    if args.json:
        print(json.dumps(inspection.to_dict(), indent=2))
    else:
        print(inspection.render_text())
    if inspection.recognition.kind == NOT_A_DIRECTORY:
        return EXIT_USAGE
    return EXIT_OK if inspection.ok else EXIT_FINDINGS


def _dims(args: argparse.Namespace, defaults: fmt.ModelDims) -> fmt.ModelDims:
    return fmt.ModelDims(**{
        field: getattr(args, field) if getattr(args, field) is not None else getattr(defaults, field)
        for field in fmt.ModelDims.__dataclass_fields__
    })


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    if args.hf is not None:
        return _make_tiny_source(args)
    _needs("", "torch")
    from .tiny import TINY_DIMS, make_tiny

    dims = _dims(args, TINY_DIMS)
    try:
        out = make_tiny(
            args.out, dims=dims, padded_hidden_size=args.padded_hidden_size,
            padded_intermediate_size=args.padded_intermediate_size,
            max_shard_size=_size(args.max_shard_size), seed=args.seed, overwrite=args.overwrite,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    report = preflight(out, allow_custom_model=True)
    print(f"wrote {out}")
    print(report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _make_tiny_source(args: argparse.Namespace) -> int:
    """``make-tiny --hf-mxfp4`` / ``--hf-bf16``: a tiny synthetic HF source to try ``convert`` on."""
    _needs(f"--hf-{args.hf}", "torch", "safetensors")
    from .synthetic import SOURCE_BF16, SOURCE_DIMS, SOURCE_MXFP4, make_source
    from .writer import prepare_output

    if args.padded_hidden_size is not None or args.padded_intermediate_size is not None:
        raise UsageError("an HF source is never padded: pass --padded-hidden-size/--padded-intermediate-size to convert")
    try:
        prepare_output(os.path.abspath(args.out), overwrite=args.overwrite)
    except NxdiGptossFp8Error as exc:
        raise UsageError(str(exc)) from None
    if args.overwrite and os.path.isdir(args.out):
        import shutil

        shutil.rmtree(args.out)
    source_kind = SOURCE_MXFP4 if args.hf == "mxfp4" else SOURCE_BF16
    out = make_source(args.out, source_kind, dims=_dims(args, SOURCE_DIMS), seed=args.seed, original=False)
    kind = "MXFP4" if args.hf == "mxfp4" else "BF16"
    print(f"wrote a tiny synthetic HF {kind} GPT-OSS source to {out} (random values, the published repos' layout)")
    print(f"try: nxdi-gptoss-fp8 convert {out} {out}-fp8 && nxdi-gptoss-fp8 verify-conversion {out}-fp8 --source {out}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return EXIT_OK if run_demo() else EXIT_FINDINGS


def _cmd_inference_demo(args: argparse.Namespace) -> int:
    from . import nxdi_hook

    if not nxdi_hook.nxdi_available():
        raise UsageError("NxDI (neuronx-distributed-inference) is not installed here: run this on a Neuron host "
                         "with NxDI installed; it registers the hook, then runs NxDI's inference_demo")
    return nxdi_hook.run_inference_demo(args.nxdi_args)


def _resolve(spec: str, revision: str | None, *, recorded_in: str | None = None) -> Any:
    """A local directory or a Hub repo id (``hub.resolve_source``); says on stderr which was used."""
    from .errors import ConversionError
    from .hub import is_repo_id, recorded_revision, resolve_source

    ambiguous = is_repo_id(spec)
    if revision is None and recorded_in is not None and ambiguous and not os.path.lexists(spec):
        revision = recorded_revision(recorded_in, spec)  # the commit the output was converted from
    try:
        resolved = resolve_source(spec, revision=revision)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    if ambiguous or resolved.from_hub:
        print(f"source {resolved.describe()}", file=sys.stderr)
    return resolved


def _cmd_convert(args: argparse.Namespace) -> int:
    _needs("", "torch", "safetensors")
    from .convert import convert
    from .errors import ConversionError
    from .hub import companion_files

    max_shard_size = _size(args.max_shard_size)
    workers = _workers(args.workers)
    source = _resolve(args.src, args.revision)
    try:
        report = convert(
            source.path, args.out, padded_hidden_size=args.padded_hidden_size,
            padded_intermediate_size=args.padded_intermediate_size, max_shard_size=max_shard_size,
            overwrite=args.overwrite, progress=True, provenance=source.provenance(),
            extra_files=companion_files(source.path), gate_up_split=args.ct_gate_up_split, workers=workers,
        )
    except ConversionError as exc:  # a source or output we cannot use: unreadable input
        raise UsageError(str(exc)) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK


def _cmd_verify_conversion(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.out, "OUT, the converted checkpoint directory")
    _needs("", "torch", "safetensors")
    from .errors import ConversionError
    from .verify import verify_conversion

    workers = _workers(args.workers)
    source = _resolve(args.source, args.revision, recorded_in=args.out)
    try:
        report = verify_conversion(args.out, source.path, progress=True, gate_up_split=args.ct_gate_up_split,
                                   workers=workers)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from .errors import CpuModelError
    from .selfcheck import selfcheck, to_json

    if args.tp < 1:
        raise UsageError(f"--tp must be at least 1, not {args.tp}")
    os.environ.setdefault("NXD_LOG_LEVEL", "warning")  # NxD's per-rank INFO lines would bury the report
    try:
        report = selfcheck(tp=args.tp)
    except CpuModelError as exc:  # NxDI missing or its run failed: the check cannot run
        raise UsageError(str(exc)) from None
    print(to_json(report) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _cmd_check_forward(args: argparse.Namespace) -> int:
    from .errors import ConversionError, CpuModelError
    from .forward_check import check_forward

    os.environ.setdefault("NXD_LOG_LEVEL", "warning")  # NxD's per-rank INFO lines would bury the report
    try:
        report = check_forward(
            args.path, args.source, layers=args.layers, tokens=args.tokens, steps=args.steps,
            neuron_config=_load_neuron_config(args.neuron_config),
            allow_custom_model=args.allow_custom_model,
        )
    except (CpuModelError, ConversionError, ValueError) as exc:  # cannot run, or unusable inputs
        raise UsageError(str(exc)) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _size(text: str) -> int:
    from .writer import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _workers(value: int | None) -> int | None:
    """``--workers`` checked (a usage error, exit 2, outside 1…MAX_WORKERS)."""
    from .convert.workers import check_workers

    try:
        return None if value is None else check_workers(value)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None


def _add_workers_option(command: argparse.ArgumentParser, what: str) -> None:
    """``--workers N`` of convert and verify-conversion (``convert.workers``)."""
    command.add_argument("--workers", type=int, metavar="N",
                         help=f"experts {what} at once: up to 3 as threads, from 4 on as N/2 worker processes "
                              "taking whole layers (default: the CPUs this process may use, after its affinity and "
                              "cgroup quota; one process for models under 1 GB); fewer, with a warning, when the "
                              "available memory cannot hold them. The result does not depend on N")


def _add_split_option(command: argparse.ArgumentParser) -> None:
    """compressed-tensors sources whose files cannot tell how gate_up was split."""
    command.add_argument("--ct-gate-up-split", choices=("interleaved", "halves"), default=None,
                         help="compressed-tensors FP8 sources only, when the converter asks: how llm-compressor "
                              "split gate_up_proj (halves: llm-compressor 0.12.0-0.13.0; interleaved: other versions)")


def _add_output_options(command: argparse.ArgumentParser, *, max_shard_size: str, why: str = "") -> None:
    """The options of every command that writes a normalized checkpoint."""
    command.add_argument("--padded-hidden-size", type=int, metavar="N", help="H' (H plus a multiple of 32)")
    command.add_argument("--padded-intermediate-size", type=int, metavar="N", help="I' (I plus a multiple of 32)")
    command.add_argument("--max-shard-size", default=max_shard_size, help=f"largest shard (default {max_shard_size}{why})")
    command.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nxdi-gptoss-fp8",
        description=(
            "Validate, inspect, make and convert normalized static-FP8 GPT-OSS checkpoints for "
            "AWS NeuronX Distributed Inference. Validation reads headers only and needs no "
            "Neuron SDK: run it on any host before you load."
        ),
        epilog=("Exit codes: 0 valid/success, 1 findings or failed check, 2 usage error or unreadable input, "
                "3 partial verdict (validate --headers-only: no errors in what was checked, not everything checked)."),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    validate = commands.add_parser(
        "validate", help="check a checkpoint directory against the format (fail-closed preflight)",
        description=(
            "Run the preflight: config, index, every shard header, ownership, collisions, the "
            "exact namespace, dtypes and shapes, scale sidecars and scale values. Reads headers "
            "and scales only. Every finding is listed with its file, key and the fix."
        ),
    )
    validate.add_argument("path", help="the checkpoint directory (holds model.safetensors.index.json)")
    validate.add_argument("--json", action="store_true", help="print the report as JSON (ok, summary, findings)")
    validate.add_argument("--all", action="store_true",
                          help=f"list every finding, one line each (text output otherwise summarizes repeated "
                               f"findings and shows at most {TEXT_FINDINGS_LIMIT} lines)")
    validate.add_argument("--neuron-config", metavar="FILE.json",
                          help="NxDI NeuronConfig attributes as JSON (flat, or nested under \"neuron_config\" "
                               "as NxDI saves it): also check that NxDI will run this checkpoint as configured")
    validate.add_argument("--allow-custom-model", action="store_true",
                          help=f"accept model_profile 'custom' (tiny test models); also {fmt.ALLOW_CUSTOM_ENV}=1")
    validate.add_argument("--headers-only", action="store_true",
                          help="read no tensor data at all: skip the scale-value check. A partial verdict, never "
                               "VALID: PARTIAL and exit 3 when what was checked is clean (JSON: ok false, "
                               "complete false, not_checked)")
    validate.add_argument("--deep", action="store_true",
                          help="also read every FP8 expert byte once: values beyond ±240 or NaN, non-zero "
                               "padding, all-zero experts (reads the whole checkpoint; progress on a terminal)")
    validate.add_argument("--verify-checksums", action="store_true",
                          help="hash every shard (in parallel) against the index's shard_sha256; "
                               "a checkpoint without digests then fails")
    validate.set_defaults(handler=_cmd_validate)

    inspect = commands.add_parser(
        "inspect", help="say which checkpoint any directory is and what to do with it; summarize a normalized one",
        description="Recognize any directory (HF MXFP4 or BF16, compressed-tensors FP8, NxDI legacy, normalized FP8, "
                    "NxDI pre-sharded weights, a compiled NxDI model) from its files and tensor names: the "
                    "CHECKPOINT_FORMAT value or the command that applies, and why. A normalized checkpoint also "
                    "gets its shards, tensors, bytes by dtype, profile, padding and preflight verdict (with the "
                    "first findings when invalid). Exit 0 recognized (and valid), 1 invalid or unrecognized, "
                    "2 not a directory.",
    )
    inspect.add_argument("path", help="any directory")
    inspect.add_argument("--json", action="store_true", help="print the recognition and summary as JSON")
    inspect.add_argument("--allow-custom-model", action="store_true",
                         help=f"accept model_profile 'custom' as validate does; also {fmt.ALLOW_CUSTOM_ENV}=1")
    inspect.set_defaults(handler=_cmd_inspect)

    tiny = commands.add_parser(
        "make-tiny", help="write a valid tiny custom-profile checkpoint, or a tiny HF source for convert (needs torch)",
        description="Write a tiny, valid normalized checkpoint with random values, for tests and demos. "
                    "Dimensions default to a 2-layer, 4-expert, 64-wide model. With --hf-mxfp4 or --hf-bf16, "
                    "write a tiny synthetic HF GPT-OSS source instead (2 layers, 3 experts, H 64, I 96), to try "
                    "convert and verify-conversion without downloading a published checkpoint.",
    )
    source_kind = tiny.add_mutually_exclusive_group()
    source_kind.add_argument("--hf-mxfp4", dest="hf", action="store_const", const="mxfp4",
                             help="write an HF MXFP4 source (like openai/gpt-oss-*) instead")
    source_kind.add_argument("--hf-bf16", dest="hf", action="store_const", const="bf16",
                             help="write an HF BF16 source (dense experts) instead")
    tiny.add_argument("out", help="output directory (must be empty or absent)")
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
    tiny.set_defaults(handler=_cmd_make_tiny)

    demo = commands.add_parser(
        "demo", help="make a tiny checkpoint, validate it, corrupt copies and show the findings",
        description="No arguments: everything happens in a temporary directory that is removed afterwards. "
                    "Needs nothing but Python; the last step (the zero-copy load) runs when torch is installed.",
    )
    demo.set_defaults(handler=_cmd_demo)

    inference_demo = commands.add_parser(
        "inference-demo", help="register the normalized-FP8 hook, then run NxDI's inference_demo with ARGS",
        description="Everything after 'inference-demo' goes to NxDI's inference_demo unchanged, e.g. "
                    "CHECKPOINT_FORMAT=normalized_fp8 nxdi-gptoss-fp8 inference-demo --model-type gpt_oss "
                    "--task-type causal-lm run --model-path DIR --quantized --quantized-checkpoints-path DIR ...",
        # no option of ours: every argument, '--help' included, is NxDI's
        prefix_chars="\x00", add_help=False,
    )
    inference_demo.add_argument("nxdi_args", nargs=argparse.REMAINDER, metavar="ARGS")
    inference_demo.set_defaults(handler=_cmd_inference_demo)

    convert = commands.add_parser(
        "convert", help="convert a GPT-OSS checkpoint (HF MXFP4, HF BF16 or compressed-tensors FP8) to normalized FP8 "
                        "(needs torch)",
        description="Convert the HF set of openai/gpt-oss-120b or -20b (MXFP4), an HF BF16 GPT-OSS checkpoint "
                    "or an llm-compressor FP8_DYNAMIC (compressed-tensors) one into the normalized FP8 format, "
                    "streaming one expert at a time. SRC may be a Hub repo id: only "
                    "config, index, the listed shards, tokenizer and generation config are fetched (never original/ "
                    "or metal/), through huggingface_hub's cache (HF_HOME, HF_HUB_OFFLINE, HF_TOKEN apply); they are "
                    "copied into OUT with the commit recorded. MXFP4 and FP8 values stay exact wherever Neuron's "
                    "E4M3 can hold them (the report counts the rest). The output appears only when "
                    "complete; SRC is never modified. Check the result with verify-conversion.",
    )
    convert.add_argument("src", metavar="SRC", help="the HF checkpoint directory (config.json + model.safetensors.index.json), "
                                                    "or a Hub repo id such as openai/gpt-oss-120b (an existing local path wins)")
    convert.add_argument("out", metavar="OUT", help="output directory (must be empty or absent)")
    convert.add_argument("--revision", metavar="R", help="Hub branch, tag or commit of a repo-id SRC (default main)")
    _add_output_options(convert, max_shard_size="5GB")
    _add_split_option(convert)
    _add_workers_option(convert, "encoded")
    convert.add_argument("--json", action="store_true", help="print the conversion report as JSON")
    convert.set_defaults(handler=_cmd_convert)

    verify_conversion = commands.add_parser(
        "verify-conversion", help="compare a converted checkpoint with its source, value by value (needs torch)",
        description="Re-read OUT and SRC one expert at a time: every non-expert tensor must be bit-exact, every "
                    "FP8 expert value exact where E4M3 allows and within half an E4M3 step otherwise. Prints a "
                    "per-layer table; exit 1 on any violation.",
    )
    verify_conversion.add_argument("out", metavar="OUT", help="the converted checkpoint directory")
    verify_conversion.add_argument("--source", required=True, metavar="SRC",
                                   help="the source it was converted from: a directory or a Hub repo id")
    verify_conversion.add_argument("--revision", metavar="R", help="Hub revision of a repo-id SRC (default: the commit "
                                                                 "OUT records, else main)")
    _add_split_option(verify_conversion)
    _add_workers_option(verify_conversion, "compared")
    verify_conversion.add_argument("--json", action="store_true", help="print the report as JSON")
    verify_conversion.set_defaults(handler=_cmd_verify_conversion)

    selfcheck = commands.add_parser(
        "selfcheck", help="run NxDI's real GPT-OSS on the CPU from a tiny checkpoint three ways and compare (needs NxDI)",
        description="Write one tiny GPT-OSS weight set as HF MXFP4, normalized FP8 and NxDI's legacy FP8, run NxDI's "
                    "model in its CPU mode from each (normalized through this package's hook) and transformers' "
                    "GptOssForCausalLM on the same weights: normalized vs legacy must be bit-identical, each within "
                    "1e-5 of transformers. Exit 0 pass, 1 mismatch, 2 cannot run (NxDI missing).",
    )
    selfcheck.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree; N > 1 runs N torchrun workers (gloo)")
    selfcheck.add_argument("--json", action="store_true", help="print the report as JSON")
    selfcheck.set_defaults(handler=_cmd_selfcheck)

    check_forward = commands.add_parser(
        "check-forward", help="run the first K layers of a checkpoint through NxDI's model on the CPU against its source (needs NxDI)",
        description="Preflight CKPT, then run its first K layers through the hook in NxDI's real GPT-OSS model (CPU "
                    "mode) and the same K layers of the published source (HF MXFP4 decoded exactly, or BF16) in "
                    "transformers on a fixed token sequence; report per position max |Δlogit|, cosine, top-1 "
                    "agreement and KL. An MXFP4 source must agree to float32 rounding, a BF16 source within FP8 "
                    "quantization error. Exit 1 on a preflight failure or a violated bound.",
    )
    check_forward.add_argument("path", metavar="CKPT", help="the normalized checkpoint directory")
    check_forward.add_argument("--source", required=True, metavar="HF_DIR", help="the HF checkpoint it was made from")
    check_forward.add_argument("--layers", type=int, default=2, metavar="K", help="decoder layers to run (default 2)")
    check_forward.add_argument("--tokens", type=int, default=12, metavar="N", help="length of the token sequence (default 12)")
    check_forward.add_argument("--steps", type=int, default=6, metavar="S", help="teacher-forced token steps after the context pass (default 6)")
    check_forward.add_argument("--neuron-config", metavar="FILE.json",
                               help="NxDI NeuronConfig attributes as JSON (fused_qkv, lm_head padding, ...); the "
                                    "settings CPU mode needs replace the device ones and are listed")
    check_forward.add_argument("--allow-custom-model", action="store_true",
                               help=f"accept model_profile 'custom' (tiny test models); also {fmt.ALLOW_CUSTOM_ENV}=1")
    check_forward.add_argument("--json", action="store_true", help="print the report as JSON")
    check_forward.set_defaults(handler=_cmd_check_forward)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # names from disk may not be valid UTF-8
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    debug = os.environ.get("NXDI_GPTOSS_FP8_DEBUG", "") not in ("", "0")
    _log_to_stderr()
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as exc:
        print(f"nxdi-gptoss-fp8 {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MissingDependencyError as exc:
        print(f"nxdi-gptoss-fp8 {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:  # an optional package that a lazy import needed
        if debug or (exc.name or "").split(".")[0] not in OPTIONAL:
            raise
        print(f"nxdi-gptoss-fp8 {args.command}: {missing(exc.name or '')}", file=sys.stderr)
        return EXIT_USAGE
    except NxdiGptossFp8Error as exc:
        if debug:
            raise
        print(f"nxdi-gptoss-fp8 {args.command}: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    except OSError as exc:
        if debug:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"nxdi-gptoss-fp8 {args.command}: cannot access{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the message."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _log_to_stderr() -> None:
    """The package's warnings (e.g. a removed leftover of an interrupted run) as plain stderr lines."""
    logger = logging.getLogger(__package__ or "nxdi_gptoss_fp8")
    if not any(isinstance(handler, _StderrHandler) for handler in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("nxdi-gptoss-fp8: %(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _silence_stdout() -> None:
    """After the reader of stdout went away, send what is still buffered nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
