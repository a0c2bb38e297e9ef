"""Verify a converted checkpoint against its source, value by value.

Re-reads both sides one tensor (one expert per lane, two lanes) at a time. Every non-expert
tensor must equal the source, renamed, cast to BF16 and zero-padded, bit for bit. Every FP8
expert is dequantized (``fp8 × scale``) and compared with the source as its kind's
``reference_rows`` decodes it, independently of the converter (MXFP4 through a value table and
a power of two; compressed-tensors as their FP8 × their scale; BF16 as is), the stored expert
brought back to the source's row layout by the verifier's own transposes; padding must be zero.
With ``y = source / scale``:

* wherever ``y`` is an E4M3 value within ±240 the result must be exact;
* elsewhere ``|dequantized − source| ≤ max(2^-4·|source|, 2^-10·scale) · (1 + 2^-16)``:
  half an E4M3 step (3 mantissa bits; 2^-10 is half the subnormal step 2^-9), with room for
  one float32 rounding of ``y``;
* every stored FP8 value lies within ±240 (no NaN, no exponent-all-ones byte).

This is what catches a swapped gate/up interleave, a missing transpose, a swapped nibble order
or an exponent bias off by one. Requires torch and safetensors.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from .. import format as fmt
from ..errors import ConversionError
from ..hub import is_repo_id
from ..progress import Progress
from ..units import plural
from ..validate.pipeline import preflight
from . import (
    KINDS,
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    Source,
    SourceKind,
    SourceReader,
    non_expert_names,
    open_source,
    source_kind,
)
from .output import single_threaded_torch
from .source import FINGERPRINT_FIELDS, FINGERPRINT_PARTS, read_json
from .verify_expert import ExpertResult, compare_expert
from .verify_report import LayerRow, VerificationReport
from .workers import LayerPool, peak_rss, plan_workers, refuse_in_worker_start

__all__ = [
    "LANES", "LayerVerdict", "logger", "recorded_source", "source_mismatch_hint", "swapped_arguments_hint", "verify_conversion",
    "verify_layer",
]

LANES = 2
logger = logging.getLogger(__name__)


def _compare_tensor(expected: torch.Tensor, got: torch.Tensor, row: LayerRow, report: VerificationReport,
                    name: str, offset: int = 0) -> bool:
    if offset == 0:
        row.tensors += 1
    if got.shape == expected.shape and torch.equal(got.view(torch.int16), expected.view(torch.int16)):
        return True
    if got.shape != expected.shape:
        report.note(f"{name}: stored shape {list(got.shape)}, expected {list(expected.shape)}", counts=False)
    else:
        index = int((got.view(torch.int16) != expected.view(torch.int16)).reshape(-1).nonzero()[0])
        report.note(f"{name}: element {offset + index} is {float(got.reshape(-1)[index])}, expected "
                    f"{float(expected.reshape(-1)[index])} (not bit-exact)", counts=False)
    return False


def _check_non_expert(src: SourceReader, out: SourceReader, hf_name: str, name: str, shape: tuple[int, ...],
                      row: LayerRow, report: VerificationReport) -> None:
    source_shape = src.source.tensors[hf_name][1].shape
    if len(shape) == 1:
        expected = torch.zeros(shape, dtype=torch.bfloat16)
        expected[: source_shape[0]] = src.get(hf_name).to(torch.bfloat16)
        if not _compare_tensor(expected, out.get(name), row, report, name):
            row.tensor_mismatches += 1
        return
    rows, cols = shape
    step = max(1, (16 << 20) // (2 * cols))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        expected = torch.zeros((stop - start, cols), dtype=torch.bfloat16)
        if start < source_shape[0]:
            part = src.slice(hf_name)[start:min(stop, source_shape[0])]
            expected[: part.shape[0], : part.shape[1]] = part
            del part
        same = _compare_tensor(expected, out.slice(name)[start:stop], row, report, name, offset=start * cols)
        src.release()  # keeps RSS flat on large tensors: see SourceReader.release
        out.release()
        if not same:
            row.tensor_mismatches += 1
            return


def _check_biases(kind: SourceKind, src: SourceReader, out: SourceReader, layer: int, layout: fmt.Layout,
                  row: LayerRow, report: VerificationReport) -> None:
    prefix = fmt.layer_prefix(layer)
    ip, hp = layout.padded_intermediate_size, layout.padded_hidden_size
    gate_up, down = kind.reference_biases(src, layer)
    expected = torch.zeros((gate_up.shape[0], 2 * ip), dtype=torch.bfloat16)
    half = gate_up.shape[1] // 2
    expected[:, :half] = gate_up[:, 0::2]
    expected[:, ip:ip + half] = gate_up[:, 1::2]
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.GATE_UP}.bias"), row, report, f"{prefix}{fmt.GATE_UP}.bias"):
        row.tensor_mismatches += 1
    expected = torch.zeros((down.shape[0], hp), dtype=torch.bfloat16)
    expected[:, : down.shape[1]] = down
    if not _compare_tensor(expected, out.get(f"{prefix}{fmt.DOWN}.bias"), row, report, f"{prefix}{fmt.DOWN}.bias"):
        row.tensor_mismatches += 1


def _output_source(out: str, report_view: Any) -> Source:
    tensors = {}
    for name in report_view.weight_map:
        shard, info = report_view.tensor(name)
        tensors[name] = (os.path.join(out, shard), info)
    return Source(root=out, kind="normalized", config=report_view.config, dims=report_view.dims, tensors=tensors)


def _add(row: LayerRow, result: ExpertResult, report: VerificationReport) -> None:
    row.values += result.values
    row.exact += result.exact
    row.inexact += result.inexact
    row.violations += result.violations
    row.max_rel_error = max(row.max_rel_error, result.max_rel_error)
    row.flushed += result.flushed
    if result.problem is not None:
        report.note(result.problem, counts=False)


class _LaneReaders:
    """A source and an output reader per worker thread (a reader's ``release`` must not close
    files another thread is reading); all closed together at the end."""

    def __init__(self, src: Source, out: Source) -> None:
        self.src, self.out = src, out
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[SourceReader] = []

    def get(self) -> tuple[SourceReader, SourceReader]:
        if not hasattr(self._local, "pair"):
            self._local.pair = (SourceReader(self.src), SourceReader(self.out))
            with self._lock:
                self._all.extend(self._local.pair)
        return self._local.pair

    def __enter__(self) -> _LaneReaders:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self._all:
            reader.release()


def _verify_expert(kind: SourceKind, readers: _LaneReaders, layer: int, proj: str, expert: int, scale: torch.Tensor,
                   padded_i: int) -> ExpertResult:
    src, out = readers.get()
    name = f"{fmt.layer_prefix(layer)}{proj}.weight"
    try:
        want = kind.reference_rows(src, layer, proj, expert)
        stored = out.slice(name)[expert]
        return compare_expert(want, stored, scale, proj, padded_i, f"{name}[{expert}]")
    finally:
        src.release()  # keeps RSS flat: see SourceReader.release
        out.release()


def _check_experts(kind: SourceKind, readers: _LaneReaders, out: SourceReader, layer: int, proj: str,
                   layout: fmt.Layout, pool: ThreadPoolExecutor, row: LayerRow, report: VerificationReport,
                   progress: Progress | None = None, lanes: int = LANES) -> int:
    """Every expert of one projection, ``lanes`` at a time (one expert per lane in memory);
    returns the number of inexact values."""
    tick = progress.update if progress is not None else (lambda _count: None)
    name = f"{fmt.layer_prefix(layer)}{proj}"
    scales = out.get(f"{name}.scale").clone()
    tick(scales.numel() * 4)
    weight = out.source.tensors[f"{name}.weight"][1]
    per_expert = weight.nbytes // max(1, weight.shape[0])
    row.tensors += 2
    in_flight: list[Future[ExpertResult]] = []
    inexact = 0
    for expert in range(readers.src.dims.num_local_experts):
        if len(in_flight) == lanes:
            result = in_flight.pop(0).result()
            inexact += result.inexact
            _add(row, result, report)
            tick(per_expert)
        in_flight.append(pool.submit(_verify_expert, kind, readers, layer, proj, expert, scales[expert, 0],
                                     layout.padded_intermediate_size))
    for future in in_flight:
        result = future.result()
        inexact += result.inexact
        _add(row, result, report)
        tick(per_expert)
    return inexact


def _normalized_index(path: str) -> bool:
    """Whether ``path`` holds an index of the normalized format (a converted checkpoint)."""
    try:
        index = read_json(os.path.join(path, fmt.INDEX_FILE), fmt.INDEX_FILE)
    except ConversionError:
        return False
    metadata = index.get("metadata") if isinstance(index, dict) else None
    return isinstance(metadata, dict) and metadata.get("format") == fmt.FORMAT_NAME


def swapped_arguments_hint(out: str | os.PathLike[str], source: str | os.PathLike[str]) -> str | None:
    """A one-line hint when the arguments cannot be what ``verify-conversion`` compares: ``out``
    a compiled NxDI model directory (what it is, and ``validate`` for it), or ``source`` a
    converted checkpoint — swapped (with the command that works) only when ``out`` is a source
    the converter reads, else what ``out`` is (``recognize``)."""
    from ..recognize import compiled_model_dir, recognize

    out, source = os.fspath(out), os.fspath(source)
    if compiled_model_dir(out) is not None:
        return (f"{out} is a compiled NxDI model directory, not a converted checkpoint: check it with "
                f"`nxdi-gptoss-fp8 validate {out}`; verify-conversion compares a converted checkpoint with the "
                "checkpoint it was converted from (nxdi-gptoss-fp8 verify-conversion CONVERTED --source SOURCE)")
    if os.path.isdir(source) and _normalized_index(source) and not _normalized_index(out):
        found = recognize(out)
        if found.kind in KINDS:
            return (f"the arguments look swapped: {source} is a converted (normalized FP8) checkpoint and {out} is "
                    f"{found.title}; run: nxdi-gptoss-fp8 verify-conversion {source} --source {out}")
        return (f"{source} is a converted (normalized FP8) checkpoint, not a source: --source takes the checkpoint it "
                f"was converted from, and {out} is {found.title}: run nxdi-gptoss-fp8 verify-conversion {source} "
                "--source SOURCE")
    return None


def source_mismatch_hint(recorded: dict[str, Any], src: Source, given: str | None, *, out: str = "OUT",
                         option: str = "--source") -> str | None:
    """When OUT's recorded ``source`` (format, Hub repo, path) disagrees with the source given:
    one line naming what OUT (``out``) says it was converted from, and that ``option`` takes it."""
    said = []
    if isinstance(recorded.get("format"), str) and recorded["format"] != src.kind:
        said.append(f"format {recorded['format']} (this source is {src.kind})")
    repo = recorded.get("repo")
    if isinstance(repo, str) and given is not None and is_repo_id(given) and not os.path.lexists(given) and repo != given:
        said.append(f"Hub repo {repo} (you gave {given})")
    fingerprint = recorded.get("fingerprint")
    if isinstance(fingerprint, dict) and not said:
        try:
            given_fingerprint = src.fingerprint()
        except ConversionError:
            given_fingerprint = {}
        differ = [name for name in FINGERPRINT_FIELDS
                  if isinstance(fingerprint.get(name), str) and fingerprint[name] != given_fingerprint.get(name)]
        if differ:
            said.append(f"a source whose {', '.join(FINGERPRINT_PARTS[name] for name in differ)} differ from those of "
                        f"{src.root} (recorded {', '.join(f'{n} {str(fingerprint[n])[:12]}…' for n in differ)})")
    if not said:
        return None
    revision = f" at {recorded['revision']}" if isinstance(recorded.get("revision"), str) else ""
    return (f"hint: {out} records that it was converted from {'; '.join(said)}{revision}: pass that source with {option}, "
            f"or check that {out} is the conversion you meant")


@dataclass
class LayerVerdict:
    """One layer's row, its problems in the order found and its inexact count (merged into the
    report in layer order, wherever the layer was checked)."""

    row: LayerRow
    problems: list[str]
    inexact: int
    peak_rss: int = 0


def verify_layer(kind: SourceKind, src_reader: SourceReader, out_reader: SourceReader, readers: _LaneReaders,
                 pool: ThreadPoolExecutor, lanes: int, layer: int, layout: fmt.Layout,
                 progress: Progress | None = None) -> LayerVerdict:
    """Every tensor of one layer: the non-expert ones bit for bit, the biases, then every expert
    ``lanes`` at a time on ``pool``. Runs here or in a worker process alike (there without
    ``progress``: the main process counts whole layers)."""
    namespace = fmt.expected_namespace(layout)
    row, found = LayerRow(str(layer)), VerificationReport(out="", source="")
    prefix = fmt.layer_prefix(layer)
    for hf_name, name in non_expert_names(layout.dims).items():
        if name.startswith(prefix):
            _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, row, found)
            if progress is not None:
                progress.update(namespace[name].nbytes)
    _check_biases(kind, src_reader, out_reader, layer, layout, row, found)
    if progress is not None:
        progress.update(namespace[f"{prefix}{fmt.GATE_UP}.bias"].nbytes + namespace[f"{prefix}{fmt.DOWN}.bias"].nbytes)
    inexact = sum(_check_experts(kind, readers, out_reader, layer, proj, layout, pool, row, found, progress, lanes)
                  for proj in (fmt.GATE_UP, fmt.DOWN))
    return LayerVerdict(row, found.problems, inexact)


@dataclass
class _VerifyJob:
    """What every verification worker is set up with (pickled once per process)."""

    src: Source
    output: Source
    layout: fmt.Layout
    lanes: int


_WORKER: dict[str, Any] = {}  # a verification worker's job, readers and lanes, kept from layer to layer


def _setup_verify(job: _VerifyJob) -> None:
    _WORKER["job"] = job


def _verify_layer_in_worker(layer: int) -> LayerVerdict:
    job: _VerifyJob = _WORKER["job"]
    if "pool" not in _WORKER:
        _WORKER.update(pool=ThreadPoolExecutor(max_workers=job.lanes, thread_name_prefix="verify"),
                       readers=_LaneReaders(job.src, job.output))
    with SourceReader(job.src) as src_reader, SourceReader(job.output) as out_reader:
        verdict = verify_layer(source_kind(job.src), src_reader, out_reader, _WORKER["readers"], _WORKER["pool"],
                               job.lanes, layer, job.layout)
    verdict.peak_rss = peak_rss()
    return verdict


def recorded_source(out_path: str) -> dict[str, Any]:
    """The ``source`` provenance the converter recorded in the output's index, if readable."""
    try:
        index = read_json(os.path.join(out_path, fmt.INDEX_FILE), fmt.INDEX_FILE)
    except ConversionError:
        return {}
    metadata = index.get("metadata") if isinstance(index, dict) else None
    recorded = metadata.get("source") if isinstance(metadata, dict) else None
    return recorded if isinstance(recorded, dict) else {}


def verify_conversion(out: str | os.PathLike[str], source: str | os.PathLike[str], *,
                      progress: bool = False, gate_up_split: str | None = None,
                      given_source: str | None = None, workers: int | None = None) -> VerificationReport:
    """Compare the converted checkpoint ``out`` with its ``source``, value by value.

    ``gate_up_split`` (compressed-tensors sources whose files cannot tell it) defaults to the
    split the converter recorded in ``out``. ``progress`` shows a bar on a terminal and a plain
    line every few seconds elsewhere. ``given_source`` is what the user named (a Hub id, say)
    for the hint when OUT records another source. ``workers``: experts compared at once, layers
    in parallel processes as ``convert`` spreads them (None: the CPUs the host offers, bounded by
    memory); the report is the same whatever the count. Returns a ``VerificationReport``
    (``report.ok`` is the verdict, ``render_text()`` the per-layer table). Raises
    ``ConversionError`` when ``source`` is not a supported GPT-OSS checkpoint, or is the
    converted one (arguments swapped); ``OSError`` naming the file when a file of ``out`` cannot
    be read. Reads both checkpoints fully, one expert per lane at a
    time. Example::

        report = verify_conversion("gpt-oss-120b-fp8", "gpt-oss-120b")
        print(report.render_text())
    """
    refuse_in_worker_start()
    out_path = os.path.abspath(os.fspath(out))
    swapped = swapped_arguments_hint(out_path, source)
    if swapped:
        raise ConversionError(swapped)
    recorded = recorded_source(out_path)
    stated = recorded.get("gate_up_split") if recorded.get("format") == SOURCE_COMPRESSED_TENSORS else None
    # the split OUT records applies to a compressed-tensors source only: any other source given
    # gets the "OUT records …" hint, not a refusal of an option the user never passed
    src = open_source(source, gate_up_split=gate_up_split,
                      recorded_gate_up_split=stated if isinstance(stated, str) else None)
    kind = source_kind(src)
    report = VerificationReport(out=out_path, source=src.root, source_format=src.kind)
    hint = source_mismatch_hint(recorded, src, given_source if given_source is not None else os.fspath(source))
    checked = preflight(out_path, allow_custom_model=True)
    unreadable = next((f for f in checked.errors if f.code == "filesystem.unreadable"), None)
    if unreadable is not None:  # an I/O error on OUT, not a verdict on the conversion
        where = os.path.join(out_path, unreadable.file) if unreadable.file else out_path
        raise OSError(errno.EIO, unreadable.message.split(": ", 1)[-1], where)
    if not checked.ok:
        for finding in checked.errors:
            report.note(f"preflight: {finding.code}: {finding.message}")
        return report
    view = checked.view
    layout = view.layout
    if view.dims != src.dims:
        if hint:
            report.note(hint, counts=False)
        report.note(f"dimensions differ: output {view.dims}, source {src.dims}: not a conversion of this source")
        return report
    namespace = fmt.expected_namespace(layout)
    renames = non_expert_names(src.dims)
    exactness = recorded.get("exactness")
    try:
        plan = plan_workers(workers, layout, src.kind)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    if plan.note:
        logger.warning("verify-conversion: %s", plan.note)
    bar = Progress(sum(spec.nbytes for spec in namespace.values()), f"verify 0/{src.dims.num_hidden_layers} layers",
                   show=None if progress else False)
    output = _output_source(out_path, view)
    layers = range(src.dims.num_hidden_layers)
    with bar, SourceReader(src) as src_reader, SourceReader(output) as out_reader, \
            _LaneReaders(src, output) as readers, ThreadPoolExecutor(max_workers=plan.lanes, thread_name_prefix="verify") as pool, single_threaded_torch():
        global_row = LayerRow("global")

        def check_globals() -> None:
            for hf_name, name in renames.items():
                if not name.startswith("layers."):
                    _check_non_expert(src_reader, out_reader, hf_name, name, namespace[name].shape, global_row, report)
                    bar.update(namespace[name].nbytes)
            report.rows.append(global_row)

        layer_bytes = [sum(spec.nbytes for name, spec in namespace.items() if name.startswith(fmt.layer_prefix(layer)))
                       for layer in layers]
        if plan.processes == 1:
            check_globals()
            verdicts = []
            for layer in layers:
                verdicts.append(verify_layer(kind, src_reader, out_reader, readers, pool, plan.lanes, layer, layout,
                                             bar))
                bar.set_description(f"verify {layer + 1}/{src.dims.num_hidden_layers} layers")
        else:  # the layers in worker processes, the globals here meanwhile; progress by whole layers
            counted = [0]

            def layers_done(done: int) -> None:
                while counted[0] < done:
                    bar.update(layer_bytes[counted[0]])
                    counted[0] += 1
                bar.set_description(f"verify {done}/{src.dims.num_hidden_layers} layers")

            with LayerPool(plan.processes, _setup_verify, (_VerifyJob(src, output, layout, plan.lanes),)) as workers_:
                futures = [workers_.submit(_verify_layer_in_worker, layer) for layer in layers]
                check_globals()
                verdicts = workers_.gather(futures, layers_done)
        for verdict in verdicts:  # in layer order: the report does not depend on the workers
            report.rows.append(verdict.row)
            for message in verdict.problems:
                report.note(message, counts=False)
        inexact_total = sum(verdict.inexact for verdict in verdicts)
    if (src.kind != SOURCE_BF16 and isinstance(exactness, dict)
            and exactness.get("inexact_values") != inexact_total):
        report.note(f"the converter recorded inexact_values={exactness.get('inexact_values')!r} in the index, "
                    f"verification found {plural(inexact_total, 'inexact value')}")
    if hint and not report.ok:
        report.problems.insert(0, hint)
    return report
