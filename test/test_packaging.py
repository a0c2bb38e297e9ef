"""What the packages ship: the wheel the format document the messages cite and ``python -m nxdi_gptoss_fp8``,
the sdist the docs; and PyPI's description, the README with links that work from PyPI."""

from __future__ import annotations

import email
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import documents
import pytest

from nxdi_gptoss_fp8 import format as fmt

ROOT = Path(__file__).resolve().parent.parent
SOURCE_PARTS = ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in", "CHANGELOG.md", "LICENSE", "docs", "nxdi_gptoss_fp8")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source tree to build from (the tree itself stays clean)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is needed to build the packages")
    tree = tmp_path_factory.mktemp("tree")
    for part in SOURCE_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, tree / part, ignore=shutil.ignore_patterns("__pycache__", "format.md", "*.so")
                            if part == "nxdi_gptoss_fp8" else None)
        elif source.exists():
            shutil.copy(source, tree / part)
    return tree


@pytest.fixture(scope="module")
def wheel(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(tree), "-w", str(out)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_compiled_encoders_where_a_compiler_works(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    if shutil.which("cc") or shutil.which("gcc"):
        assert any(name.startswith("nxdi_gptoss_fp8/convert/_kernels.") and name.endswith(".so") for name in names)


def test_a_wheel_builds_without_a_compiler_and_converts_on_torch(tree: Path, tmp_path: Path) -> None:
    """``CC=false``: the optional extension fails, the wheel is built all the same, without it,
    and the package it installs says the converter runs its torch path."""
    own = shutil.copytree(tree, tmp_path / "tree", ignore=shutil.ignore_patterns("build", "*.so", "*.egg-info"))
    env = {**os.environ, "CC": "false"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(own), "-w",
                    str(tmp_path / "wheel")], check=True, capture_output=True, timeout=300, env=env)
    (built,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        assert not [name for name in archive.namelist() if "_kernels" in name]
        archive.extractall(tmp_path / "site")
    code = "from nxdi_gptoss_fp8.convert import kernels; print(kernels.AVAILABLE)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.stdout.strip() == "False"


def test_the_sdist_ships_every_docs_page(tree: Path, tmp_path: Path) -> None:
    own = shutil.copytree(tree, tmp_path / "tree")  # the sdist's egg-info stays out of the wheel's tree
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=own, check=True,
                   capture_output=True, timeout=300)
    (built,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(built) as archive:
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {page for page in documents.pages()} <= shipped
    assert {"LICENSE", "CHANGELOG.md"} <= shipped


def test_pypi_shows_the_readme_with_absolute_links(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = email.message_from_string(archive.read(metadata_name).decode("utf-8"))
    description = metadata.get_payload()
    readme = documents.page("README.md")
    targets = re.findall(r"\]\(([^)\s]+)\)", description)
    assert len(targets) == len(documents.links("README.md")) > 10
    for target, original in zip(targets, documents.links("README.md"), strict=True):
        if re.match(r"^[a-z]+:", original):
            assert target == original
        else:
            assert target == f"https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/{original}"
            path = original.partition("#")[0]
            assert (ROOT / path).exists(), path
    assert description.replace("https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/", "").strip() == readme.strip()


def test_the_wheel_ships_the_format_document_unchanged(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "nxdi_gptoss_fp8/format.md" in names and "nxdi_gptoss_fp8/__main__.py" in names
        assert archive.read("nxdi_gptoss_fp8/format.md") == (ROOT / "docs" / "format.md").read_bytes()


def test_the_installed_document_is_found_where_messages_cite_it(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    code = "from nxdi_gptoss_fp8 import format as f; print(f.format_document_path())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path)}, check=True)
    assert Path(done.stdout.strip()) == tmp_path / "nxdi_gptoss_fp8" / "format.md"
    help_text = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8", "--help"], capture_output=True, text=True,
                               cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "COLUMNS": "400"}, check=True).stdout
    assert str(tmp_path / "nxdi_gptoss_fp8" / "format.md") in help_text


def test_a_source_tree_cites_docs_format_md() -> None:
    assert fmt.format_document_path() == str(ROOT / "docs" / "format.md")


def test_python_dash_m_runs_the_command_line(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8", "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.startswith("python -m nxdi_gptoss_fp8 0.")
    done = subprocess.run([sys.executable, "-m", "nxdi_gptoss_fp8", "validate", str(tmp_path / "absent")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "does not exist" in done.stderr and "Traceback" not in done.stderr
