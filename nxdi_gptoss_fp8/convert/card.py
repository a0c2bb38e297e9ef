"""The model card ``convert`` writes into OUT as ``README.md``, inside the atomic write.

YAML front matter as the Hugging Face Hub reads it (``base_model`` with ``base_model_relation:
quantized`` when the source repo is known, ``license`` carried from the source's card or config,
``pipeline_tag``, ``tags``), then what the directory is, how it was made, how exact it is, the
NeuronConfig that loads it (a JSON block to paste), how to validate it, and how to upload it with
the Hub's own CLI. The front matter is written by a tiny emitter that double-quotes every string
(a JSON string is a valid YAML double-quoted scalar), so no value can change the YAML's shape.
A source's own README.md is never copied over the card. No timestamps: the card is reproducible.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import format as fmt
from .._version import __version__
from ..errors import NotRegularFileError
from ..hub import is_repo_id
from ..nxdi.recipes import neuron_config_keys, vllm_command
from ..padding import TARGETS
from ..safeio.files import open_regular
from ..units import plural
from ..writer import CheckpointWriter
from .output import ConversionReport
from .source import Source

CARD_FILE = "README.md"
# a Hub commit or a plain branch/tag name: nothing a shell reads as anything but one word
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CUSTOM_NOTE = (f"This is a custom-profile model: `validate` needs `--allow-custom-model`, and loading it needs "
                f"`{fmt.ALLOW_CUSTOM_ENV}=1` in NxDI's environment. ")
MAX_SOURCE_CARD_BYTES = 1 << 20
TAGS = ("gpt-oss", "fp8", "neuron", "nxdi", "normalized-fp8", "nxdi-gptoss-fp8")
PIPELINE_TAG = "text-generation"
_LICENSE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
SOURCE_FORMATS = {"hf-mxfp4": "HF MXFP4", "hf-bf16": "HF BF16", "compressed-tensors-fp8": "compressed-tensors FP8"}


def _printable(code: int) -> bool:
    """YAML 1.1's printable set, less tab, line breaks and NEL (those are escaped too)."""
    return 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or 0x10000 <= code <= 0x10FFFF


def _scalar(value: Any) -> str:
    """A YAML scalar: booleans and integers as themselves, anything else a double-quoted string
    with every character outside the printable set escaped."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    out = []
    for char in str(value):
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif _printable(code):
            out.append(char)
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def front_matter(fields: Mapping[str, Any]) -> str:
    """``---``-delimited YAML of scalars and lists of scalars (None values are left out)."""
    lines = ["---"]
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and not value:
            lines.append(f"{key}: []")
        elif isinstance(value, (list, tuple)):
            lines.append(f"{key}:")
            lines += [f"- {_scalar(item)}" for item in value]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join([*lines, "---"]) + "\n"


# what YAML reads as something other than the string written (YAML 1.1 booleans, null)
_YAML_NON_STRINGS = frozenset({"null", "true", "false", "yes", "no", "on", "off", "y", "n"})
_YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})
_LICENSE_KEY = re.compile(r"""^(?P<q>["']?)license(?P=q)\s*:""")  # a quoted key is the same key to YAML
# a top-level value that starts a quoted scalar or a flow collection must end on its line, or
# the lines after it may belong to it: then the card's structure is not read by lines
_OPENS = {'"': re.compile(r'^"(?:[^"\\]|\\.)*"\s*(?:#.*)?$'), "'": re.compile(r"^'(?:[^']|'')*'\s*(?:#.*)?$")}
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")
_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # Python or YAML 1.1 may break lines here


def _front_matter_lines(text: str) -> list[str] | None:
    """The lines of the front matter of a card (between a first ``---`` line and the next), or
    None when there is none or it holds a character YAML and Python split lines at differently."""
    lines = _LINE_BREAKS.split(text.removeprefix("\ufeff"))
    if not lines or lines[0].rstrip() != "---":
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---"), None)
    if end is None:
        return None
    body = lines[1:end]
    return None if any(_OTHER_BREAKS.search(line) for line in body) else body


def _plain_license(value: str) -> str | None:
    """The license id a top-level ``license:`` value states as a plain string YAML reads back as
    exactly this text (unquoted, or in simple quotes), else None."""
    value = re.sub(r"\s+#.*$", "", value).strip()
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
    text = value[1:-1] if quoted else value
    if not _LICENSE.match(text) or (not quoted and (not text[0].isalpha() or text.lower() in _YAML_NON_STRINGS)):
        return None
    return text


def _ends_on_its_line(line: str) -> bool:
    """Whether a front-matter line that starts a top-level quoted scalar or flow collection
    also ends it (other lines: True)."""
    match = re.match(r"^[^\s#][^:]*:\s*(?P<value>.*)$", line)
    value = match.group("value").strip() if match else ""
    if not value or value[0] not in "\"'[{":
        return True
    if value[0] in _OPENS:
        return bool(_OPENS[value[0]].match(value))
    flow = re.sub(r"\s+#.*$", "", value)
    return not re.search("[\"'#]", flow) and flow.count("[") == flow.count("]") and \
        flow.count("{") == flow.count("}") and flow[-1] == {"[": "]", "{": "}"}[flow[0]]


def _continued(lines: list[str], line: str) -> bool:
    """Whether an indented line follows ``line`` before the next top-level one (a multi-line
    value, or a nested block: either way not the one-line value it shows)."""
    after = lines[lines.index(line) + 1:]
    for following in after:
        if following.strip() and not following[0].isspace():
            return False
        if following.strip():
            return True
    return False


def source_license(root: str, config: Mapping[str, Any]) -> str | None:
    """The license id the source states, when the card can state exactly the same: its card's
    front matter ``license:`` as a plain id (a number, a list, a boolean, an alias, a tagged or
    multi-line value, a repeated key or a front matter whose lines cannot be trusted: None, the
    card then names none), else, when the card's front matter has no ``license`` key or states
    it null, config.json's ``license`` as a plain id."""
    try:
        with open_regular(os.path.join(root, CARD_FILE)) as handle:
            text = handle.read(MAX_SOURCE_CARD_BYTES).decode("utf-8", errors="replace")
    except (OSError, NotRegularFileError):
        text = ""
    lines = _front_matter_lines(text)
    content = [line for line in lines or [] if line.strip() and not line.lstrip().startswith("#")]
    if content and (content[0][0].isspace() or any(line.startswith(("?", "<<")) for line in content)):
        return None  # an indented top-level mapping, an explicit or a merge key: not read by lines
    if lines is not None:
        stated = [line for line in lines if _LICENSE_KEY.match(line)]
        if stated:
            if (len(stated) != 1 or stated[0][0] in "\"'" or not all(_ends_on_its_line(line) for line in lines)
                    or _continued(lines, stated[0])):
                return None
            value = re.sub(r"\s+#.*$", "", stated[0].split(":", 1)[1]).strip()
            if value not in _YAML_NULLS:  # `license: null` states none: config.json may
                return _plain_license(value)
    value = config.get("license")
    return value if isinstance(value, str) and _plain_license(value) == value else None


def loading_neuron_config(layout: fmt.Layout, path: str = "/path/to/this/directory") -> dict[str, Any]:
    """The NeuronConfig attributes that load this checkpoint through the hook (``--neuron-config``)."""
    keys = neuron_config_keys(path, layout.padded_hidden_size, layout.padded_intermediate_size)
    return {**keys, "checkpoint_format": "normalized_fp8"}


def _tp_degrees(padded_intermediate: int) -> str:
    return ", ".join(str(d) for d in (1, 2, 4, 8, 16, 32, 64) if padded_intermediate % d == 0)


def render_card(report: ConversionReport, source: Source, layout: fmt.Layout, provenance: Mapping[str, Any],
                companions: Sequence[str]) -> str:
    """The card's text (front matter and body); it names no output path, so two conversions of one
    source are byte-identical wherever they were written."""
    repo = provenance.get("repo")
    repo = repo if isinstance(repo, str) and is_repo_id(repo) else None
    name = f"{repo.split('/')[1] if repo else report.profile}-normalized-fp8"
    revision = provenance.get("revision") if repo else None
    revision = revision if isinstance(revision, str) and _REVISION.match(revision) else None
    license_id = source_license(source.root, source.config)
    fields: dict[str, Any] = {"base_model": repo, "base_model_relation": "quantized" if repo else None,
                              "license": license_id, "pipeline_tag": PIPELINE_TAG, "tags": list(TAGS)}
    source_text = f"`{repo}`" + (f" at commit `{revision}`" if revision else " (commit not recorded)") if repo \
        else "a local directory (no Hub repo recorded)"
    dims = layout.dims
    padding = ", ".join(
        f"{what} {base} → {padded}" + (f" (+{padded - base} zero rows/columns)" if padded != base else " (none)")
        for what, base, padded in (("hidden", dims.hidden_size, layout.padded_hidden_size),
                                   ("intermediate", dims.intermediate_size, layout.padded_intermediate_size)))
    neuron_config = json.dumps(loading_neuron_config(layout), indent=2)
    verify_source = repo or "SRC"
    verify = f"nxdi-gptoss-fp8 verify-conversion . --source {verify_source}" + (f" --revision {revision}" if revision else "")
    custom = report.profile == fmt.PROFILE_CUSTOM  # the card's own commands carry the opt-in it needs
    validate = "nxdi-gptoss-fp8 validate . --neuron-config ../neuron_config.json" + (" --allow-custom-model" if custom else "")
    validate_hub = f"nxdi-gptoss-fp8 validate YOUR-ORG/{name} --verify-checksums" + (" --allow-custom-model" if custom else "")
    companions_text = ", ".join(f"`{c}`" for c in companions) if companions else "none (add the source's tokenizer before serving)"
    body = f"""
# {name}: normalized static FP8 for AWS NeuronX Distributed Inference

GPT-OSS ({report.profile}, {plural(report.layers, 'layer')}) with FP8 E4M3 experts (±{fmt.FP8_MAX:g}, one scale per
expert and output channel) and every other tensor in BF16, already in NxDI's namespace and
layout. It loads through the `CHECKPOINT_FORMAT=normalized_fp8` hook of
[nxdi-gptoss-fp8](https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8): a fail-closed preflight,
then zero-copy loading, with no conversion at load time.

| | |
|---|---|
| format | `{fmt.FORMAT_NAME}` version {fmt.FORMAT_VERSION} ([docs/format.md](https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/docs/format.md)) |
| source | {source_text}, {SOURCE_FORMATS.get(report.source_format, report.source_format)} |
| converter | nxdi-gptoss-fp8 {__version__} (`nxdi-gptoss-fp8 convert`) |
| padding | {padding} |{_target_row(report.target)}
| exactness | {report.exactness_text()} |
| tensors | {plural(report.tensors, 'tensor')}, {plural(report.bytes_written, 'byte')} ({report.fp8_bytes:,} FP8) |
| companion files | {companions_text} |

## Load it with NxDI

Needs NxDI on a Trn2, which only Neuron SDK 2.27–2.31 images ship (the hook is verified against NxDI
0.9, SDK 2.29; NxDI is not supported on Trn2/Trn3 since SDK 2.34.0, and since SDK 2.29 its models run
only on Trn2 and newer, so Inf2/Trn1, kept in maintenance at 2.31, are no route: see "Support window"
below; `nxdi-gptoss-fp8 env` says where your host stands). Install nxdi-gptoss-fp8, call
`nxdi_gptoss_fp8.register()` before NxDI loads weights (vLLM's NxDI-backed `vllm-neuron` does it
through the package's plugin entry point), and give NxDI these NeuronConfig settings, with
`quantized_checkpoints_path` set to where this directory is:

```json
{neuron_config}
```

`tp_degree` must divide the padded intermediate size {layout.padded_intermediate_size} ({_tp_degrees(layout.padded_intermediate_size)} do).

With vLLM (the NxDI-backed `vllm-neuron`, run against its 0.1.0 and 0.2.0 loaders; Neuron SDK 2.27–2.31
images), from a local copy of this directory, compiled artifacts on persistent storage outside
it, and Harmony's `o200k_base.tiktoken` in `TIKTOKEN_ENCODINGS_BASE`
(`nxdi-gptoss-fp8 doctor -- vllm serve ...` checks all of it first):

```bash
{vllm_command("/data/models/this-directory", "/data/neuron-compiled/this-directory", "/data/tiktoken",
              layout.padded_hidden_size, layout.padded_intermediate_size)}
```

## Validate it

```bash
{validate}   # headers and scales, seconds, any host
{verify}   # value by value against the source
{validate_hub}   # once uploaded, before downloading it
```

{_CUSTOM_NOTE if custom else ""}`validate` runs the same preflight the loader runs, with the settings above saved as
`neuron_config.json` outside this directory (inside, it would look like a compiled NxDI model);
`verify-conversion` re-reads this directory and its source one expert at a
time (every non-expert tensor bit-exact, every FP8 value exact where E4M3 allows and within half
an E4M3 step otherwise). On the Hub, `validate REPO_ID` gives the same verdict without downloading the
weights: it reads the config, the index, each shard's header and the expert scales over HTTP ranges
(about 0.13 % of the bytes) and compares the index's digests with the Hub's LFS records.

## Upload it

With the Hub's own CLI (`pip install -U huggingface_hub`, then `hf auth login`):

```bash
hf upload-large-folder YOUR-ORG/{name} . --repo-type=model
```

It uploads in resumable chunks: after an interruption, run the same command again.

## Support window

{_support_window()}
"""
    return front_matter(fields) + body


def _target_row(target: str | None) -> str:
    """The card's table row naming the conversion target: what it is for, who loads it."""
    known = TARGETS.get(target) if target else None
    if known is None:
        return ""
    return f"\n| target | `{known.name}`: {known.purpose}; {known.status} |"


def _support_window() -> str:
    from ..support import SUPPORT_WINDOW

    return SUPPORT_WINDOW + "."


def card_size_bound(writer: CheckpointWriter, source: Source) -> int:
    """An upper bound of the card's bytes, known before the conversion (the plan counts it): the
    card rendered with the widest figures the output allows (every count at the output's byte
    count, the widest error), in both exactness wordings."""
    from .output import ExpertStats

    big = sum(planned.spec.nbytes for planned in writer.planned.values())
    companions = sorted(name for name in writer.extra_files if name != CARD_FILE)
    sizes = []
    for mean in (None, 1.23e-308):
        report = ConversionReport(
            source=source.root, source_format=source.kind, out=writer.out, profile=writer.profile,
            padded_hidden_size=writer.layout.padded_hidden_size,
            padded_intermediate_size=writer.layout.padded_intermediate_size, layers=writer.layout.dims.num_hidden_layers,
            tensors=len(writer.planned), bytes_written=big, fp8_bytes=big, elapsed_s=0.0,
            experts=[ExpertStats("bound", big, big, big, 1.23e-308, mean)], target=writer.conversion_target)
        sizes.append(len(render_card(report, source, writer.layout, writer.source or {}, companions).encode("utf-8")))
    return max(sizes)


def write_model_card(writer: CheckpointWriter, report: ConversionReport, source: Source) -> str:
    """Hand ``README.md`` to the writer (``text_files``: written into its temporary directory at
    commit, so it moves into place with the checkpoint and counts as ours for ``--overwrite``)
    and drop a source ``README.md`` from the files to copy: the card replaces it.
    Returns the card's text."""
    assert writer.tmp is not None, "write_model_card() inside the writer's with-block"
    writer.extra_files.pop(CARD_FILE, None)
    companions = sorted(writer.extra_files)
    text = render_card(report, source, writer.layout, writer.source or {}, companions)
    writer.text_files[CARD_FILE] = text
    return text


__all__ = ["CARD_FILE", "card_size_bound", "front_matter", "loading_neuron_config", "render_card", "source_license", "write_model_card"]
