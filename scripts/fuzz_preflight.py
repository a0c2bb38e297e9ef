"""Long fuzz campaigns against the header reader, the index parser and the whole preflight.

Targets (the invariants are in ``test/support/fuzz_targets.py``):

- ``header``: one shard file of a small valid checkpoint, mutated, through ``read_header``;
- ``index``: ``model.safetensors.index.json`` mutated, through the whole preflight;
- ``preflight``: any file of the checkpoint mutated (the first input byte picks it, the
  second turns on the deep scan and checksum verification), through the whole preflight.

Engines: ``atheris`` (coverage-guided libFuzzer; seeds are the checkpoint's own files) when it
is installed, else ``hypothesis`` (bit flips, truncations, insertions, overwrites). Memory is
capped with ``resource.setrlimit``; each input has a time limit. Prints the number of inputs,
the outcome counts and the result; exit status 0 means no invariant broke.

    python scripts/fuzz_preflight.py --target header --runs 1000000
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test" / "support"))

TARGETS = ("header", "index", "preflight")
# Small documents beside the real files, so short inputs (null, [], {}) are explored from the start.
SMALL_JSON = (b"null", b"[]", b"{}", b'{"metadata": {}, "weight_map": {}}', b"0", b'""')


class Campaign:
    """Counts outcomes and runs one input of a target under a per-input deadline."""

    def __init__(self, target: str, base: Any, runs: int, timeout_s: float, report_every: int) -> None:
        import fuzz_targets

        self.ft = fuzz_targets
        self.target, self.base, self.runs = target, base, runs
        self.timeout_s, self.report_every = timeout_s, report_every
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.count = 0
        self.started = time.perf_counter()
        self.names = base.names
        self.header_path = base.scratch / "fuzz-input.safetensors"

    def one(self, data: bytes) -> None:
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        try:
            outcome = self._dispatch(data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.count += 1
        self.outcomes[outcome] += 1
        if self.count == self.runs:
            self.finish()
        elif self.count % self.report_every == 0:
            self.print_status()

    def finish(self) -> None:
        """Print the final counts (libFuzzer exits the process right after the last input)."""
        self.print_status()
        print(f"RESULT: {self.count:,} inputs, no invariant violated, no exception, no hang", flush=True)

    def _dispatch(self, data: bytes) -> str:
        if self.target == "header":
            self.header_path.write_bytes(data)
            return self.ft.run_header_reader(self.header_path)
        if self.target == "index":
            return self.ft.run_preflight(self.base, "model.safetensors.index.json", data)
        if len(data) < 2:
            return "short_input"
        name = self.names[data[0] % len(self.names)]
        flags = data[1]
        return self.ft.run_preflight(self.base, name, data[2:], deep=bool(flags & 1), verify_checksums=bool(flags & 2))

    def seeds(self) -> list[bytes]:
        files = self.base.files
        if self.target == "header":
            return [files[name] for name in self.base.shards]
        if self.target == "index":
            return [files["model.safetensors.index.json"], *SMALL_JSON]
        return [bytes([i, flags]) + content for i, name in enumerate(self.names) for flags in (0, 3)
                for content in (files[name], *SMALL_JSON)]

    def print_status(self) -> None:
        elapsed = time.perf_counter() - self.started
        top = ", ".join(f"{code}={n}" for code, n in self.outcomes.most_common(12))
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"[{self.target}] {self.count:,} inputs in {elapsed:,.0f} s ({self.count / max(elapsed, 1e-9):,.0f}/s), "
              f"{len(self.outcomes)} distinct outcomes, peak RSS {peak_mb:,.0f} MB; top: {top}", flush=True)


class InputTimeout(BaseException):
    """One input ran past the per-input limit (a hang). Not an OSError, so nothing catches it."""


def _timeout(signum: int, frame: Any) -> None:
    raise InputTimeout("one fuzz input took longer than the per-input limit")


def run_atheris(campaign: Campaign, corpus_dir: Path, max_len: int) -> None:
    import atheris

    for i, seed in enumerate(campaign.seeds()):
        (corpus_dir / f"seed-{i}").write_bytes(seed)
    argv = [sys.argv[0], str(corpus_dir), f"-runs={campaign.runs}", f"-max_len={max_len}",
            f"-rss_limit_mb={campaign_memory_mb}", "-print_final_stats=1", "-timeout=60",
            f"-artifact_prefix={corpus_dir.parent}/"]  # a failing input is saved beside the corpus
    atheris.Setup(argv, campaign.one)
    atheris.Fuzz()


def run_hypothesis(campaign: Campaign) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    ft = campaign.ft
    seeds = campaign.seeds()
    mutation = st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7).map(lambda bit: bytes([bit]))),
        st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.binary(max_size=0)),
        st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("overwrite"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
    )

    @settings(max_examples=campaign.runs, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(seeds), st.lists(mutation, min_size=1, max_size=4), st.booleans())
    def fuzz(seed: bytes, mutations: list[tuple[str, int, bytes]], near_header: bool) -> None:
        data = seed
        offset = 2 if campaign.target == "preflight" else 0
        for op, position, chunk in mutations:
            limit = ft.header_end(data[offset:]) + 16 if near_header else len(data)
            position = offset + position % max(limit, 1)
            if op == "flip":
                data = ft.flip_bit(data, 8 * position + chunk[0])
            elif op == "truncate":
                data = ft.truncate(data, position)
            elif op == "insert":
                data = ft.insert(data, position, chunk)
            else:
                data = ft.overwrite(data, position, chunk)
        campaign.one(data)

    fuzz()


campaign_memory_mb = 2048


def main() -> int:
    global campaign_memory_mb
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, default="header")
    parser.add_argument("--runs", type=int, default=100_000, help="inputs to run (default 100,000)")
    parser.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    parser.add_argument("--memory-mb", type=int, default=2048, help="address-space cap of this process (default 2048)")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="limit per input (default 10 s)")
    parser.add_argument("--workdir", help="where to write the checkpoint and corpus (default: a temporary directory)")
    args = parser.parse_args()
    campaign_memory_mb = args.memory_mb
    engine = args.engine
    if engine == "auto":
        try:
            import atheris

            engine = "atheris"
        except ImportError:
            engine = "hypothesis"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fuzz-preflight-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if engine == "atheris":
        import atheris

        with atheris.instrument_imports(include=["nxdi_gptoss_fp8"]):
            pass
    import fuzz_targets

    base = fuzz_targets.FuzzBase.create(workdir / "checkpoint") if not (workdir / "checkpoint" / "pristine").exists() \
        else fuzz_targets.FuzzBase.from_checkpoint(workdir / "checkpoint" / "pristine", workdir / "checkpoint" / "work")
    # torch (used once to write the checkpoint) reserves much address space: cap after it
    cap = args.memory_mb * 1024 * 1024 + _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _timeout)
    campaign = Campaign(args.target, base, args.runs, args.timeout_s, report_every=max(1, args.runs // 20))
    print(f"fuzzing {args.target} with {engine}: {args.runs:,} inputs, memory cap +{args.memory_mb} MB "
          f"(RLIMIT_AS {cap / 2**20:,.0f} MB), {args.timeout_s:g} s per input, workdir {workdir}", flush=True)
    if engine == "atheris":
        corpus = workdir / f"corpus-{args.target}"
        corpus.mkdir(exist_ok=True)
        max_len = max(len(seed) for seed in campaign.seeds()) + 256
        run_atheris(campaign, corpus, max_len)
    else:
        run_hypothesis(campaign)
        if campaign.count != campaign.runs:  # hypothesis may stop early
            campaign.finish()
    return 0


def _address_space() -> int:
    """Current virtual memory size of this process (Linux), so the cap is relative to it."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
