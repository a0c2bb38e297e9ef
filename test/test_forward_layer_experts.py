"""What ``layer_experts`` does without NxD: dropping a file-mapped tensor's pages keeps its values
and never touches anonymous memory. (The layer-at-a-time model itself runs against the real
NxDI in ``test_forward_cpu_model``.)"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from nxdi_gptoss_fp8.forward.layer_experts import release_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps are Linux's")


def rss_file() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("RssFile:"))


def test_a_file_mapped_tensor_leaves_the_resident_set_and_keeps_its_values(tmp_path: Path) -> None:
    data = torch.arange(64 << 20, dtype=torch.int64).to(torch.uint8)  # 64 MiB of a known pattern
    path = tmp_path / "blob"
    path.write_bytes(data.numpy().tobytes())
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    view = torch.frombuffer(mapping, dtype=torch.uint8)
    assert int(view.sum()) == int(data.sum())  # every page touched
    before = rss_file()
    release_pages(view)
    assert before - rss_file() >= 60 << 20
    assert torch.equal(view, data)  # read back from the page cache
    del view
    mapping.close()


@pytest.mark.parametrize("make", [lambda: torch.full((16 << 20,), 7, dtype=torch.uint8),
                                  lambda: torch.frombuffer(mmap.mmap(-1, 16 << 20), dtype=torch.uint8).fill_(7)],
                         ids=["torch", "anonymous-mmap"])
def test_anonymous_memory_is_never_dropped(make: object) -> None:
    tensor = make()  # type: ignore[operator]
    release_pages(tensor)
    assert int(tensor.min()) == int(tensor.max()) == 7
