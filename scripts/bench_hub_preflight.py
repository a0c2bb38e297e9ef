"""``validate REPO_ID`` against downloading the repo whole: a sparse gpt-oss-120b-shaped checkpoint
served by a Hub protocol server on 127.0.0.1 (``test/support/hub_server.py``), read by the real
huggingface_hub client.

Ours: ``preflight(hub.hub_checkpoint(REPO_ID))`` — revision look-up, file listing, config, index,
every shard's header (in parallel), then the expert scales (in parallel). The baseline: every
file of the repo fetched whole through huggingface_hub's session (``hf_hub_url`` + ``get_session``),
streamed to nothing — a download without its disk writes, so a lower bound of ``hf download``.
Printed: requests, bytes sent by the server, wall time, and our bytes as a share of the shard
bytes. The server and both clients share this machine's CPUs.

    python scripts/bench_hub_preflight.py [--workdir DIR] [--repeat 3] [--baseline-shards N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # sparse_checkpoint
sys.path.insert(0, os.path.join(ROOT, "test", "support"))  # hub_server

REPO_ID = "bench-org/gpt-oss-120b-fp8"
COMMIT = "b" * 40


def _point_hub_at(endpoint: str) -> None:
    from hub_server import endpoint_settings

    os.environ["HF_ENDPOINT"] = endpoint
    for target, name, value in endpoint_settings(endpoint):
        setattr(target, name, value)


def _repo_requests(server: object) -> list[tuple[str, str, str | None]]:
    return [r for r in server.requests if r[1].startswith("/api/models/") or "/resolve/" in r[1]]  # type: ignore[attr-defined]


def _ours(server: object, repeat: int) -> dict:
    from nxdi_gptoss_fp8.hub import hub_checkpoint
    from nxdi_gptoss_fp8.validate.pipeline import preflight

    runs = []
    for _ in range(repeat):
        server.reset_counts()  # type: ignore[attr-defined]
        started = time.perf_counter()
        report = preflight(hub_checkpoint(REPO_ID))
        elapsed = time.perf_counter() - started
        assert report.ok, report.render_text(limit=10)
        runs.append({"seconds": elapsed, "requests": len(_repo_requests(server)),
                     "bytes_sent": server.bytes_sent, "bytes_read": report.bytes_read})  # type: ignore[attr-defined]
    return {"seconds": statistics.median(r["seconds"] for r in runs), "runs": runs,
            "requests": runs[-1]["requests"], "bytes_sent": runs[-1]["bytes_sent"], "bytes_read": runs[-1]["bytes_read"]}


def _download_whole(server: object, root: str, shards: int | None) -> dict:
    from huggingface_hub import get_session, hf_hub_url

    names = sorted(name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name)))
    weights = [name for name in names if name.endswith(".safetensors")]
    chosen = [name for name in names if not name.endswith(".safetensors")] + weights[:shards]
    session = get_session()
    follow = {"follow_redirects": True} if type(session).__module__.startswith("httpx") else {}
    server.reset_counts()  # type: ignore[attr-defined]
    started = time.perf_counter()
    for name in chosen:
        url = hf_hub_url(REPO_ID, name, revision=COMMIT)
        if follow:  # httpx
            with session.stream("GET", url, timeout=60, **follow) as response:
                for _ in response.iter_bytes(8 << 20):
                    pass
        else:  # requests
            with session.get(url, stream=True, timeout=60) as response:
                for _ in response.iter_content(8 << 20):
                    pass
    elapsed = time.perf_counter() - started
    total = sum(os.path.getsize(os.path.join(root, name)) for name in names)
    fetched = sum(os.path.getsize(os.path.join(root, name)) for name in chosen)
    return {"seconds": elapsed, "seconds_whole": elapsed * total / fetched, "requests": len(_repo_requests(server)),
            "bytes_sent": server.bytes_sent, "files": len(chosen), "of_files": len(names),  # type: ignore[attr-defined]
            "extrapolated": fetched != total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where to build the sparse checkpoint (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=3, help="timed preflight runs (median reported)")
    parser.add_argument("--baseline-shards", type=int, default=None,
                        help="download only this many shards whole and scale the time to the whole repo (default: all)")
    args = parser.parse_args()

    import huggingface_hub
    from hub_server import HubServer, Repo
    from sparse_checkpoint import build_sparse_checkpoint

    from nxdi_gptoss_fp8 import format as fmt
    from nxdi_gptoss_fp8.safeio.safetensors_header import read_header

    work = args.workdir or tempfile.mkdtemp(prefix="bench-hub-")
    root = os.path.join(work, "gpt-oss-120b-fp8")
    if not os.path.exists(os.path.join(root, fmt.INDEX_FILE)):
        build_sparse_checkpoint(root, fmt.PROFILE_120B)
    shards = sorted(name for name in os.listdir(root) if name.endswith(".safetensors"))
    shard_bytes = sum(os.path.getsize(os.path.join(root, name)) for name in shards)
    scale_bytes = sum(info.nbytes for name in shards for key, info in read_header(os.path.join(root, name)).tensors.items()
                      if fmt.is_expert_scale(key))
    # a cheap stand-in for the LFS oid (hashing 119 GB of holes measures nothing here)
    repo = Repo(__import__("pathlib").Path(root), COMMIT, oid=lambda path: "0" * 64)
    with HubServer({REPO_ID: repo}, max_requests=1_000_000, timeout=120) as server:
        _point_hub_at(server.endpoint)
        ours = _ours(server, args.repeat)
        baseline = _download_whole(server, root, args.baseline_shards)
    result = {
        "huggingface_hub": huggingface_hub.__version__, "load_average": os.getloadavg(),
        "shards": len(shards), "shard_bytes": shard_bytes, "scale_bytes": scale_bytes,
        "ours": ours, "baseline": baseline,
        "ours_bytes_over_shard_bytes": ours["bytes_sent"] / shard_bytes,
        "bound_bytes": 0.01 * shard_bytes + scale_bytes,
        "speedup": baseline["seconds_whole"] / ours["seconds"],
    }
    print(json.dumps(result, indent=2))
    print(f"validate {REPO_ID}: {ours['seconds']:.2f} s, {ours['requests']} requests, {ours['bytes_sent'] / 1e6:.1f} MB "
          f"({100 * result['ours_bytes_over_shard_bytes']:.3f} % of {shard_bytes / 1e9:.1f} GB of shards; "
          f"scales {scale_bytes / 1e6:.1f} MB)")
    print(f"download whole: {baseline['seconds_whole']:.1f} s{' (extrapolated)' if baseline['extrapolated'] else ''}, "
          f"{baseline['requests']} requests; {result['speedup']:.0f}x the preflight's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
