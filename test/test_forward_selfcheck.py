"""``selfcheck`` (and ``check-forward``) where NxDI is importable only in part: NxDI and NxD
sources found on ``PYTHONPATH`` whose import fails (NxD's ``boto3``/``tenacity``, the Neuron-only
``torch_xla``, a stand-in lacking a name). Simulated by stand-in packages whose import raises as
the real ones do; the command prints one line and exits 2, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAILURES = {
    # what NxD's package import raises without boto3 (trainer/checkpoint_storage.py)
    "boto3": ("raise ModuleNotFoundError(\"No module named 'boto3'\", name='boto3')",
              ["'boto3'", "pip install 'nxdi-gptoss-fp8[nxdi-cpu]'"]),
    "tenacity": ("raise ModuleNotFoundError(\"No module named 'tenacity'\", name='tenacity')",
                 ["'tenacity'", "pip install 'nxdi-gptoss-fp8[nxdi-cpu]'"]),
    "torch_xla": ("raise ModuleNotFoundError(\"No module named 'torch_xla.core'\", name='torch_xla.core')",
                  ["needs torch_xla, which exists only on a Neuron host", "docs/model-checks.md#where-selfcheck-and-check-forward-run"]),
    "attribute": ("raise AttributeError(\"module 'torch_neuronx' has no attribute 'xla_impl'\")",
                  ["importing neuronx_distributed_inference.models.gpt_oss.modeling_gpt_oss failed: AttributeError"]),
}


def partial_nxdi(site: Path, failure: str) -> None:
    """NxDI and NxD as source trees: found by ``find_spec``, failing when NxD is imported."""
    nxd = site / "neuronx_distributed"
    nxd.mkdir(parents=True)
    (nxd / "__init__.py").write_text(FAILURES[failure][0] + "\n")
    modeling = site / "neuronx_distributed_inference" / "models" / "gpt_oss"
    modeling.mkdir(parents=True)
    for package in (site / "neuronx_distributed_inference", modeling.parent, modeling):
        (package / "__init__.py").write_text("")
    (modeling / "modeling_gpt_oss.py").write_text("import neuronx_distributed\n")


@pytest.mark.parametrize("json_flag", [False, True])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_selfcheck_with_nxdi_importable_only_in_part_is_one_line(tmp_path: Path, failure: str, json_flag: bool) -> None:
    partial_nxdi(tmp_path / "site", failure)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "selfcheck", *(["--json"] if json_flag else [])],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "NxDI is importable here only in part" in done.stderr
    for expected in FAILURES[failure][1]:
        assert expected in done.stderr
    if json_flag:
        result = json.loads(done.stdout)
        assert result["ok"] is False and result["exit_code"] == 2 and "only in part" in result["error"]["message"]
        assert result["error"]["kind"] == "missing_dependency"
    else:
        assert done.stdout == ""


CPU_ROUTE = "docs/model-checks.md#where-selfcheck-and-check-forward-run"
STANDIN_SITE = ROOT / "test" / "support" / "nxdi_standin" / "cpu_site"


@pytest.mark.skipif(importlib.util.find_spec("neuronx_distributed_inference") is not None, reason="NxDI is installed here")
@pytest.mark.parametrize(("setting", "said"), [
    ("no-sources", "which were not loaded here"),
    ("outside-the-clone", "name source checkouts, but the Neuron stand-ins were not loaded"),
    ("src-folders", "the Neuron stand-ins were not loaded"),
    ("src-folders-with-stand-ins", "the Neuron stand-ins were loaded"),
])
def test_selfcheck_on_a_cpu_host_points_at_the_cpu_route(tmp_path: Path, setting: str, said: str) -> None:
    """NxDI not importable on a CPU host: the one line names the CPU route of docs/model-checks.md
    and whether the stand-ins were loaded — also when NXDI_SRC/NXD_SRC are right but the route's
    relative PYTHONPATH was used outside the clone, where it finds no stand-ins."""
    for repo, package in (("nxdi", "neuronx_distributed_inference"), ("nxd", "neuronx_distributed")):
        (tmp_path / repo / "src" / package).mkdir(parents=True)  # a checkout's layout; never imported here
    env = {key: value for key, value in os.environ.items() if key not in ("NXDI_SRC", "NXD_SRC")}
    env["PYTHONPATH"] = str(ROOT)
    if setting != "no-sources":
        src = setting.startswith("src-folders")
        env.update(NXDI_SRC=str(tmp_path / "nxdi" / ("src" if src else "")), NXD_SRC=str(tmp_path / "nxd" / ("src" if src else "")))
    if setting == "outside-the-clone":  # the route's command as written, run from another directory
        env["PYTHONPATH"] = os.pathsep.join(["test/support/nxdi_standin/cpu_site", str(ROOT)])
    if setting == "src-folders-with-stand-ins":
        env["PYTHONPATH"] = os.pathsep.join([str(STANDIN_SITE), str(ROOT)])
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8.cli", "selfcheck"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert CPU_ROUTE in done.stderr and said in done.stderr, done.stderr
