"""The adversarial corpus, end to end: for every malformed checkpoint the preflight reports an
error of the expected check, ``validate`` exits 1 without a traceback, and the loader refuses
before it maps anything."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from corpus import CASES, Bases, Options

from nxdi_gptoss_fp8 import cli
from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.findings import CHECKS, Severity
from nxdi_gptoss_fp8.validate.pipeline import preflight

REPO = Path(__file__).resolve().parent.parent
ERROR_CASES = [entry for entry in CASES if not entry.warning]
IDS = [entry.name for entry in ERROR_CASES]
PARAMS = [(entry.name, entry.check) for entry in ERROR_CASES]
CODES = {entry.name: entry.code for entry in CASES}
# every error code of the case's own check it may draw: its code, and the ones its defect implies
CHECK_CODES = {entry.name: {entry.code, *entry.also} for entry in CASES}
WARNING_CASES = [entry for entry in CASES if entry.warning]
HAS_LOADER = importlib.util.find_spec("nxdi_gptoss_fp8.loader") is not None


@pytest.fixture(autouse=True)
def _no_custom_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fmt.ALLOW_CUSTOM_ENV, raising=False)


def test_corpus_is_large_named_and_covers_every_check() -> None:
    assert len(CASES) >= 50
    assert len({entry.name for entry in CASES}) == len(CASES)
    assert {entry.check for entry in CASES} == set(CHECKS) - {"presharded"}  # compiled directories: test_validate_presharded
    assert all(entry.code.startswith(entry.check + ".") for entry in CASES)


@pytest.mark.parametrize("base", ["tiny", "padded", "other_plan", "other_seed"])
def test_bases_are_valid(bases: Bases, base: str) -> None:
    report = preflight(getattr(bases, base), allow_custom_model=True, deep=True, verify_checksums=True)
    assert report.ok, report.render_text()
    assert not report.warnings


SCALE_CASES = [entry.name for entry in ERROR_CASES if entry.code == "values.bad_scale"]


@pytest.mark.parametrize("name", SCALE_CASES)
def test_scale_values_are_judged_alike_with_and_without_numpy(
        built: Callable[[str], tuple[Path, Options]], name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scale check's numpy path (numpy already loaded, as in NxDI's process) and its stdlib
    path report the same findings, to the message."""
    import numpy

    from nxdi_gptoss_fp8.validate import scales as checks

    path, options = built(name)
    reports = {}
    for label, module in (("numpy", numpy), ("stdlib", None)):
        monkeypatch.setattr(checks, "loaded_numpy", lambda module=module: module)
        reports[label] = [(f.check, f.code, f.severity, f.file, f.key, f.message) for f in preflight(path, **options).findings]
    assert reports["numpy"] == reports["stdlib"]
    assert CODES[name] in {code for _, code, *_ in reports["stdlib"]}


@pytest.mark.parametrize(("name", "check"), PARAMS, ids=IDS)
def test_preflight_reports_the_expected_check(built: Callable[[str], tuple[Path, Options]], name: str, check: str) -> None:
    path, options = built(name)
    report = preflight(path, **options)
    assert not report.ok
    assert CODES[name] in {f.code for f in report.errors}, report.render_text()
    assert {f.code for f in report.errors if f.check == check} == CHECK_CODES[name], report.render_text()
    report.render_text()
    json.loads(report.to_json())


@pytest.mark.parametrize("name", [entry.name for entry in WARNING_CASES])
def test_warning_cases_warn_with_their_code(built: Callable[[str], tuple[Path, Options]], name: str) -> None:
    """Classes that are warnings: the checkpoint stays valid, the warning names the problem."""
    path, options = built(name)
    report = preflight(path, **options)
    assert report.ok, report.render_text()
    assert CODES[name] in {f.code for f in report.warnings}, report.render_text()
    assert all(f.severity is Severity.WARNING for f in report.findings if f.code == CODES[name])


def cli_argv(path: Path, options: Options, workdir: Path) -> list[str]:
    argv = ["validate", str(path)]
    if options.get("allow_custom_model"):
        argv.append("--allow-custom-model")
    if options.get("deep"):
        argv.append("--deep")
    if options.get("verify_checksums"):
        argv.append("--verify-checksums")
    if "neuron_config" in options:
        config = workdir / "neuron_config.json"
        config.write_text(json.dumps(options["neuron_config"]))
        argv += ["--neuron-config", str(config)]
    return argv


# A path that is not a directory is a usage error on the command line (exit 2, one line); the
# library reports it as a filesystem finding.
USAGE_CASES = {"missing_directory", "path_is_a_file"}


@pytest.mark.parametrize(("name", "check"), PARAMS, ids=IDS)
def test_cli_exits_1_without_traceback(built: Callable[[str], tuple[Path, Options]], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str], name: str, check: str) -> None:
    path, options = built(name)
    code = cli.main(cli_argv(path, options, tmp_path))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if name in USAGE_CASES:
        assert code == cli.EXIT_USAGE and out == "" and len(err.strip().splitlines()) == 1
    else:
        assert code == cli.EXIT_FINDINGS
        assert f"ERROR {CODES[name]}" in out
        assert all(line.isprintable() for line in out.split("\n")), "a name from disk reached the terminal unescaped"


# One case per kind of input the command line prints (and the names from disk that are not
# UTF-8), in a real process with a strict UTF-8 stdout.
SUBPROCESS_CASES = ["stray_pt_non_utf8_name", "length_prefix_2_64_minus_1", "index_lone_surrogate_shard_name",
                    "deep_fp8_nan_byte_0x7f", "digest_mismatch_flipped_data_byte", "nc_not_quantized", "missing_directory"]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_cli_process_exits_1_without_traceback(built: Callable[[str], tuple[Path, Options]], tmp_path: Path, name: str) -> None:
    path, options = built(name)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONPATH": str(REPO)}
    env.pop(fmt.ALLOW_CUSTOM_ENV, None)
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", *cli_argv(path, options, tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr
    if name in USAGE_CASES:
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    else:
        assert done.returncode == 1, done.stderr
        assert "INVALID" in done.stdout


@pytest.mark.skipif(not HAS_LOADER, reason="nxdi_gptoss_fp8.loader is missing: the loader cannot be tested")
@pytest.mark.parametrize(("name", "check"), PARAMS, ids=IDS)
def test_loader_refuses_before_mapping_any_tensor(built: Callable[[str], tuple[Path, Options]], monkeypatch: pytest.MonkeyPatch,
                                                  name: str, check: str) -> None:
    from nxdi_gptoss_fp8 import loader
    from nxdi_gptoss_fp8.errors import PreflightError

    def must_not_map(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the loader mapped a shard of an invalid checkpoint")

    monkeypatch.setattr(loader, "map_shard", must_not_map)
    monkeypatch.setattr(loader, "tensor_view", must_not_map)
    monkeypatch.setattr(loader.mmap, "mmap", must_not_map)
    path, options = built(name)
    extra = {key: options[key] for key in ("deep", "verify_checksums") if key in options}
    # the loader runs the default preflight itself; checks it does not run (deep scan,
    # hashing) reach it as a report, which it must honour
    report = preflight(path, **options) if extra else None
    with pytest.raises(PreflightError) as caught:
        loader.load_state_dict(path, options.get("neuron_config"), report=report,
                               allow_custom_model=options["allow_custom_model"])
    assert CODES[name] in {f.code for f in caught.value.report.errors}
