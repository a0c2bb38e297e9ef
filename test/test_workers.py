"""Layers in parallel worker processes: the plan (CPUs, cgroup quota, memory), byte-identical
output, the same verdicts, and nothing left behind when a worker fails or the run is interrupted."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.cli import main
from nxdi_gptoss_fp8.convert import convert, workers
from nxdi_gptoss_fp8.convert.verify import verify_conversion
from nxdi_gptoss_fp8.convert.workers import MAX_WORKERS, check_workers, plan_workers
from nxdi_gptoss_fp8.errors import ConversionError
from nxdi_gptoss_fp8.synthetic.sources import (
    SOURCE_BF16,
    SOURCE_COMPRESSED_TENSORS,
    SOURCE_DIMS,
    SOURCE_MXFP4,
    make_source,
)

REPO = Path(__file__).resolve().parent.parent
FOUR_LAYERS = dataclasses.replace(SOURCE_DIMS, num_hidden_layers=4)
LAYOUT_120B = fmt.Layout.unpadded(fmt.PROFILES[fmt.PROFILE_120B])
GIB = 1 << 30
PROGRESS_LINE = re.compile(r"^convert \d+/\d+ layers: ")  # the progress line a non-terminal stderr gets every few seconds


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {kind: make_source(root / kind, kind, dims=FOUR_LAYERS)
            for kind in (SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS)}


# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("value", [0, -1, MAX_WORKERS + 1, True, 2.0, "2", None])
def test_a_bad_worker_count_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=f"from 1 to {MAX_WORKERS}"):
        check_workers(value)


@pytest.mark.parametrize("requested, cpus, processes, lanes", [
    (None, 8, 4, 2),     # what the host offers, two lanes per process
    (None, 1, 1, 1),
    (2, 8, 1, 2),        # asked for: up to 3 as threads in this process ...
    (3, 8, 1, 3),
    (5, 8, 2, 2),        # ... then processes
    (96, 2, 36, 2),      # at most one process per layer (36 layers) ...
    (400, 2, 36, 8),     # ... and at most MAX_LANES lanes each
    (1, 8, 1, 1),
])
def test_the_plan_follows_cpus_and_layers(requested: int | None, cpus: int, processes: int, lanes: int) -> None:
    plan = plan_workers(requested, LAYOUT_120B, SOURCE_MXFP4, cpus=(cpus, "test"), memory=(1 << 50, "test"))
    assert (plan.processes, plan.lanes, plan.workers) == (processes, lanes, processes * lanes)
    capped = requested is not None and processes * lanes < requested  # said, never silent
    assert (plan.note is not None) == capped
    if capped:
        assert plan.note.startswith(f"{requested:,} workers asked for, {processes * lanes} run")


def test_the_plan_is_bounded_by_memory_and_says_why() -> None:
    per_process = workers.process_bytes(LAYOUT_120B, SOURCE_MXFP4, 1)
    available = 4 * per_process + per_process // 2  # this process and three workers
    plan = plan_workers(None, LAYOUT_120B, SOURCE_MXFP4, cpus=(16, "16 CPUs offered"), memory=(available, "MemAvailable"))
    assert plan.processes == 3 and plan.workers < 16
    assert plan.process_bytes * plan.processes + per_process <= available  # fits ...
    more = workers.process_bytes(LAYOUT_120B, SOURCE_MXFP4, plan.lanes + 1)
    assert more * plan.processes + per_process > available  # ... and is the most that does
    assert plan.note is not None and "16 workers (16 CPUs offered)" in plan.note and "3 processes" in plan.note
    assert "MemAvailable" in plan.note and "available" in plan.note
    squeezed = plan_workers(8, LAYOUT_120B, SOURCE_BF16, cpus=(8, "x"), memory=(1, "the cgroup"))
    assert (squeezed.processes, squeezed.lanes) == (1, 1) and squeezed.note is not None


def test_a_small_model_stays_in_one_process_unless_asked() -> None:
    tiny = fmt.Layout.unpadded(SOURCE_DIMS)
    assert plan_workers(None, tiny, SOURCE_MXFP4, cpus=(8, "x"), memory=(1 << 40, "x")).processes == 1
    assert plan_workers(4, tiny, SOURCE_MXFP4, cpus=(8, "x"), memory=(1 << 40, "x")).processes == 2


# --------------------------------------------------------------------------- same output, same verdict


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS])
def test_two_workers_write_the_same_bytes_as_one(sources: dict[str, Path], tmp_path: Path, kind: str) -> None:
    one = convert(sources[kind], tmp_path / "one", max_shard_size="40KB", progress=False, workers=1)
    two = convert(sources[kind], tmp_path / "two", max_shard_size="40KB", progress=False, workers=4)
    assert "2 processes" in two.workers and "in this process" in one.workers
    assert two.peak_rss_per_process > 0
    digests = tree_digest(tmp_path / "one")
    assert digests == tree_digest(tmp_path / "two")  # shards, index (metadata included), config
    assert len([name for name in digests if name.endswith(".safetensors")]) > 2
    assert one.experts == two.experts and (one.bytes_written, one.fp8_bytes) == (two.bytes_written, two.fp8_bytes)


def _poke(out: Path, name: str, data: bytes, at: int) -> None:
    from nxdi_gptoss_fp8.safeio.safetensors_header import read_header

    index = json.loads((out / fmt.INDEX_FILE).read_text())
    shard = out / index["weight_map"][name]
    header = read_header(shard)
    with open(shard, "r+b") as handle:
        handle.seek(header.data_offset + header.tensors[name].begin + at)
        handle.write(data)


def test_two_workers_give_the_same_verdict_as_one(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert(sources[SOURCE_BF16], out, progress=False, workers=1)
    clean = [verify_conversion(out, sources[SOURCE_BF16], workers=count).to_dict() for count in (1, 4)]
    assert clean[0] == clean[1] and clean[0]["ok"]
    for layer in (0, 3, 2):
        _poke(out, f"layers.{layer}.{fmt.DOWN}.weight", b"\x7f", 17 + layer)  # NaN
        _poke(out, f"layers.{layer}.self_attn.learned_sinks.sink", b"\x01", 0)
    broken = [verify_conversion(out, sources[SOURCE_BF16], workers=count) for count in (1, 4)]
    assert broken[0].to_dict() == broken[1].to_dict()
    assert not broken[1].ok and len(broken[1].problems) == 6
    assert [row.layer for row in broken[1].rows] == ["global", "0", "1", "2", "3"]


# --------------------------------------------------------------------------- failures


FAULTY = """
    import multiprocessing, os, signal, sys, time
    from nxdi_gptoss_fp8.convert.kinds import hf_mxfp4
    from nxdi_gptoss_fp8.errors import ConversionError

    real = hf_mxfp4._projection

    def faulty(reader, layer, *args, **kwargs):
        if layer == 2 and multiprocessing.parent_process() is not None:  # only in a worker process
            mode = os.environ["FAULT"]
            if mode == "raise":
                raise ConversionError("model.layers.2.mlp.experts.gate_up_proj_scales[0]: injected fault")
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(120)
        return real(reader, layer, *args, **kwargs)

    hf_mxfp4._projection = faulty  # runs in every spawned worker too: they import this file as __mp_main__

    if __name__ == "__main__":
        from nxdi_gptoss_fp8.cli import main
        sys.exit(main(sys.argv[1:]))
"""


def _faulty_run(tmp_path: Path, source: Path, fault: str) -> subprocess.Popen[str]:
    script = tmp_path / "faulty.py"
    script.write_text(textwrap.dedent(FAULTY))
    env = {**os.environ, "FAULT": fault,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(script), "convert", str(source), str(tmp_path / "run" / "out"),
                             "--workers", "4"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _session_processes(session: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(int(entry))
    return found


def _gone(session: int) -> bool:
    deadline = time.monotonic() + 10
    while _session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _session_processes(session)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("fault, message", [
    ("raise", "gate_up_proj_scales[0]: injected fault"),
    ("kill", "a worker process ended abruptly"),
])
def test_a_failure_in_a_worker_leaves_nothing_and_says_one_line(sources: dict[str, Path], tmp_path: Path,
                                                                fault: str, message: str) -> None:
    (tmp_path / "run").mkdir()
    run = _faulty_run(tmp_path, sources[SOURCE_MXFP4], fault)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    lines = [line for line in err.splitlines() if not PROGRESS_LINE.match(line)]  # a slow host prints progress
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
    assert list((tmp_path / "run").iterdir()) == []  # no OUT, no hidden partial directory
    assert _gone(run.pid), "worker processes outlived the run"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)])
def test_a_signal_ends_the_workers_and_leaves_nothing(sources: dict[str, Path], tmp_path: Path, signum: int,
                                                      to_group: bool) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it), and SIGTERM or SIGHUP
    to the main process alone (kill, timeout, docker stop): the workers end, nothing is left,
    and the one sentence names the signal."""
    (tmp_path / "run").mkdir()
    run = _faulty_run(tmp_path, sources[SOURCE_MXFP4], "sleep")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_session_processes(run.pid)) < 3:  # this run and its 2 workers
        time.sleep(0.1)
    time.sleep(1.0)  # layer 2's worker is asleep, the others are done
    assert list((tmp_path / "run").iterdir()), "the partial directory exists while converting"
    if to_group:
        os.killpg(run.pid, signum)  # what a terminal's Ctrl-C does: the whole process group
    else:
        os.kill(run.pid, signum)
    _, err = run.communicate(timeout=60)
    lines = [line for line in err.splitlines() if not PROGRESS_LINE.match(line)]
    assert run.returncode == 128 + signum and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"nxdi-gptoss-fp8 convert: interrupted by {signal.Signals(signum).name}")
    assert lines[0].endswith(f"the partial output was removed and OUT is as it was before the run (exit {128 + signum})")
    assert list((tmp_path / "run").iterdir()) == []
    assert _gone(run.pid), "worker processes outlived the run"


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


SLOW_START = """
import os, sys, time
if "--multiprocessing-fork" in sys.orig_argv and "resource_tracker" not in " ".join(sys.orig_argv):
    open(os.path.join(os.environ["STARTING_DIR"], str(os.getpid())), "w").close()
    time.sleep(float(os.environ["STARTING_SECONDS"]))  # a worker still starting (importing)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_while_a_worker_starts_prints_only_the_sentence(sources: dict[str, Path], tmp_path: Path) -> None:
    """A real SIGINT to the whole process group (a terminal's Ctrl-C) while a spawned worker is
    still starting (held in its interpreter's start-up by a ``sitecustomize``): no multiprocessing
    traceback from it, only the command's one sentence (what was interrupted, what was cleaned
    up, the exit code), and nothing left behind."""
    (tmp_path / "run").mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "starting").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_START)
    env = {**os.environ, "STARTING_DIR": str(tmp_path / "starting"), "STARTING_SECONDS": "3",
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen([sys.executable, "-m", "nxdi_gptoss_fp8", "convert", str(sources[SOURCE_MXFP4]),
                            str(tmp_path / "run" / "out"), "--workers", "4"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "starting").iterdir()) and run.poll() is None:
        time.sleep(0.01)
    assert list((tmp_path / "starting").iterdir()), "no worker process started"
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=60)
    lines = [line for line in err.splitlines() if not PROGRESS_LINE.match(line)]
    assert run.returncode == 130 and "Traceback" not in err, err
    assert lines == ["nxdi-gptoss-fp8 convert: interrupted by SIGINT (Ctrl-C): the partial output was removed and "
                     "OUT is as it was before the run (exit 130)"], err
    assert list((tmp_path / "run").iterdir()) == []
    assert _gone(run.pid), "worker processes outlived the run"


# In the main process: after a worker process is spawned and before it is sent its start data
# (the window a signal used to cut in half), mark the moment and, with PARENT_SECONDS, stay there.
PARENT_IN_START = """
import os, time
from multiprocessing import util
_spawn = util.spawnv_passfds
def spawnv_passfds(path, args, passfds):
    pid = _spawn(path, args, passfds)
    if "--multiprocessing-fork" in args:
        open(os.path.join(os.environ["STARTING_DIR"], str(pid)), "w").close()
        time.sleep(float(os.environ.get("PARENT_SECONDS", "0")))
    return pid
util.spawnv_passfds = spawnv_passfds
"""


def _run_marking_starts(sources: dict[str, Path], tmp_path: Path, parent_seconds: float) -> subprocess.Popen[str]:
    for name in ("run", "site", "starting"):
        (tmp_path / name).mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PARENT_IN_START)
    env = {**os.environ, "STARTING_DIR": str(tmp_path / "starting"), "PARENT_SECONDS": str(parent_seconds),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "nxdi_gptoss_fp8", "convert", str(sources[SOURCE_MXFP4]),
                             str(tmp_path / "run" / "out"), "--workers", "4"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _assert_only_the_sentence(run: subprocess.Popen[str], tmp_path: Path, signum: int) -> None:
    _, err = run.communicate(timeout=90)
    lines = [line for line in err.splitlines() if not PROGRESS_LINE.match(line)]
    name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    assert run.returncode == 128 + signum and "Traceback" not in err, err
    assert lines == [f"nxdi-gptoss-fp8 convert: interrupted by {name}: the partial output was removed and "
                     f"OUT is as it was before the run (exit {128 + signum})"], err
    assert list((tmp_path / "run").iterdir()) == []
    assert _gone(run.pid), "worker processes outlived the run"


def _wait_for_a_start(run: subprocess.Popen[str], tmp_path: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not list((tmp_path / "starting").iterdir()) and run.poll() is None:
        time.sleep(0.01)
    assert list((tmp_path / "starting").iterdir()), "no worker process started"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_the_main_process_starts_a_worker_prints_only_the_sentence(
        sources: dict[str, Path], tmp_path: Path, signum: int) -> None:
    """SIGTERM or SIGHUP to the main process (kill, timeout, docker stop), or Ctrl-C to the whole
    group, while the main process is between spawning a worker and sending it its start data:
    the start completes first, so no worker dies reading it (``EOFError`` in multiprocessing's
    spawn), every worker is ended, and only the command's sentence is printed."""
    run = _run_marking_starts(sources, tmp_path, parent_seconds=2)
    _wait_for_a_start(run, tmp_path)
    if signum == signal.SIGINT:
        os.killpg(run.pid, signum)
    else:
        os.kill(run.pid, signum)
    _assert_only_the_sentence(run, tmp_path, signum)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("delay, signum", [(0.0, signal.SIGTERM), (0.05, signal.SIGHUP), (0.15, signal.SIGTERM),
                                           (0.3, signal.SIGHUP), (0.6, signal.SIGTERM), (1.0, signal.SIGTERM)])
def test_a_signal_in_the_first_second_of_the_workers_prints_only_the_sentence(
        sources: dict[str, Path], tmp_path: Path, delay: float, signum: int) -> None:
    """``kill`` at several moments after the first worker process is spawned (imports,
    start data, the first layer): each time one sentence, the interruption's exit code, nothing
    left, no worker alive — never a traceback or a lost signal (a conversion that completes)."""
    run = _run_marking_starts(sources, tmp_path, parent_seconds=0)
    _wait_for_a_start(run, tmp_path)
    time.sleep(delay)
    os.kill(run.pid, signum)
    _assert_only_the_sentence(run, tmp_path, signum)


@pytest.mark.parametrize("requested, layers, expected", [(1024, 4, 32), (5, 2, 4), (9, 4, 8), (17, 2, 16)])
def test_a_capped_worker_count_is_said_never_silent(requested: int, layers: int, expected: int) -> None:
    layout = fmt.Layout.unpadded(dataclasses.replace(SOURCE_DIMS, num_hidden_layers=layers))
    plan = plan_workers(requested, layout, SOURCE_MXFP4, cpus=(2, "2 CPUs"), memory=(None, "unknown"))
    assert plan.workers == expected
    assert plan.note is not None and plan.note.startswith(f"{requested:,} workers asked for, {expected} run")


def test_an_uncapped_worker_count_has_no_note() -> None:
    layout = fmt.Layout.unpadded(FOUR_LAYERS)
    for requested in (1, 2, 3, 4, 8):
        assert plan_workers(requested, layout, SOURCE_MXFP4, cpus=(2, "2 CPUs"), memory=(None, "unknown")).note is None


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("command", ["convert", "verify-conversion"])
@pytest.mark.parametrize("value", ["0", "-3", str(MAX_WORKERS + 1), "9" * 30])
def test_cli_refuses_a_bad_worker_count(sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        command: str, value: str) -> None:
    source = str(sources[SOURCE_MXFP4])
    argv = [command, source, str(tmp_path / "out")] if command == "convert" else \
        [command, source, "--source", source]
    assert main([*argv, "--workers", value]) == 2
    err = capsys.readouterr().err
    assert f"--workers must be an integer from 1 to {MAX_WORKERS}, not {value}" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["convert", "verify-conversion"])
@pytest.mark.parametrize("value", ["2.5", "four", "", "0x4"])
def test_cli_refuses_a_worker_count_that_is_no_integer(sources: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str], command: str,
                                                       value: str) -> None:
    source = str(sources[SOURCE_MXFP4])
    argv = [command, source, str(tmp_path / "out")] if command == "convert" else [command, source, "--source", source]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--workers", value])
    assert exit_.value.code == 2 and "--workers: invalid int value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--workers", value, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["error"]["kind"] == "usage" and "--workers" in document["error"]["message"]
    assert not (tmp_path / "out").exists()


def test_cli_convert_and_verify_with_workers(sources: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    assert main(["convert", str(sources[SOURCE_MXFP4]), out, "--workers", "4"]) == 0
    shown = capsys.readouterr().out
    assert "4 workers (2 processes × 2 lanes" in shown and "measured peak RSS per process" in shown
    assert main(["verify-conversion", out, "--source", str(sources[SOURCE_MXFP4]), "--workers", "4"]) == 0
    assert "OK: every value within its bound" in capsys.readouterr().out


def test_library_refuses_a_bad_worker_count(sources: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="workers must be"):
        convert(sources[SOURCE_MXFP4], tmp_path / "out", progress=False, workers=0)
    assert not (tmp_path / "out").exists()


def test_a_script_without_a_main_guard_is_told_and_leaves_nothing(sources: dict[str, Path], tmp_path: Path) -> None:
    """Spawned workers re-import the main script: an unguarded convert() call must stop there
    before it writes anything, and the run must say what to do."""
    script = tmp_path / "unguarded.py"
    script.write_text(f"from nxdi_gptoss_fp8.convert import convert\n"
                      f"convert({str(sources[SOURCE_MXFP4])!r}, {str(tmp_path / 'run' / 'out')!r}, progress=False, "
                      "workers=4)\n")
    (tmp_path / "run").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1
    assert 'under `if __name__ == "__main__":`' in done.stderr.splitlines()[-1]
    assert list((tmp_path / "run").iterdir()) == []
