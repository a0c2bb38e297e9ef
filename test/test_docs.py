"""The documented Python example runs as written, the README's first screen is the two commands, and
docs/format.md matches the code it describes. Pages are read with ``documents`` (test/support)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import documents
import pytest

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.validate.findings import CHECKS

ROOT = documents.REPO
README = documents.page("README.md")
FORMAT_DOC = documents.page("docs/format.md")


def test_the_from_python_example_runs_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

    snippet = documents.code_block("docs/validating.md", "From Python", "python")
    assert "nxdi-gptoss-fp8 make-tiny tiny-fp8" in documents.section("docs/validating.md", "From Python")
    monkeypatch.chdir(tmp_path)
    make_tiny("tiny-fp8")  # what `nxdi-gptoss-fp8 make-tiny tiny-fp8` writes
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "docs/validating.md", "exec"), {"__name__": "__docs__"})
    assert out.getvalue().startswith("True {'errors': 0")


def test_the_first_screen_starts_with_a_virtualenv_and_needs_no_torch_for_the_demo() -> None:
    first = documents.code_block("README.md", "nxdi-gptoss-fp8", "bash")
    commands = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert commands[0].startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "torch" not in commands[0] and commands[0].endswith("nxdi-gptoss-fp8 demo")
    assert README.index(first) < README.index("\n## ")  # the quick start comes before any section


def test_the_readme_is_a_front_door() -> None:
    """At most 150 lines, the job in order, every docs page in its table."""
    assert len(README.splitlines()) <= 150
    job = documents.section("README.md", "The job, in order")
    steps = ("validate ORG/REPO", "inspect", "convert gpt-oss-120b gpt-oss-120b-fp8 --dry-run",
             "convert gpt-oss-120b gpt-oss-120b-fp8`", "verify-conversion", "validate gpt-oss-120b-fp8",
             "doctor -- vllm serve", "Serve")
    positions = [job.index(step) for step in steps]
    assert positions == sorted(positions)
    table = documents.section("README.md", "Documentation")
    for name in documents.pages()[1:]:
        assert f"]({name})" in table, name
def test_the_format_document_lists_every_tensor_and_every_check() -> None:
    layout = fmt.Layout.unpadded(fmt.PROFILES[fmt.PROFILE_20B])
    expert = "feed_forward.moe.expert_mlps.mlp_op."
    for spec in fmt.layer_specs(layout, 0):
        name = spec.name.removeprefix("layers.0.").replace(expert, "experts.")
        stem, last = name.rsplit(".", 1)
        assert f"`{name}`" in FORMAT_DOC or f"`{stem}.weight`, `.{last}`" in FORMAT_DOC, name
    for spec in fmt.global_specs(layout):
        assert f"`{spec.name}`" in FORMAT_DOC
    for check in CHECKS:
        assert f"| `{check}` |" in FORMAT_DOC
    for field in fmt.REQUIRED_METADATA:
        assert f"| `{field}` |" in FORMAT_DOC


def test_package_messages_point_at_the_projects_own_document() -> None:
    for path in (ROOT / "nxdi_gptoss_fp8").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "§" not in text and "nxdi-contract" not in text and "normalized-fp8-format" not in text, path.name
    assert "](docs/format.md" in README


def test_the_format_document_states_the_config_field_rule() -> None:
    """Every config.json field class of format.py is in the document, and every config code."""
    section = FORMAT_DOC[FORMAT_DOC.index("## config.json, field by field"):FORMAT_DOC.index("## Findings by check")]
    for field in (fmt.CONFIG_READ_FIELDS - {"num_experts", "experts_per_token"}) | fmt.CONFIG_HARD_CODED.keys() \
            | fmt.ROPE_SCALING_READ - {"type"} | fmt.ROPE_SCALING_HARD_CODED | {"layer_types"}:
        assert f"`{field}`" in section or field in fmt.ModelDims.__dataclass_fields__, field
    assert "CONFIG_INERT_FIELDS" in section
    for code in ("hard_coded_mismatch", "layer_types_mismatch", "rope_mismatch", "bad_rope", "heads_indivisible",
                 "unknown_field", "dtype_not_bfloat16", "not_boolean"):
        assert f"`{code}`" in FORMAT_DOC, code


PROJECT_PATH = re.compile(r"(?<![\w./-])((?:test|scripts)/[\w./-]*)")


@pytest.mark.parametrize("name", documents.pages())
def test_every_test_and_script_path_a_page_names_exists(name: str) -> None:
    named = {match.rstrip(".,") for match in PROJECT_PATH.findall(documents.page(name))}
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"{name} names paths that do not exist: {missing}"


def test_the_pages_name_the_scripts_and_tests_they_describe() -> None:
    named = " ".join(documents.page(name) for name in documents.pages())
    assert "test/test_forward_cpu_model.py" in named and "scripts/fuzz_preflight.py" in named


# the format document and the generated command-line reference have shapes of their own
TASK_PAGES = [name for name in documents.pages()[1:] if name not in ("docs/format.md", "docs/cli.md")]


@pytest.mark.parametrize("name", TASK_PAGES)
def test_every_page_opens_with_what_it_is_for_and_the_commands_to_copy(name: str) -> None:
    text = documents.page(name)
    first_section = next((h.line for h in documents.headings(text) if h.level == 2), len(text.splitlines()))
    opening = "\n".join(text.splitlines()[:first_section])
    prose = [line for _, line in documents.prose_lines(opening) if line.strip() and not line.startswith("#")]
    assert prose, f"{name}: no sentence saying what the page is for before its first section"
    assert re.search(r"^```(bash|python)\n", opening, flags=re.M), f"{name}: no commands before its first section"


# names written in lower case that may open a paragraph
LOWER_CASE_NAMES = ("llm-compressor", "vLLM", "vllm-neuron", "transformers", "torchrun", "huggingface_hub")


@pytest.mark.parametrize("name", documents.pages())
def test_every_section_opens_with_a_whole_sentence(name: str) -> None:
    """A section's first paragraph starts a sentence (a capital, a code span, a link or a list),
    never mid-sentence as a bullet's "**Safety:** one expert per lane …" did once moved under a
    heading; a name written in lower case may open it."""
    lines = documents.page(name).splitlines()
    prose = dict(documents.prose_lines(documents.page(name)))
    broken = []
    for heading in documents.headings(documents.page(name)):
        first = next((lines[n] for n in range(heading.line + 1, len(lines)) if lines[n].strip()), "")
        if heading.line + 1 in prose and first[:1].islower() and not first.startswith(LOWER_CASE_NAMES):
            broken.append(f"{heading.title!r}: {first[:60]}")
    assert not broken, f"{name}: sections that start mid-sentence: {broken}"


def _bench_presharded() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_presharded", documents.REPO / "scripts" / "bench_presharded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_presharded_page_states_the_size_the_script_derives(tmp_path: Path) -> None:
    """docs/benchmarks.md's 120b rank files — their size and the manifest time computed for them —
    are what ``scripts/bench_presharded.py`` derives from the per-rank shapes and writes (no size
    typed into the script: a typed 118 GB once disagreed with the 64 × 2.02 GB it wrote)."""
    from nxdi_gptoss_fp8.units import format_bytes

    bench: Any = _bench_presharded()
    tensors = bench.rank_tensors()
    total = bench.rank_set_bytes(tensors)
    assert bench.write_sparse_rank(str(tmp_path / "rank.safetensors"), tensors) * bench.TP == total  # sparse: no disk
    text = documents.section("docs/benchmarks.md", "Pre-sharded weights")
    per_rank = re.search(r"(\d+) sparse rank files of ([\d.]+ [kMGT]?B), (\d+) tensors", text)
    assert per_rank is not None, text
    assert (int(per_rank[1]), per_rank[2], int(per_rank[3])) == (bench.TP, format_bytes(total / bench.TP), len(tensors))
    stated = re.search(r"(\d+ [kMGT]?B): the script derives.*?≈ (\d+) s at this rate", text, flags=re.S)
    rate = re.search(r"\| manifest at compile [^|]*\| ([\d.]+) GB/s \|", text)
    assert stated is not None and rate is not None, text
    assert stated[1] == format_bytes(total) and int(stated[2]) == round(total / (float(rate[1]) * 1e9))
    source = (documents.REPO / "scripts" / "bench_presharded.py").read_text(encoding="utf-8")
    assert re.findall(r"\b(?!1e9\b)\d+(?:\.\d+)?e9\b", source) == [], "a byte count typed into the script"
