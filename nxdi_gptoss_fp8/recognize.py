"""Which GPT-OSS checkpoint is this directory? The format doctor behind ``inspect`` and the NxDI
hook's refusals. Stdlib only; reads JSON files and safetensors headers, never a tensor byte.

The commonest failure in the field is the right command on the wrong directory, so every answer
names the kind of checkpoint, what to do with it (the ``CHECKPOINT_FORMAT`` value NxDI needs, or
the command that converts it) and why: the files and tensor names that decided it. A directory
that is none of the known kinds says what was looked for.

Recognized: HF MXFP4 (the published ``openai/gpt-oss-*`` HF set, ``…_blocks``/``…_scales``),
HF BF16 (dense ``gate_up_proj``), compressed-tensors (llm-compressor's per-expert FP8 and its
other schemes), NxDI's legacy layout (``block.N.*``, BF16 or FP8), OpenAI's ``original/`` set,
normalized FP8 (with its format version), NxDI pre-sharded weights (``tpN_sharded_checkpoint``)
and compiled NxDI model directories (``neuron_config.json``).

Bounded work: at most ``MAX_ENTRIES`` directory entries, ``MAX_HEADERS`` shard headers of at
most ``MAX_HEADER_BYTES`` each, ``MAX_JSON_FILE_BYTES`` per JSON file and ``MAX_NAMES`` tensor names
are examined; FIFOs, sockets, devices and directories are refused before they are opened.

One module over 500 lines: one decision table over every checkpoint kind; split, the order of
its rules would hide.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import format as fmt
from . import other_formats
from .padding import TARGETS
from .safeio.files import file_kind, not_regular_reason
from .safeio.json_file import MAX_JSON_FILE_BYTES, JsonFileError, read_json_file
from .safeio.safetensors_header import HeaderError, read_header
from .units import plural

MAX_ENTRIES = 10_000
MAX_HEADERS = 4
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_NAMES = 1_000_000
MAX_SHARDS_CHECKED = 10_000
MAX_INSIDE = 32  # subdirectories of an unknown directory examined for a checkpoint one level down
MAX_INSIDE_SHOWN = 4

NEURON_CONFIG_FILE = "neuron_config.json"
COMPILED_MODEL_FILE = "model.pt"
SINGLE_FILE = "model.safetensors"
PRESHARDED_DIR = "weights"
_PRESHARDED = re.compile(r"^tp(\d+)_sharded_checkpoint\.safetensors$")
_HF_MXFP4 = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_up|down)_proj_(blocks|scales)$")
_HF_DENSE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_up|down)_proj$")
_PER_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(?:experts\.)?\d+\.(gate|up|down)_proj\.")
_NESTED_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.experts\.\d+\.(gate|up|down)_proj\.")
_LEGACY = re.compile(r"^block\.\d+\.")
_LEGACY_MXFP4 = re.compile(r"^block\.\d+\.mlp\.mlp[12]_weight\.(blocks|scales)$")
_LEGACY_EXPERT = re.compile(r"^block\.\d+\.mlp\.mlp1_weight$")
_LEGACY_SCALE = re.compile(r"^block\.\d+\.mlp\.mlp[12]_scale$")
_NORMALIZED = re.compile(r"^layers\.\d+\.feed_forward\.moe\.")

# kinds
HF_MXFP4 = "hf-mxfp4"
HF_BF16 = "hf-bf16"
COMPRESSED_TENSORS_FP8 = "compressed-tensors-fp8"
COMPRESSED_TENSORS = "compressed-tensors"
LEGACY_BF16 = "nxdi-legacy-bf16"
LEGACY_FP8 = "nxdi-legacy-fp8"
OPENAI_ORIGINAL = "openai-original"
NORMALIZED = "normalized-fp8"
PRESHARDED = "nxdi-presharded"
COMPILED = "nxdi-compiled"
UNKNOWN = "unknown"
NOT_A_DIRECTORY = "not-a-directory"

TITLES: dict[str, str] = {
    HF_MXFP4: "an HF MXFP4 checkpoint (openai layout)",
    HF_BF16: "an HF BF16 checkpoint",
    COMPRESSED_TENSORS_FP8: "a compressed-tensors FP8 checkpoint (llm-compressor, per-expert linear layers)",
    COMPRESSED_TENSORS: "a compressed-tensors checkpoint that is not FP8 per-channel",
    LEGACY_BF16: "an NxDI legacy-layout checkpoint (block.N.*, BF16 experts)",
    LEGACY_FP8: "an NxDI legacy-layout checkpoint (block.N.*, FP8 experts)",
    OPENAI_ORIGINAL: "OpenAI's original/ set (block.N.*, MXFP4)",
    NORMALIZED: "a normalized FP8 checkpoint",
    PRESHARDED: "NxDI pre-sharded weights (one file per tensor-parallel rank)",
    COMPILED: "a compiled NxDI model directory",
    UNKNOWN: "not a GPT-OSS checkpoint this tool knows",
    NOT_A_DIRECTORY: "not a checkpoint directory",
}
# the CHECKPOINT_FORMAT value NxDI needs to load each kind directly (None: NxDI cannot)
CHECKPOINT_FORMATS: dict[str, str | None] = {
    HF_MXFP4: "hf", LEGACY_BF16: "legacy", LEGACY_FP8: "legacy", NORMALIZED: "normalized_fp8",
}
LOOKED_FOR = (
    f"{fmt.INDEX_FILE} with normalized metadata (format {fmt.FORMAT_NAME!r})",
    f"{fmt.CONFIG_FILE} quantization_config (mxfp4, compressed-tensors)",
    "tensor names: model.layers.N.mlp.experts.* (HF), …experts.E.{gate,up,down}_proj (compressed-tensors), "
    "block.N.* (legacy / OpenAI original), layers.N.feed_forward.moe.* (normalized)",
    f"{NEURON_CONFIG_FILE} (compiled NxDI model), {PRESHARDED_DIR}/tpN_sharded_checkpoint.safetensors (pre-sharded)",
)


@dataclass
class Recognition:
    """What a directory holds, what to do with it, and the evidence that decided it."""

    path: str
    kind: str
    checkpoint_format: str | None = None
    actions: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # files not opened: not regular files
    looked_for: list[str] = field(default_factory=list)
    format_version: int | None = None
    names_examined: int = 0
    headers_read: int = 0
    # checkpoints one level down in a directory that is none itself: (subdirectory, its title)
    inside: list[tuple[str, str]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return TITLES[self.kind]

    @property
    def known(self) -> bool:
        return self.kind not in (UNKNOWN, NOT_A_DIRECTORY)

    def hint(self) -> str:
        """One line: "this is an HF MXFP4 checkpoint: unset CHECKPOINT_FORMAT …, or convert it …"."""
        if self.inside:  # "DIR holds gpt-oss-120b-fp8/, a normalized FP8 checkpoint: nxdi-gptoss-fp8 validate …"
            return "; ".join(f"{self.path} holds {name}/, {title}: {action}"
                             for (name, title), action in zip(self.inside, self.actions, strict=True))
        what = f"{self.path} is {self.title}"
        return f"{what}: {', or '.join(self.actions)}" if self.actions else what

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "title": self.title,
            "checkpoint_format": self.checkpoint_format,
            "format_version": self.format_version,
            "actions": list(self.actions),
            "evidence": list(self.evidence),
            "notes": list(self.notes),
            "refused": list(self.refused),
            "looked_for": list(self.looked_for),
            "names_examined": self.names_examined,
            "headers_read": self.headers_read,
            "inside": [{"name": name, "title": title} for name, title in self.inside],
        }

    def render_text(self) -> str:
        lines = [f"checkpoint  {self.path}", f"kind        {self.title}" + (
            f" (format version {self.format_version})" if self.format_version is not None else "")]
        if self.checkpoint_format:
            lines.append(f"NxDI        CHECKPOINT_FORMAT={self.checkpoint_format}")
        for label, items in (("do", self.actions), ("why", self.evidence), ("note", self.notes),
                             ("refused", self.refused), ("looked for", self.looked_for)):
            for number, item in enumerate(items):
                lead = "or " if label == "do" and number else ""
                lines.append(f"{label if number == 0 else '':<11} {lead}{item}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- bounded reading


class _Reader:
    """The directory's files, read within the caps; remembers what it refused."""

    def __init__(self, recognition: Recognition) -> None:
        self.rec = recognition
        self.root = recognition.path
        self._regular: dict[str, bool] = {}
        self._json: dict[str, Any] = {}

    def regular(self, name: str) -> bool:
        """Whether ``name`` (relative to the root) exists and is a regular file; refusals noted."""
        if name not in self._regular:
            try:
                reason = not_regular_reason(os.path.join(self.root, name))
            except (OSError, ValueError):  # ValueError: a name no file can have (a NUL, a lone surrogate)
                reason = ""
            if reason:
                self.rec.refused.append(f"{name} is {reason.rsplit(' is ', 1)[-1]}: not opened")
            self._regular[name] = reason is None
        return self._regular[name]

    def json(self, name: str) -> Any:
        """The parsed JSON file ``name``, or None (absent, refused, too large or malformed: noted)."""
        if name not in self._json:
            self._json[name] = self._read_json(name) if self.regular(name) else None
        return self._json[name]

    def _read_json(self, name: str) -> Any:
        try:  # NxDI's own neuron_config.json holds its Infinity; the checkpoint's JSON stays strict
            return read_json_file(os.path.join(self.root, name), what=name, nxdi_constants=name == NEURON_CONFIG_FILE)
        except JsonFileError as exc:
            if exc.code == "not_a_file":
                self.rec.refused.append(f"{name}: {exc.cause}")
            elif exc.code == "unreadable":
                self.rec.notes.append(f"{name}: cannot be read ({getattr(exc.cause, 'strerror', None) or exc.cause})")
            elif exc.oversized:
                self.rec.notes.append(f"{name}: larger than {MAX_JSON_FILE_BYTES:,} bytes; not parsed")
            else:
                self.rec.notes.append(f"{name}: not valid JSON ({exc.cause}); run validate for details")
            return None

    def header_names(self, name: str) -> dict[str, str] | None:
        """tensor name → dtype from the header of shard ``name`` (None when it cannot be read).

        Only plain file names in the directory: an index naming ``../elsewhere`` is not followed.
        """
        if os.path.basename(name) != name or name in ("", ".", ".."):
            return None
        if self.rec.headers_read >= MAX_HEADERS or not self.regular(name):
            return None
        self.rec.headers_read += 1
        try:
            header = read_header(os.path.join(self.root, name), max_header_size=MAX_HEADER_BYTES)
        except (HeaderError, OSError) as exc:
            self.rec.notes.append(f"{name}: header not readable ({exc})")
            return None
        return {tensor: info.dtype for tensor, info in header.tensors.items()}


def _listing(root: str) -> tuple[dict[str, bool], bool]:
    """Entry name → is a directory, for at most ``MAX_ENTRIES`` entries; and whether it was cut."""
    entries: dict[str, bool] = {}
    with os.scandir(root) as scan:
        for entry in scan:
            if len(entries) >= MAX_ENTRIES:
                return entries, True
            try:
                entries[entry.name] = entry.is_dir()
            except OSError:
                entries[entry.name] = False
    return entries, False


def _first(names: Iterable[str], pattern: re.Pattern[str]) -> str | None:
    return next((name for name in names if pattern.search(name)), None)


# --------------------------------------------------------------------------- recognition


def recognize(path: str | os.PathLike[str], *, look_inside: bool = True) -> Recognition:
    """Say which checkpoint ``path`` is, what to do with it and why. Never raises for a bad
    directory: a missing path, a file, a FIFO or an unreadable directory is ``not-a-directory``.
    A directory that is no checkpoint but holds one a level down (``look_inside``) names it and
    the command for it (``Recognition.inside``)."""
    root = os.fspath(path)
    rec = Recognition(path=root, kind=UNKNOWN)
    try:
        mode = os.stat(root).st_mode
    except OSError as exc:
        rec.kind = NOT_A_DIRECTORY
        rec.evidence.append(f"{root}: {exc.strerror or exc}")
        return rec
    if not os.path.isdir(root):
        rec.kind = NOT_A_DIRECTORY
        rec.evidence.append(f"{root} is {file_kind(mode)}: pass the checkpoint directory")
        return rec
    try:
        entries, cut = _listing(root)
    except OSError as exc:
        rec.kind = NOT_A_DIRECTORY
        rec.evidence.append(f"{root} cannot be listed: {exc.strerror or exc}")
        return rec
    if cut:
        rec.notes.append(f"more than {MAX_ENTRIES:,} entries: only the first {MAX_ENTRIES:,} were examined")
    reader = _Reader(rec)
    config = reader.json(fmt.CONFIG_FILE) if fmt.CONFIG_FILE in entries else None
    config = config if isinstance(config, dict) else None
    _recognize_weights(rec, reader, entries, config)
    _compiled_artifacts(rec, reader, entries)
    if rec.kind == UNKNOWN and look_inside:
        _checkpoints_inside(rec, entries)
    if rec.kind == UNKNOWN and not rec.inside:
        rec.looked_for = list(LOOKED_FOR)
        shown = ", ".join(sorted(name + ("/" if is_dir else "") for name, is_dir in entries.items())[:12])
        rec.evidence.append(f"found: {shown or 'an empty directory'}" + (f" … ({plural(len(entries), 'entry', 'entries')})" if len(entries) > 12 else ""))
    rec.checkpoint_format = CHECKPOINT_FORMATS.get(rec.kind)
    return rec


def _checkpoints_inside(rec: Recognition, entries: Mapping[str, bool]) -> None:
    """Checkpoints (or compiled directories) one level down in ``rec.path``, which is none itself:
    each named with what it is and the command for it (``validate`` for normalized and compiled,
    ``inspect`` for another kind). At most ``MAX_INSIDE`` subdirectories holding a
    ``config.json``, an index, a ``neuron_config.json``, a ``model.safetensors`` or rank 0's
    pre-sharded file are recognized (never deeper)."""
    markers = (fmt.CONFIG_FILE, fmt.INDEX_FILE, NEURON_CONFIG_FILE, SINGLE_FILE, "tp0_sharded_checkpoint.safetensors")
    candidates = [name for name in sorted(entries) if entries[name]
                  and any(os.path.isfile(os.path.join(rec.path, name, marker)) for marker in markers)][:MAX_INSIDE]
    for name in candidates:
        sub = recognize(os.path.join(rec.path, name), look_inside=False)
        if not sub.known or len(rec.inside) >= MAX_INSIDE_SHOWN:
            continue
        command = "validate" if sub.kind in (NORMALIZED, COMPILED) else "inspect"
        rec.inside.append((name, sub.title))
        rec.actions.append(f"nxdi-gptoss-fp8 {command} {sub.path}")
        rec.evidence.append(f"{name}/: {sub.title}" + (f" (format version {sub.format_version})"
                                                       if sub.format_version is not None else ""))


def _quant_method(config: Mapping[str, Any] | None) -> tuple[str | None, Mapping[str, Any]]:
    quant = config.get("quantization_config") if config else None
    if not isinstance(quant, dict):
        return None, {}
    method = quant.get("quant_method")
    return (method if isinstance(method, str) else None), quant


def _weight_names(rec: Recognition, reader: _Reader, entries: Mapping[str, bool]) -> tuple[list[str], dict[str, str], str] | None:
    """(tensor names, name → shard, where they came from) from the index, the single file, or the
    first shards' headers; None when the directory holds no safetensors at all."""
    if fmt.INDEX_FILE in entries:
        index = reader.json(fmt.INDEX_FILE)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if isinstance(weight_map, dict):
            names, owner = [], {}
            for name, shard in weight_map.items():
                if len(names) >= MAX_NAMES:
                    rec.notes.append(f"the index lists more than {MAX_NAMES:,} tensors: only the first were examined")
                    break
                names.append(name)
                if isinstance(shard, str):
                    owner[name] = shard
            return names, owner, f"{fmt.INDEX_FILE} ({plural(len(weight_map), 'tensor')})"
    files = sorted(name for name, is_dir in entries.items() if not is_dir and name.endswith(".safetensors"))
    if SINGLE_FILE in files:
        files.remove(SINGLE_FILE)
        files.insert(0, SINGLE_FILE)
    names, owner, read = [], {}, []
    for shard in files[:MAX_HEADERS]:
        dtypes = reader.header_names(shard)
        if dtypes is None:
            continue
        read.append(shard)
        for name in dtypes:
            if len(names) < MAX_NAMES:
                names.append(name)
                owner[name] = shard
    if not read:
        return None
    more = f" (of {len(files)} .safetensors files)" if len(files) > len(read) else ""
    return names, owner, f"the headers of {', '.join(read)}{more}"


def _note_target(rec: Recognition, target: Any) -> None:
    """Name the conversion target an index records (``metadata.target``), what it is for and who loads it."""
    if target is None:
        return
    known = TARGETS.get(target) if isinstance(target, str) else None
    if known is None:
        rec.notes.append(f"{fmt.INDEX_FILE}: metadata.target {str(target)[:100]!r} is not a target this package knows "
                         f"({', '.join(TARGETS)}): validate refuses it")
        return
    rec.evidence.append(f"{fmt.INDEX_FILE}: metadata.target = {known.name!r}")
    rec.notes.append(f"converted for the target {known.name}: {known.purpose}; {known.status}")


def _recognize_weights(rec: Recognition, reader: _Reader, entries: Mapping[str, bool],
                       config: Mapping[str, Any] | None) -> None:
    root = rec.path
    method, quant = _quant_method(config)
    index = reader.json(fmt.INDEX_FILE) if fmt.INDEX_FILE in entries else None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    if isinstance(metadata, dict) and metadata.get("format") == fmt.FORMAT_NAME:
        rec.kind = NORMALIZED
        version = metadata.get("format_version")
        rec.format_version = version if type(version) is int else None
        rec.evidence.append(f"{fmt.INDEX_FILE}: metadata.format = {fmt.FORMAT_NAME!r}, format_version = {version!r}")
        if version != fmt.FORMAT_VERSION:
            rec.notes.append(f"this package reads format version {fmt.FORMAT_VERSION}; version {version!r} will be refused")
        rec.actions = [f"CHECKPOINT_FORMAT=normalized_fp8 loads it (check it first: `nxdi-gptoss-fp8 validate {root}`)"]
        _note_target(rec, metadata.get("target"))
        _note_listed_shards(rec, reader, index)
        return
    found = _weight_names(rec, reader, entries)
    if found is None:
        return
    names, owner, source = found
    rec.names_examined = len(names)
    if method == "compressed-tensors":
        _compressed_tensors(rec, quant, names, source, config)
    elif (name := _first(names, _HF_MXFP4)) is not None:
        rec.kind = HF_MXFP4
        rec.evidence.append(f"{source}: {name} (MXFP4 blocks/scales)")
        rec.evidence.append(f"{fmt.CONFIG_FILE}: quantization_config.quant_method = {method!r}")
        if method != "mxfp4":
            rec.notes.append(f"{fmt.CONFIG_FILE} should declare quant_method 'mxfp4' beside MXFP4 tensors: "
                             "config and weights may come from different sets (convert refuses the pair)")
        rec.actions = [other_formats.ADVICE_HF_LOAD, other_formats.convert_advice(root)]
    elif (name := _first(names, _HF_DENSE)) is not None:
        rec.kind = HF_BF16
        rec.evidence.append(f"{source}: {name} (dense fused experts)")
        if method is not None:
            rec.notes.append(f"{fmt.CONFIG_FILE} declares quantization_config.quant_method {method!r}, "
                             "which dense expert tensors contradict: config and weights may come from different sets")
        rec.actions = [other_formats.convert_advice(root)]
        rec.notes.append("NxDI's HF converter reads only the MXFP4 layout (…_blocks/_scales): it cannot load this directly")
    elif (name := _first(names, _PER_EXPERT)) is not None:
        rec.evidence.append(f"{source}: {name} (per-expert linear layers)")
        rec.evidence.append(f"{fmt.CONFIG_FILE}: quantization_config.quant_method = {method!r}, not 'compressed-tensors'")
        rec.looked_for = ["a compressed-tensors quantization_config beside per-expert tensor names"]
    elif (name := _first(names, _LEGACY)) is not None:
        _legacy(rec, reader, names, owner, source, name)
    elif (name := _first(names, _NORMALIZED)) is not None:
        rec.kind = NORMALIZED
        rec.evidence.append(f"{source}: {name} (NxDI's namespace)")
        rec.evidence.append(f"{fmt.INDEX_FILE}: no normalized metadata (metadata.format is not {fmt.FORMAT_NAME!r})")
        rec.actions = [f"`nxdi-gptoss-fp8 validate {root}` lists what it lacks to be a normalized FP8 checkpoint"]
        _note_listed_shards(rec, reader, index if isinstance(index, dict) else None)
    else:
        rec.evidence.append(f"{source}: {plural(len(names), 'tensor')}, none with a GPT-OSS expert name (e.g. "
                            f"{', '.join(names[:3]) or 'none'})")
    if rec.kind in (HF_MXFP4, HF_BF16, COMPRESSED_TENSORS_FP8) and entries.get("original"):
        rec.notes.append("original/ holds OpenAI's other set: it is never read (neither by NxDI's HF path nor by convert)")


def _note_listed_shards(rec: Recognition, reader: _Reader, index: Mapping[str, Any] | None) -> None:
    """Stat (never open) the shards the index lists: a FIFO or device among them is refused."""
    weight_map = index.get("weight_map") if index else None
    if not isinstance(weight_map, dict):
        return
    shards = sorted({shard for shard in weight_map.values() if isinstance(shard, str) and shard
                     and os.path.basename(shard) == shard and shard not in (".", "..")})
    for shard in shards[:MAX_SHARDS_CHECKED]:
        reader.regular(shard)


def _compressed_tensors(rec: Recognition, quant: Mapping[str, Any], names: list[str], source: str,
                        config: Mapping[str, Any] | None) -> None:
    root = rec.path
    fmt_name = quant.get("format")
    groups = quant.get("config_groups")
    rec.evidence.append(f"{fmt.CONFIG_FILE}: quantization_config.quant_method = 'compressed-tensors', format = {fmt_name!r}")
    expert = _first(names, _PER_EXPERT)
    rec.evidence.append(f"{source}: {expert} (per-expert linear layers)" if expert else
                        f"{source}: no per-expert names (model.layers.N.mlp.experts.E.{{gate,up,down}}_proj.*)")
    problems = []
    if fmt_name != "float-quantized":
        problems.append(f"format {fmt_name!r}, not 'float-quantized'")
    if not isinstance(groups, dict) or not groups:
        problems.append("no config_groups")
    else:
        for group_name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                problems.append(f"config_groups.{group_name} has no weights scheme")
                continue
            scheme = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"))
            if scheme != (8, "float", "channel"):
                problems.append(f"config_groups.{group_name} weights are {scheme[0]}-bit {scheme[1]} "
                                f"{scheme[2]}-strategy, not 8-bit float per channel")
            acts = group.get("input_activations") if isinstance(group, dict) else None
            if isinstance(acts, dict) and acts.get("dynamic") is not True:
                problems.append(f"config_groups.{group_name} has static input activations (input_scale)")
    if expert is None:
        problems.append("the experts are not per-expert linear layers")
    if problems:
        rec.kind = COMPRESSED_TENSORS
        rec.evidence.append("; ".join(problems))
        rec.actions = ["none: only compressed-tensors FP8_DYNAMIC (8-bit float weights per output channel, "
                       "dynamic activations) converts; re-export the model with that scheme"]
    else:
        rec.kind = COMPRESSED_TENSORS_FP8
        version = config.get("transformers_version") if isinstance(config, Mapping) else None
        split, why = other_formats.ct_known_split(version, _first(names, _NESTED_EXPERT) is not None)
        if split is None:
            rec.evidence.append(f"{fmt.CONFIG_FILE}: transformers_version {version!r} with experts.E names: "
                                "the gate/up split cannot be told from the files")
            rec.actions = [f"convert it with `{other_formats.CONVERT_COMMAND} {root} OUT --ct-gate-up-split interleaved|halves`: "
                           f"the files cannot tell the gate/up split; state it with {other_formats.CT_SPLIT_HELP}"]
        else:
            rec.evidence.append(f"gate/up split {split}: {why}")
            rec.actions = [other_formats.convert_advice(root)]
        rec.notes.append("NxDI cannot load compressed-tensors checkpoints directly (no CHECKPOINT_FORMAT applies)")


def _legacy(rec: Recognition, reader: _Reader, names: list[str], owner: Mapping[str, str], source: str, first: str) -> None:
    root = rec.path
    if (name := _first(names, _LEGACY_MXFP4)) is not None:
        rec.kind = OPENAI_ORIGINAL
        rec.evidence.append(f"{source}: {name} (MXFP4 in OpenAI's block.N layout)")
        parent = os.path.dirname(os.path.abspath(root))
        hf_set = os.path.isfile(os.path.join(parent, fmt.INDEX_FILE))
        rec.actions = [f"use the HF set at {parent} instead (inspect it)" if hf_set else
                       "use the HF set of the same repo (the files beside original/), not this directory"]
        rec.notes.append("NxDI's legacy converter expects dense block.N tensors, and convert reads only the HF set")
        return
    expert = _first(names, _LEGACY_EXPERT)
    dtype = None
    if expert is not None and expert in owner:
        dtypes = reader.header_names(owner[expert])
        dtype = dtypes.get(expert) if dtypes else None
    scale = _first(names, _LEGACY_SCALE)
    fp8 = (dtype or "").startswith("F8_") or scale is not None
    rec.kind = LEGACY_FP8 if fp8 else LEGACY_BF16
    rec.evidence.append(f"{source}: {first} (NxDI's legacy block.N layout)")
    if expert is not None:
        rec.evidence.append(f"{expert}: {dtype or 'dtype not read'}" + (f"; {scale} present" if scale else ""))
    rec.actions = [other_formats.ADVICE_LEGACY_LOAD]


def _compiled_artifacts(rec: Recognition, reader: _Reader, entries: Mapping[str, bool]) -> None:
    """A compiled NxDI model directory (``neuron_config.json``, ``model.pt``, ``weights/``) or
    NxDI's pre-sharded weights (``tpN_sharded_checkpoint.safetensors``)."""
    root = rec.path
    ranks = sorted(int(m.group(1)) for name in entries if (m := _PRESHARDED.match(name)))
    compiled = NEURON_CONFIG_FILE in entries
    weights_dir = os.path.join(root, PRESHARDED_DIR)
    sharded: list[int] = []
    if entries.get(PRESHARDED_DIR) and not ranks:
        try:
            sharded = sorted(int(m.group(1)) for entry, _ in _listing(weights_dir)[0].items() if (m := _PRESHARDED.match(entry)))
        except OSError:
            sharded = []
    if not compiled and not ranks and not sharded:
        return
    if ranks and rec.kind != UNKNOWN and not any(name in entries for name in (fmt.INDEX_FILE, SINGLE_FILE, fmt.CONFIG_FILE)):
        # only rank files, holding NxDI's own namespace: pre-sharded weights, not a checkpoint
        rec.kind, rec.checkpoint_format, rec.format_version = UNKNOWN, None, None
        rec.evidence.clear()
        rec.actions.clear()
    if rec.kind != UNKNOWN:  # a checkpoint with compiled artifacts mixed in: the checkpoint wins
        rec.notes.append(f"also holds NxDI compile output ({NEURON_CONFIG_FILE if compiled else 'tpN_sharded_checkpoint files'})")
        return
    if compiled:
        rec.kind = COMPILED
        rec.evidence.append(f"{NEURON_CONFIG_FILE} present" + (f", {COMPILED_MODEL_FILE} present" if COMPILED_MODEL_FILE in entries else f", no {COMPILED_MODEL_FILE}"))
        document = reader.json(NEURON_CONFIG_FILE)
        neuron_config = document.get("neuron_config") if isinstance(document, dict) else None
        neuron_config = neuron_config if isinstance(neuron_config, dict) else (document if isinstance(document, dict) else {})
        settings = {key: neuron_config[key] for key in ("tp_degree", "quantized", "save_sharded_checkpoint", "checkpoint_format")
                    if key in neuron_config and isinstance(neuron_config[key], (str, int, bool))}
        if settings:
            rec.evidence.append(f"{NEURON_CONFIG_FILE}: " + ", ".join(f"{key}={value!r}" for key, value in settings.items()))
        if sharded:
            rec.evidence.append(f"{PRESHARDED_DIR}/: pre-sharded weights for {plural(len(sharded), 'rank')}")
        rec.actions = [f"check it with `nxdi-gptoss-fp8 validate {root}` (its pre-sharded weights against their manifest), "
                       f"then pass it to NxDI as the compiled model path (model.load({root!r})); it is not a checkpoint to convert"]
        if settings.get("checkpoint_format") == "normalized_fp8" and not sharded:
            rec.actions.append("its weights load from the normalized checkpoint it was compiled with: keep CHECKPOINT_FORMAT=normalized_fp8")
        return
    if not ranks:  # only weights/ of a compiled directory: one verdict, not "unknown"
        rec.kind = PRESHARDED
        rec.evidence.append(f"{PRESHARDED_DIR}/: {plural(len(sharded), 'file')} tpN_sharded_checkpoint.safetensors "
                            f"(ranks {sharded[0]}…{sharded[-1]}), but no {NEURON_CONFIG_FILE} or {COMPILED_MODEL_FILE}")
        rec.actions = [f"this is an incomplete copy of a compiled NxDI model directory: copy the whole directory "
                       f"({NEURON_CONFIG_FILE}, {COMPILED_MODEL_FILE}, {PRESHARDED_DIR}/) and load that with NxDI"]
        return
    rec.kind = PRESHARDED
    rec.evidence.append(f"{plural(len(ranks), 'file')} tpN_sharded_checkpoint.safetensors (ranks {ranks[0]}…{ranks[-1]})")
    parent = os.path.dirname(os.path.abspath(root))
    rec.actions = [f"these are written by NxDI at compile time (save_sharded_checkpoint=True): load the compiled "
                   f"model directory {parent} with NxDI; re-shard from the original checkpoint, never from these"]


def compiled_model_dir(path: str | os.PathLike[str]) -> str | None:
    """The compiled NxDI model directory that ``path`` is, or whose ``weights/`` folder it is
    (None otherwise); recognizes only where a ``neuron_config.json`` makes it possible."""
    root = os.fspath(path)
    for candidate in (root, os.path.dirname(os.path.abspath(root)) if os.path.basename(os.path.normpath(root)) == PRESHARDED_DIR else None):
        if candidate and os.path.isfile(os.path.join(candidate, NEURON_CONFIG_FILE)) and recognize(candidate).kind == COMPILED:
            return candidate
    return None


__all__ = ["CHECKPOINT_FORMATS", "TITLES", "Recognition", "compiled_model_dir", "recognize"]
