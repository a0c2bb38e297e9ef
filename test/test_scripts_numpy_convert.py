"""scripts/numpy_convert.py, the benchmark's independent baseline: byte-identical to ``convert``
on every source kind, and to the shared bench/ converter kept beside the repository
(``../shared/bench``; skipped where it is absent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nxdi_gptoss_fp8.convert import SOURCE_BF16, SOURCE_COMPRESSED_TENSORS, SOURCE_MXFP4, convert
from nxdi_gptoss_fp8.convert.source import non_expert_names
from nxdi_gptoss_fp8.safeio.safetensors_header import read_header
from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_DIMS, make_source

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "numpy_convert.py"
SHARED_BENCH = next((path for path in (ROOT.parent / "shared" / "bench", Path("/work/shared/bench"))
                     if (path / "ref_convert.py").is_file()), None)
KINDS = [SOURCE_MXFP4, SOURCE_BF16, SOURCE_COMPRESSED_TENSORS]


def tensor_bytes(paths: list[Path]) -> dict[str, bytes]:
    tensors = {}
    for path in paths:
        header = read_header(str(path))
        data = path.read_bytes()
        for name, info in header.tensors.items():
            tensors[name] = data[header.data_offset + info.begin:header.data_offset + info.end]
    return tensors


def run_converter(script: Path, src: Path, target: Path, kind: str) -> dict:
    done = subprocess.run([sys.executable, str(script), str(src), str(target), "--kind", kind],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=KINDS)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, bytes]]:
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    options = {} if kind == SOURCE_COMPRESSED_TENSORS else {"scale_range": REALISTIC_SCALE_RANGE}
    src = make_source(root / "src", kind, **options)
    convert(src, root / "out", progress=False)
    ours = tensor_bytes(sorted((root / "out").glob("*.safetensors")))
    renamed = non_expert_names(SOURCE_DIMS)
    return kind, src, {hf: ours[name] for hf, name in renamed.items()} | ours


def _differing(theirs: dict[str, bytes], ours: dict[str, bytes]) -> list[str]:
    return sorted(name for name, data in theirs.items() if ours.get(name) != data)


def test_the_numpy_converter_writes_what_convert_writes(converted: tuple[str, Path, dict[str, bytes]],
                                                         tmp_path: Path) -> None:
    kind, src, ours = converted
    result = run_converter(SCRIPT, src, tmp_path / "numpy.safetensors", kind)
    theirs = tensor_bytes([tmp_path / "numpy.safetensors"])
    assert len(theirs) == 19 * SOURCE_DIMS.num_hidden_layers + 3
    assert _differing(theirs, ours) == []
    assert result["kind"] == kind and result["fp8_bytes"] > 0 and result["cpu_s"] >= 0


@pytest.mark.skipif(SHARED_BENCH is None, reason="the shared bench/ folder is not beside the repository")
def test_the_numpy_converter_writes_what_the_shared_baseline_writes(converted: tuple[str, Path, dict[str, bytes]],
                                                                     tmp_path: Path) -> None:
    kind, src, _ = converted
    assert SHARED_BENCH is not None
    run_converter(SCRIPT, src, tmp_path / "numpy.safetensors", kind)
    run_converter(SHARED_BENCH / "ref_convert.py", src, tmp_path / "shared.safetensors", kind)
    ours, shared = tensor_bytes([tmp_path / "numpy.safetensors"]), tensor_bytes([tmp_path / "shared.safetensors"])
    assert ours.keys() == shared.keys() and _differing(shared, ours) == []
