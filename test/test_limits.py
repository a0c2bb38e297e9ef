"""Resource limits: hostile sizes give clean findings in bounded time and memory.

The heavy cases run in a child process that reports its own elapsed time and peak RSS above
its baseline (after imports), so the bounds below are the ones docs/validating.md states:

- a header at the 100,000,000-byte cap: < 10 s, < 4 × its size in memory;
- a header length above the cap, or beyond the file: refused before any allocation;
- one million tiny tensors (a 68 MB header): < 120 s, < 3 GB;
- JSON nested 10,000,000 deep (index, config or header): refused at Python's recursion limit;
- a 10,000-shard index: < 20 s whether the shards exist or not;
- a config.json claiming 10^11 layers: one finding, the namespace is not enumerated;
- config/index above 64 MB: refused from their size, unread;
- a mis-shaped multi-GB "scale" tensor: never read.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from corpus import Ckpt

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.safeio.json_file import MAX_JSON_FILE_BYTES
from nxdi_gptoss_fp8.safeio.safetensors_header import MAX_HEADER_SIZE, read_header
from nxdi_gptoss_fp8.validate import deep_scan as ds
from nxdi_gptoss_fp8.validate.pipeline import preflight

REPO = Path(__file__).resolve().parent.parent
MB = 1 << 20


def measure(body: str, **values: Any) -> dict[str, Any]:
    """Run ``body`` in a child process; it sets ``result`` (a dict). Adds elapsed_s and the
    peak RSS above the child's baseline after imports (peak_mb; Linux /proc)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("memory is measured from /proc/self/status (Linux)")
    program = textwrap.dedent("""
        import json, sys, time
        sys.path.insert(0, {repo!r})
        from nxdi_gptoss_fp8.validate.pipeline import preflight
        from nxdi_gptoss_fp8.safeio.safetensors_header import read_header, HeaderError

        def status_kb(field):  # this process's own memory (ru_maxrss would include the parent's)
            with open("/proc/self/status") as handle:
                return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))

        values = json.loads({values!r})
        base = status_kb("VmRSS")
        started = time.perf_counter()
        result = {{}}
    """).format(repo=str(REPO), values=json.dumps(values)) + textwrap.dedent(body) + textwrap.dedent("""
        result["elapsed_s"] = time.perf_counter() - started
        result["peak_mb"] = (status_kb("VmHWM") - base) / 1024
        print(json.dumps(result))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_header_at_the_cap_is_parsed_in_bounded_time_and_memory(tiny_checkpoint: Path) -> None:
    ck = Ckpt(tiny_checkpoint)
    shard = ck.shard_of("norm.weight")
    text, data = ck.raw_header(shard)
    document = json.loads(text)
    skeleton = json.dumps({"__metadata__": {"note": ""}, **document}, separators=(",", ":")).encode()
    document = {"__metadata__": {"note": "x" * (MAX_HEADER_SIZE - len(skeleton))}, **document}
    ck.write_raw(shard, document, data)
    ck.sync()
    assert read_header(tiny_checkpoint / shard).header_length == MAX_HEADER_SIZE
    result = measure("""
        report = preflight(values["path"], allow_custom_model=True)
        result["codes"] = report.codes()
    """, path=str(tiny_checkpoint))
    assert result["codes"] == []  # metadata is free text: at the cap, still valid
    assert result["elapsed_s"] < 10
    assert result["peak_mb"] < 4 * MAX_HEADER_SIZE / MB


def test_header_one_byte_above_the_cap_is_refused(tiny_checkpoint: Path) -> None:
    ck = Ckpt(tiny_checkpoint)
    shard = ck.shard_of("norm.weight")
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text + b" " * (MAX_HEADER_SIZE + 1 - len(text)), data)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert "header.header_too_large" in report.codes()
    assert report.bytes_read < MB


@pytest.mark.parametrize(("length", "code"), [
    (2**64 - 1, "header_too_large"), (MAX_HEADER_SIZE + 1, "header_too_large"), (MAX_HEADER_SIZE, "header_beyond_file"),
])
def test_huge_length_prefixes_allocate_nothing(tmp_path: Path, length: int, code: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b"{}")
    result = measure("""
        try:
            read_header(values["path"])
        except HeaderError as exc:
            result["code"] = exc.code
    """, path=str(path))
    assert result["code"] == code
    assert result["peak_mb"] < 8 and result["elapsed_s"] < 1


@pytest.mark.slow
def test_a_million_tiny_tensors(tiny_checkpoint: Path) -> None:
    count = 1_000_000
    text = ("{" + ",".join(f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(count)) + "}").encode()
    Ckpt(tiny_checkpoint).write_raw("extra.safetensors", text, bytes(count))
    def list_them(index: dict[str, Any]) -> None:
        index["weight_map"].update(dict.fromkeys((f"t{i}" for i in range(count)), "extra.safetensors"))
        index["metadata"].pop("shard_sha256")
    Ckpt(tiny_checkpoint).edit_index(list_them)
    result = measure("""
        report = preflight(values["path"], allow_custom_model=True)
        text = report.render_text(limit=50)
        result["errors"] = report.summary()["errors"]  # exact, though only 10,000 per code are stored
        result["codes"] = sorted(set(report.codes()))
        result["tensors"] = report.tensors
        result["lines"] = len(text.splitlines())
        result["summarized"] = "ERROR namespace.unexpected_key [extra.safetensors]: 10,000 times (t" in text \
            and "... and 990,000 more namespace.unexpected_key findings (counted, not stored)" in text
        result["capped_lines"] = len(report.render_text(limit=50, summarize=False).splitlines())
    """, path=str(tiny_checkpoint))
    assert result["codes"] == ["index.total_size_mismatch", "integrity.no_digests", "namespace.unexpected_key", "values.not_checked"]
    assert result["errors"] == count + 1 and result["tensors"] == count + 41
    # total_size, the 10,000 stored in one line, the summary note, the count of those not
    # stored, no_digests, the scales not read, the verdict
    assert result["lines"] == 7 and result["summarized"], result
    assert result["capped_lines"] == 53  # unsummarized: 50 findings, "... and N more lines", the count not stored, the verdict
    assert result["elapsed_s"] < 120, result
    assert result["peak_mb"] < 3 * 1024, result


@pytest.mark.parametrize("where", ["index", "config", "header"])
def test_deeply_nested_json_is_refused_quickly(tiny_checkpoint: Path, where: str) -> None:
    depth = 10_000_000
    nested = "[" * depth + "]" * depth
    ck = Ckpt(tiny_checkpoint)
    if where == "index":
        ck.replace_in(fmt.INDEX_FILE, '"source": {', f'"source": {{"deep": {nested},')
    elif where == "config":
        ck.replace_in(fmt.CONFIG_FILE, '"model_type"', f'"deep": {nested}, "model_type"')
    else:
        shard = ck.shard_of("norm.weight")
        text, data = ck.raw_header(shard)
        ck.write_raw(shard, b'{"__metadata__":' + nested.encode() + b"," + text.strip()[1:], data)
    result = measure("""
        result["codes"] = preflight(values["path"], allow_custom_model=True).codes()
    """, path=str(tiny_checkpoint))
    assert f"{where}.too_deep" in result["codes"]
    assert result["elapsed_s"] < 5 and result["peak_mb"] < 200


@pytest.mark.parametrize("shards_exist", [False, True])
def test_ten_thousand_shard_index(tiny_checkpoint: Path, shards_exist: bool) -> None:
    count = 10_000
    names = {f"extra.{i}.weight": f"extra-{i:05d}.safetensors" for i in range(count)}
    if shards_exist:
        for key, shard in names.items():
            text = json.dumps({key: _entry("BF16", [2], 0, 4)}).encode()
            Ckpt(tiny_checkpoint).write_raw(shard, text, bytes(4))
    Ckpt(tiny_checkpoint).edit_index(lambda index: index["weight_map"].update(names))
    result = measure("""
        report = preflight(values["path"], allow_custom_model=True)
        result["codes"] = report.codes()
        report.render_text(limit=50)
    """, path=str(tiny_checkpoint))
    expected = "namespace.unexpected_key" if shards_exist else "ownership.missing_shard"
    assert result["codes"].count(expected) == count
    assert result["elapsed_s"] < 20 and result["peak_mb"] < 500, result


@pytest.mark.parametrize(("layers", "code"), [(10**4, "config.dims_out_of_proportion"), (2**31, "config.dims_out_of_proportion"),
                                             (10**11, "config.out_of_range")])
def test_a_config_claiming_absurdly_many_layers_is_not_enumerated(tiny_checkpoint: Path, layers: int, code: str) -> None:
    Ckpt(tiny_checkpoint).edit_config(num_hidden_layers=layers)
    neuron_config = {"quantized": True, "modules_to_not_convert": ["self_attn", "lm_head"]}
    result = measure("""
        result["codes"] = preflight(values["path"], allow_custom_model=True, deep=True,
                                    neuron_config=values["nc"]).codes()
    """, path=str(tiny_checkpoint), nc=neuron_config)
    assert code in result["codes"]
    assert result["elapsed_s"] < 2 and result["peak_mb"] < 100


@pytest.mark.parametrize("name", [fmt.INDEX_FILE, fmt.CONFIG_FILE])
def test_json_files_above_64_mb_are_not_read(tiny_checkpoint: Path, name: str) -> None:
    os.truncate(tiny_checkpoint / name, MAX_JSON_FILE_BYTES + 1)  # sparse: nothing on disk
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    check = "index" if name == fmt.INDEX_FILE else "config"
    assert f"{check}.too_large" in report.codes()
    assert report.bytes_read < MB


def test_a_mis_shaped_giant_scale_is_never_read(tiny_checkpoint: Path) -> None:
    key = f"layers.0.{fmt.GATE_UP}.scale"
    ck = Ckpt(tiny_checkpoint)
    shard = ck.shard_of(key)
    ck.edit_shard(shard, lambda tensors: tensors.pop(key))
    text, data = ck.raw_header(shard)
    document = json.loads(text)
    size = 4 << 30  # a 4 GiB "scale" at the end of the shard, sparse on disk
    document[key] = _entry("F32", [4, 1, size // 16], len(data), len(data) + size)
    ck.write_raw(shard, document, data)
    with open(tiny_checkpoint / shard, "r+b") as handle:
        handle.truncate(handle.seek(0, os.SEEK_END) + size)
    report = preflight(tiny_checkpoint, allow_custom_model=True, deep=True)
    assert "dtype_shape.wrong_shape" in report.codes()
    assert report.bytes_read < 2 * MB


def test_deep_scan_memory_is_one_chunk(tiny_template: Path) -> None:
    report = preflight(tiny_template, allow_custom_model=True)
    for target in ds.scan_targets(report.view):
        row = target.cols * target.itemsize
        for chunk_bytes in (1, 100, 10_000):
            blocks = list(ds._chunks(target, chunk_bytes))
            assert all(count * row <= max(chunk_bytes, row) for _, _, count in blocks)
            assert sum(count for _, _, count in blocks) == target.experts * target.rows


def test_limits_match_the_format() -> None:
    assert MAX_HEADER_SIZE == 100_000_000
    assert MAX_JSON_FILE_BYTES == 64 * MB


def _phantom_index(ckpt: Path, count: int) -> int:
    """List ``count`` phantom keys (no shard holds them) in the index; returns its size."""
    def add(index: dict[str, Any]) -> None:
        index["weight_map"].update(dict.fromkeys((f"p{i}" for i in range(count)), "a.safetensors"))
    Ckpt(ckpt).edit_index(add)
    (ckpt / "a.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return (ckpt / fmt.INDEX_FILE).stat().st_size


def test_a_phantom_index_is_bounded(tiny_checkpoint: Path) -> None:
    """500,000 phantom keys: exact counts, bounded findings, seconds and memory."""
    size = _phantom_index(tiny_checkpoint, 500_000)
    result = measure("""
        report = preflight(values["path"], allow_custom_model=True)
        result["summary"] = report.summary()
        result["stored"] = len(report.findings)
        result["omitted"] = report.omitted
    """, path=str(tiny_checkpoint))
    # the index also lacks a digest for a.safetensors: one more index error
    assert result["summary"]["errors_by_check"] == {"index": 1, "ownership": 500_000, "namespace": 500_000}
    assert result["stored"] < 25_000 and result["omitted"]["namespace.unexpected_key"] == 490_000
    assert result["elapsed_s"] < 10, result
    assert result["peak_mb"] < 40 * size / MB, result  # a small constant factor of the index


@pytest.mark.parametrize(("name", "literal", "code"), [
    ("depth", "[" * 100_000 + "]" * 100_000, "too_deep"),
    ("digits", "1" + "0" * 4999, "number_too_large"),
])
def test_neuron_config_file_bounds_exit_2(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         name: str, literal: str, code: str) -> None:
    from nxdi_gptoss_fp8 import cli

    path = tmp_path / "nc.json"
    path.write_text('{"quantized": true, "tp_degree": ' + literal + "}")
    assert cli.main(["validate", str(tiny_checkpoint), "--neuron-config", str(path)]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("nested" in err) if code == "too_deep" else ("digits" in err)


def test_a_huge_claimed_padding_with_a_sparse_giant_scale_is_never_read(tiny_checkpoint: Path) -> None:
    """The index claims I' of 2^27; one "scale" of that shape (1 GiB, sparse) is in a shard."""
    key = f"layers.0.{fmt.GATE_UP}.scale"
    padded = 64 + 32 * 2**22
    ck = Ckpt(tiny_checkpoint)
    ck.edit_metadata(padded_intermediate_size=padded)
    shard = ck.shard_of(key)
    ck.edit_shard(shard, lambda tensors: tensors.pop(key))
    text, data = ck.raw_header(shard)
    document = json.loads(text)
    size = 4 * 4 * 2 * padded
    document[key] = _entry("F32", [4, 1, 2 * padded], len(data), len(data) + size)
    ck.write_raw(shard, document, data)
    with open(tiny_checkpoint / shard, "r+b") as handle:
        handle.truncate(handle.seek(0, os.SEEK_END) + size)
    assert size >= 1 << 30
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert "dtype_shape.wrong_shape" in report.codes() and "values.not_checked" in report.codes()
    assert report.bytes_read < 2 * MB


def test_scales_beyond_the_cap_are_not_read(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.validate import scales as checks

    monkeypatch.setattr(checks, "MAX_SCALE_BYTES", 1000)
    report = preflight(tiny_checkpoint, allow_custom_model=True)
    assert report.codes() == ["values.scales_too_large"]
    assert report.bytes_read < 64 * 1024  # the scales (6 KiB) were not read
