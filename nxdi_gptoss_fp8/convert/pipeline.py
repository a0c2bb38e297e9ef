"""Detect a source checkpoint and convert it: the driver shared by every source kind.

``open_source`` reads and validates the source's files (``source``), asks each kind whether
the tensor names are its layout, lets that kind resolve and check its config, then checks every
tensor name, shape and dtype before a byte is written. ``convert`` streams the non-expert
tensors (renamed, zero-padded, BF16) and hands each layer's experts to the kind.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import format as fmt
from ..errors import ConversionError
from ..padding import TARGETS
from ..progress import Progress
from ..units import parse_size, plural
from ..validate.config_fields import config_field_problems
from ..writer import CheckpointWriter
from .card import CARD_FILE, card_size_bound, write_model_card
from .kinds.base import SourceKind
from .kinds.compressed_tensors import NAME as SOURCE_COMPRESSED_TENSORS
from .kinds.compressed_tensors import CompressedTensorsFp8
from .kinds.hf_bf16 import NAME as SOURCE_BF16
from .kinds.hf_bf16 import HfBf16
from .kinds.hf_mxfp4 import NAME as SOURCE_MXFP4
from .kinds.hf_mxfp4 import HfMxfp4
from .layer import convert_layer
from .output import ConversionReport, ExpertStats, Output, Workspace, copy_padded, output_config, single_threaded_torch
from .plan import ConversionPlan, PlannedFile, local_reads, plan_conversion
from .source import (
    Source,
    SourceReader,
    SourceSpec,
    check_claimed_dims,
    check_tensors,
    non_expert_names,
    read_source_files,
)
from .workers import ConversionWorkers, lane_buffers, peak_rss, plan_workers, refuse_in_worker_start

__all__ = [
    "KINDS", "convert", "logger", "open_source", "plan", "plan_from_hub", "plan_writer",
    "source_kind", "source_specs",
]

logger = logging.getLogger(__name__)
KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (HfMxfp4(), HfBf16(), CompressedTensorsFp8())}


def source_kind(source: Source) -> SourceKind:
    """The kind object of a detected source."""
    return KINDS[source.kind]


def source_specs(dims: fmt.ModelDims, kind: str, options: dict[str, Any] | None = None) -> dict[str, SourceSpec]:
    """Every tensor of a GPT-OSS source of ``kind`` (``hf-mxfp4``, ``hf-bf16`` or
    ``compressed-tensors-fp8``; the latter needs the ``options`` its detection resolved)."""
    if kind not in KINDS:
        raise ValueError(f"unknown source kind {kind!r}: one of {', '.join(KINDS)}")
    return KINDS[kind].specs(dims, options or {})


def _classify(names: set[str]) -> SourceKind:
    for kind in KINDS.values():
        if kind.recognizes(names):
            return kind
    sample = ", ".join(sorted(names)[:4])
    if any(name.startswith("block.") for name in names):
        what = "OpenAI's original layout (block.N.*): convert the HF set (the parent of original/) instead"
    elif any(name.startswith(("layers.", "embed_tokens.")) for name in names):
        what = "already-converted (NxDI) names: a normalized checkpoint needs no conversion; validate it instead"
    else:
        what = "no GPT-OSS expert tensors (looked for " + "; ".join(k.description for k in KINDS.values()) + ")"
    raise ConversionError(f"unrecognized source layout: {what} (found {plural(len(names), 'tensor')}, e.g. {sample})")


def open_source(src: str | os.PathLike[str], *, gate_up_split: str | None = None,
                recorded_gate_up_split: str | None = None) -> Source:
    """Detect and validate a source checkpoint directory.

    Args:
        src: an HF MXFP4, HF BF16 or compressed-tensors FP8 GPT-OSS checkpoint directory.
        gate_up_split: for compressed-tensors sources whose files cannot tell it,
            ``"interleaved"`` or ``"halves"`` (see ``compressed_tensors.SPLIT_HELP``); refused
            for any other source kind (the user named an option that does not apply).
        recorded_gate_up_split: the split a converted output records, the default for a
            compressed-tensors source when ``gate_up_split`` is None; ignored for other kinds.

    Raises ``ConversionError`` naming what was found when it is none of these.
    """
    root, config, dims, tensors = read_source_files(src)
    kind = _classify(set(tensors))
    check_claimed_dims(os.path.join(root, fmt.CONFIG_FILE), dims, tensors)  # before any work sized by them
    if gate_up_split is not None and kind.name != SOURCE_COMPRESSED_TENSORS:
        raise ConversionError(f"--ct-gate-up-split is for compressed-tensors FP8 sources only, and {root} is an "
                              f"{kind.name} source: drop the option")
    if gate_up_split is None and kind.name == SOURCE_COMPRESSED_TENSORS:
        gate_up_split = recorded_gate_up_split
    stated = {} if gate_up_split is None else {"gate_up_split": gate_up_split}
    options = kind.resolve(config, dims, tensors, os.path.join(root, fmt.CONFIG_FILE), stated)
    check_tensors(tensors, kind.specs(dims, options), kind.name)
    return Source(root=root, kind=kind.name, config=config, dims=dims, tensors=tensors, options=options)


def _check_paths(source_root: str, out: str) -> None:
    real_src, real_out = os.path.realpath(source_root), os.path.realpath(out)
    if real_out == real_src or real_out.startswith(real_src + os.sep) or real_src.startswith(real_out + os.sep):
        raise ConversionError(
            f"OUT {out} overlaps SRC {source_root}: the source is never modified; choose an output outside it"
        )


def _padded(value: Any, label: str, base: int) -> int:
    """A padded size as asked (None: the model's own), bounded like the format bounds it."""
    if value is None:
        return base
    if type(value) is not int or not 1 <= value <= fmt.MAX_DIMENSION:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else f"an integer of {len(str(abs(value)))} digits"
        raise ConversionError(f"{label} must be an integer in {base} … 2^31 ({base} plus a multiple of "
                              f"{fmt.PAD_MULTIPLE}), not {shown}")
    return value


def target_sizes(target: str | None, padded_hidden_size: int | None,
                 padded_intermediate_size: int | None) -> tuple[int | None, int | None]:
    """The padded sizes a conversion uses: a named target's (``format.TARGETS``), else those given.
    A size given beside a target must equal the target's: a different one is refused."""
    if target is None:
        return padded_hidden_size, padded_intermediate_size
    known = TARGETS.get(target)
    if known is None:
        raise ConversionError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    for label, given, wanted in (("padded_hidden_size", padded_hidden_size, known.padded_hidden_size),
                                 ("padded_intermediate_size", padded_intermediate_size, known.padded_intermediate_size)):
        if given is not None and given != wanted:
            raise ConversionError(f"target {target} sets {label}={wanted}; {label}={given!r} contradicts it: "
                                  "drop one of the two")
    return known.padded_hidden_size, known.padded_intermediate_size


def plan_writer(source_config: Mapping[str, Any], dims: fmt.ModelDims, out: str | os.PathLike[str], *,
                padded_hidden_size: int | None = None, padded_intermediate_size: int | None = None,
                max_shard_size: str | int = "5GB", overwrite: bool = False,
                source: Mapping[str, Any] | None = None,
                extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
                target: str | None = None) -> CheckpointWriter:
    """The output side of a conversion, planned and checked (nothing written yet): padded sizes
    (a named ``target``'s, ``target_sizes``) and the shard size within the format's bounds, OUT
    usable (``output_target.output_target``)."""
    padded_hidden_size, padded_intermediate_size = target_sizes(target, padded_hidden_size, padded_intermediate_size)
    layout = fmt.Layout(dims, _padded(padded_hidden_size, "padded_hidden_size", dims.hidden_size),
                        _padded(padded_intermediate_size, "padded_intermediate_size", dims.intermediate_size))
    problems = layout.padding_problems()
    if problems:
        raise ConversionError("; ".join(problems))
    total = fmt.expected_total_size(layout)
    if total > fmt.MAX_BYTE_COUNT:
        raise ConversionError(f"the output would hold {plural(total, 'byte')}, beyond the format's 2^53: use smaller padded sizes")
    try:
        shard_bytes = parse_size(max_shard_size)
    except ValueError as exc:
        raise ConversionError(f"--max-shard-size: {exc}") from None
    config = output_config(dict(source_config), dims)
    refused = [p for p in config_field_problems(config, dims, what="the source's config.json") if not p.warning]
    if refused:  # the output would fail validate: NxDI would compute another model than the source's
        raise ConversionError("; ".join(f"{p.message} (config.{p.reason})" for p in refused)
                              + ": the converted checkpoint would not pass validate; fix the source's config.json")
    return CheckpointWriter(os.path.abspath(os.fspath(out)), layout, fmt.profile_for_dims(dims),
                            config, max_shard_size=shard_bytes,
                            source=source, overwrite=overwrite, extra_files=extra_files,
                            conversion_target=target)


def plan(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    provenance: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
    gate_up_split: str | None = None,
    target: str | None = None,
) -> ConversionPlan:
    """What ``convert`` with the same arguments would read and write, where, whether it fits
    and its expected peak memory; writes nothing (``ConversionPlan.render_text`` / ``to_dict``).
    Raises ``ConversionError`` for what ``convert`` would refuse before planning."""
    return _prepare(src, out, padded_hidden_size=padded_hidden_size,
                    padded_intermediate_size=padded_intermediate_size, max_shard_size=max_shard_size,
                    overwrite=overwrite, provenance=provenance, extra_files=extra_files,
                    gate_up_split=gate_up_split, target=target)[2]


def _prepare(src: str | os.PathLike[str], out: str | os.PathLike[str], *, padded_hidden_size: int | None,
             padded_intermediate_size: int | None, max_shard_size: str | int, overwrite: bool,
             provenance: Mapping[str, Any] | None, extra_files: Mapping[str, str | os.PathLike[str]] | None,
             gate_up_split: str | None, target: str | None = None) -> tuple[Source, CheckpointWriter, ConversionPlan]:
    source = open_source(src, gate_up_split=gate_up_split)
    out_path = os.path.abspath(os.fspath(out))
    _check_paths(source.root, out_path)
    writer = plan_writer(source.config, source.dims, out_path, padded_hidden_size=padded_hidden_size,
                         padded_intermediate_size=padded_intermediate_size, max_shard_size=max_shard_size,
                         overwrite=overwrite, source={**source.provenance(), **(provenance or {})},
                         extra_files=extra_files, target=target)
    extras = {name: os.fspath(path) for name, path in (extra_files or {}).items()}
    reads = local_reads(source.root, source.tensors, extras)
    _reserve_card(writer, source)
    return source, writer, plan_conversion(source=source.root, source_format=source.kind, writer=writer, reads=reads)


def _reserve_card(writer: CheckpointWriter, source: Source) -> None:
    """Count the model card the conversion writes at the end (at its bound) in the writer's
    plan, in place of a source README.md it replaces."""
    writer.extra_files.pop(CARD_FILE, None)
    writer.reserved[CARD_FILE] = card_size_bound(writer, source)


def plan_from_hub(fetch: Any, out: str | os.PathLike[str], *, padded_hidden_size: int | None = None,
                  padded_intermediate_size: int | None = None, max_shard_size: str | int = "5GB",
                  overwrite: bool = False, target: str | None = None) -> ConversionPlan:
    """The plan of converting a Hub repo from its ``hub.FetchPlan`` (config, index and companions
    fetched; the shards' sizes from the cache or the Hub's metadata), before the shards move."""
    from ..hub import COMPANION_FILES, companion_files
    from .source import read_json

    config_path = os.path.join(fetch.metadata_path, fmt.CONFIG_FILE)
    config = read_json(config_path, fmt.CONFIG_FILE)
    if not isinstance(config, dict):
        raise ConversionError(f"{config_path} is not a JSON object")
    try:
        dims = fmt.dims_from_config(config)
    except fmt.ConfigFieldError as exc:
        raise ConversionError(f"{config_path}: {exc}") from None
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    kind = {"mxfp4": SOURCE_MXFP4, "compressed-tensors": SOURCE_COMPRESSED_TENSORS}.get(method, SOURCE_BF16)
    extras = companion_files(fetch.metadata_path)
    writer = plan_writer(config, dims, out, padded_hidden_size=padded_hidden_size,
                         padded_intermediate_size=padded_intermediate_size, max_shard_size=max_shard_size,
                         overwrite=overwrite, source={}, extra_files=extras, target=target)
    reads = []
    for name in (fmt.CONFIG_FILE, fmt.INDEX_FILE, *COMPANION_FILES):
        path = os.path.join(fetch.metadata_path, name)
        if os.path.isfile(path):
            reads.append(PlannedFile(name, os.stat(path).st_size, cached=True))
    reads += [PlannedFile(shard, fetch.sizes.get(shard), cached=fetch.cached.get(shard, False)) for shard in fetch.shards]
    _reserve_card(writer, Source(root=fetch.metadata_path, kind=kind, config=config, dims=dims, tensors={}))
    return plan_conversion(source=f"{fetch.repo_id}@{fetch.commit or fetch.revision or 'main'}", source_format=kind,
                           writer=writer, reads=reads, download_dir=fetch.download_dir)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    progress: bool = True,
    provenance: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
    gate_up_split: str | None = None,
    workers: int | None = None,
    target: str | None = None,
) -> ConversionReport:
    """Convert the GPT-OSS checkpoint ``src`` (HF MXFP4, HF BF16 or compressed-tensors FP8) into a
    normalized FP8 checkpoint at ``out``.

    Args:
        src: the checkpoint directory (config.json + model.safetensors.index.json or
            model.safetensors); its ``original/`` subdirectory is never read. Never modified.
        out: the output directory; absent, or an existing directory (written inside, so a
            mount point works) that is empty unless ``overwrite`` (then only an earlier output
            of this converter is replaced).
        padded_hidden_size / padded_intermediate_size: H' and I' (H or I plus a multiple of 32).
        target: a named geometry (``format.TARGETS``, e.g. ``"nki-moe"``): its padded sizes, recorded
            in the index as ``metadata.target``; a padded size given beside it must equal the target's.
        max_shard_size: largest shard, e.g. ``"5GB"``.
        progress: show progress on stderr: a bar on a terminal, a plain line every few seconds
            elsewhere (``progress.Progress``).
        provenance: extra fields for the index's ``source`` metadata (e.g. the Hub repo and the
            commit it resolved to; ``hub.ResolvedSource.provenance()``).
        extra_files: output file name → file to copy beside the checkpoint (tokenizer and
            generation config: ``hub.companion_files(src)``), inside the atomic write.
        gate_up_split: compressed-tensors sources only, when their files cannot tell:
            ``"interleaved"`` or ``"halves"`` (the error message says how to decide).
        workers: experts encoded at once, spread over up to one process per layer (None: the
            CPUs the host offers); bounded by the available memory, with a warning on the
            package logger when that lowers it (``workers.plan_workers``). The output is
            byte-identical whatever the count.

    Returns:
        A ``ConversionReport`` (bytes, time, exactness). Raises ``ConversionError`` for a source
        that is not a supported GPT-OSS checkpoint or holds a non-finite value, an output that
        cannot or must not be written, bad padded sizes, or a plan (``plan``) that does not fit
        the free space. Example::

            report = convert("gpt-oss-120b", "gpt-oss-120b-fp8")
            print(report.render_text())
    """
    refuse_in_worker_start()
    started = time.perf_counter()
    source, writer, planned = _prepare(
        src, out, padded_hidden_size=padded_hidden_size, padded_intermediate_size=padded_intermediate_size,
        max_shard_size=max_shard_size, overwrite=overwrite, provenance=provenance, extra_files=extra_files,
        gate_up_split=gate_up_split, target=target)
    planned.check()
    kind = source_kind(source)
    dims = source.dims
    layout = writer.layout
    profile = writer.profile
    out_path = writer.out
    try:
        plan = plan_workers(workers, layout, source.kind)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    if plan.note:
        logger.warning("convert: %s", plan.note)
    # the shards are hashed at commit in parallel threads, one per shard: as many as the workers
    # (at least the writer's two), so a many-core host does not wait on two threads at the end
    writer.hash_workers = max(writer.hash_workers, plan.workers)
    by_layer: dict[int, list[tuple[str, str]]] = {}
    globals_: list[tuple[str, str]] = []
    for hf_name, name in non_expert_names(dims).items():
        match = re.match(r"layers\.(\d+)\.", name)
        (by_layer.setdefault(int(match.group(1)), []) if match else globals_).append((hf_name, name))
    stats: list[ExpertStats] = []
    bar = Progress(fmt.expected_total_size(layout), f"convert 0/{dims.num_hidden_layers} layers",
                   show=None if progress else False)
    with bar, SourceReader(source) as reader, writer, ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert-write") as pool, ThreadPoolExecutor(
        max_workers=plan.lanes, thread_name_prefix="convert-encode"
    ) as compute, single_threaded_torch():
        # the pools exit before the writer: no write is still running when it closes its files
        workspace = Workspace(compute, lanes=lane_buffers(plan.lanes))
        output = Output(writer, bar, pool)

        def copy_globals() -> None:
            for hf_name, name in globals_:
                copy_padded(reader, hf_name, output, name)

        if plan.processes == 1:
            copy_globals()
            for layer in range(dims.num_hidden_layers):
                stats += convert_layer(kind, reader, output, layout, workspace, by_layer[layer], layer)
                bar.set_description(f"convert {layer + 1}/{dims.num_hidden_layers} layers")
            process_peak = peak_rss()
        else:  # the layers in worker processes, the globals here meanwhile; merged in layer order
            with ConversionWorkers(plan, source, kind, layout, writer, by_layer) as layer_workers:
                for outcome in layer_workers.convert(range(dims.num_hidden_layers), bar, copy_globals):
                    outcome.record(writer, output)
                    stats += outcome.stats
            process_peak = layer_workers.peak_rss
        report = ConversionReport(
            source=source.root, source_format=source.kind, out=out_path, profile=profile,
            padded_hidden_size=layout.padded_hidden_size, padded_intermediate_size=layout.padded_intermediate_size,
            layers=dims.num_hidden_layers, tensors=len(writer.planned), bytes_written=output.bytes,
            fp8_bytes=output.fp8_bytes, elapsed_s=0.0, experts=stats, workers=plan.describe(),
            peak_rss_per_process=process_peak, target=writer.conversion_target,
        )
        assert writer.source is not None
        writer.source["exactness"] = report.exactness_summary()
        write_model_card(writer, report, source)  # README.md, written with the checkpoint at commit
        bar.close()
        writer.commit(show_progress=None if progress else False)
    written = [os.path.join(out_path, name) for name in writer.planned_files()]
    report.files, report.files_bytes = len(written), sum(os.path.getsize(path) for path in written)
    report.elapsed_s = time.perf_counter() - started
    return report
