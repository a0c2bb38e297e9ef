"""Text rendering of reports: plurals, summaries of repeated findings, damaged shards, the cap."""

from __future__ import annotations

import pytest

from nxdi_gptoss_fp8.validate.findings import GROUP_AFTER, PreflightReport, Severity, damaged_shards


def report_with(*findings: tuple[str, str, str | None, str | None]) -> PreflightReport:
    report = PreflightReport(path="/ckpt", shards=2, tensors=5)
    for check, reason, file, key in findings:
        report.add(check, reason, f"{key} is wrong", file=file, key=key)
    return report


@pytest.mark.parametrize("count", [1, GROUP_AFTER, GROUP_AFTER + 1, 49])
def test_repeats_of_one_code_in_one_file_are_one_line_past_the_threshold(count: int) -> None:
    report = report_with(*[("namespace", "hf_name", "a.safetensors", f"model.k{n}") for n in range(count)])
    lines = report.render_text().splitlines()
    if count <= GROUP_AFTER:
        assert len(lines) == count + 1 and all(line.startswith("ERROR namespace.hf_name") for line in lines[:-1])
    else:
        assert lines[0] == (f"ERROR namespace.hf_name [a.safetensors]: {count} times (model.k0, model.k1, model.k2, ...); "
                            "the first: model.k0 is wrong")
        assert lines[1] == "(similar findings summarized: --all lists every one)"
    assert len(report.render_text(summarize=False).splitlines()) == count + 1
    assert lines[-1].startswith(f"INVALID: /ckpt: {count} error{'s' if count > 1 else ''}, 0 warnings; 2 shards, 5 tensors")


def test_the_same_code_in_two_files_stays_two_groups() -> None:
    report = report_with(*[("namespace", "hf_name", f"{f}.safetensors", f"k{n}") for f in "ab" for n in range(5)])
    assert [line.split(":")[0] for line in report.render_text().splitlines()[:2]] == [
        "ERROR namespace.hf_name [a.safetensors]", "ERROR namespace.hf_name [b.safetensors]"]


def test_the_cap_names_the_flag_that_shows_everything() -> None:
    report = report_with(*[("namespace", f"r{n}", "a.safetensors", "k") for n in range(10)])
    lines = report.render_text(limit=4).splitlines()
    assert lines[4] == "... and 6 more lines (--all lists every finding, --json gives them as data)"


@pytest.mark.parametrize(("findings", "damaged"), [
    ([("header", "not_utf8", "s.safetensors", None)], True),
    ([("header", "invalid_json", "s.safetensors", None)], True),
    ([("header", "data_beyond_file", "s.safetensors", "x")], True),
    ([("ownership", "key_not_in_shard", "s.safetensors", "layers.0.a"),
      ("ownership", "unlisted_key", "s.safetensors", "layars.0.a"),
      ("namespace", "unexpected_key", "s.safetensors", "layars.0.a")], True),
    ([("ownership", "key_not_in_shard", "s.safetensors", "layers.0.a")], False),
    ([("ownership", "unlisted_key", "s.safetensors", "extra")], False),
    ([("ownership", "key_in_other_shard", "s.safetensors", "layers.0.a")], False),
])
def test_a_damaged_shard_gets_one_line(findings: list[tuple[str, str, str | None, str | None]], damaged: bool) -> None:
    report = report_with(*findings)
    assert bool(damaged_shards(report.findings)) is damaged
    lines = report.render_text().splitlines()
    if damaged:
        assert "s.safetensors looks corrupted or half-copied" in lines[0] and "--verify-checksums" in lines[0]
        assert sum("s.safetensors" in line for line in lines) == 1
    else:
        assert not any("half-copied" in line for line in lines)


def test_warnings_and_durations_read_right() -> None:
    report = PreflightReport(path="/ckpt", elapsed_s=1.5, bytes_read=1)
    report.add("integrity", "no_digests", "no digests", severity=Severity.WARNING)
    assert report.render_text().splitlines()[-1] == (
        "VALID: /ckpt: 0 errors, 1 warning; 0 shards, 0 tensors, profile unknown; read 1 byte in 1.50 s")


@pytest.mark.parametrize("name", ["x\rVALID", "\x1b[2J\x1b[31mred", "a\nVALID: fine", "evil\u202egnp.safetensors", "bad\udcffname"])
def test_names_from_disk_cannot_forge_or_hide_output_lines(name: str) -> None:
    report = PreflightReport(path=f"/ckpt/{name}")
    report.add("namespace", "unexpected_key", f"{name} is not part of the format", file=f"{name}.safetensors", key=name)
    text = report.render_text()
    assert len(text.split("\n")) == 2
    assert all(line.isprintable() for line in text.split("\n"))
    assert "\\x" in text or "\\u" in text
