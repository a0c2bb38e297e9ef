"""An adversarial corpus: named malformed checkpoints, each with the check that must catch it.

Every case starts from a valid tiny checkpoint (``make_tiny``: unpadded, or padded for the
padding cases), breaks it in one realistic way, and by default re-syncs the index's
``total_size`` and ``shard_sha256`` so the intended defect is the only one (cases about those
fields opt out). Every case names the exact finding ``code`` it must draw (and, in ``also``,
any other code of the same check its defect draws by nature). ``corpus(bases)`` yields
``(name, expected_check, builder)``; ``builder(dest)`` writes the case into ``dest`` and returns
the preflight keyword arguments it needs (``deep``, ``verify_checksums``, ``neuron_config``,
``allow_custom_model``).

    python test/support/corpus.py OUT_DIR     # writes every case into OUT_DIR/<name>/ and validates it
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_edit import read_json, shard_of, shards, write_json

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.safeio.safetensors_header import HeaderError, read_header
from nxdi_gptoss_fp8.writer import build_header

Options = dict[str, Any]
Builder = Callable[[Path], Options]

GATE_UP_W = f"layers.0.{fmt.GATE_UP}.weight"
GATE_UP_S = f"layers.0.{fmt.GATE_UP}.scale"
GATE_UP_B = f"layers.0.{fmt.GATE_UP}.bias"
DOWN_W = f"layers.0.{fmt.DOWN}.weight"
DOWN_S = f"layers.0.{fmt.DOWN}.scale"

# A NeuronConfig that runs the tiny checkpoint; each neuron_config case breaks one thing.
GOOD_NEURON_CONFIG: dict[str, Any] = {
    "quantized": True,
    "quantized_checkpoints_path": "/ckpt",
    "quantization_dtype": fmt.QUANTIZATION_DTYPE,
    "quantization_type": fmt.QUANTIZATION_TYPE,
    "modules_to_not_convert": ["self_attn", "lm_head"],
    "tp_degree": 2,
}


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class Bases:
    """The valid checkpoints cases start from (or borrow files from)."""

    tiny: Path
    padded: Path
    other_plan: Path  # same model, written with a different shard plan
    other_seed: Path  # same layout and shard plan, different values

    @classmethod
    def create(cls, root: str | os.PathLike[str]) -> Bases:
        """Write the base checkpoints under ``root`` (needs torch; about two seconds)."""
        from nxdi_gptoss_fp8.synthetic.tiny import make_tiny

        root = Path(root)
        return cls(
            tiny=Path(make_tiny(root / "tiny")),
            padded=Path(make_tiny(root / "padded", padded_hidden_size=96, padded_intermediate_size=96)),
            other_plan=Path(make_tiny(root / "other-plan", max_shard_size=30_000)),
            other_seed=Path(make_tiny(root / "other-seed", seed=1)),
        )


class Ckpt:
    """Edit a checkpoint directory in place: index, config, shard headers and bytes."""

    def __init__(self, root: Path, bases: Bases | None = None) -> None:
        self.root = Path(root)
        self._bases = bases

    @property
    def bases(self) -> Bases:
        assert self._bases is not None, "this edit borrows files from the base checkpoints"
        return self._bases

    # ----------------------------------------------------------------- JSON files
    def load(self, name: str) -> Any:
        return read_json(self.root / name)

    def save(self, name: str, document: Any) -> None:
        write_json(self.root / name, document)

    @property
    def index(self) -> dict[str, Any]:
        return self.load(fmt.INDEX_FILE)

    def edit_index(self, edit: Callable[[dict[str, Any]], Any]) -> None:
        document = self.index
        edit(document)
        self.save(fmt.INDEX_FILE, document)

    def edit_metadata(self, **fields: Any) -> None:
        self.edit_index(lambda doc: doc["metadata"].update(fields))

    def edit_config(self, **fields: Any) -> None:
        config = self.load(fmt.CONFIG_FILE)
        config.update(fields)
        self.save(fmt.CONFIG_FILE, config)

    def replace_in(self, name: str, old: str, new: str) -> None:
        text = (self.root / name).read_text()
        assert old in text, f"{old!r} not in {name}"
        (self.root / name).write_text(text.replace(old, new, 1))

    # ----------------------------------------------------------------- shards
    def shard_of(self, key: str) -> str:
        return shard_of(self.root, key)

    def shards(self) -> list[str]:
        return shards(self.root)

    def tensors(self, shard: str) -> dict[str, Tensor]:
        path = self.root / shard
        header = read_header(path)
        data = path.read_bytes()[header.data_offset:]
        ordered = sorted(header.tensors.values(), key=lambda t: t.begin)
        return {t.name: Tensor(t.dtype, t.shape, data[t.begin:t.end]) for t in ordered}

    def write_shard(self, shard: str, tensors: dict[str, Tensor]) -> None:
        """Re-pack ``shard`` with these tensors through the writer's header builder."""
        specs = [fmt.TensorSpec(name, t.shape, t.dtype) for name, t in tensors.items()]
        header, offsets = build_header(specs)
        out = bytearray(header) + bytearray(sum(len(t.data) for t in tensors.values()))
        for name, tensor in tensors.items():
            assert len(tensor.data) == fmt.TensorSpec(name, tensor.shape, tensor.dtype).nbytes, name
            out[offsets[name]:offsets[name] + len(tensor.data)] = tensor.data
        (self.root / shard).write_bytes(bytes(out))

    def edit_shard(self, shard: str, edit: Callable[[dict[str, Tensor]], Any]) -> None:
        tensors = self.tensors(shard)
        edit(tensors)
        self.write_shard(shard, tensors)

    def raw_header(self, shard: str) -> tuple[bytes, bytes]:
        """(header JSON bytes, data bytes) of ``shard``."""
        blob = (self.root / shard).read_bytes()
        (length,) = struct.unpack("<Q", blob[:8])
        return blob[8:8 + length], blob[8 + length:]

    def write_raw(self, shard: str, header: bytes | dict[str, Any], data: bytes, *, length: int | None = None) -> None:
        text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
        prefix = struct.pack("<Q", len(text) if length is None else length)
        (self.root / shard).write_bytes(prefix + text + data)

    def edit_header_json(self, shard: str, edit: Callable[[dict[str, Any]], Any]) -> None:
        text, data = self.raw_header(shard)
        document = json.loads(text)
        edit(document)
        self.write_raw(shard, document, data)

    def poke(self, key: str, position: int, value: bytes) -> None:
        """Overwrite bytes of tensor ``key`` starting at byte ``position`` of its data."""
        shard = self.shard_of(key)
        header = read_header(self.root / shard)
        info = header.tensors[key]
        assert position + len(value) <= info.nbytes
        with open(self.root / shard, "r+b") as handle:
            handle.seek(header.data_offset + info.begin + position)
            handle.write(value)

    def move_tensor(self, key: str, to_shard: str, *, update_index: bool = True) -> None:
        source = self.shard_of(key)
        moved: dict[str, Tensor] = {}
        self.edit_shard(source, lambda ts: moved.update({key: ts.pop(key)}))
        self.edit_shard(to_shard, lambda ts: ts.update(moved))
        if update_index:
            self.edit_index(lambda doc: doc["weight_map"].update({key: to_shard}))

    def add_tensor(self, key: str, tensor: Tensor, shard: str | None = None) -> None:
        shard = shard or self.shards()[0]
        self.edit_shard(shard, lambda ts: ts.update({key: tensor}))
        self.edit_index(lambda doc: doc["weight_map"].update({key: shard}))

    def remove_tensor(self, key: str) -> None:
        shard = self.shard_of(key)
        self.edit_shard(shard, lambda ts: ts.pop(key))
        self.edit_index(lambda doc: doc["weight_map"].pop(key))

    def sync(self) -> None:
        """Recompute total_size and shard_sha256 so only the intended defect remains."""
        try:
            document = self.index
            weight_map, metadata = document["weight_map"], document["metadata"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        shards = sorted({s for s in weight_map.values() if isinstance(s, str)} if isinstance(weight_map, dict) else ())
        total, digests = 0, {}
        for shard in shards:
            path = self.root / shard
            if "/" in shard or not path.is_file():
                return
            try:
                total += sum(t.nbytes for t in read_header(path).tensors.values())
            except HeaderError:
                total = -1
            digests[shard] = hashlib.sha256(path.read_bytes()).hexdigest()
        if total >= 0:
            metadata["total_size"] = total
        if "shard_sha256" in metadata:
            metadata["shard_sha256"] = digests
        self.save(fmt.INDEX_FILE, document)


@dataclass(frozen=True)
class Case:
    name: str
    check: str
    mutate: Callable[[Ckpt], Options | None]
    base: str
    sync: bool
    code: str  # the exact finding code the case must draw (an error, or a warning if ``warning``)
    warning: bool = False  # a warning on an otherwise valid checkpoint (not an error)
    also: tuple[str, ...] = ()  # other codes of the same check the defect also draws, by its nature


CASES: list[Case] = []


def case(name: str, check: str, *, code: str, base: str = "tiny", sync: bool = True,
         warning: bool = False, also: tuple[str, ...] = ()) -> Callable[[Callable[[Ckpt], Any]], Any]:
    """Register a corpus case: ``mutate(ckpt)`` breaks a copy of the base checkpoint."""
    def register(mutate: Callable[[Ckpt], Options | None]) -> Callable[[Ckpt], Options | None]:
        assert check in _CHECKS, check
        assert all(c.startswith(check + ".") for c in (code, *also)), (code, also)
        assert all(c.name != name for c in CASES), name
        CASES.append(Case(name, check, mutate, base, sync, code, warning, also))
        return mutate
    return register


def case_builder(bases: Bases, root: Path) -> Callable[[str], tuple[Path, Options]]:
    """A getter building each corpus case once, on first use, as ``root/NAME`` (the tests only read it)."""
    builders = {name: build for name, _, build in corpus(bases)}
    cache: dict[str, tuple[Path, Options]] = {}

    def get(name: str) -> tuple[Path, Options]:
        if name not in cache:
            cache[name] = (root / name, builders[name](root / name))
        return cache[name]

    return get


def corpus(bases: Bases) -> Iterator[tuple[str, str, Builder]]:
    """Yield ``(name, expected_check, builder)`` for every case."""
    for entry in CASES:
        yield entry.name, entry.check, functools.partial(_build, entry, bases)


def _build(entry: Case, bases: Bases, dest: Path) -> Options:
    shutil.copytree(getattr(bases, entry.base), dest, symlinks=True)
    ckpt = Ckpt(Path(dest), bases)
    options: Options = {"allow_custom_model": True}
    options.update(entry.mutate(ckpt) or {})
    if entry.sync and Path(dest).is_dir():
        ckpt.sync()
    return options


_CHECKS = ("filesystem", "index", "header", "ownership", "collision", "namespace", "dtype_shape",
           "sidecar", "values", "config", "neuron_config", "integrity")
SHARD1 = "model-00001-of-00004.safetensors"
SHARD2 = "model-00002-of-00004.safetensors"


def _shard_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _zeros(dtype: str, shape: tuple[int, ...]) -> Tensor:
    return Tensor(dtype, shape, bytes(fmt.TensorSpec("x", shape, dtype).nbytes))


# ============================================================================ filesystem


@case("missing_directory", "filesystem", code="filesystem.missing_directory")
def _(ck: Ckpt) -> None:
    shutil.rmtree(ck.root)


@case("path_is_a_file", "filesystem", code="filesystem.not_a_directory")
def _(ck: Ckpt) -> None:
    shutil.rmtree(ck.root)
    ck.root.write_text("not a checkpoint")


@case("missing_index", "filesystem", code="filesystem.missing_index")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).unlink()


@case("single_file_model_without_index", "filesystem", code="filesystem.missing_index")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).unlink()
    for shard in list(ck.root.glob("*.safetensors"))[1:]:
        shard.unlink()
    next(ck.root.glob("*.safetensors")).rename(ck.root / "model.safetensors")


@case("shard_name_dotdot", "filesystem", code="filesystem.unsafe_shard_name")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": "../x.safetensors"}))


@case("shard_name_absolute", "filesystem", code="filesystem.unsafe_shard_name")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": "/etc/passwd"}))


@case("shard_name_backslash", "filesystem", code="filesystem.unsafe_shard_name")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": "sub\\model.safetensors"}))


@case("shard_name_drive_letter", "filesystem", code="filesystem.unsafe_shard_name")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": "C:model.safetensors"}))


@case("symlinked_shard_outside", "filesystem", code="filesystem.link_outside")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    (ck.root / shard).unlink()
    (ck.root / shard).symlink_to(ck.bases.tiny / shard)


@case("shard_is_a_directory", "filesystem", code="filesystem.not_a_file")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    (ck.root / shard).unlink()
    (ck.root / shard).mkdir()


@case("stray_pytorch_bin_pickle", "filesystem", code="filesystem.stray_weight_file")
def _(ck: Ckpt) -> None:
    (ck.root / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # a pickle: never opened


@case("stray_second_safetensors_set", "filesystem", code="filesystem.stray_weight_file")
def _(ck: Ckpt) -> None:
    first = _shard_files(ck.bases.other_plan)[0]
    shutil.copy(first, ck.root / first.name)


@case("stray_pt_non_utf8_name", "filesystem", code="filesystem.stray_weight_file")
def _(ck: Ckpt) -> None:
    with open(os.path.join(os.fsencode(ck.root), b"consolidated\xff.pt"), "wb") as handle:
        handle.write(b"\x80\x02.")


# ============================================================================ index


@case("index_not_json", "index", sync=False, code="index.invalid_json")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).write_text("{'metadata': {},")


@case("index_not_utf8", "index", sync=False, code="index.invalid_json")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).write_bytes(b'{"metadata": {"format": "\xff\xfe"}}')


@case("index_not_an_object", "index", sync=False, code="index.not_an_object")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).write_text("[1, 2, 3]")


@case("index_json_null", "index", sync=False, code="index.not_an_object")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.INDEX_FILE).write_text("null")


@case("index_duplicate_weight_map_key", "index", sync=False, code="index.duplicate_key")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"weight_map": {', f'"weight_map": {{\n    "norm.weight": "{SHARD1}",')


@case("index_duplicate_metadata_key", "index", sync=False, code="index.duplicate_key")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"metadata": {', '"metadata": {\n    "padded_hidden_size": 96,')


@case("index_nan_literal", "index", sync=False, code="index.invalid_json")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"fp8_max": 240.0', '"fp8_max": NaN')


@case("index_integer_beyond_digit_limit", "index", sync=False, code="index.number_too_large")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"format_version": 1', '"format_version": 1' + "0" * 5000)


@case("index_lone_surrogate_shard_name", "index", sync=False, code="index.invalid_json")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"norm.weight": "', '"norm.weight": "\\ud800')


@case("index_deeply_nested", "index", sync=False, code="index.too_deep")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"source": {', '"source": {"x": ' + "[" * 100_000 + "]" * 100_000 + ",")


@case("index_missing_metadata_field", "index", code="index.missing_metadata_field")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["metadata"].pop("padded_hidden_size"))


@case("index_extra_metadata_field", "index", code="index.unexpected_metadata")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(quantization_block_size=128)


@case("index_extra_top_level_field", "index", code="index.unexpected_field")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc.update(version="1"))


@case("index_format_version_2", "index", code="index.wrong_metadata_value")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(format_version=2)


@case("index_format_version_bool", "index", code="index.wrong_metadata_type")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(format_version=True)


@case("index_fp8_max_448_ocp_range", "index", code="index.wrong_metadata_value")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(fp8_max=448.0)


@case("index_wrong_format_name", "index", code="index.wrong_metadata_value")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(format="compressed-tensors")


@case("index_unknown_profile", "index", code="index.unknown_profile")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(model_profile="gpt-oss-200b")


@case("index_unknown_target", "index", code="index.unknown_target")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(target="torchneuron")


@case("index_total_size_wrong", "index", sync=False, code="index.total_size_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(total_size=ck.index["metadata"]["total_size"] + 2)


@case("index_total_size_is_file_sizes", "index", sync=False, code="index.total_size_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(total_size=sum((ck.root / s).stat().st_size for s in ck.shards()))


@case("index_empty_weight_map", "index", code="index.empty_weight_map")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc.update(weight_map={}))


@case("index_weight_map_not_an_object", "index", code="index.missing_weight_map")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc.update(weight_map=[SHARD1]))


@case("index_shard_name_not_a_string", "index", code="index.bad_weight_map_entry")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": 4}))


@case("hf_index_over_normalized_shards", "index", code="index.not_normalized", also=("index.missing_metadata_field",))
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc.update(metadata={"total_size": doc["metadata"]["total_size"]}))


@case("index_digest_uppercase_hex", "index", sync=False, code="index.bad_shard_sha256")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["metadata"]["shard_sha256"].update(
        {SHARD1: doc["metadata"]["shard_sha256"][SHARD1].upper()}))


@case("index_digest_for_unknown_shard", "index", sync=False, code="index.bad_shard_sha256")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["metadata"]["shard_sha256"].update({"model-00009-of-00009.safetensors": "0" * 64}))


@case("index_digests_not_an_object", "index", sync=False, code="index.wrong_metadata_type")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["metadata"].update(shard_sha256=sorted(doc["metadata"]["shard_sha256"].values())))


@case("index_source_not_an_object", "index", code="index.wrong_metadata_type")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(source="converted by hand")


# ============================================================================ header


def _header_case(name: str, *, code: str, check: str = "header") -> Callable[[Callable[[Ckpt, str], Any]], Any]:
    """A case that breaks the header of the shard holding norm.weight."""
    def register(mutate: Callable[[Ckpt, str], Any]) -> Callable[[Ckpt, str], Any]:
        case(name, check, code=code)(lambda ck: mutate(ck, ck.shard_of("norm.weight")))
        return mutate
    return register


@_header_case("half_copied_shard", code="header.data_beyond_file")
def _(ck: Ckpt, shard: str) -> None:
    path = ck.root / shard
    os.truncate(path, path.stat().st_size // 2)


@_header_case("shard_shorter_than_prefix", code="header.too_short")
def _(ck: Ckpt, shard: str) -> None:
    (ck.root / shard).write_bytes(b"\x10\x00\x00")


@_header_case("empty_shard_file", code="header.too_short")
def _(ck: Ckpt, shard: str) -> None:
    (ck.root / shard).write_bytes(b"")


@_header_case("length_prefix_2_64_minus_1", code="header.header_too_large")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text, data, length=2**64 - 1)


@_header_case("length_prefix_above_cap", code="header.header_too_large")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text, data, length=100_000_001)


@_header_case("length_prefix_beyond_file", code="header.header_beyond_file")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text, data, length=len(text) + len(data) + 1)


@_header_case("header_padded_with_nuls", code="header.invalid_json")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    stripped = text.rstrip(b" ")
    ck.write_raw(shard, stripped + b"\x00" * (len(text) - len(stripped) + 8), data)


@_header_case("duplicate_names_in_one_header", code="header.duplicate_key")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    entry = json.dumps({"norm.weight": {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}})[1:-1]
    ck.write_raw(shard, b"{" + entry.encode() + b"," + text.strip()[1:], data)


@_header_case("header_not_utf8", code="header.not_utf8")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text.replace(b'"norm.weight"', b'"norm.w\xe9ight"'), data)


@_header_case("header_json_array", code="header.invalid_json")
def _(ck: Ckpt, shard: str) -> None:
    _, data = ck.raw_header(shard)
    ck.write_raw(shard, b"[" + b" " * 6 + b"]", data)


@_header_case("header_nan_offset", code="header.invalid_json")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text.replace(b'"data_offsets":[0,', b'"data_offsets":[NaN,', 1), data)


@_header_case("header_deeply_nested_metadata", code="header.too_deep")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, b'{"__metadata__":' + b"[" * 200_000 + b"]" * 200_000 + b"," + text.strip()[1:], data)


@_header_case("header_metadata_not_strings", code="header.bad_metadata")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc.update({"__metadata__": {"format": 1}}))


@_header_case("unknown_dtype_f8_e4m3fn", code="header.unknown_dtype")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(dtype="F8_E4M3FN"))


@_header_case("negative_shape", code="header.bad_shape")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(shape=[-64]))


@_header_case("float_shape", code="header.bad_shape")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(shape=[64.0]))


@_header_case("entry_with_extra_field", code="header.bad_entry")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(layout="row_major"))


@_header_case("size_not_numel_times_itemsize", code="header.size_mismatch")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(shape=[63]))


@_header_case("shape_overflows_64_bits", code="header.size_overflow")
def _(ck: Ckpt, shard: str) -> None:
    ck.edit_header_json(shard, lambda doc: doc["norm.weight"].update(shape=[2**40, 2**40]))


def _shift(doc: dict[str, Any], key: str, delta: int) -> None:
    begin, end = doc[key]["data_offsets"]
    doc[key]["data_offsets"] = [begin + delta, end + delta]


@_header_case("overlapping_offsets", code="header.offsets_overlap")
def _(ck: Ckpt, shard: str) -> None:
    def edit(doc: dict[str, Any]) -> None:
        last = max((k for k in doc if k != "__metadata__"), key=lambda k: doc[k]["data_offsets"][0])
        _shift(doc, last, -2)
    ck.edit_header_json(shard, edit)


@_header_case("gap_between_tensors", code="header.offsets_gap")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    document = json.loads(text)
    last = max(document, key=lambda k: document[k]["data_offsets"][0])
    begin = document[last]["data_offsets"][0]
    _shift(document, last, 2)
    ck.write_raw(shard, document, data[:begin] + b"\x00\x00" + data[begin:])


@_header_case("trailing_bytes_after_data", code="header.trailing_bytes")
def _(ck: Ckpt, shard: str) -> None:
    with open(ck.root / shard, "ab") as handle:
        handle.write(b"\x00" * 16)


@_header_case("offsets_not_from_zero", code="header.offsets_gap")
def _(ck: Ckpt, shard: str) -> None:
    text, data = ck.raw_header(shard)
    document = json.loads(text)
    for key in document:
        _shift(document, key, 8)
    ck.write_raw(shard, document, bytes(8) + data)


# ============================================================================ ownership, collision


@case("key_assigned_to_wrong_shard", "ownership", code="ownership.key_in_other_shard")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": SHARD1}))


@case("key_missing_from_index", "ownership", code="ownership.unlisted_key")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].pop("norm.weight"))


@case("listed_shard_missing", "ownership", code="ownership.missing_shard")
def _(ck: Ckpt) -> None:
    (ck.root / ck.shard_of("norm.weight")).unlink()


@case("second_checkpoints_shard_dropped_in", "ownership", code="ownership.key_not_in_shard")
def _(ck: Ckpt) -> None:
    shutil.copy(_shard_files(ck.bases.other_plan)[1], ck.root / SHARD2)


@case("tensor_in_two_shards", "collision", code="collision.duplicate_tensor")
def _(ck: Ckpt) -> None:
    copy = ck.tensors(ck.shard_of("norm.weight"))["norm.weight"]
    ck.edit_shard(SHARD1, lambda ts: ts.update({"norm.weight": copy}))


@case("tensor_in_two_shards_both_listed_elsewhere", "collision", code="collision.duplicate_tensor")
def _(ck: Ckpt) -> None:
    copy = ck.tensors(SHARD1)[GATE_UP_B]
    ck.edit_shard(SHARD2, lambda ts: ts.update({GATE_UP_B: copy}))


# ============================================================================ namespace


@case("missing_canonical_key", "namespace", code="namespace.missing_key")
def _(ck: Ckpt) -> None:
    ck.remove_tensor("layers.1.self_attn.learned_sinks.sink")


@case("unexpected_key", "namespace", code="namespace.unexpected_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("layers.0.self_attn.q_norm.weight", _zeros("BF16", (64,)))


@case("layer_beyond_num_hidden_layers", "namespace", code="namespace.unexpected_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("layers.2.input_layernorm.weight", _zeros("BF16", (64,)))


@case("derived_rank_util_stored", "namespace", code="namespace.derived_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("rank_util.rank", Tensor("I32", (2,), struct.pack("<2i", 0, 1)))


@case("derived_weight_unpadded_stored", "namespace", code="namespace.derived_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("norm.weight_unpadded", _zeros("BF16", (64,)))


@case("derived_lm_head_bias_stored", "namespace", code="namespace.derived_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("lm_head.bias", _zeros("F32", (128,)))


@case("derived_fused_wqkv_stored", "namespace", code="namespace.derived_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("layers.0.self_attn.Wqkv.weight", _zeros("BF16", (128, 64)))


@case("hf_model_prefix_names", "namespace", code="namespace.hf_name", also=("namespace.missing_key",))
def _(ck: Ckpt) -> None:
    for shard in ck.shards():
        ck.edit_shard(shard, lambda ts: ts.update({f"model.{k}": ts.pop(k) for k in list(ts)}))
    ck.edit_index(lambda doc: doc.update(weight_map={f"model.{k}": v for k, v in doc["weight_map"].items()}))


@case("key_renamed_to_legacy_name", "namespace", code="namespace.legacy_name", also=("namespace.missing_key",))
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("embed_tokens.weight")
    ck.edit_shard(shard, lambda ts: ts.update({"embedding.weight": ts.pop("embed_tokens.weight")}))
    ck.edit_index(lambda doc: doc["weight_map"].update({"embedding.weight": doc["weight_map"].pop("embed_tokens.weight")}))


@case("hf_mxfp4_blocks_tensor", "namespace", code="namespace.hf_name")
def _(ck: Ckpt) -> None:
    ck.add_tensor("layers.0.mlp.experts.gate_up_proj_blocks", _zeros("U8", (4, 128, 2, 16)))


@case("legacy_block_prefix_tensor", "namespace", code="namespace.legacy_name")
def _(ck: Ckpt) -> None:
    ck.add_tensor("block.0.attn.norm.scale", _zeros("BF16", (64,)))


# ============================================================================ dtype_shape


def _retype(ck: Ckpt, key: str, dtype: str, shape: tuple[int, ...] | None = None) -> None:
    def edit(ts: dict[str, Tensor]) -> None:
        old = ts[key]
        ts[key] = _zeros(dtype, shape or old.shape)
    ck.edit_shard(ck.shard_of(key), edit)


@case("bias_stored_f32", "dtype_shape", code="dtype_shape.wrong_dtype")
def _(ck: Ckpt) -> None:
    _retype(ck, GATE_UP_B, "F32")


@case("expert_weight_e5m2", "dtype_shape", code="dtype_shape.wrong_dtype")
def _(ck: Ckpt) -> None:
    _retype(ck, GATE_UP_W, "F8_E5M2")


@case("expert_weight_unquantized_bf16", "dtype_shape", code="dtype_shape.wrong_dtype")
def _(ck: Ckpt) -> None:
    _retype(ck, DOWN_W, "BF16")


@case("gate_up_in_hf_orientation", "dtype_shape", code="dtype_shape.wrong_shape")
def _(ck: Ckpt) -> None:
    _retype(ck, GATE_UP_W, "F8_E4M3", (4, 128, 64))


@case("scale_without_singleton_dim", "dtype_shape", code="dtype_shape.wrong_shape")
def _(ck: Ckpt) -> None:
    _retype(ck, GATE_UP_S, "F32", (4, 128))


@case("scale_stored_bf16", "dtype_shape", code="dtype_shape.wrong_dtype")
def _(ck: Ckpt) -> None:
    _retype(ck, DOWN_S, "BF16")


@case("norm_with_wrong_length", "dtype_shape", code="dtype_shape.wrong_shape")
def _(ck: Ckpt) -> None:
    _retype(ck, "norm.weight", "BF16", (65,))


# ============================================================================ sidecar


@case("missing_scale", "sidecar", code="sidecar.missing_scale")
def _(ck: Ckpt) -> None:
    ck.remove_tensor(GATE_UP_S)


@case("orphan_scale_without_weight", "sidecar", code="sidecar.orphan_scale")
def _(ck: Ckpt) -> None:
    ck.remove_tensor(DOWN_W)


@case("scale_moved_to_other_shard", "sidecar", code="sidecar.split_shard")
def _(ck: Ckpt) -> None:
    ck.move_tensor(GATE_UP_S, SHARD2)


@case("stray_weight_scale", "sidecar", code="sidecar.stray_scale")
def _(ck: Ckpt) -> None:
    ck.add_tensor(f"layers.0.{fmt.GATE_UP}.weight_scale", _zeros("F32", (4, 1, 128)))


@case("stray_input_scale", "sidecar", code="sidecar.stray_scale")
def _(ck: Ckpt) -> None:
    ck.add_tensor(f"layers.0.{fmt.DOWN}.input_scale", Tensor("F32", (1,), _f32(1.0)))


@case("stray_attention_weight_scale", "sidecar", code="sidecar.stray_scale")
def _(ck: Ckpt) -> None:
    ck.add_tensor("layers.0.self_attn.q_proj.weight_scale", Tensor("F32", (1,), _f32(1.0)))


# ============================================================================ values


@case("nan_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(GATE_UP_S, 4 * 7, struct.pack("<I", 0x7FC00000))


@case("zero_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(DOWN_S, 0, _f32(0.0))


@case("negative_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(DOWN_S, 4 * 3, _f32(-0.01))


@case("negative_zero_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(DOWN_S, 4 * 5, _f32(-0.0))


@case("infinite_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(GATE_UP_S, 4 * 100, _f32(float("inf")))


@case("deep_fp8_nan_byte_0x7f", "values", code="values.fp8_out_of_range")
def _(ck: Ckpt) -> Options:
    ck.poke(GATE_UP_W, 1234, b"\x7f")
    return {"deep": True}


@case("deep_fp8_minus_256_byte_0xf8", "values", code="values.fp8_out_of_range")
def _(ck: Ckpt) -> Options:
    ck.poke(DOWN_W, 4095, b"\xf8")
    return {"deep": True}


@case("deep_nonzero_gate_padding_column", "values", base="padded", code="values.nonzero_padding")
def _(ck: Ckpt) -> Options:
    ck.poke(GATE_UP_W, 5 * 192 + 70, b"\x38")  # expert 0, row 5, gate column 70 (I=64, I'=96)
    return {"deep": True}


@case("deep_nonzero_up_padding_column", "values", base="padded", code="values.nonzero_padding")
def _(ck: Ckpt) -> Options:
    ck.poke(GATE_UP_W, 96 * 192 * 3 + 2 * 192 + 191, b"\x01")  # expert 3, row 2, last up column
    return {"deep": True}


@case("deep_nonzero_gate_up_padding_row", "values", base="padded", code="values.nonzero_padding")
def _(ck: Ckpt) -> Options:
    ck.poke(GATE_UP_W, 80 * 192 + 3, b"\x30")  # row 80 >= H=64
    return {"deep": True}


@case("deep_nonzero_down_padding_row", "values", base="padded", code="values.nonzero_padding")
def _(ck: Ckpt) -> Options:
    ck.poke(DOWN_W, 96 * 96 + 70 * 96 + 1, b"\x30")  # expert 1, row 70 >= I=64
    return {"deep": True}


@case("deep_nonzero_bf16_embedding_padding", "values", base="padded", code="values.nonzero_padding")
def _(ck: Ckpt) -> Options:
    ck.poke("embed_tokens.weight", 2 * (3 * 96 + 90), struct.pack("<H", 0x3F80))  # row 3, column 90
    return {"deep": True}


# ============================================================================ config


@case("config_missing", "config", code="config.missing")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.CONFIG_FILE).unlink()


@case("config_not_json", "config", code="config.invalid_json")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.CONFIG_FILE).write_text('{"model_type": "gpt_oss",')


@case("config_json_null", "config", code="config.not_an_object")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.CONFIG_FILE).write_text("null\n")


@case("config_duplicate_key", "config", code="config.duplicate_key")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.CONFIG_FILE, '"hidden_size": 64', '"hidden_size": 64, "hidden_size": 64')


@case("config_wrong_model_type", "config", code="config.wrong_model_type")
def _(ck: Ckpt) -> None:
    ck.edit_config(model_type="llama")


@case("config_wrong_architecture", "config", code="config.wrong_architecture")
def _(ck: Ckpt) -> None:
    ck.edit_config(architectures=["GptOssForCausalLM", "MistralForCausalLM"])


@case("config_mxfp4_quantization", "config", code="config.mxfp4_quantization_config")
def _(ck: Ckpt) -> None:
    ck.edit_config(quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]})


@case("config_foreign_quantization", "config", code="config.foreign_quantization_config")
def _(ck: Ckpt) -> None:
    ck.edit_config(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})


@case("custom_profile_without_opt_in", "config", code="config.custom_profile_not_allowed")
def _(ck: Ckpt) -> Options:
    return {"allow_custom_model": False}


@case("profile_claims_gpt_oss_20b", "config", code="config.profile_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(model_profile="gpt-oss-20b")


@case("padded_size_not_multiple_of_32", "config", code="config.padding_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(padded_hidden_size=80)


@case("padded_size_below_model_size", "config", code="config.padding_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(padded_intermediate_size=32)


@case("config_hidden_size_disagrees_with_index", "config", code="config.padding_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_config(hidden_size=128)


@case("config_claims_10_to_the_11_layers", "config", code="config.out_of_range")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_hidden_layers=10**11)


@case("config_dimension_as_float", "config", code="config.bad_field")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_local_experts=4.0)


@case("config_dimension_missing", "config", code="config.bad_field")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.CONFIG_FILE, '"head_dim": 16,', "")


@case("config_more_experts_per_token_than_experts", "config", code="config.bad_field")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_experts_per_tok=5, experts_per_token=5)  # the tiny model has 4 experts


# ============================================================================ neuron_config


def _neuron_case(name: str, code: str, **changes: Any) -> None:
    config = {**GOOD_NEURON_CONFIG, **changes}
    case(name, "neuron_config", code=f"neuron_config.{code}")(lambda ck: {"neuron_config": config})


_neuron_case("nc_not_quantized", "not_quantized", quantized=False)
_neuron_case("nc_quantization_dtype_int8", "wrong_quantization_dtype", quantization_dtype="int8")
_neuron_case("nc_per_channel_not_expert_wise", "wrong_quantization_type", quantization_type="per_channel_symmetric")
_neuron_case("nc_padded_intermediate_differs", "padding_mismatch", padded_intermediate_size=96)
_neuron_case("nc_mxfp4_compute_on", "mxfp4_compute", is_mxfp4_compute=True)
_neuron_case("nc_attention_not_excluded", "attention_not_excluded", modules_to_not_convert=["lm_head"])
_neuron_case("nc_lm_head_not_excluded", "lm_head_not_excluded", modules_to_not_convert=["self_attn"])
_neuron_case("nc_experts_excluded", "experts_excluded", modules_to_not_convert=["self_attn", "lm_head", "mlp_op"])
_neuron_case("nc_tp_does_not_divide_intermediate", "expert_tp_indivisible", tp_degree=3)
_neuron_case("nc_ep_does_not_divide_experts", "expert_ep_indivisible", moe_ep_degree=3, moe_tp_degree=1)
_neuron_case("nc_tp_degree_zero", "bad_degree", tp_degree=0)


# ============================================================================ integrity


@case("digest_mismatch_flipped_data_byte", "integrity", sync=False, code="integrity.digest_mismatch")
def _(ck: Ckpt) -> Options:
    ck.poke("lm_head.weight", 100, b"\x42\x42")
    return {"verify_checksums": True}


@case("same_layout_shard_from_other_seed", "integrity", sync=False, code="integrity.digest_mismatch")
def _(ck: Ckpt) -> Options:
    shutil.copy(ck.bases.other_seed / SHARD2, ck.root / SHARD2)
    return {"verify_checksums": True}


@case("verify_requested_without_digests", "integrity", code="integrity.no_digests")
def _(ck: Ckpt) -> Options:
    ck.edit_index(lambda doc: doc["metadata"].pop("shard_sha256"))
    return {"verify_checksums": True}


# ============================================================================ bounds and trust (docs/format.md)


def _replace_first_number(ck: Ckpt, shard: str, field: str, old: str, new: str) -> None:
    """Rewrite the first ``"field":[old`` number of ``shard``'s header as the literal ``new``."""
    text, data = ck.raw_header(shard)
    needle = f'"{field}":[{old}'.encode()
    assert needle in text, needle
    ck.write_raw(shard, text.replace(needle, f'"{field}":[{new}'.encode(), 1), data)


def _first_entry(ck: Ckpt, shard: str) -> tuple[str, dict[str, Any]]:
    document = json.loads(ck.raw_header(shard)[0])
    name = min((k for k in document if k != "__metadata__"), key=lambda k: document[k]["data_offsets"][0])
    return name, document[name]


def _not_plain_offset(name: str, literal: Callable[[int], str]) -> None:
    """The first tensor's end offset (or its begin 0) written as a number that is not a plain integer."""
    @case(name, "header", code="header.bad_offsets")
    def _(ck: Ckpt) -> None:
        shard = ck.shard_of("norm.weight")
        _, entry = _first_entry(ck, shard)
        begin, end = entry["data_offsets"]
        _replace_first_number(ck, shard, "data_offsets", f"{begin},{end}", f"{begin},{literal(end)}")


@_header_case("offset_written_minus_zero", code="header.bad_offsets")
def _(ck: Ckpt, shard: str) -> None:
    _replace_first_number(ck, shard, "data_offsets", "0,", "-0,")  # Python's json reads -0 as 0


_not_plain_offset("offset_written_as_float", lambda end: f"{end}.0")
_not_plain_offset("offset_written_with_exponent", lambda end: f"{end}e0")
_not_plain_offset("offset_written_with_capital_exponent", lambda end: f"{end / 10:g}E1" if end % 10 == 0 else f"{end}E0")
_not_plain_offset("offset_written_as_huge_float", lambda end: "1e400")


@case("shape_written_minus_zero_float", "header", code="header.bad_shape")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    _, entry = _first_entry(ck, shard)
    _replace_first_number(ck, shard, "shape", str(entry["shape"][0]), "-0.0")


@case("shape_written_with_exponent", "header", code="header.bad_shape")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    _, entry = _first_entry(ck, shard)
    _replace_first_number(ck, shard, "shape", str(entry["shape"][0]), f"{entry['shape'][0]}e0")


@case("config_attention_bias_absent", "config", code="config.no_attention_bias")
def _(ck: Ckpt) -> None:
    config = ck.load(fmt.CONFIG_FILE)
    config.pop("attention_bias")
    ck.save(fmt.CONFIG_FILE, config)


@case("config_attention_bias_false", "config", code="config.no_attention_bias")
def _(ck: Ckpt) -> None:
    ck.edit_config(attention_bias=False)


@case("config_attention_bias_string_true", "config", code="config.no_attention_bias")
def _(ck: Ckpt) -> None:
    ck.edit_config(attention_bias="true")


@case("config_original_hidden_size_differs", "config", code="config.original_size_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_config(original_hidden_size=32)


@case("config_original_intermediate_size_differs", "config", code="config.original_size_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_config(original_intermediate_size=96)


@case("config_num_hidden_layers_4300_digits", "config", code="config.number_too_large")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.CONFIG_FILE, '"num_hidden_layers": 2', '"num_hidden_layers": 1' + "0" * 4299)


@case("config_dimension_above_2_31", "config", code="config.out_of_range")
def _(ck: Ckpt) -> None:
    ck.edit_config(vocab_size=2**31 + 1)


@case("config_dimension_negative", "config", code="config.out_of_range")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_key_value_heads=-2)


@case("config_heads_times_head_dim_2_62", "dtype_shape", code="dtype_shape.wrong_shape")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_attention_heads=2**31, head_dim=2**31)


@case("index_padded_intermediate_4300_digits", "index", code="index.number_too_large", sync=False)
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"padded_intermediate_size": 64', '"padded_intermediate_size": 6' + "4" * 4299)


@case("index_padded_hidden_above_2_31", "index", code="index.out_of_range")
def _(ck: Ckpt) -> None:
    ck.edit_metadata(padded_hidden_size=2**40 + 64)


@case("index_total_size_above_2_53", "index", code="index.out_of_range", sync=False)
def _(ck: Ckpt) -> None:
    ck.edit_metadata(total_size=2**60)


def _outside_link(ck: Ckpt, name: str) -> None:
    outside = ck.root.parent / f"{ck.root.name}-outside-{name}"
    shutil.move(ck.root / name, outside)
    (ck.root / name).symlink_to(outside)


@case("config_link_outside_directory", "filesystem", code="filesystem.link_outside")
def _(ck: Ckpt) -> None:
    _outside_link(ck, fmt.CONFIG_FILE)


@case("index_link_outside_directory", "filesystem", code="filesystem.link_outside", sync=False)
def _(ck: Ckpt) -> None:
    ck.sync()
    _outside_link(ck, fmt.INDEX_FILE)


@case("listed_shard_not_safetensors", "filesystem", code="filesystem.not_safetensors")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    (ck.root / shard).rename(ck.root / "norm.bin")
    ck.edit_index(lambda doc: doc["weight_map"].update(
        {k: "norm.bin" for k, v in doc["weight_map"].items() if v == shard}))


def _not_a_file(name: str, target: Callable[[Ckpt], str], make: Callable[[Path], None], sync: bool = True) -> None:
    @case(name, "filesystem", code="filesystem.not_a_file", sync=sync)
    def _(ck: Ckpt) -> None:
        path = ck.root / target(ck)
        path.unlink()
        make(path)


_not_a_file("config_is_a_fifo", lambda ck: fmt.CONFIG_FILE, os.mkfifo)
_not_a_file("index_is_a_fifo", lambda ck: fmt.INDEX_FILE, os.mkfifo, sync=False)
_not_a_file("shard_is_a_fifo", lambda ck: ck.shard_of("norm.weight"), os.mkfifo)
_not_a_file("config_is_a_directory", lambda ck: fmt.CONFIG_FILE, os.mkdir)


@case("original_subdirectory_with_weights", "filesystem", code="filesystem.nested_weight_files", warning=True)
def _(ck: Ckpt) -> None:
    (ck.root / "original").mkdir()
    (ck.root / "original" / "model.safetensors").write_bytes(b"\x00" * 16)
    (ck.root / "original" / "consolidated.00.pth").write_bytes(b"\x80\x02.")


@case("subnormal_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(GATE_UP_S, 4 * 9, _f32(1e-40))


@case("smallest_subnormal_scale", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    ck.poke(DOWN_S, 4 * 2, struct.pack("<I", 1))


@case("all_scales_zero_preallocated", "values", code="values.bad_scale")
def _(ck: Ckpt) -> None:
    for key in (GATE_UP_S, DOWN_S):
        size = read_header(ck.root / ck.shard_of(key)).tensors[key].nbytes
        ck.poke(key, 0, bytes(size))


_neuron_case("nc_quantized_mlp_kernel_enabled", "quantization_rewritten", quantized_mlp_kernel_enabled=True)
_neuron_case("nc_activation_quantization_type", "quantization_rewritten", activation_quantization_type="dynamic")
_neuron_case("nc_hybrid_sharding_config", "hybrid_sharding", hybrid_sharding_config={"moe_cte_tp_degree": 2, "moe_tkg_tp_degree": 2})
_neuron_case("nc_tp_degree_above_2_31", "bad_degree", tp_degree=2**31 + 2)
_neuron_case("nc_padded_size_above_2_31", "out_of_range", padded_intermediate_size=2**40)


def _nested_case(name: str, code: str, **model: Any) -> None:
    # a nested file's model part is an InferenceConfig serialized: the same codes as at load
    @case(name, "config", code=f"config.{code}")
    def _(ck: Ckpt) -> Options:
        config = ck.load(fmt.CONFIG_FILE)
        config.update(model)
        config.pop("quantization_config", None)
        return {"neuron_config": {**config, "neuron_config": GOOD_NEURON_CONFIG}}


_nested_case("nc_nested_file_disagrees_on_experts", "nxdi_config_mismatch", num_local_experts=8, num_experts=8)
_nested_case("nc_nested_file_without_attention_bias", "no_attention_bias", attention_bias=False)
_nested_case("nc_nested_file_original_hidden_differs", "original_size_mismatch", original_hidden_size=32)


@case("nc_unknown_key_tp_degre", "neuron_config", code="neuron_config.unknown_key", warning=True)
def _(ck: Ckpt) -> Options:
    return {"neuron_config": {**GOOD_NEURON_CONFIG, "tp_degre": 4}}


# ============================================================================ from the format document alone


@case("index_duplicate_key_inside_source", "index", code="index.duplicate_key", sync=False)
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"seed": 0', '"seed": 0, "seed": 1')


@case("index_duplicate_key_inside_shard_sha256", "index", code="index.duplicate_key", sync=False)
def _(ck: Ckpt) -> None:
    digests = ck.index["metadata"]["shard_sha256"]
    ck.replace_in(fmt.INDEX_FILE, '"shard_sha256": {', f'"shard_sha256": {{"{SHARD1}": "{digests[SHARD1]}",')


@case("index_weight_map_value_null", "index", code="index.bad_weight_map_entry")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": None}))


@case("index_weight_map_value_list", "index", code="index.bad_weight_map_entry")
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight": [SHARD1]}))


@case("index_weight_map_key_trailing_space", "ownership", code="ownership.unlisted_key", also=("ownership.key_not_in_shard",))
def _(ck: Ckpt) -> None:
    ck.edit_index(lambda doc: doc["weight_map"].update({"norm.weight ": doc["weight_map"].pop("norm.weight")}))


@case("index_format_version_1_point_0", "index", code="index.wrong_metadata_type", sync=False)
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.INDEX_FILE, '"format_version": 1,', '"format_version": 1.0,')


@case("index_fp8_max_as_string", "index", code="index.wrong_metadata_type", also=("index.wrong_metadata_value",))
def _(ck: Ckpt) -> None:
    ck.edit_metadata(fp8_max="240")


@case("index_total_size_as_float", "index", code="index.wrong_metadata_type", sync=False)
def _(ck: Ckpt) -> None:
    ck.sync()
    total = ck.index["metadata"]["total_size"]
    ck.replace_in(fmt.INDEX_FILE, f'"total_size": {total}', f'"total_size": {total}.0')


@case("index_total_size_as_bool", "index", code="index.wrong_metadata_type", sync=False)
def _(ck: Ckpt) -> None:
    ck.edit_metadata(total_size=True)


@case("index_with_utf8_bom", "index", code="index.invalid_json", sync=False)
def _(ck: Ckpt) -> None:
    ck.sync()
    path = ck.root / fmt.INDEX_FILE
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


@case("config_with_utf8_bom", "config", code="config.invalid_json")
def _(ck: Ckpt) -> None:
    path = ck.root / fmt.CONFIG_FILE
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


@case("config_model_type_upper_case", "config", code="config.wrong_model_type")
def _(ck: Ckpt) -> None:
    ck.edit_config(model_type="GPT_OSS")


@case("config_unknown_quant_method", "config", code="config.foreign_quantization_config")
def _(ck: Ckpt) -> None:
    ck.edit_config(quantization_config={"quant_method": "awq", "bits": 4})


@case("config_duplicate_key_inside_rope_scaling", "config", code="config.duplicate_key")
def _(ck: Ckpt) -> None:
    ck.replace_in(fmt.CONFIG_FILE, '"factor": 32.0', '"factor": 32.0, "factor": 1.0')


@case("config_experts_per_token_without_num_experts_per_tok", "config", code="config.alias_only")
def _(ck: Ckpt) -> None:
    config = ck.load(fmt.CONFIG_FILE)
    config.pop("num_experts_per_tok")  # transformers then gives NxDI its default top-k, not this one
    ck.save(fmt.CONFIG_FILE, config)


@case("config_num_experts_disagrees_with_num_local_experts", "config", code="config.alias_mismatch")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_experts=8)


@case("config_dangling_link", "config", code="config.missing")
def _(ck: Ckpt) -> None:
    (ck.root / fmt.CONFIG_FILE).unlink()
    (ck.root / fmt.CONFIG_FILE).symlink_to("nowhere.json")


@case("header_duplicate_key_inside_metadata", "header", code="header.duplicate_key")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, b'{"__metadata__":{"format":"pt","format":"pt"},' + text.strip()[1:], data)


@case("header_duplicate_name_through_escape", "header", code="header.duplicate_key")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    text, data = ck.raw_header(shard)
    entry = b'"norm.weigh\\u0074":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},'
    ck.write_raw(shard, b"{" + entry + text.strip()[1:], data)


@case("header_bytes_after_the_json", "header", code="header.invalid_json")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    text, data = ck.raw_header(shard)
    ck.write_raw(shard, text.rstrip() + b"{}", data)


@case("header_metadata_null", "header", code="header.bad_metadata")
def _(ck: Ckpt) -> None:
    ck.edit_header_json(ck.shard_of("norm.weight"), lambda doc: doc.update({"__metadata__": None}))


@case("header_zero_length_tensor_inside_another", "header", code="header.offsets_overlap")
def _(ck: Ckpt) -> None:
    def edit(doc: dict[str, Any]) -> None:
        begin = doc["norm.weight"]["data_offsets"][0]
        doc["zero"] = {"dtype": "BF16", "shape": [0], "data_offsets": [begin + 2, begin + 2]}
    ck.edit_header_json(ck.shard_of("norm.weight"), edit)


@case("header_empty_tensor_set_up_to_eof", "ownership", code="ownership.key_not_in_shard")
def _(ck: Ckpt) -> None:
    ck.write_raw(ck.shard_of("norm.weight"), b"{}", b"")


@case("shard_name_differs_only_in_case", "ownership", code="ownership.missing_shard")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    ck.edit_index(lambda doc: doc["weight_map"].update(
        {k: shard.replace("model", "Model") for k, v in doc["weight_map"].items() if v == shard}))


@case("shard_name_in_another_unicode_normalization", "ownership", code="ownership.missing_shard")
def _(ck: Ckpt) -> None:
    shard, composed = ck.shard_of("norm.weight"), "mod\u00e8l.safetensors"  # è as one code point (NFC)
    (ck.root / shard).rename(ck.root / composed)
    decomposed = "mode\u0300l.safetensors"  # the same name in NFD: another file name on POSIX
    ck.edit_index(lambda doc: doc["weight_map"].update({k: decomposed for k, v in doc["weight_map"].items() if v == shard}))


@case("shard_is_a_link_to_another_listed_shard", "collision", code="collision.duplicate_tensor")
def _(ck: Ckpt) -> None:
    (ck.root / SHARD2).unlink()
    (ck.root / SHARD2).symlink_to(SHARD1)


@case("shard_is_a_link_into_a_subdirectory", "filesystem", code="filesystem.link_outside")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    (ck.root / "sub").mkdir()
    (ck.root / shard).rename(ck.root / "sub" / "data")
    (ck.root / shard).symlink_to("sub/data")


@case("shard_is_a_link_to_dev_zero", "filesystem", code="filesystem.link_outside")
def _(ck: Ckpt) -> None:
    shard = ck.shard_of("norm.weight")
    (ck.root / shard).unlink()
    (ck.root / shard).symlink_to("/dev/zero")


@case("stray_weight_file_name_with_terminal_escapes", "filesystem", code="filesystem.stray_weight_file")
def _(ck: Ckpt) -> None:
    (ck.root / "\x1b[2J\rVALID.safetensors").write_bytes(b"\x00" * 8)


@case("stray_scale_in_upper_case", "sidecar", code="sidecar.stray_scale")
def _(ck: Ckpt) -> None:
    ck.add_tensor(f"layers.0.{fmt.GATE_UP}.SCALE", _zeros("F32", (4, 1, 128)))


@case("tensor_name_with_terminal_escapes", "namespace", code="namespace.unexpected_key")
def _(ck: Ckpt) -> None:
    ck.add_tensor("\x1b[2Jx\rVALID: 0 errors\n", Tensor("BF16", (1,), b"\x00\x00"))


@case("padded_scale_channel_nan", "values", code="values.bad_scale", base="padded")
def _(ck: Ckpt) -> None:
    ck.poke(GATE_UP_S, 4 * 70, struct.pack("<I", 0x7FC00000))  # gate column 70 >= I=64


@case("deep_fp8_nan_in_padding", "values", code="values.fp8_out_of_range", also=("values.nonzero_padding",), base="padded")
def _(ck: Ckpt) -> Options:
    ck.poke(GATE_UP_W, 5 * 192 + 70, b"\x7f")
    return {"deep": True}


@case("deep_fp8_negative_nan_0xff", "values", code="values.fp8_out_of_range")
def _(ck: Ckpt) -> Options:
    ck.poke(DOWN_W, 77, b"\xff")
    return {"deep": True}


def _non_finite_case(name: str, key: str, element: int, value: int, *, base: str = "tiny") -> None:
    @case(name, "values", code="values.non_finite", base=base)
    def _(ck: Ckpt) -> Options:
        ck.poke(key, 2 * element, struct.pack("<H", value))
        return {"deep": True}


# the BF16 tensors of every kind the deep scan reads: +inf, -inf, NaN (quiet, signalling, negative)
for _name, _key, _element, _value in (
    ("deep_bf16_nan_in_q_proj", "layers.0.self_attn.q_proj.weight", 17, 0x7FC0),
    ("deep_bf16_inf_in_embedding", "embed_tokens.weight", 1000, 0x7F80),
    ("deep_bf16_negative_inf_in_lm_head", "lm_head.weight", 3, 0xFF80),
    ("deep_bf16_negative_nan_in_sinks", "layers.1.self_attn.learned_sinks.sink", 0, 0xFFFF),
    ("deep_bf16_signalling_nan_in_router", "layers.1.feed_forward.moe.router.linear_router.weight", 9, 0x7F81),
    ("deep_bf16_nan_in_router_bias", "layers.0.feed_forward.moe.router.linear_router.bias", 1, 0x7FC0),
    ("deep_bf16_inf_in_norm", "norm.weight", 0, 0x7F80),
    ("deep_bf16_nan_in_layernorm", "layers.1.input_layernorm.weight", 5, 0xFFC0),
    ("deep_bf16_inf_in_expert_bias", f"layers.0.{fmt.GATE_UP}.bias", 33, 0x7F80),
    ("deep_bf16_nan_in_o_proj_bias", "layers.1.self_attn.o_proj.bias", 2, 0x7FC0),
):
    _non_finite_case(_name, _key, _element, _value)
_non_finite_case("deep_bf16_nan_in_padded_q_proj", "layers.0.self_attn.q_proj.weight", 3, 0x7FC0, base="padded")


def _padding_case(name: str, key: str, position: int) -> None:
    @case(name, "values", code="values.nonzero_padding", base="padded")
    def _(ck: Ckpt) -> Options:
        ck.poke(key, position, struct.pack("<H", 0x3F80))  # bf16 1.0 in a padded row or column
        return {"deep": True}


_padding_case("deep_nonzero_gate_up_bias_padding", GATE_UP_B, 2 * 70)
_padding_case("deep_nonzero_q_proj_padding_column", "layers.0.self_attn.q_proj.weight", 2 * 70)
_padding_case("deep_nonzero_o_proj_bias_padding", "layers.0.self_attn.o_proj.bias", 2 * 70)
_padding_case("deep_nonzero_router_padding_column", "layers.0.feed_forward.moe.router.linear_router.weight", 2 * 70)
_padding_case("deep_nonzero_norm_padding", "norm.weight", 2 * 70)
_neuron_case("nc_modules_to_not_convert_as_string", "bad_modules_to_not_convert", modules_to_not_convert="self_attn,lm_head")
_neuron_case("nc_tp_degree_as_string", "bad_degree", tp_degree="2")
_neuron_case("nc_load_mode_unknown", "bad_load_option", normalized_fp8_load_mode="mapped")
_neuron_case("nc_verify_at_load_not_a_switch", "bad_load_option", normalized_fp8_verify_at_load="sometimes")


@case("nc_quantization_type_absent", "neuron_config", code="neuron_config.wrong_quantization_type")
def _(ck: Ckpt) -> Options:
    return {"neuron_config": {k: v for k, v in GOOD_NEURON_CONFIG.items() if k != "quantization_type"}}


# ============================================================================ config.json means what NxDI computes


def _config_case(name: str, code: str, *, warning: bool = False, also: tuple[str, ...] = (),
                 drop: tuple[str, ...] = (), **changes: Any) -> None:
    """config.json with ``changes`` (``rope_scaling__member`` edits one member of rope_scaling; the
    value ``_DROP`` removes it) and the top-level fields ``drop`` removed."""
    @case(name, "config", code=f"config.{code}", warning=warning, also=also)
    def _(ck: Ckpt) -> None:
        config = ck.load(fmt.CONFIG_FILE)
        for field in drop:
            config.pop(field)
        for field, value in changes.items():
            if field.startswith("rope_scaling__"):
                member = field[len("rope_scaling__"):]
                if value is _DROP:
                    config["rope_scaling"].pop(member)
                else:
                    config["rope_scaling"][member] = value
            else:
                config[field] = value
        ck.save(fmt.CONFIG_FILE, config)


_DROP = object()
_TINY_LAYERS = 2  # the tiny base: layer 0 slides, layer 1 attends fully
_config_case("config_layer_types_reversed", "layer_types_mismatch", layer_types=["full_attention", "sliding_attention"])
_config_case("config_layer_types_all_full_attention", "layer_types_mismatch", layer_types=["full_attention"] * _TINY_LAYERS)
_config_case("config_layer_types_all_sliding", "layer_types_mismatch", layer_types=["sliding_attention"] * _TINY_LAYERS)
_config_case("config_layer_types_one_short", "layer_types_mismatch", layer_types=["sliding_attention"])
_config_case("config_layer_types_one_long", "layer_types_mismatch",
             layer_types=["sliding_attention", "full_attention", "sliding_attention"])
_config_case("config_layer_types_unknown_kind", "layer_types_mismatch", layer_types=["sliding_attention", "chunked_attention"])
_config_case("config_layer_types_a_string", "layer_types_mismatch", layer_types="sliding_attention,full_attention")
_config_case("config_rms_norm_eps_1e_6", "hard_coded_mismatch", rms_norm_eps=1e-6)
_config_case("config_rms_norm_eps_as_string", "hard_coded_mismatch", rms_norm_eps="1e-05")
_config_case("config_swiglu_limit_10", "hard_coded_mismatch", swiglu_limit=10.0)
_config_case("config_swiglu_limit_true", "hard_coded_mismatch", swiglu_limit=True)
_config_case("config_tie_word_embeddings_true", "hard_coded_mismatch", tie_word_embeddings=True)
_config_case("config_tie_word_embeddings_string_false", "hard_coded_mismatch", tie_word_embeddings="false")
_config_case("config_hidden_act_gelu", "hard_coded_mismatch", hidden_act="gelu")
_config_case("config_shared_experts", "hard_coded_mismatch", n_shared_experts=1)
_config_case("config_partial_rotary_factor_half", "hard_coded_mismatch", partial_rotary_factor=0.5)
_config_case("config_rope_type_linear", "rope_mismatch", rope_scaling__rope_type="linear")
_config_case("config_rope_legacy_type_dynamic", "rope_mismatch", rope_scaling__rope_type=_DROP, rope_scaling__type="dynamic")
_config_case("config_rope_truncate_true", "rope_mismatch", rope_scaling__truncate=True)
_config_case("config_rope_truncate_absent", "rope_mismatch", rope_scaling__truncate=_DROP)
_config_case("config_rope_original_max_positions_8192", "rope_mismatch", rope_scaling__original_max_position_embeddings=8192)
_config_case("config_rope_original_max_positions_absent", "rope_mismatch",  # transformers then takes max_position_embeddings
             rope_scaling__original_max_position_embeddings=_DROP)
_config_case("config_rope_attention_factor", "rope_mismatch", rope_scaling__attention_factor=1.2)
_config_case("config_rope_mscale", "rope_mismatch", rope_scaling__mscale=1.0, rope_scaling__mscale_all_dim=0.5)
_config_case("config_rope_scaling_factor_at_top_level_differs", "rope_mismatch", rope_scaling_factor=16.0)
_config_case("config_rope_scaling_null", "bad_rope", rope_scaling=None)
_config_case("config_rope_scaling_a_list", "bad_rope", rope_scaling=[32.0, 1.0, 32.0])
_config_case("config_rope_factor_missing", "bad_rope", rope_scaling__factor=_DROP)
_config_case("config_rope_factor_below_1", "bad_rope", rope_scaling__factor=0.5)
_config_case("config_rope_beta_fast_missing", "bad_rope", rope_scaling__beta_fast=_DROP)
_config_case("config_rope_beta_slow_string", "bad_rope", rope_scaling__beta_slow="1.0")
_config_case("config_rope_betas_swapped", "bad_rope", rope_scaling__beta_fast=1.0, rope_scaling__beta_slow=32.0)
_config_case("config_rope_theta_zero", "bad_rope", rope_theta=0)
_config_case("config_rope_theta_negative", "bad_rope", rope_theta=-150000)
_config_case("config_rope_theta_one", "bad_rope", rope_theta=1.0)
_config_case("config_rope_theta_string", "bad_rope", rope_theta="150000")
_config_case("config_rope_theta_null", "bad_rope", rope_theta=None)
_config_case("config_initial_context_length_missing", "bad_field", drop=("initial_context_length",))
_config_case("config_initial_context_length_zero", "out_of_range", initial_context_length=0)
_config_case("config_pad_token_id_equals_vocab_size", "out_of_range", pad_token_id=128)
_config_case("config_pad_token_id_negative", "out_of_range", pad_token_id=-1)
_config_case("config_torch_dtype_unknown", "bad_field", torch_dtype="fp8")
_config_case("config_torch_dtype_float32", "dtype_not_bfloat16", warning=True, torch_dtype="float32")
_config_case("config_unknown_top_level_field", "unknown_field", warning=True, use_flash_attention_3=True)
_config_case("config_unknown_rope_scaling_member", "unknown_field", warning=True, rope_scaling__low_freq_factor=1.0)


@case("config_query_heads_not_a_multiple_of_kv_heads", "config", code="config.heads_indivisible")
def _(ck: Ckpt) -> None:
    ck.edit_config(num_key_value_heads=3)  # 4 query heads: the k/v shapes differ too (dtype_shape)


_neuron_case("nc_quantized_string_false", "not_boolean", quantized="false")
_neuron_case("nc_fused_qkv_integer_1", "not_boolean", fused_qkv=1)
_neuron_case("nc_on_cpu_null", "not_boolean", on_cpu=None)
_neuron_case("nc_vocab_parallel_string_true", "not_boolean", vocab_parallel="True")


# ============================================================================ command line


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[-1].strip(), file=sys.stderr)
        return 2
    from nxdi_gptoss_fp8.validate.pipeline import preflight

    out = Path(argv[0])
    bases = Bases.create(out / "_bases")
    missed = 0
    for name, check, build in corpus(bases):
        options = build(out / name)
        report = preflight(out / name, **options)
        caught = any(f.check == check for f in report.errors)
        missed += not caught
        codes = sorted({f.code for f in report.errors})
        print(f"{'caught' if caught else 'MISSED'} {name:<48} {check:<14} {', '.join(codes)}")
    print(f"{len(CASES)} cases, {missed} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
