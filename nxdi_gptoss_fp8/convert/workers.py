"""Layers in parallel: how many workers a host offers, and the worker processes that convert
(or verify) one layer at a time each.

``--workers N`` is how many experts are encoded (or compared) at once: ``N`` lanes (threads)
in this process for N < 4, else ``min(⌊N/2⌋, layers)`` worker processes, fewer when memory
is short, each taking one layer at a time with ``N // processes`` lanes (at most 8). Two
threads in one process did as well as two processes on a 2-core machine (a process costs
its start, ≈ 2 CPU-seconds of importing torch, and its own mappings); beyond that, processes
scale where one process would not: each has its own GIL, its own source reader (whose
releases unmap pages only it uses) and its own write thread, so nothing is shared but the
page cache. They are spawned (a fresh interpreter each: no forked locks or OpenMP state)
once per run. ``scripts/bench_convert.py --workers 1 2`` measures the alternatives.

Every worker writes its tensors at the offsets the main process's ``CheckpointWriter``
planned before any worker started, into the writer's hidden partial directory, and never
creates a file; the main process merges the results in layer order. The shard plan, the
offsets and the merge order never depend on which worker finishes first, so the output is
byte-identical to a one-worker run. Workers ignore SIGINT (the main process handles Ctrl-C
and ends them), are ended when the main process ends, and are killed at once when anything
fails: the writer then removes its partial directory, and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import resource
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import format as fmt
from ..errors import ConversionError
from ..interrupts import interrupts_held
from ..machine import available_memory, host_cpus
from ..units import format_bytes, plural
from ..writer import CheckpointWriter, PlannedTensor, planned_bytes, pwrite_all

__all__ = [
    "BF16_EXPERT_COPIES", "COPY_BYTES", "LANES_BEFORE_PROCESSES", "LANE_EXPERT_COPIES", "MAX_LANES",
    "MAX_WORKERS", "MIN_PARALLEL_BYTES", "POLL_SECONDS", "PROCESS_BYTES", "ConversionWorkers", "ConvertJob",
    "LayerOutcome", "LayerPool", "ShardFiles", "SharedProgress", "T", "WorkerPlan",
    "check_workers", "lane_buffers", "peak_rss", "plan_workers", "process_bytes",
    "refuse_in_worker_start", "sigint_blocked",
]

MAX_WORKERS = 1024
MAX_LANES = 8  # per process: its one loader and one write thread feed them
# Lanes a process takes before another process starts: two threads in one process matched or
# beat two processes here (scripts/bench_convert.py --workers 1 2 4: a process costs ≈ 2 s of
# CPU to start and its own mappings); more processes scale past one GIL, loader and writer.
LANES_BEFORE_PROCESSES = 2
# Peak RSS of one process, measured on gpt-oss-120b layers (scripts/bench_convert.py): the
# interpreter with torch and this package (≈ 245 MB) plus allocator slack, the non-expert
# copy's two chunks, and per lane its output buffers and in-flight source experts.
PROCESS_BYTES = 320 << 20
COPY_BYTES = 64 << 20
LANE_EXPERT_COPIES = 3  # output buffers of both shapes plus the source expert in flight, per lane
BF16_EXPERT_COPIES = 4  # BF16 sources: as above, the source expert in flight at 2 bytes a value
POLL_SECONDS = 0.2
# By default, models smaller than this are converted in one process: a worker's start (an
# interpreter importing torch, ≈ 1.4 s here) costs more than the whole conversion.
MIN_PARALLEL_BYTES = 1 << 30

T = TypeVar("T")


# --------------------------------------------------------------------------- the worker count


def check_workers(value: object) -> int:
    """``value`` as a worker count: an integer from 1 to ``MAX_WORKERS``; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {value!r}")
    return value


# --------------------------------------------------------------------------- the plan


def lane_buffers(lanes: int) -> int:
    """Output buffers for ``lanes`` compute threads: one more, so that a full buffer is written
    while the next expert is encoded (with one buffer per thread, a lone thread would wait for
    every write)."""
    return lanes + 1


def process_bytes(layout: fmt.Layout, kind: str, lanes: int) -> int:
    """Estimated peak RSS of one process converting or verifying layers of ``layout`` from a
    ``kind`` source with ``lanes`` compute lanes (the largest expert dominates)."""
    hp, ip = layout.padded_hidden_size, layout.padded_intermediate_size
    expert = hp * 2 * ip  # gate_up [H', 2I'] FP8 values, the largest expert tensor
    copies = BF16_EXPERT_COPIES if kind == "hf-bf16" else LANE_EXPERT_COPIES
    work = lane_buffers(lanes) * copies * expert
    return PROCESS_BYTES + COPY_BYTES + work


@dataclass(frozen=True)
class WorkerPlan:
    """How a run is spread: ``workers`` experts at once, as ``processes`` processes (1: all in
    this one) of ``lanes`` compute lanes each; ``note`` says why, when fewer than asked for or
    offered."""

    workers: int
    processes: int
    lanes: int
    process_bytes: int
    note: str | None = None

    def describe(self) -> str:
        where = (f"{plural(self.lanes, 'lane')} in this process" if self.processes == 1
                 else f"{plural(self.processes, 'process', 'processes')} × {plural(self.lanes, 'lane')}")
        return f"{plural(self.workers, 'worker')} ({where}, ≈ {format_bytes(self.process_bytes)} peak RSS per process estimated)"


def plan_workers(requested: int | None, layout: fmt.Layout, kind: str, *,
                 cpus: tuple[int, str] | None = None,
                 memory: tuple[int | None, str] | None = None) -> WorkerPlan:
    """The plan for ``requested`` workers (None: the CPUs the host offers): one process per
    ``LANES_BEFORE_PROCESSES`` lanes (fewer than twice that: all in this process), at most one
    process per layer and ``MAX_LANES`` lanes per process, no more than the available memory holds,
    and one process for a model smaller than ``MIN_PARALLEL_BYTES`` unless ``requested``
    (``cpus`` and ``memory`` default to ``host_cpus()`` and ``available_memory()``). Raises
    ``ValueError`` for a bad count."""
    cpus = cpus or host_cpus()
    if requested is None:
        workers, source = min(cpus[0], MAX_WORKERS), cpus[1]
    else:
        workers, source = check_workers(requested), "asked for"
    processes = min(max(1, workers // LANES_BEFORE_PROCESSES), max(1, layout.dims.num_hidden_layers))
    if requested is None and fmt.expected_total_size(layout) < MIN_PARALLEL_BYTES:
        processes = 1  # a small model: starting workers would take longer than converting it here

    def lanes_for(count: int) -> int:
        return min(MAX_LANES, max(1, workers // count))

    def needs(count: int, lanes: int) -> int:  # this process too, when it only copies the globals
        return count * process_bytes(layout, kind, lanes) + (process_bytes(layout, kind, 1) if count > 1 else 0)

    lanes = lanes_for(processes)
    available, where = memory or available_memory()
    note = None
    if available is not None and needs(processes, lanes) > available:
        # as many processes as fit with one lane each (a layer each), then as many lanes as fit
        fits = next((count for count in range(processes, 0, -1) if needs(count, 1) <= available), 1)
        fit_lanes = next((n for n in range(lanes_for(fits), 0, -1) if needs(fits, n) <= available), 1)
        if (fits, fit_lanes) != (processes, lanes):
            note = (f"{plural(workers, 'worker')} ({source}) run as {plural(fits, 'process', 'processes')} × "
                    f"{plural(fit_lanes, 'lane')} to fit in memory: ≈ "
                    f"{format_bytes(process_bytes(layout, kind, fit_lanes))} peak RSS per process, "
                    f"{format_bytes(available)} available ({where})")
            processes, lanes = fits, fit_lanes
    if note is None and requested is not None and processes * lanes < workers:  # capped: said, never silent
        note = (f"{plural(workers, 'worker')} asked for, {processes * lanes} run ({plural(processes, 'process', 'processes')}"
                f" × {plural(lanes, 'lane')}): the same lanes in every process, at most one process per layer "
                f"({plural(layout.dims.num_hidden_layers, 'layer')}) and {MAX_LANES} lanes per process")
    return WorkerPlan(workers=processes * lanes, processes=processes, lanes=lanes,
                      process_bytes=process_bytes(layout, kind, lanes), note=note)


# --------------------------------------------------------------------------- worker processes


def refuse_in_worker_start() -> None:
    """Raise ``ConversionError`` when called while a worker process starts: a script that calls
    ``convert`` at module level, outside ``if __name__ == "__main__":``, runs that call again
    in every spawned worker, which must stop before it writes anything."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConversionError("called while a worker process starts: put the call under "
                              "`if __name__ == \"__main__\":` (worker processes re-import the main script)")


def peak_rss() -> int:
    """This process's peak RSS in bytes (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _end_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when the process that started it ends (Linux), so a
    killed conversion leaves no worker writing into its partial directory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(1)


def _start_worker(parent: int, setup: Callable[..., None], args: tuple[Any, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process decides
    _end_with_parent(parent)
    import torch

    torch.set_num_threads(1)  # the lanes are the parallelism (see output.single_threaded_torch)
    setup(*args)


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while a helper process is started inside: Ctrl-C reaches
    the whole process group, and a process still importing (before it ignores SIGINT) would
    print a multiprocessing traceback. The blocked mask survives the exec, and the pending
    SIGINT is dropped once the process ignores it (``_start_worker``; multiprocessing's
    resource tracker does the same). Here the block lasts only for the start: a Ctrl-C
    meanwhile reaches this process right after."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _QuietStartProcess(multiprocessing.context.SpawnProcess):
    """A spawned worker started with SIGINT blocked (``sigint_blocked``)."""

    def start(self) -> None:
        with sigint_blocked():
            super().start()


class _QuietStartContext(multiprocessing.context.SpawnContext):
    Process = _QuietStartProcess


class LayerPool:
    """``processes`` spawned worker processes, each set up once with ``setup(*args)`` (a
    module-level function: it is pickled by name). Leaving the block normally waits for them;
    leaving it by an exception (Ctrl-C included) kills them at once."""

    def __init__(self, processes: int, setup: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._executor = ProcessPoolExecutor(processes, mp_context=_QuietStartContext(),
                                             initializer=_start_worker, initargs=(os.getpid(), setup, args))

    def __enter__(self) -> LayerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self._executor.shutdown(wait=True)
        else:
            self.kill()

    def kill(self) -> None:
        """End every worker now (they hold nothing worth saving) and wait until they are gone."""
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                process.kill()
        for process in processes:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                process.join(timeout=10)

    def submit(self, function: Callable[[int], T], layer: int) -> Future[T]:
        """Queue ``layer``; a worker process may start here, with interruptions held until it
        is started and registered (``interrupts_held``): one cut off while receiving its start
        data would print a multiprocessing traceback, and one not registered would not be killed."""
        with interrupts_held():
            return self._executor.submit(function, layer)

    def gather(self, futures: list[Future[T]], poll: Callable[[int], None]) -> list[T]:
        """The results in submission order; ``poll(done)`` runs every ``POLL_SECONDS`` while
        waiting. The first failure is raised as soon as it happens (its original exception; a
        worker killed from outside, e.g. out of memory, as a ``ConversionError``)."""
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    future.result()
                except BrokenProcessPool:
                    raise ConversionError(
                        "a worker process ended abruptly (killed; out of memory: try fewer workers; or, from a "
                        "Python script, a call not under `if __name__ == \"__main__\":`, which the spawned "
                        "workers re-import); nothing was written") from None
            poll(len(futures) - len(pending))
        return [future.result() for future in futures]


# --------------------------------------------------------------------------- conversion workers


class SharedProgress:
    """Bytes written by every worker, summed in shared memory for the main process's bar (the
    ``bar`` a worker's ``Output`` updates)."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter

    def update(self, size: int) -> None:
        with self.counter.get_lock():
            self.counter.value += size


class ShardFiles:
    """A worker's side of the ``CheckpointWriter``: the planned tensors, written with ``put``
    at their offsets into the shard files the main process created (opened for writing, never
    created: once the partial directory is gone, a write fails instead of leaving a file)."""

    def __init__(self, tmp: str, planned: Mapping[str, PlannedTensor]) -> None:
        self.tmp, self.planned = tmp, planned
        self.written: dict[str, int] = {}
        self._fds: dict[str, int] = {}

    def put(self, name: str, data: Any, *, offset: int = 0) -> None:
        planned, raw = planned_bytes(self.planned, name, data, offset)
        if planned.shard not in self._fds:
            self._fds[planned.shard] = os.open(os.path.join(self.tmp, planned.shard), os.O_WRONLY | os.O_CLOEXEC)
        try:
            pwrite_all(self._fds[planned.shard], raw, planned.offset + offset)
        except OSError as exc:  # the file being written named (a pwrite error names none)
            exc.filename = exc.filename or os.path.join(self.tmp, planned.shard)
            raise
        self.written[name] = self.written.get(name, 0) + raw.nbytes


@dataclass
class LayerOutcome:
    """What a worker did with one layer: per-projection exactness, bytes per tensor, and its
    process's peak RSS so far."""

    layer: int
    stats: list[Any]
    written: dict[str, int]
    bytes: int
    fp8_bytes: int
    peak_rss: int

    def record(self, writer: CheckpointWriter, output: Any) -> None:
        """Count this layer's bytes as written, in the writer's completeness check and the report."""
        for name, size in self.written.items():
            writer.mark_written(name, size)
        output.bytes += self.bytes
        output.fp8_bytes += self.fp8_bytes


@dataclass
class ConvertJob:
    """What every conversion worker is set up with (pickled once per process)."""

    source: Any
    kind: Any  # the source's SourceKind (stateless, pickled by class)
    layout: fmt.Layout
    tmp: str
    planned: dict[str, PlannedTensor]
    by_layer: dict[int, list[tuple[str, str]]]
    lanes: int
    progress: Any = None


_WORKER: dict[str, Any] = {}  # a conversion worker's job and its pools, kept from layer to layer


def _setup_convert(job: ConvertJob) -> None:
    _WORKER["job"] = job


def _convert_layer(layer: int) -> LayerOutcome:
    """One layer in a worker, through the same ``layer.convert_layer`` a one-process run uses."""
    from .layer import convert_layer
    from .output import Output, Workspace
    from .source import SourceReader

    job: ConvertJob = _WORKER["job"]
    if "shards" not in _WORKER:
        compute = ThreadPoolExecutor(job.lanes, thread_name_prefix="convert-encode")
        _WORKER.update(write=ThreadPoolExecutor(1, thread_name_prefix="convert-write"),
                       workspace=Workspace(compute, lanes=lane_buffers(job.lanes)), shards=ShardFiles(job.tmp, job.planned))
    shards: ShardFiles = _WORKER["shards"]
    shards.written = {}
    output = Output(shards, SharedProgress(job.progress), _WORKER["write"])  # type: ignore[arg-type]
    with SourceReader(job.source) as reader:
        stats = convert_layer(job.kind, reader, output, job.layout, _WORKER["workspace"],
                              job.by_layer[layer], layer)
    return LayerOutcome(layer, stats, dict(shards.written), output.bytes, output.fp8_bytes, peak_rss())


class ConversionWorkers:
    """The worker processes of one conversion, around its ``CheckpointWriter`` (whose partial
    directory and plan they write into); a progress bar follows the bytes they write."""

    def __init__(self, plan: WorkerPlan, source: Any, kind: Any, layout: fmt.Layout, writer: CheckpointWriter,
                 by_layer: dict[int, list[tuple[str, str]]]) -> None:
        assert writer.tmp is not None, "the writer's block must be entered first"
        with sigint_blocked(), interrupts_held():  # the lock may start multiprocessing's resource tracker
            self._counter = multiprocessing.get_context("spawn").Value("q", 0)
        job = ConvertJob(source, kind, layout, writer.tmp, dict(writer.planned), by_layer, plan.lanes, self._counter)
        self._pool = LayerPool(plan.processes, _setup_convert, (job,))
        self.peak_rss = 0

    def __enter__(self) -> ConversionWorkers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pool.__exit__(*exc)

    def convert(self, layers: Iterable[int], bar: Any, meanwhile: Callable[[], None]) -> list[LayerOutcome]:
        """Every layer of ``layers`` in the workers, ``meanwhile()`` here as they start; the
        outcomes in layer order."""
        layers = list(layers)
        futures = [self._pool.submit(_convert_layer, layer) for layer in layers]
        meanwhile()
        shown = 0

        def poll(done: int) -> None:
            nonlocal shown
            total = self._counter.value
            bar.update(total - shown)
            shown = total
            bar.set_description(f"convert {done}/{len(layers)} layers")

        outcomes = self._pool.gather(futures, poll)
        self.peak_rss = max((outcome.peak_rss for outcome in outcomes), default=0)
        return outcomes
