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
    # the support window as env states it: NxDI gone from Trn2/Trn3 since 2.34.0, serving needs 2.27-2.31
    from nxdi_gptoss_fp8.support import SUPPORT_WINDOW

    assert body.rstrip().endswith(SUPPORT_WINDOW + ".") and "only Neuron SDK 2.27–2.31 images ship" in body
    flat = " ".join(body.split())  # the Trn2-only fact (NxDI 2.29) and Inf2/Trn1 as no route, in the load section
    assert "Needs NxDI on a Trn2" in flat and "since SDK 2.29 its models run only on Trn2 and newer" in flat
    assert "Inf2/Trn1, kept in maintenance at 2.31, are no route" in flat
    assert "| target |" not in body  # no named target asked for


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


@pytest.mark.parametrize("name_or_path", ["openai/gpt-oss-20b", "/home/someone/models/gpt-oss-20b"])
def test_name_or_path_is_inert_for_the_card_and_the_index(tmp_path: Path, name_or_path: str) -> None:
    """``_name_or_path`` (inert, docs/format.md) names no base model, repo or path, even when it
    looks like a repo id."""
    root = make_source(tmp_path / "src", SOURCE_MXFP4, original=False)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "_name_or_path": name_or_path}))
    convert(root, tmp_path / "out", max_shard_size="40KB", progress=False)
    meta, body = card(tmp_path / "out")
    assert "base_model" not in meta and "a local directory (no Hub repo recorded)" in body
    source = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())["metadata"]["source"]
    assert "repo" not in source and "path" not in source and name_or_path not in json.dumps(source)


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


# --------------------------------------------------------------------------- hostile sources


LICENSE_VALUES = ["mit", "apache-2.0", "llama3.1", "2", "1.0", "0x1f", "yes", "No", "on", "null", "~", "", "[mit]",
                  "[mit, apache-2.0]", "{a: b}", "'mit'", '"mit"', "'it''s'", '"a\\"b"', "*anchor", "&a mit", "!!str mit",
                  "mit # a comment", "other", "'2'", "2001-12-14", "-mit", ".inf", "|", ">"]
OTHER_LINES = ["tags: [a,", "b]", 'description: "abc', '"', "description: 'x", "'", "- mit", "  - apache-2.0",
               "extra_gated_fields:", "  license: inner", "# license: commented", "pipeline_tag: text-generation",
               "title: x: y", "license_name: custom", "base_model: openai/gpt-oss-20b", "  continued",
               '"license": mit', "'license': apache-2.0", "license : mit", "? license", "license\t: mit",
               "<<: {license: merged}", "defaults: &d {license: x}", "<<: *d"]


def _yaml_front_matter(text: str) -> Any:
    """The front matter as a YAML parser reads it (lines split where YAML splits them)."""
    lines = re.split(r"\r\n|\r|\n", text.removeprefix("\ufeff"))
    end = next(i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---")
    return yaml.safe_load("\n".join(lines[1:end]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(OTHER_LINES), st.sampled_from(LICENSE_VALUES).map(lambda v: f"license: {v}")),
                max_size=6),
       st.sampled_from(["\n", "\r\n", "\r"]), st.booleans(), st.sampled_from([None, "mit", "2", "yes", "a b"]))
def test_a_license_is_claimed_only_as_the_source_card_states_it(lines: list[str], newline: str, bom: bool,
                                                                 config_license: str | None) -> None:
    """Whatever a source card's front matter holds (numbers, lists, booleans, aliases, tags,
    multi-line values, repeated keys, CRLF or CR lines, a BOM), the license the card claims is
    exactly the string a YAML parser reads there, or config.json's when the card states none."""
    import tempfile

    text = ("\ufeff" if bom else "") + newline.join(["---", *lines, "---", "# body"]) + newline
    config = {} if config_license is None else {"license": config_license}
    with tempfile.TemporaryDirectory() as root:
        Path(root, CARD_FILE).write_bytes(text.encode())
        claimed = source_license(root, config)
    try:
        parsed = _yaml_front_matter(text)
    except yaml.YAMLError:
        return  # no metadata the Hub could read: nothing to contradict
    if claimed is None or not isinstance(parsed, dict):
        return
    stated = parsed.get("license")
    assert claimed == stated or (stated is None and claimed == config_license), (text, claimed, stated)
    assert isinstance(claimed, str)


@pytest.mark.parametrize(("card_text", "expected"), [
    ("---\r\nlicense: apache-2.0\r\n---\r\n", "apache-2.0"),  # CRLF
    ("\ufeff---\nlicense: mit\n---\n", "mit"),  # a BOM
    ("---\nlicense: 2\n---\n", None),  # a number: the card would claim the string "2"
    ("---\nlicense:\n- mit\n- apache-2.0\n---\n", None),  # a list
    ("---\nlicense: [mit, apache-2.0]\n---\n", None),
    ("---\nlicense: mit\nlicense: apache-2.0\n---\n", None),  # repeated: YAML keeps the last
    ('---\ndescription: "x\nlicense: mit\n"\n---\n', None),  # inside a multi-line string
    ("---\nlicense: *default\n---\n", None),  # an alias
    ("---\nlicense: yes\n---\n", None),  # YAML 1.1's true
])
def test_licenses_the_card_cannot_reproduce_exactly_are_left_out(tmp_path: Path, card_text: str,
                                                                 expected: str | None) -> None:
    (tmp_path / CARD_FILE).write_bytes(card_text.encode())
    assert source_license(str(tmp_path), {"license": "from-config"}) == expected


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=40), st.sampled_from(["openai/gpt-oss-20b", "a/b\nlicense: x", "../x/y", "x"])),
       st.one_of(st.none(), st.text(max_size=40), st.just(COMMIT)))
def test_the_card_yaml_states_exactly_what_the_card_claims(converted: tuple[Any, Any, Path], repo: str,
                                                           revision: str | None) -> None:
    """Hostile provenance (a repo that is no repo id, a revision with shell or YAML syntax): the
    front matter parses back to exactly the fields the card claims, and no command line of the
    card carries the hostile text."""
    from nxdi_gptoss_fp8.convert.card import render_card

    report, src, layout = converted
    text = render_card(report, src, layout, {"repo": repo, "revision": revision}, [])
    meta, body = card_text_parts(text)
    expected_repo = repo if hub.is_repo_id(repo) else None
    assert meta.get("base_model") == expected_repo
    assert meta.get("base_model_relation") == ("quantized" if expected_repo else None)
    assert meta.get("license") == source_license(src.root, src.config)
    (verify,) = [line for line in body.splitlines() if line.startswith("nxdi-gptoss-fp8 verify-conversion")]
    shown = re.search(r"--revision (\S+)", verify)
    safe = isinstance(revision, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", revision)
    assert (shown.group(1) if shown else None) == (revision if expected_repo and safe else None)


def card_text_parts(text: str) -> tuple[dict[str, Any], str]:
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert match, "the card has no YAML front matter"
    return yaml.safe_load(match.group(1)), match.group(2)


@pytest.fixture(scope="module")
def converted(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    from nxdi_gptoss_fp8.convert import open_source

    out = tmp_path_factory.mktemp("card") / "out"
    report = convert(source, out, max_shard_size="40KB", progress=False)
    from nxdi_gptoss_fp8.validate.pipeline import preflight

    return report, open_source(source), preflight(out, allow_custom_model=True).view.layout


# --------------------------------------------------------------------------- the card's own commands


def _run_on_local_hub(argv: list[str], repo_id: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``cli.main(argv)`` with ``root`` published as ``repo_id`` on a Hub protocol server on 127.0.0.1."""
    from hub_server import endpoint_settings, serve_directory
    from huggingface_hub import constants

    with serve_directory(root, repo_id, "d" * 40) as hub, monkeypatch.context() as patch:
        for target, name, value in endpoint_settings(hub.endpoint):
            patch.setattr(target, name, value)
        patch.setenv("HF_ENDPOINT", hub.endpoint)
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        return cli.main(argv)


@pytest.mark.parametrize("kind", [SOURCE_MXFP4, SOURCE_BF16])
def test_the_cards_commands_pass_when_run(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every nxdi-gptoss-fp8 command the card prints runs and passes, as printed, from inside the
    converted directory (a custom profile: the card's validate carries the opt-in), with the
    NeuronConfig block saved where the card says and SRC the source."""
    import shlex

    src = make_source(tmp_path / "src", kind, original=False)
    out = tmp_path / "out"
    convert(src, out, max_shard_size="40KB", progress=False)
    _, body = card(out)
    block = neuron_config_block(body)
    (tmp_path / "neuron_config.json").write_text(json.dumps(block))  # the placeholder path, as printed
    commands = [line.split("   #")[0].strip() for block in re.findall(r"```bash\n(.*?)\n```", body, re.S)
                for line in block.splitlines() if line.startswith("nxdi-gptoss-fp8 ")]
    assert any(" validate " in c for c in commands) and any(" verify-conversion " in c for c in commands)
    assert all("--allow-custom-model" in c for c in commands if " validate " in c)  # the tiny model is custom
    monkeypatch.chdir(out)
    validate = next(c for c in commands if " validate " in c)
    assert cli.main(shlex.split(validate)[1:]) == 1  # the card says: set quantized_checkpoints_path first
    assert "quantized_checkpoints_path" in capsys.readouterr().out
    (tmp_path / "neuron_config.json").write_text(json.dumps({**block, "quantized_checkpoints_path": str(out)}))
    for command in commands:
        argv = [str(src) if word == "SRC" else word for word in shlex.split(command)[1:]]
        published = next((word for word in argv if word.startswith("YOUR-ORG/")), None)
        # the check of the uploaded repo: this directory, on a local Hub
        code = _run_on_local_hub(argv, published, out, monkeypatch) if published is not None else cli.main(argv)
        captured = capsys.readouterr()
        assert code == cli.EXIT_OK, (command, captured.out[-400:], captured.err[-400:])
