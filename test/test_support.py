"""``env`` and the tested matrix, against fake installed distributions (``.dist-info`` folders in
a temporary site directory, read through importlib.metadata exactly as an install would be)."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import documents
import nxdi_standin
import pytest

from nxdi_gptoss_fp8 import cli, support
from nxdi_gptoss_fp8.errors import RegistrationError
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.nxdi import vllm_plugin

# a Neuron SDK 2.29 host (the verified stack) with the NxDI-backed vLLM plugin
PAGE = "docs/supported-environments.md"
SDK_229 = {"torch": "2.9.0", "transformers": "4.57.1", "neuronx-distributed-inference": "0.9.17334",
           "neuronx-distributed": "0.18.26921", "torch-neuronx": "2.9.0.2.13.23887", "neuronx-cc": "2.24.5133.0",
           "vllm": "0.13.0", "vllm-neuron": "0.5.0"}
# a Neuron SDK 2.32 host: no NxDI, the newer plugin
SDK_232 = {"torch": "2.9.0", "transformers": "4.57.1", "torch-neuronx": "2.9.0.2.15.32035",
           "neuronx-cc": "2.27.5334.0", "vllm": "0.24.0", "vllm-neuron": "0.24.0.1.1.0+e8242a9"}
# a Neuron SDK 2.33.x Trn2 host: no NxDI, TorchNeuron (torch-neuronx 2.14.3.0), the newer plugin
SDK_233 = {"torch": "2.14.0", "transformers": "4.57.1", "torch-neuronx": "2.14.3.0", "neuronx-cc": "2.28.7631.0",
           "vllm": "0.29.0", "vllm-neuron": "0.29.0.1.2.0"}
# a Neuron SDK 2.34 Trn2 host: the same kinds; a later plugin of the newer form (vLLM's version, then its own)
SDK_234 = {**SDK_233, "vllm": "0.31.0", "vllm-neuron": "0.31.0.1.3.0"}


def install(site: Path, name: str, version: str, *, requires: list[str] | None = None,
            files: list[str] | None = None) -> None:
    """A ``.dist-info`` folder as pip writes it: METADATA (and RECORD when ``files``)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {req}" for req in requires or []]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if files is not None:
        (info / "RECORD").write_text("".join(f"{path},,\n" for path in [*files, f"{info.name}/METADATA"]))


def site_with(tmp_path: Path, packages: dict[str, str]) -> list[str]:
    site = tmp_path / "site"
    site.mkdir(parents=True, exist_ok=True)
    for name, version in packages.items():
        install(site, name, version)
    return [str(site)]


def statuses(report: support.EnvironmentReport) -> dict[str, str]:
    return {c.component: c.status for c in report.components}


def test_the_verified_stack(tmp_path: Path) -> None:
    path = site_with(tmp_path, {**SDK_229, "torch": "2.13.0+cpu", "transformers": "4.57.6"})
    report = support.environment_report(path, python_version="3.11.7")
    assert statuses(report) == {
        "Python": support.VERIFIED, "torch": support.VERIFIED, "transformers": support.VERIFIED,
        "NxDI": support.VERIFIED, "NxD": support.VERIFIED, "torch-neuronx": support.EXPECTED,
        "neuronx-cc": support.EXPECTED, "vLLM": support.EXPECTED, "vLLM Neuron": support.EXPECTED,
    }
    assert report.ok and report.vllm_neuron.kind == support.NXDI_BACKED
    assert report.component("NxDI").version == "0.9.17334"


def test_a_sdk_232_host_is_told_why_and_what_to_do(tmp_path: Path) -> None:
    report = support.environment_report(site_with(tmp_path, SDK_232), python_version="3.12.3")
    found = statuses(report)
    assert found["NxDI"] == found["NxD"] == support.ABSENT
    assert found["vLLM Neuron"] == found["vLLM"] == support.UNSUPPORTED
    assert found["Python"] == support.EXPECTED and found["torch"] == support.EXPECTED
    assert report.vllm_neuron.kind == support.WITHOUT_NXDI_KIND and not report.ok
    plugin = report.component("vLLM Neuron")
    assert "does not use NxDI" in plugin.reason and "gpt-oss-120b" in plugin.forward and "2.31" in plugin.forward
    text = report.render_text()
    assert "0.24.0.1.1.0+e8242a9" in text and "way forward:" in text
    assert text.splitlines()[-1] == support.SUPPORT_WINDOW


@pytest.mark.parametrize("host", [SDK_233, SDK_234], ids=["2.33.1", "2.34"])
def test_a_host_after_nxdi_can_convert_and_validate_but_not_serve(tmp_path: Path, host: dict[str, str]) -> None:
    report = support.environment_report(site_with(tmp_path, host), python_version="3.12.3")
    found = statuses(report)
    assert found["NxDI"] == found["NxD"] == support.ABSENT and not report.ok
    assert found["vLLM Neuron"] == found["vLLM"] == found["torch-neuronx"] == support.UNSUPPORTED
    assert report.vllm_neuron.kind == support.WITHOUT_NXDI_KIND
    assert "TorchNeuron" in report.component("torch-neuronx").reason
    assert "convert, validate, inspect and goldens work" in report.component("NxDI").reason
    assert "2.27-2.31" in report.component("vLLM Neuron").forward and "2.34.0" in report.component("vLLM Neuron").forward


# hosts of the newer plugin's stack: the plugin alone (its SDK 2.31 beta: 0.21.0.1.0.0), TorchNeuron alone, both
NEWER_STACK_HOSTS = {
    "2.31 newer plugin": ({"vllm-neuron": "0.21.0.1.0.0"}, ["vllm-neuron 0.21.0.1.0.0"]),
    "2.32": (SDK_232, ["vllm-neuron 0.24.0.1.1.0+e8242a9"]),
    "2.33.1": (SDK_233, ["vllm-neuron 0.29.0.1.2.0", "torch-neuronx 2.14.3.0"]),
    "2.34": (SDK_234, ["vllm-neuron 0.31.0.1.3.0", "torch-neuronx 2.14.3.0"]),
    "TorchNeuron only": ({"torch-neuronx": "2.13.3.0"}, ["torch-neuronx 2.13.3.0"]),
}


@pytest.mark.parametrize("host", list(NEWER_STACK_HOSTS))
def test_a_host_with_the_newer_stack_is_told_in_one_line_that_this_format_does_not_serve_there(
        tmp_path: Path, host: str) -> None:
    packages, named = NEWER_STACK_HOSTS[host]
    report = support.environment_report(site_with(tmp_path, packages), python_version="3.12.3")
    assert "\n" not in report.serving and report.serving.startswith("this format does not serve on this host")
    assert all(name in report.serving for name in named), report.serving
    assert "vllm serve openai/gpt-oss-120b" in report.serving and "Trn2 with a Neuron SDK 2.27-2.31 image" in report.serving
    lines = report.render_text().splitlines()
    assert lines[1] == f"  {report.serving}" and lines[-1] == support.SUPPORT_WINDOW
    assert report.to_dict()["serving"] == report.serving


@pytest.mark.parametrize("packages", [SDK_229, {"torch-neuronx": "2.13.2.0"}, {"vllm-neuron": "0.6.0"}, {}],
                         ids=["2.29", "torch-neuronx 2.13.2", "NxDI-backed 0.6.0", "nothing"])
def test_other_hosts_get_no_such_line(tmp_path: Path, packages: dict[str, str]) -> None:
    report = support.environment_report(site_with(tmp_path, packages), python_version="3.11.7")
    assert report.serving == "" and "does not serve on this host" not in report.render_text()


def test_the_window_names_the_trn2_only_release_and_no_route_on_inf2_trn1() -> None:
    window = support.SUPPORT_WINDOW
    for words in ("since Neuron SDK 2.29 NxDI models run only on Trn2 and newer (NxD Inference release notes, 2.29.0)",
                  "On Inf2/Trn1 they stay in maintenance", "at SDK 2.31", "no route for this format",
                  "needs a Trn2 with a Neuron SDK 2.27-2.31 image"):
        assert words in window, words


def test_the_window_says_what_changed_with_2_34_in_the_present_tense() -> None:
    window = support.SUPPORT_WINDOW
    for words in ("since Neuron SDK 2.34.0 (2026-11-30; AWS notice of 2026-11-17)", "Trn2/Trn3", "Inf2/Trn1",
                  "maintenance", "2.27-2.31", "convert, validate, inspect and goldens work", "serving this format does not"):
        assert words in window, words
    package = Path(support.__file__).resolve().parent
    texts = [path.read_text(encoding="utf-8") for path in package.rglob("*.py")]
    texts.append((package.parent / "docs" / "format.md").read_text(encoding="utf-8"))
    for text in texts:  # support is over or goes on; nothing "ends" ahead
        assert not re.search(r"\bends (with|after|in) (Neuron )?(SDK )?2\.34|will end", " ".join(text.split())), text[:80]


@pytest.mark.parametrize(("packages", "component", "status", "words"), [
    ({"neuronx-distributed-inference": "0.10.18399"}, "NxDI", support.EXPECTED, "no public source"),
    ({"neuronx-distributed-inference": "0.8.16251"}, "NxDI", support.EXPECTED, "since 0.7"),
    ({"neuronx-distributed-inference": "0.6.10598"}, "NxDI", support.UNSUPPORTED, "no GPT-OSS"),
    ({"neuronx-distributed-inference": "0.9.0+4bcdc54.dev"}, "NxDI", support.VERIFIED, "0.9.0 source"),
    ({"neuronx-distributed": "0.19.28492"}, "NxD", support.EXPECTED, "final 0.19.28492"),
    ({"neuronx-distributed": "0.14.0"}, "NxD", support.UNSUPPORTED, "not an NxD release"),
    ({"transformers": "5.0.0"}, "transformers", support.UNSUPPORTED, "expert layout"),
    ({"transformers": "4.56.2"}, "transformers", support.EXPECTED, "4.55"),
    ({"torch": "2.0.1"}, "torch", support.UNSUPPORTED, "2.1 or later"),
    ({"torch-neuronx": "1.13.1.1.15.0"}, "torch-neuronx", support.UNSUPPORTED, "NxDI 0.7-0.10"),
    ({"torch-neuronx": "2.9.0.2.15.32035"}, "torch-neuronx", support.EXPECTED, "NxDI 0.7-0.10"),
    ({"torch-neuronx": "2.13.3.0"}, "torch-neuronx", support.UNSUPPORTED, "TorchNeuron"),
])
def test_each_component_is_placed_in_the_matrix(tmp_path: Path, packages: dict[str, str], component: str,
                                                status: str, words: str) -> None:
    found = support.environment_report(site_with(tmp_path, packages), python_version="3.11.0").component(component)
    assert (found.status, found.version) == (status, next(iter(packages.values())))
    assert words in found.reason
    assert bool(found.forward) == (status == support.UNSUPPORTED)  # a way forward exactly when unsupported


@pytest.mark.parametrize(("python", "status"), [("3.11.9", support.VERIFIED), ("3.10.0", support.EXPECTED),
                                                ("3.13.1", support.EXPECTED), ("3.9.18", support.UNSUPPORTED)])
def test_python(tmp_path: Path, python: str, status: str) -> None:
    assert support.environment_report([str(tmp_path)], python_version=python).component("Python").status == status


@pytest.mark.parametrize(("version", "kwargs", "kind", "evidence"), [
    ("0.5.0", {}, support.NXDI_BACKED, "0.x"),
    ("0.5.3", {}, support.NXDI_BACKED, "0.x"),
    ("0.6.0", {}, support.NXDI_BACKED, "0.x"),
    ("0.2.2+lts", {}, support.NXDI_BACKED, "0.x"),
    ("0.21.0.1.0.0+794754d", {}, support.WITHOUT_NXDI_KIND, "vLLM's followed by the plugin's"),
    ("0.29.0.1.2.0", {}, support.WITHOUT_NXDI_KIND, "vLLM's followed by the plugin's"),
    ("1.0.0", {}, support.WITHOUT_NXDI_KIND, "vLLM's followed by the plugin's"),
    # metadata wins over the version
    ("0.29.0.1.2.0", {"requires": ["neuronx-distributed-inference>=0.10"]}, support.NXDI_BACKED, "Requires-Dist"),
    ("0.9", {"files": [support.NXDI_BACKED_FILE]}, support.NXDI_BACKED, "files include"),
    ("0.9", {"files": [support.WITHOUT_NXDI_FILE]}, support.WITHOUT_NXDI_KIND, "own models"),
    ("0.3.0.1", {}, support.UNKNOWN_KIND, "neither"),
])
def test_vllm_neuron_kind(tmp_path: Path, version: str, kwargs: dict[str, list[str]], kind: str, evidence: str) -> None:
    install(tmp_path, "vllm-neuron", version, **kwargs)
    found = support.vllm_neuron_kind([str(tmp_path)])
    assert (found.kind, found.distribution, found.version) == (kind, "vllm-neuron", version)
    assert evidence in found.evidence


def test_a_vllm_built_for_neuron_is_nxdi_backed(tmp_path: Path) -> None:
    install(tmp_path, "vllm", "0.9.0+neuron225")
    report = support.environment_report([str(tmp_path)], python_version="3.11.0")
    assert report.vllm_neuron.kind == support.NXDI_BACKED
    assert report.component("vLLM").status == support.EXPECTED and "own Neuron worker" in report.component("vLLM").reason


@pytest.mark.parametrize(("version", "status"), [
    ("0.1.0", support.VERIFIED), ("0.2.0", support.VERIFIED), ("0.2.2+lts", support.EXPECTED), ("0.5.0", support.EXPECTED),
    ("0.5.3", support.EXPECTED), ("0.6.0", support.EXPECTED),
])
def test_the_vllm_neuron_releases_run_by_the_client_tests_are_verified(tmp_path: Path, version: str, status: str) -> None:
    install(tmp_path, "vllm-neuron", version)
    plugin = support.environment_report([str(tmp_path)], python_version="3.11.0").component("vLLM Neuron")
    assert plugin.status == status and "0.1.0, 0.2.0" in plugin.reason and "gptoss" in plugin.reason



@pytest.mark.parametrize("vllm", ["0.24.0", "0.11.0+cu128", "0.10.1.1"])
def test_a_gpu_host_with_plain_vllm_is_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], vllm: str) -> None:
    """Plain vLLM without any Neuron plugin (a GPU host): the hook is not used there, which is
    said in one line; nothing of ours is unsupported, so env exits 0."""
    path = site_with(tmp_path, {"torch": "2.8.0", "transformers": "4.57.1", "vllm": vllm})
    report = support.environment_report(path, python_version="3.12.3")
    engine = report.component("vLLM")
    assert engine.status == support.NOT_USED and "hook is not used there" in engine.reason and not engine.forward
    assert report.component("vLLM Neuron").status == support.ABSENT and report.ok
    monkeypatch.setattr(sys, "path", path)
    assert cli.main(["env"]) == cli.EXIT_OK
    assert "not used" in capsys.readouterr().out
    assert cli.main(["env", "--json"]) == cli.EXIT_OK and json.loads(capsys.readouterr().out)["ok"] is True


# the version classes: a final release, a post-release and a local build place like the release;
# a pre-release or dev release of the verified line is expected to work, never verified; a
# string that is no PEP 440 version is unsupported (it cannot be placed)
@pytest.mark.parametrize(("version", "status"), [
    ("0.9.17334", support.VERIFIED), ("0.9.0", support.VERIFIED), ("0.9.0.post1", support.VERIFIED),
    ("0.9.0+neuron", support.VERIFIED), ("0.9.17334+4bcdc54", support.VERIFIED), ("v0.9.0", support.VERIFIED),
    ("0.9.0rc1", support.EXPECTED), ("0.9.0.dev3", support.EXPECTED), ("0.9.0a1+local", support.EXPECTED),
    ("0.10.0rc2", support.EXPECTED), ("0.10.18399", support.EXPECTED),
    ("0.11.0rc1", support.UNSUPPORTED), ("0.6.0", support.UNSUPPORTED), ("1!0.9.0", support.UNSUPPORTED),
    ("garbage", support.UNSUPPORTED), ("", support.UNSUPPORTED), ("0.9.x", support.UNSUPPORTED),
    ("0.9.0 beta", support.UNSUPPORTED), ("nightly-2026-01-01", support.UNSUPPORTED),
])
def test_nxdi_version_classes(tmp_path: Path, version: str, status: str) -> None:
    found = support.environment_report(site_with(tmp_path, {"neuronx-distributed-inference": version or "0"}),
                                       python_version="3.11.0").component("NxDI") if version else \
        support._judge(next(r for r in support.MATRIX if r.component == "NxDI"), version)
    assert found.status == status, (version, found)
    if status == support.UNSUPPORTED and support.parse_version(version) is None:
        assert "not a version number" in found.reason and "pip show neuronx-distributed-inference" in found.forward
    if status == support.EXPECTED and ("rc" in version or "dev" in version or "a1" in version):
        assert "pre-release" in found.reason


@pytest.mark.parametrize(("python", "status"), [("3.11.0rc1", support.EXPECTED), ("3.14.0a3", support.EXPECTED),
                                                ("3.9.0rc1", support.UNSUPPORTED), ("3.11.7+", support.UNSUPPORTED)])
def test_python_pre_releases_and_garbage(python: str, status: str) -> None:
    assert support._judge(support.MATRIX[0], python).status == status


@pytest.mark.parametrize(("kind_version", "kind"), [
    ("0.5.0rc1", support.NXDI_BACKED), ("0.2.2+lts", support.NXDI_BACKED), ("0.24.0.1.1.0rc1", support.WITHOUT_NXDI_KIND),
    ("garbage", support.UNKNOWN_KIND), ("", support.UNKNOWN_KIND),
])
def test_vllm_neuron_versions_of_both_kinds(tmp_path: Path, kind_version: str, kind: str) -> None:
    install(tmp_path, "vllm-neuron", kind_version or "x")
    if not kind_version:
        info = next(tmp_path.glob("*.dist-info"))
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-neuron\nVersion: \n")
    found = support.vllm_neuron_kind([str(tmp_path)])
    assert found.kind == kind
    report = support.environment_report([str(tmp_path)], python_version="3.11.0")
    assert report.ok == (kind == support.NXDI_BACKED)  # the newer plugin and an unknown one are unsupported


@pytest.mark.parametrize(("version", "specs", "expected"), [
    ("2.13.0+cpu", ["==2.13.0"], True), ("2.13.1", ["==2.13.0"], False), ("0.9.17334", ["==0.9.*"], True),
    ("0.10.18399", ["==0.9.*"], False), ("4.57.6", [">=4.55,<5"], True), ("5.0.0rc1", [">=4.55,<5"], False),
    ("2", [">=2,<3"], True), ("garbage", [">=0"], False), ("0.19.28492", [">=0.16,<0.20"], True),
])
def test_version_specs(version: str, specs: list[str], expected: bool) -> None:
    assert support.matches(version, specs) is expected


def test_env_cli_text_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = site_with(tmp_path, SDK_232)
    monkeypatch.setattr(sys, "path", path)
    assert cli.main(["env"]) == cli.EXIT_FINDINGS  # the newer plugin is unsupported for normalized FP8
    text = capsys.readouterr().out
    assert "vLLM Neuron (vllm-neuron)" in text and support.SUPPORT_WINDOW in text
    assert cli.main(["env", "--json"]) == cli.EXIT_FINDINGS
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["vllm_neuron"]["kind"] == support.WITHOUT_NXDI_KIND
    assert {c["component"]: c["version"] for c in document["components"]}["vLLM Neuron"] == "0.24.0.1.1.0+e8242a9"
    monkeypatch.setattr(sys, "path", site_with(tmp_path / "229", SDK_229))
    assert cli.main(["env"]) == cli.EXIT_OK


def test_env_imports_nothing_it_reports_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", site_with(tmp_path, SDK_229) + sys.path)
    before = set(sys.modules)
    support.environment_report()
    assert not {m for m in set(sys.modules) - before
                if m.split(".")[0] in ("torch", "transformers", "vllm", "vllm_neuron", nxdi_hook.NXDI_PACKAGE)}


def test_vllm_refusal_without_nxdi_says_what_to_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, "vllm-neuron", "0.24.0.1.1.0+e8242a9")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv(nxdi_hook.ENV_VAR, "normalized_fp8")
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
    monkeypatch.setattr(nxdi_hook, "MODELING_MODULE", "nxdi_gptoss_fp8_no_such_module.modeling")
    with pytest.raises(RegistrationError) as caught:
        vllm_plugin.register_plugin()
    message = str(caught.value)
    assert "\n" not in message and "NxDI-backed stack" in message and "2.31" in message
    assert "vllm serve openai/gpt-oss-120b" in message and "vllm-neuron 0.24.0.1.1.0+e8242a9" in message


def test_vllm_without_nxdi_not_asked_warns_once_with_the_window(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    monkeypatch.setattr(nxdi_hook, "nxdi_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        vllm_plugin.register_plugin()
    (record,) = [r for r in caplog.records if r.name.startswith("nxdi_gptoss_fp8")]
    message = record.getMessage()
    assert "\n" not in message and support.SERVING_NEEDS in message and "since Neuron SDK 2.34.0" in message


@pytest.mark.parametrize(("version", "warned"), [("0.10.18399", True), ("0.9.17334", False), ("0.6.0", True)])
def test_register_warns_once_outside_the_verified_nxdi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, version: str, warned: bool,
) -> None:
    install(tmp_path, support.NXDI_DISTRIBUTION, version)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setattr(support, "_WARNED", set())
    logger = logging.getLogger("nxdi_gptoss_fp8.nxdi.hook")
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        support.warn_unverified_nxdi(logger)
        support.warn_unverified_nxdi(logger)
    records = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(records) == (1 if warned else 0)
    if warned:
        assert version in records[0].getMessage() and "outside the verified set" in records[0].getMessage()
        assert records[0].getMessage().endswith(support.SUPPORT_WINDOW)  # the window, with 2.34.0, in the warning


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The stand-in NxDI modules under the real names; the hook is removed afterwards."""
    monkeypatch.delenv(nxdi_hook.ENV_VAR, raising=False)
    with nxdi_standin.installed() as modules:
        yield modules


def test_register_itself_warns_for_an_unverified_nxdi(
    nxdi: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    install(tmp_path, support.NXDI_DISTRIBUTION, "0.10.18399")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setattr(support, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="nxdi_gptoss_fp8"):
        nxdi_hook.register()
        nxdi_hook.unregister()
        nxdi_hook.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NxDI 0.10.18399" in warnings[0] and "expected to work" in warnings[0]
    assert nxdi_hook.is_registered()


def test_the_supported_environments_page_states_the_same_window_and_matrix() -> None:
    window = documents.section(PAGE, "The support window")
    first_paragraph = " ".join(window.split("\n\n")[1].split())
    assert first_paragraph == support.SUPPORT_WINDOW + "."
    matrix = documents.section(PAGE, "The matrix")
    for rule in support.MATRIX:
        assert f"| {rule.component}" in matrix, rule.component


def test_no_document_says_support_ends_in_the_future() -> None:
    """AWS ended NxDI on Trn2/Trn3 with SDK 2.34.0: no page (nor the window the package prints) says it will."""
    for name, text in [*((name, documents.page(name)) for name in documents.pages()), ("SUPPORT_WINDOW", support.SUPPORT_WINDOW)]:
        text = " ".join(text.split())
        assert "ends with 2.34" not in text and "ends with SDK 2.34" not in text, name


def test_selfcheck_prints_the_same_header(tmp_path: Path) -> None:
    from nxdi_gptoss_fp8.forward.selfcheck import SelfcheckReport

    header = support.environment_report(site_with(tmp_path, SDK_229), python_version="3.11.7")
    model = {"layers": 2, "experts": 3, "top_k": 2, "hidden_size": 64, "intermediate_size": 96, "vocab_size": 40,
             "tokens": 12, "context": 6}
    report = SelfcheckReport(1, {"version": "0", "path": "/p", "files_sha256": "0" * 64}, {}, model, support=header)
    assert report.render_text().startswith(header.render_text() + "\nnxdi-gptoss-fp8 selfcheck (tp 1)")
    assert report.to_dict()["support"] == header.to_dict()


@pytest.mark.parametrize(("version", "status"), [("0.9.0", support.VERIFIED), ("0.10.1", support.EXPECTED),
                                                 ("0.5.0", support.UNSUPPORTED), (None, support.UNSUPPORTED)])
def test_a_component_run_from_source_is_not_reported_as_absent(tmp_path: Path, version: str | None, status: str) -> None:
    report = support.environment_report(site_with(tmp_path, {"torch": "2.13.0"}), python_version="3.11.0")
    support.from_source(report, "NxDI", version, "/src/nxdi/src/neuronx_distributed_inference")
    found = report.component("NxDI")
    assert found.status == status and found.version == version
    assert found.reason.startswith("from source at /src/nxdi/src/neuronx_distributed_inference (no installed distribution)")
    assert "not installed" not in report.render_text().split("NxDI")[1].splitlines()[0]


def test_an_installed_component_is_left_as_installed(tmp_path: Path) -> None:
    report = support.environment_report(site_with(tmp_path, SDK_229), python_version="3.11.0")
    before = report.component("NxDI")
    support.from_source(report, "NxDI", "0.5.0", "/elsewhere")
    assert report.component("NxDI") == before
