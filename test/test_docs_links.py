"""Every link of the README and docs/ resolves, anchors included (GitHub's slugs), and every page and
section the package cites — in a message, a docstring or a command's ``--help`` — exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import documents
import pytest

from nxdi_gptoss_fp8.cli import build_parser

PACKAGE = documents.REPO / "nxdi_gptoss_fp8"
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:
# docs/NAME.md, docs/NAME.md#anchor, and a section named after it: `docs/x.md, "Title"` or `docs/x.md, Title)`
DOC_CITATION = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?(?:,\s+\\?\"([^\"\\]+)\\?\"|,\s+([A-Za-z][^()\"\\:;]{0,60}?)[):;])?")
README_CITATION = re.compile(r"README(?:'s)?,?\s+(?:section\s+)?\\?\"([^\"\\]+)\\?\"")


def relative_links() -> list[tuple[str, str]]:
    """(page, target) of every link that is not to another site."""
    return [(name, target) for name in documents.pages() for target in documents.links(name)
            if not EXTERNAL.match(target)]


def resolve(page: str, target: str) -> tuple[str, str]:
    """The repository-relative path and the anchor a link of ``page`` leads to."""
    path, _, anchor = target.partition("#")
    if not path:
        return page, anchor
    joined = (documents.REPO / page).parent / path
    return Path(joined.resolve()).relative_to(documents.REPO).as_posix(), anchor


def check_target(path: str, anchor: str, where: str) -> None:
    assert (documents.REPO / path).exists(), f"{where}: {path} does not exist"
    if anchor:
        assert path.endswith(".md"), f"{where}: an anchor into {path}, which is not a page"
        assert anchor in documents.anchors(path), f"{where}: {path} has no heading #{anchor}"


@pytest.mark.parametrize(("page", "target"), relative_links())
def test_every_relative_link_and_anchor_resolves(page: str, target: str) -> None:
    path, anchor = resolve(page, target)
    check_target(path, anchor, f"{page} links {target!r}")


def test_every_page_links_somewhere_and_the_readme_reaches_every_page() -> None:
    reached = {resolve("README.md", target)[0] for target in documents.links("README.md") if not EXTERNAL.match(target)}
    assert set(documents.pages()[1:]) <= reached
    assert {"CHANGELOG.md", "LICENSE"} <= reached


@pytest.mark.parametrize(("title", "slug"), [
    ("Which checkpoint is this? (`inspect`)", "which-checkpoint-is-this-inspect"),
    ("vLLM (the NxDI-backed `vllm-neuron`)", "vllm-the-nxdi-backed-vllm-neuron"),
    ("config.json, field by field", "configjson-field-by-field"),
    ("Pre-sharded weights: the manifest", "pre-sharded-weights-the-manifest"),
    ("Check a serving host first: `doctor`", "check-a-serving-host-first-doctor"),
    ("Try it on a tiny source; what `--overwrite` replaces", "try-it-on-a-tiny-source-what---overwrite-replaces"),
    ("Model-level checks — `selfcheck` → [more](x.md)", "model-level-checks--selfcheck--more"),
])
def test_slugs_follow_githubs_rules(title: str, slug: str) -> None:
    assert documents.github_slug(title) == slug


def test_a_repeated_heading_gets_a_numbered_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "page", lambda name: "# A\n## Notes\n```\n# not a heading\n```\n## Notes\n")
    assert documents.anchors("x.md") == {"a", "notes", "notes-1"}


def help_texts() -> str:
    """Every command's ``--help``, as the parser renders it."""
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts.extend(sub.format_help() for sub in action.choices.values())
    return "\n".join(texts)


def package_citations() -> list[tuple[str, re.Match[str]]]:
    """(where, match) of every documentation citation in the package's source and its ``--help``."""
    sources = [(str(path.relative_to(documents.REPO)), path.read_text(encoding="utf-8"))
               for path in sorted(PACKAGE.rglob("*.py"))]
    sources.append(("--help", help_texts()))
    found = []
    for where, text in sources:
        flat = " ".join(re.sub(r"\"\s*\n\s*(f?)\"", "", text).split())  # adjacent string literals joined, one line
        flat = flat.replace(" # ", " ")  # a comment continued on the next line
        found.extend((where, match) for match in DOC_CITATION.finditer(flat))
        found.extend((where, match) for match in README_CITATION.finditer(flat))
    return found


def test_every_page_and_section_the_package_cites_exists() -> None:
    citations = package_citations()
    pages = {match.group(1) for _, match in citations if match.re is DOC_CITATION}
    assert {"format.md", "serving.md", "model-checks.md", "install.md", "loading.md"} <= pages  # the scan finds them
    for where, match in citations:
        if match.re is README_CITATION:
            titles = {heading.title for heading in documents.headings(documents.page("README.md"))}
            assert match.group(1) in titles, f"{where} cites the README section {match.group(1)!r}, which does not exist"
            continue
        page, anchor, quoted, named = f"docs/{match.group(1)}", match.group(2), match.group(3), match.group(4)
        check_target(page, anchor or "", f"{where} cites {match.group(0)!r}")
        if quoted or named:
            titles = [heading.title for heading in documents.headings(documents.page(page))]
            if quoted:
                assert quoted in titles, f"{where} cites {page}, {quoted!r}: no such section"
            else:
                assert any(title.startswith(named.strip()) for title in titles), \
                    f"{where} cites {page}, {named.strip()!r}: no section of that name"


def test_messages_cite_the_serving_page_where_they_cited_a_readme_section() -> None:
    from nxdi_gptoss_fp8.nxdi import recipes, serving_host
    from nxdi_gptoss_fp8.validate.findings import PreflightReport

    report = PreflightReport("/ckpt")
    report.add("neuron_config", "not_quantized", "message")
    hint = recipes.vllm_hint(report, "/ckpt", {"vllm_neuron": object()})
    assert hint is not None and "docs/serving.md#vllm-the-nxdi-backed-vllm-neuron" in hint
    assert "docs/serving.md#vllm-the-nxdi-backed-vllm-neuron" in serving_host.HostReport([], None).render_text()
