"""docs/cli.md is generated from the parser (``scripts/cli_reference.py``) and current."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_reference import PAGE, REGENERATE, main, render_reference

from nxdi_gptoss_fp8.cli import build_parser
from nxdi_gptoss_fp8.cli._help import subcommands

ROOT = Path(__file__).resolve().parent.parent


def test_docs_cli_md_is_current() -> None:
    page = ROOT / PAGE
    assert page.is_file() and page.read_text(encoding="utf-8") == render_reference(), \
        f"{PAGE} is stale: regenerate it with `{REGENERATE}` (from the repository's root) and commit it"


def test_the_page_has_every_command_its_examples_and_how_to_regenerate() -> None:
    text = render_reference()
    assert REGENERATE in text.splitlines()[2]
    for name, (_, parser) in subcommands(build_parser()).items():
        assert f"\n## {name}\n" in text and f"(#{name})" in text
        for example in parser.examples:
            assert example.command in text


def test_the_page_does_not_depend_on_the_terminal_or_the_installed_path(monkeypatch: pytest.MonkeyPatch) -> None:
    first = render_reference()
    monkeypatch.setenv("COLUMNS", "37")
    assert render_reference() == first
    assert str(ROOT) not in first and "docs/format.md" in first


def test_it_writes_the_page_it_renders(tmp_path: Path) -> None:
    assert main([str(tmp_path / "cli.md")]) == 0
    assert (tmp_path / "cli.md").read_text(encoding="utf-8") == render_reference()
