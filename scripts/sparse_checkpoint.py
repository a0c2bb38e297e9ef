"""Full-size normalized checkpoints as sparse files, for benchmarks and scale tests.

Headers are real and every tensor has its real size, but only the expert scales (real,
positive float32 values) are written; all other data are holes that read as zeros. A
gpt-oss-120b checkpoint is ~119 GB apparent and ~0.2 GB on disk.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.writer import CheckpointWriter


def build_sparse_checkpoint(
    out: str,
    profile: str,
    *,
    padded_hidden_size: int | None = None,
    padded_intermediate_size: int | None = None,
    max_shard_size: int = 5_000_000_000,
    seed: int = 0,
) -> str:
    """Write a sparse normalized checkpoint of a published ``profile`` to ``out``."""
    dims = fmt.PROFILES[profile]
    layout = fmt.Layout(dims, padded_hidden_size or dims.hidden_size, padded_intermediate_size or dims.intermediate_size)
    rng = np.random.default_rng(seed)
    with CheckpointWriter(out, layout, profile, fmt.hf_config(dims), max_shard_size=max_shard_size,
                          source={"generator": "sparse benchmark checkpoint"}, record_sha256=False,
                          sparse=True) as writer:
        for name, planned in writer.planned.items():
            if fmt.is_expert_scale(name):
                scales = rng.uniform(2.0**-12, 2.0**-6, size=planned.spec.numel).astype("<f4")
                writer.put(name, scales)
            else:
                writer.put_zeros(name)
        return writer.commit()


def disk_usage(path: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of the files directly in ``path``."""
    apparent = allocated = 0
    for entry in os.scandir(path):
        info = entry.stat(follow_symlinks=False)
        apparent += info.st_size
        allocated += info.st_blocks * 512
    return apparent, allocated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output directory (must be empty or absent)")
    parser.add_argument("--profile", choices=sorted(fmt.PROFILES), default=fmt.PROFILE_120B)
    args = parser.parse_args()
    path = build_sparse_checkpoint(args.out, args.profile)
    apparent, allocated = disk_usage(path)
    print(f"{path}: {apparent / 1e9:.1f} GB apparent, {allocated / 1e9:.2f} GB on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
