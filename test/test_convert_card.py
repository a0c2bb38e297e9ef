"""The model card ``convert`` writes (``convert/card.py``): its YAML read back with a YAML parser,
its NeuronConfig block fed to ``validate --neuron-config``, and the companion files ``inspect`` lists."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nxdi_gptoss_fp8 import __version__, cli, hub
from nxdi_gptoss_fp8.convert import convert
from nxdi_gptoss_fp8.convert.card import CARD_FILE, front_matter, source_license
from nxdi_gptoss_fp8.inspection import inspect_directory
from nxdi_gptoss_fp8.synthetic.sources import SOURCE_BF16, SOURCE_MXFP4, make_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SOURCE_CARD = "---\nlicense: apache-2.0\npipeline_tag: text-generation\n---\n# the source's own card\n"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_source(tmp_path_factory.mktemp("src") / "mxfp4", SOURCE_MXFP4, original=False)
    (root / CARD_FILE).write_text(SOURCE_CARD)
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "generation_config.json").write_text('{"eos_token_id": 38}')
    return root


def card(out: Path) -> tuple[dict[str, Any], str]:
    """(front matter parsed by PyYAML, body) of ``out``'s README.md."""
    text = (out / CARD_FILE).read_text()
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert match, "the card has no YAML front matter"
    return yaml.safe_load(match.group(1)), match.group(2)


def neuron_config_block(body: str) -> dict[str, Any]:
    (block,) = re.findall(r"```json\n(.*?)\n```", body, re.S)
    return json.loads(block)


def test_the_card_of_a_hub_source(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert(source, out, max_shard_size="40KB", progress=False,
            provenance={"repo": "openai/gpt-oss-20b", "revision": COMMIT}, extra_files=hub.companion_files(source))
    meta, body = card(out)
    assert meta == {"base_model": "openai/gpt-oss-20b", "base_model_relation": "quantized", "license": "apache-2.0",
                    "pipeline_tag": "text-generation",
                    "tags": ["gpt-oss", "fp8", "neuron", "nxdi", "normalized-fp8", "nxdi-gptoss-fp8"]}
    assert "the source's own card" not in body  # never copied over the card
    assert f"`openai/gpt-oss-20b` at commit `{COMMIT}`, HF MXFP4" in body
    assert "nxdi_gptoss_normalized_fp8` version 1" in body and f"nxdi-gptoss-fp8 {__version__}" in body
    index = json.loads((out / "model.safetensors.index.json").read_text())
    exactness = index["metadata"]["source"]["exactness"]
    assert f"{exactness['fp8_values']:,} of {exactness['fp8_values']:,} expert values exact" in body
    assert f"verify-conversion . --source openai/gpt-oss-20b --revision {COMMIT}" in body
    assert "hf upload-large-folder YOUR-ORG/gpt-oss-20b-normalized-fp8 . --repo-type=model" in body
    assert "resumable" in body and "`generation_config.json`, `tokenizer.json`" in body


@pytest.mark.parametrize("padding", [{}, {"padded_hidden_size": 96, "padded_intermediate_size": 128}])
def test_the_neuron_config_block_validates_the_output(source: Path, tmp_path: Path, padding: dict[str, int],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    report = convert(source, out, max_shard_size="40KB", progress=False, **padding)
    _, body = card(out)
    block = neuron_config_block(body)
    assert block["padded_hidden_size"] == report.padded_hidden_size
    assert block["padded_intermediate_size"] == report.padded_intermediate_size
    assert ("(+32 zero rows/columns)" in body) == bool(padding)
    config = tmp_path / "neuron_config.json"
    config.write_text(json.dumps({**block, "quantized_checkpoints_path": str(out), "tp_degree": 2}))
    assert cli.main(["validate", str(out), "--neuron-config", str(config), "--allow-custom-model"]) == cli.EXIT_OK
    assert "VALID" in capsys.readouterr().out
    # the block is what makes it load: without it NxDI would not run the checkpoint as FP8
    config.write_text(json.dumps({**block, "quantized": False}))
    assert cli.main(["validate", str(out), "--neuron-config", str(config), "--allow-custom-model"]) == cli.EXIT_FINDINGS


def test_a_local_source_without_a_repo_gets_no_base_model(tmp_path: Path) -> None:
    root = make_source(tmp_path / "bf16", SOURCE_BF16, original=False)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "license": "mit", "_name_or_path": "/local/models/x"}))
    convert(root, tmp_path / "out", max_shard_size="40KB", progress=False)
    meta, body = card(tmp_path / "out")
    assert "base_model" not in meta and "base_model_relation" not in meta and meta["license"] == "mit"
    assert "a local directory" in body and "amax/240" in body and "--source SRC" in body


def test_a_source_readme_given_as_an_extra_file_is_not_copied(source: Path, tmp_path: Path) -> None:
    convert(source, tmp_path / "out", max_shard_size="40KB", progress=False, extra_files={CARD_FILE: source / CARD_FILE})
    assert (tmp_path / "out" / CARD_FILE).read_text() != SOURCE_CARD
    assert card(tmp_path / "out")[0]["license"] == "apache-2.0"


@pytest.mark.parametrize(("card_text", "config", "expected"), [
    ("---\nlicense: apache-2.0\n---\n", {}, "apache-2.0"),
    ("---\nlicense: 'llama3.1'  # see LICENSE\n---\n", {}, "llama3.1"),
    ("---\ntags: [x]\n---\nlicense: apache-2.0\n", {}, None),  # not in the front matter
    ("no front matter\n", {"license": "apache-2.0"}, "apache-2.0"),
    ("---\nlicense: apache-2.0\nbase_model: evil\n---\n", {}, "apache-2.0"),
    ("---\nlicense: \"a b: c\"\n---\n", {"license": "x\ny"}, None),  # not a plain id: left out
    ("---\nlicense: null\n---\n", {}, None),  # YAML's null, not a license named "null"
    ("---\nlicense: Null\n---\n", {"license": "mit"}, "mit"),
    ("---\nlicense: false\n---\n", {}, None),  # a YAML boolean
    (None, {}, None),
])
def test_source_license(tmp_path: Path, card_text: str | None, config: dict[str, Any], expected: str | None) -> None:
    if card_text is not None:
        (tmp_path / CARD_FILE).write_text(card_text)
    assert source_license(str(tmp_path), config) == expected


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["base_model", "license", "x", "tags"]),
                       st.one_of(st.text(), st.integers(), st.booleans(), st.lists(st.text(), max_size=3))))
def test_front_matter_reads_back_as_written(fields: dict[str, Any]) -> None:
    text = front_matter(fields)
    assert text.startswith("---\n") and text.endswith("\n---\n")
    assert yaml.safe_load(text[4:-4]) == (fields or None)


def test_inspect_lists_companion_files(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    convert(source, out, max_shard_size="40KB", progress=False, extra_files=hub.companion_files(source))
    found = {c.what: c.present for c in inspect_directory(out, allow_custom_model=True).summary.companions}  # type: ignore[union-attr]
    assert found == {"tokenizer": ["tokenizer.json"], "chat template": [], "generation config": ["generation_config.json"],
                     "model card": [CARD_FILE]}
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert cli.main(["inspect", str(out), "--allow-custom-model"]) == cli.EXIT_OK
    text = capsys.readouterr().out
    assert "tokenizer.json, tokenizer_config.json" in text and "tokenizer_config.json (chat_template)" in text
    shutil.copy(out / "tokenizer_config.json", tmp_path / "keep.json")
    (out / "tokenizer.json").unlink()
    (out / "tokenizer_config.json").unlink()
    assert cli.main(["inspect", str(out), "--json", "--allow-custom-model"]) == cli.EXIT_OK
    companions = {c["what"]: c for c in json.loads(capsys.readouterr().out)["companions"]}
    assert companions["tokenizer"]["present"] == [] and companions["tokenizer"]["required"] is True
    assert companions["model card"]["required"] is False
