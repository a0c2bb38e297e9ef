"""``nxdi-gptoss-fp8``: validate, inspect, make and convert normalized FP8 GPT-OSS checkpoints.

A thin face over the library: each command parses its arguments, calls one library function
and renders the result. Data goes to stdout, messages to stderr. Exit codes: 0 success /
valid, 1 findings or a failed check, 2 usage error, unreadable input or a missing optional
dependency (torch, numpy, NxDI) or a setting that cannot be read. Known errors print one line;
set NXDI_GPTOSS_FP8_DEBUG=1 for tracebacks. A closed stdout (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from . import __version__
from . import format as fmt
from .checks import allow_custom_from_env, foreign_recognition, preflight
from .deps import OPTIONAL, missing, require
from .errors import ConfigError, MissingDependencyError, NxdiGptossFp8Error
from .findings import printable
from .nxdi_config import switch_from_env

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE
TEXT_FINDINGS_LIMIT = 50
DEBUG_ENV = "NXDI_GPTOSS_FP8_DEBUG"


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
    """The ``--neuron-config`` JSON, read like every checkpoint JSON: regular file, strict, bounded
    (``nxdi_config.read_config_file``, which ``preflight(neuron_config=PATH)`` uses too)."""
    if path is None:
        return None
    from .nxdi_config import read_config_file

    try:
        return read_config_file(path, f"--neuron-config {path}")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _allow_custom(args: argparse.Namespace) -> bool:
    """``--allow-custom-model`` or the environment opt-in (read either way: a value that is
    neither on nor off is refused even when the flag is given)."""
    return allow_custom_from_env() or args.allow_custom_model


def _cmd_validate(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.path)
    from .recognize import PRESHARDED, compiled_model_dir

    compiled = compiled_model_dir(args.path)
    if compiled is not None:
        return _validate_compiled(args, compiled)
    if args.deep:
        _needs("--deep", "numpy")
    neuron_config = _load_neuron_config(args.neuron_config)
    report = preflight(
        args.path,
        neuron_config=neuron_config,
        allow_custom_model=_allow_custom(args),
        read_scales=not args.headers_only,
        deep=args.deep,
        verify_checksums=args.verify_checksums,
    )
    # another kind of checkpoint (HF, compressed-tensors, legacy), or pre-sharded weights copied
    # without their compiled directory: inspect's one-line verdict and action first
    recognition = foreign_recognition(report.view) if not report.ok and report.view is not None else None
    if recognition is None and not report.ok and report.view is not None and report.view.recognition is not None \
            and report.view.recognition.kind == PRESHARDED:
        recognition = report.view.recognition
    hint = recognition.hint() if recognition is not None else None
    if args.json:
        print(json.dumps({**report.to_dict(), "hint": hint}, indent=2))
    else:
        if hint:
            print(printable(hint))
        print(report.render_text(limit=None, summarize=False) if args.all else report.render_text(limit=TEXT_FINDINGS_LIMIT))
    if not report.clean:
        return EXIT_FINDINGS
    return EXIT_OK if report.complete else EXIT_PARTIAL


def _validate_compiled(args: argparse.Namespace, compiled: str) -> int:
    """``validate COMPILED``: its pre-sharded weights against their manifest, its
    ``neuron_config.json`` (or ``--neuron-config``) and the source checkpoint when it is here."""
    from .recognize import NEURON_CONFIG_FILE
    from .sharded_manifest import check_presharded, describe_presharded

    if args.deep or args.headers_only:
        raise UsageError(f"{compiled} is a compiled NxDI model directory: --deep and --headers-only apply to "
                         "checkpoints (validate the checkpoint it was compiled from)")
    try:
        config = _load_neuron_config(args.neuron_config or os.path.join(compiled, NEURON_CONFIG_FILE))
    except UsageError as exc:
        raise UsageError(str(exc) if args.neuron_config else str(exc).replace("--neuron-config ", "").replace(
            "--neuron-config: ", "")) from None
    assert config is not None
    nc = config.get("neuron_config") if isinstance(config.get("neuron_config"), dict) else config
    if not nc.get("save_sharded_checkpoint") and describe_presharded(compiled) is None:
        source = nc.get("quantized_checkpoints_path") or "the checkpoint it was compiled from"
        message = (f"{compiled}: no pre-sharded weights (save_sharded_checkpoint is off): NxDI's weights are sharded at "
                   f"load from the checkpoint, where the preflight runs; validate {source}")
        print(json.dumps({"ok": True, "path": compiled, "findings": [], "message": message}, indent=2) if args.json else message)
        return EXIT_OK
    check = check_presharded(compiled, ranks=None, config=config, verify=args.verify_checksums, progress=None)
    if args.json:
        print(json.dumps(check.to_dict(), indent=2))
    else:
        print(check.render_text(limit=None if args.all else TEXT_FINDINGS_LIMIT))
    return EXIT_OK if check.ok else EXIT_FINDINGS


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .recognize import NOT_A_DIRECTORY
    from .summary import inspect_directory

    inspection = inspect_directory(args.path, allow_custom_model=_allow_custom(args))
    if inspection.recognition.kind == NOT_A_DIRECTORY and not args.json:
        raise UsageError("; ".join(inspection.recognition.evidence))
    if args.json:
        print(json.dumps(inspection.to_dict(), indent=2))
    else:
        print(inspection.render_text())
    if inspection.recognition.kind == NOT_A_DIRECTORY:
        return EXIT_USAGE
    return EXIT_OK if inspection.succeeded else EXIT_FINDINGS


def _dims(args: argparse.Namespace, defaults: fmt.ModelDims) -> fmt.ModelDims:
    return fmt.ModelDims(**{
        field: getattr(args, field) if getattr(args, field) is not None else getattr(defaults, field)
        for field in fmt.ModelDims.__dataclass_fields__
    })


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    if args.hf is not None:
        return _make_tiny_source(args)
    from .tiny_stdlib import TINY_DIMS, check_seed, tiny_layout
    from .writer import prepare_output

    dims = _dims(args, TINY_DIMS)
    max_shard_size = _size(args.max_shard_size)
    try:  # every argument and OUT checked before torch is imported or anything is written
        tiny_layout(dims, args.padded_hidden_size, args.padded_intermediate_size)
        check_seed(args.seed)
        prepare_output(os.path.abspath(args.out), overwrite=args.overwrite)
    except (ValueError, NxdiGptossFp8Error) as exc:
        raise UsageError(str(exc)) from None
    _needs("", "torch")
    from .tiny import make_tiny

    out = make_tiny(
        args.out, dims=dims, padded_hidden_size=args.padded_hidden_size,
        padded_intermediate_size=args.padded_intermediate_size,
        max_shard_size=max_shard_size, seed=args.seed, overwrite=args.overwrite,
    )
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


_SOURCE_KINDS = {"mxfp4": "HF MXFP4", "bf16": "HF BF16", "ct-fp8": "compressed-tensors FP8 (llm-compressor FP8_DYNAMIC)"}


def _make_tiny_source(args: argparse.Namespace) -> int:
    """``make-tiny --hf-mxfp4`` / ``--hf-bf16`` / ``--ct-fp8``: a tiny synthetic source to try
    ``convert`` on, checked first and written whole (into a hidden folder beside OUT, renamed at the end)."""
    option = f"--{'ct-fp8' if args.hf == 'ct-fp8' else 'hf-' + args.hf}"
    if args.padded_hidden_size is not None or args.padded_intermediate_size is not None:
        raise UsageError("a source is never padded: pass --padded-hidden-size/--padded-intermediate-size to convert")
    from .tiny_stdlib import SOURCE_DIMS, check_seed, tiny_layout
    from .writer import prepare_output

    dims = _dims(args, SOURCE_DIMS)
    try:
        tiny_layout(dims, None, None, block=32 if args.hf == "mxfp4" else None)  # 32: the MXFP4 block
        check_seed(args.seed)
        prepare_output(os.path.abspath(args.out), overwrite=args.overwrite)
    except (ValueError, NxdiGptossFp8Error) as exc:
        raise UsageError(str(exc)) from None
    _needs(option, "torch", "safetensors")
    import shutil
    import tempfile

    from .synthetic import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, current_umask, make_source

    out = os.path.abspath(args.out)
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
    try:
        os.chmod(work, 0o777 & ~current_umask())  # mkdtemp makes it 0700; OUT gets the user's umask
        kind = {"mxfp4": SOURCE_MXFP4, "bf16": SOURCE_BF16, "ct-fp8": SOURCE_COMPRESSED_TENSORS}[args.hf]
        make_source(work, kind, dims=dims, seed=args.seed, original=False)
        if os.path.isdir(out) and args.overwrite:
            shutil.rmtree(out)
        elif os.path.isdir(out):
            os.rmdir(out)  # empty: prepare_output said so
        os.rename(work, out)
    finally:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote a tiny synthetic {_SOURCE_KINDS[args.hf]} GPT-OSS source to {out} (random values, the published "
          "repos' layout)")
    print(f"try: nxdi-gptoss-fp8 convert {out} {out}-fp8 && nxdi-gptoss-fp8 verify-conversion {out}-fp8 --source {out}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return EXIT_OK if run_demo() else EXIT_FINDINGS


INFERENCE_DEMO_HELP = """\
usage: nxdi-gptoss-fp8 inference-demo ARGS...

Register the normalized-FP8 hook on NxDI's GPT-OSS model, then run NxDI's own inference_demo
with ARGS unchanged (every argument, --help included, is NxDI's). Select the normalized path
with CHECKPOINT_FORMAT=normalized_fp8 and point NxDI at the checkpoint, e.g.

  CHECKPOINT_FORMAT=normalized_fp8 nxdi-gptoss-fp8 inference-demo --model-type gpt_oss \\
      --task-type causal-lm run --model-path DIR --compiled-model-path OUT \\
      --quantized --quantized-checkpoints-path DIR --quantization-type expert_wise_per_channel_symmetric \\
      --quantization-dtype f8e4m3 ...

The hook runs the same preflight as `nxdi-gptoss-fp8 validate DIR` before any tensor is read:
check the checkpoint on any host first (add --neuron-config with NxDI's config to check that
too). Needs NxDI (neuronx-distributed-inference) and a Neuron host."""


def _cmd_inference_demo(args: argparse.Namespace) -> int:
    from . import nxdi_hook

    asks_help = not args.nxdi_args or args.nxdi_args[0] in ("-h", "--help")
    available = nxdi_hook.nxdi_available()
    if asks_help:
        print(INFERENCE_DEMO_HELP)
        if not available:
            print("\nNxDI is not installed here, so its inference_demo options cannot be listed.")
            return EXIT_OK if args.nxdi_args else EXIT_USAGE
        print("\nNxDI's inference_demo options follow.\n", flush=True)
    if not available:
        raise UsageError("NxDI (neuronx-distributed-inference) is not installed here: run this on a Neuron host "
                         "with NxDI installed; it registers the hook, then runs NxDI's inference_demo "
                         "(`nxdi-gptoss-fp8 inference-demo --help` explains)")
    return nxdi_hook.run_inference_demo(args.nxdi_args)


def _resolve(spec: str, revision: str | None, *, recorded_in: str | None = None,
             before_shards: Any = None) -> Any:
    """A local directory or a Hub repo id (``hub.resolve_source``); says on stderr which was used."""
    from .errors import ConversionError
    from .hub import is_repo_id, recorded_revision, resolve_source

    ambiguous = is_repo_id(spec)
    if revision is None and recorded_in is not None and ambiguous and not os.path.lexists(spec):
        revision = recorded_revision(recorded_in, spec)  # the commit the output was converted from
    try:
        resolved = resolve_source(spec, revision=revision, before_shards=before_shards)
    except ConversionError as exc:
        raise UsageError(str(exc)) from None
    if ambiguous or resolved.from_hub:
        print(f"source {resolved.describe()}", file=sys.stderr)
    return resolved


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so every ``with`` block unwinds as for Ctrl-C
    (the partial output is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Inside: SIGTERM (kill, timeout, docker stop, Kubernetes) and SIGHUP behave like SIGINT."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise _Terminated(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave the defaults
            previous[signum] = signal.signal(signum, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _json_errors(handler: Any) -> Any:
    """With ``--json``, an error is also printed on stdout as JSON (``ok`` false, ``error``,
    ``exit_code``), so a caller parsing stdout never gets plain text; stderr keeps its line."""
    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except (UsageError, MissingDependencyError, NxdiGptossFp8Error, OSError, KeyboardInterrupt) as exc:
            if getattr(args, "json", False) and not isinstance(exc, BrokenPipeError):
                code = EXIT_FINDINGS if isinstance(exc, NxdiGptossFp8Error) and not isinstance(
                    exc, MissingDependencyError) else EXIT_USAGE
                if isinstance(exc, KeyboardInterrupt):
                    code = 128 + getattr(exc, "signum", signal.SIGINT)
                message = str(exc) if not isinstance(exc, KeyboardInterrupt) else _interrupted_text(exc)
                print(json.dumps({"ok": False, "command": args.command, "error": message,
                                  "error_type": type(exc).__name__.lstrip("_"), "exit_code": code}, indent=2))
                sys.stdout.flush()
            raise

    return run


def _interrupted_text(exc: BaseException) -> str:
    signum = getattr(exc, "signum", signal.SIGINT)
    return f"interrupted ({signal.Signals(signum).name}): nothing was written, the partial output was removed"


def _terminated(args: argparse.Namespace, exc: _Terminated, line: str) -> int:
    """SIGTERM or SIGHUP: one line on stderr and, with ``--json``, the error as JSON on stdout (as
    for Ctrl-C); exit 128 + the signal number."""
    code = 128 + exc.signum
    print(line, file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "command": args.command, "error": _interrupted_text(exc),
                          "error_type": "Terminated", "exit_code": code}, indent=2))
    return code


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
    from .convert import convert, plan, plan_from_hub
    from .errors import ConversionError
    from .hub import companion_files

    max_shard_size = _size(args.max_shard_size, "--max-shard-size")
    workers = _workers(args.workers)
    sizes = {"padded_hidden_size": args.padded_hidden_size, "padded_intermediate_size": args.padded_intermediate_size,
             "max_shard_size": max_shard_size}
    try:
        with _signals_interrupt():
            try:
                source = _resolve(args.src, args.revision, before_shards=lambda fetch: _plan_or_refuse(
                    args, plan_from_hub(fetch, args.out, overwrite=args.overwrite, **sizes)))
                options = {**sizes, "overwrite": args.overwrite, "provenance": source.provenance(),
                           "extra_files": companion_files(source.path), "gate_up_split": args.ct_gate_up_split}
                planned = plan(source.path, args.out, **options)
                _plan_or_refuse(args, planned)
                report = convert(source.path, args.out, progress=True, workers=workers, **options)
            except ConversionError as exc:  # a source or output we cannot use: unreadable input
                raise UsageError(str(exc)) from None
    except _PlanShown as shown:
        print(json.dumps(shown.plan.to_dict(), indent=2) if args.json else shown.plan.render_text())
        return EXIT_OK if shown.plan.ok else EXIT_FINDINGS
    except _Terminated as exc:
        return _terminated(args, exc, f"nxdi-gptoss-fp8 convert: {_interrupted_text(exc)}")
    print(json.dumps({"ok": True, **report.to_dict()}, indent=2) if args.json else report.render_text())
    return EXIT_OK


def _cmd_verify_conversion(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.out, "OUT, the converted checkpoint directory")
    _needs("", "torch", "safetensors")
    from .errors import ConversionError
    from .verify import verify_conversion

    workers = _workers(args.workers)
    try:
        with _signals_interrupt():
            source = _resolve(args.source, args.revision, recorded_in=args.out)
            try:  # arguments swapped, or a source that is not one: one line with the hint
                report = verify_conversion(args.out, source.path, progress=True, gate_up_split=args.ct_gate_up_split,
                                           given_source=args.source, workers=workers)
            except ConversionError as exc:
                raise UsageError(str(exc)) from None
    except _Terminated as exc:
        return _terminated(args, exc, f"nxdi-gptoss-fp8 verify-conversion: interrupted ({signal.Signals(exc.signum).name})")
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _cmd_env(args: argparse.Namespace) -> int:
    from .support import environment_report

    report = environment_report()
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
        raise UsageError(f"{exc} (`nxdi-gptoss-fp8 env` says where this host stands)") from None
    print(to_json(report) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _cmd_check_forward(args: argparse.Namespace) -> int:
    _checkpoint_dir(args.path)  # a missing or unusable path is a usage error (exit 2), as everywhere
    _checkpoint_dir(args.source, "--source, the HF checkpoint directory it was made from")
    from .errors import ConversionError, CpuModelError
    from .forward_check import check_forward

    os.environ.setdefault("NXD_LOG_LEVEL", "warning")  # NxD's per-rank INFO lines would bury the report
    try:
        report = check_forward(
            args.path, args.source, layers=args.layers, tokens=args.tokens, steps=args.steps,
            neuron_config=_load_neuron_config(args.neuron_config),
            allow_custom_model=_allow_custom(args),
        )
    except (CpuModelError, ConversionError, ValueError) as exc:  # cannot run, or unusable inputs
        raise UsageError(str(exc)) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _size(text: str, option: str = "--max-shard-size") -> int:
    from .writer import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _padded_size(text: str) -> int:
    """An argparse type for H'/I': a decimal integer up to 2^31 (the format's dimension bound); 0 and
    sizes below the model's are refused by the command itself, which knows the model."""
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 10 or int(stripped) > fmt.MAX_DIMENSION:  # 0: the command's own check
        shown = stripped if len(stripped) <= 20 else f"a number of {len(stripped)} characters"
        raise argparse.ArgumentTypeError(f"must be a whole number up to 2^31 (the model's size plus a multiple "
                                         f"of {fmt.PAD_MULTIPLE}), not {shown}")
    return int(stripped)


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
    command.add_argument("--padded-hidden-size", type=_padded_size, metavar="N", help="H' (H plus a multiple of 32)")
    command.add_argument("--padded-intermediate-size", type=_padded_size, metavar="N", help="I' (I plus a multiple of 32)")
    command.add_argument("--max-shard-size", default=max_shard_size,
                         help=f"largest shard, 1 B … 2^53 bytes, e.g. 5GB, 500MB, 2GiB (default {max_shard_size}{why})")
    command.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def build_parser(prog: str = "nxdi-gptoss-fp8") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Validate, inspect, make and convert normalized static-FP8 GPT-OSS checkpoints for "
            "AWS NeuronX Distributed Inference. Validation reads headers only and needs no "
            "Neuron SDK: run it on any host before you load."
        ),
        epilog=("Exit codes: 0 valid/success, 1 findings or failed check, 2 usage error or unreadable input, "
                "3 partial verdict (validate --headers-only: no errors in what was checked, not everything checked). "
                f"The format, every check and finding code: {fmt.format_document_ref()}"),
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
    validate.add_argument("path", help="the checkpoint directory (holds model.safetensors.index.json), or a compiled "
                                       "NxDI model directory: its pre-sharded weights/ are checked against their "
                                       "manifest, its neuron_config.json and, when present, the source checkpoint")
    validate.add_argument("--json", action="store_true", help="print the report as JSON (ok, summary, findings)")
    validate.add_argument("--all", action="store_true",
                          help=f"list every finding, one line each (text output otherwise summarizes repeated "
                               f"findings and shows at most {TEXT_FINDINGS_LIMIT} lines)")
    validate.add_argument("--neuron-config", metavar="FILE.json",
                          help="NxDI NeuronConfig attributes as JSON (flat, or nested under \"neuron_config\" "
                               "as NxDI saves it): also check that NxDI will run this checkpoint as configured")
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
                            "checkpoint; progress on a terminal)")
    validate.add_argument("--verify-checksums", action="store_true",
                          help="hash every shard (in parallel) against the index's shard_sha256; "
                               "a checkpoint without digests then fails (a compiled directory: every rank file "
                               "against its manifest)")
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
                    "Dimensions default to a 2-layer, 4-expert, 64-wide model; a custom profile like that is "
                    "valid with --allow-custom-model (or NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL=1) only. With "
                    "--hf-mxfp4, --hf-bf16 or --ct-fp8, write a tiny synthetic source instead (2 layers, 3 experts, "
                    "H 64, I 96), to try convert and verify-conversion without downloading a published checkpoint. "
                    "The arguments are checked first, by the format's rules (each size 1 … 2^31, experts per "
                    "token at most the experts, query heads a multiple of key/value heads, MXFP4 sizes whole "
                    "32-blocks, at most 10,000 tensors and 256 MB); OUT must be empty or absent (exit 2).",
    )
    source_kind = tiny.add_mutually_exclusive_group()
    source_kind.add_argument("--hf-mxfp4", dest="hf", action="store_const", const="mxfp4",
                             help="write an HF MXFP4 source (like openai/gpt-oss-*) instead")
    source_kind.add_argument("--hf-bf16", dest="hf", action="store_const", const="bf16",
                             help="write an HF BF16 source (dense experts) instead")
    source_kind.add_argument("--ct-fp8", dest="hf", action="store_const", const="ct-fp8",
                             help="write a compressed-tensors FP8 source (llm-compressor FP8_DYNAMIC, per-expert "
                                  "linear layers, even/odd gate/up split) instead")
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
                    "E4M3 can hold them (the report counts the rest); a NaN or inf anywhere in SRC is refused. "
                    "Before a byte moves the run is planned (see --dry-run) and refused when OUT's filesystem "
                    "(or the Hub cache) lacks the space. The output appears only when complete; an existing OUT "
                    "directory (e.g. a mount point) is written inside; --overwrite replaces only an earlier output "
                    "of this converter. Ctrl-C, SIGTERM and SIGHUP remove the partial output. SRC is never "
                    "modified. Check the result with verify-conversion.",
    )
    convert.add_argument("src", metavar="SRC", help="the HF checkpoint directory (config.json + model.safetensors.index.json), "
                                                    "or a Hub repo id such as openai/gpt-oss-120b (an existing local path wins)")
    convert.add_argument("out", metavar="OUT", help="output directory (must be empty or absent)")
    convert.add_argument("--revision", metavar="R", help="Hub branch, tag or commit of a repo-id SRC (default main)")
    _add_output_options(convert, max_shard_size="5GB")
    _add_split_option(convert)
    convert.add_argument("--dry-run", action="store_true",
                         help="print the plan and stop: the files read (for a Hub id, only those fetched, with their "
                              "sizes from the cache or the Hub's metadata), the shards written and their bytes, the "
                              "free space where they go and the expected peak memory; every real run makes the same "
                              "plan first and refuses at once (exit 2) when it does not fit; a dry run that does not fit exits 1")
    _add_workers_option(convert, "encoded")
    convert.add_argument("--json", action="store_true", help="print the conversion report (or the plan, or the error) as JSON")
    convert.set_defaults(handler=_json_errors(_cmd_convert))

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
    verify_conversion.add_argument("--json", action="store_true", help="print the report (or the error) as JSON")
    verify_conversion.set_defaults(handler=_json_errors(_cmd_verify_conversion))

    env = commands.add_parser(
        "env", help="which Python, torch, transformers, NxDI, NxD, Neuron and vLLM packages are installed, and "
                    "whether each is in the tested matrix (any host)",
        description="Read the installed versions from package metadata (nothing heavy is imported) and place each "
                    "in this package's tested matrix: verified (what the nxdi tests and selfcheck ran against), "
                    "expected to work (the same API line; register() checks the signatures it wraps), unsupported "
                    "(with the reason and the way forward) or not installed. Also tells which vLLM Neuron plugin is "
                    "installed (the NxDI-backed one, or the newer one that does not use NxDI) and states the NxDI "
                    "support window. Exit 0, or 1 when an installed component is unsupported.",
    )
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    env.set_defaults(handler=_cmd_env)

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


def main(argv: Sequence[str] | None = None, prog: str = "nxdi-gptoss-fp8") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # names from disk may not be valid UTF-8
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        debug = switch_from_env(DEBUG_ENV, os.environ, "tracebacks")
    except ConfigError as exc:
        print(f"nxdi-gptoss-fp8 {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
    except (MissingDependencyError, ConfigError) as exc:  # the environment or a setting, not the checkpoint
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
