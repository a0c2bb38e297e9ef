"""The start plan against the real start, configuration by configuration: ``doctor`` (the plan
evaluated ahead of the start, ``serving_host.lint_serving_host``) and vllm-neuron's real
``get_neuron_model`` path with the hook (``VLLM_NEURON_SRC`` at a release tag, NxDI from
``NXDI_SRC``, vLLM's argument parsing and plugin loading and the Neuron compiler/device stood
in: ``vllm_standin``, ``neuron_device``) must agree on every generated configuration: doctor
exits 0 exactly when the start loads.

The configurations are generated (seeded, so a failure names a reproducible case): the recipe of
docs/serving.md with one to three of its settings changed — environment words, option forms,
tensor-parallel and padded sizes, override keys, MODEL kinds, compiled directories, prefix caching
and block sizes. Run once per tag (0.1.0 and 0.2.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ckpt_edit
import clients
import pytest
import vllm_standin

from nxdi_gptoss_fp8 import format as fmt
from nxdi_gptoss_fp8.nxdi import hook as nxdi_hook
from nxdi_gptoss_fp8.nxdi import recipes, serving_host
from nxdi_gptoss_fp8.validate.presharded_manifest import MANIFEST_FILE
from nxdi_gptoss_fp8.validate.verdict import PLACEHOLDER_PATH

pytestmark = [pytest.mark.client, pytest.mark.filterwarnings("ignore")]

COUNT = 300  # generated configurations per tag
SEED = 34
VOCABULARY = b"stand-in vocabulary 0\n"
ENV = {"format": nxdi_hook.ENV_VAR, "verify": fmt.VERIFY_AT_LOAD_ENV, "mode": fmt.LOAD_MODE_ENV,
       "allow": fmt.ALLOW_CUSTOM_ENV, "plugins": "VLLM_PLUGINS", "reference": fmt.REFERENCE_ENV}


@dataclass(frozen=True)
class Start:
    """One start configuration: the recipe's values unless changed (``None``: unset / absent)."""

    format: str | None = "normalized_fp8"
    verify: str | None = None
    mode: str | None = None
    allow: str | None = "1"  # the tiny checkpoint's custom profile needs the opt-in
    plugins: str | None = None
    reference: str | None = None
    tp: int = 64
    tp_form: str = "--tensor-parallel-size"
    config_form: str = "--additional-config"
    padded: int = 64
    max_model_len: int = 8192
    max_num_seqs: int = 4
    prefix_caching: bool = False
    block_size: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # override keys added or replaced
    qpath: str = "ckpt"
    model: str = "ckpt"
    compiled: str = "fresh"

    def describe(self) -> str:
        base = Start()
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__
                         if getattr(self, name) != getattr(base, name)) or "the recipe"


CHANGES: dict[str, list[Any]] = {
    "format": [" Normalized_FP8 ", None, "hf", "normalised-fp8", "fp8"],
    "verify": ["1", "0", "on", "ture", "2"],
    "mode": ["mmap", "private", "PRIVATE", "privat", "copy"],
    "allow": ["ture", "yes", None],
    "plugins": ["nxdi_gptoss_fp8", "neuron", "neuron,nxdi_gptoss_fp8", "", "neuron, nxdi_gptoss_fp8"],
    "reference": ["dequantized", "dequantised"],
    "tp": [1, 2, 4, 3, 128],
    "tp_form": ["-tp", "--tensor_parallel_size="],
    "config_form": ["--additional_config", "--additional-config="],
    "padded": [96],
    "max_model_len": [100, 128, 4096],
    "max_num_seqs": [1, 2],
    "prefix_caching": [True],
    "block_size": [16, 32, 48],
    "extra": [((fmt.LOAD_MODE_ATTR, "mmap"),), ((fmt.LOAD_MODE_ATTR, "private"),), ((fmt.LOAD_MODE_ATTR, "privat"),),
              ((fmt.VERIFY_AT_LOAD_ATTR, True),), ((fmt.VERIFY_AT_LOAD_ATTR, "ture"),),
              (("checkpoint_format", "normalized_fp8"),), (("checkpoint_format", "hf"),), (("pa_num_blocks", 8),),
              (("save_sharded_checkpoint", True),), (("is_prefix_caching", False),),
              (("quantization_dtype", "int8"),), (("modules_to_not_convert", ("lm_head",)),)],
    "qpath": ["other", "placeholder", "missing"],
    "model": ["hf-mxfp4", "missing", "bad-scale", "shard-removed"],
    "compiled": ["unset", "model", "model/", "symlink", "file", "inside", "precompiled", "precompiled-sharded",
                 "rank-removed", "manifest-removed", "tp-4"],
}


def configurations(count: int = COUNT, seed: int = SEED) -> list[Start]:
    """Every single change first, then seeded combinations of two or three (no duplicates)."""
    singles = [replace(Start(), **{name: value}) for name, values in CHANGES.items() for value in values]
    found = {start: None for start in [Start(), *singles]}
    rng = random.Random(seed)
    while len(found) < count:
        names = rng.sample(sorted(CHANGES), rng.choice((2, 2, 3)))
        found.setdefault(replace(Start(), **{name: rng.choice(CHANGES[name]) for name in names}), None)
    return list(found)[:count]


CONFIGURATIONS = configurations()


@pytest.fixture(autouse=True)
def isolated(stack: SimpleNamespace, tmp_path: Path) -> Iterator[None]:
    """NxDI's target and compiler work directory, as the client tests set them; the device's record cleared."""
    with clients.restored_environ():
        os.environ.update({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "BASE_COMPILE_WORK_DIR": f"{tmp_path}/compiler-workdir/"})
        stack.device.loads.clear()
        stack.device.traces = stack.device.checkpoint_loads = 0
        yield


@pytest.fixture(scope="module")
def hf_source(stack: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nxdi_gptoss_fp8.synthetic.sources import REALISTIC_SCALE_RANGE, SOURCE_MXFP4, make_source
    from nxdi_gptoss_fp8.synthetic.tiny import TINY_DIMS

    return Path(make_source(tmp_path_factory.mktemp("hf") / "mxfp4", SOURCE_MXFP4, dims=TINY_DIMS,
                            scale_range=REALISTIC_SCALE_RANGE, original=False))


@dataclass
class Materialized:
    argv: list[str]
    environ: dict[str, str]
    ckpt: Path
    notes: list[str] = field(default_factory=list)


def _serve(stack: SimpleNamespace, argv: list[str], environ: dict[str, str]) -> bool:
    """The start; whether it loaded the model through the hook (a start that loads without it — vLLM
    filtered the entry point out and 0.1.0 found NxDI's class by itself — bypassed every check of
    the plan: it did not load the normalized checkpoint as asked)."""
    with clients.restored_environ():
        for name in (*ENV.values(), serving_host.ENV_COMPILED, serving_host.ENV_TIKTOKEN):
            os.environ.pop(name, None)
        os.environ.update(environ)
        try:
            vllm_standin.serve(stack.loader, argv)
            return nxdi_hook.is_registered()
        finally:
            nxdi_hook.unregister()


def _argv(start: Start, model: str, override: dict[str, Any]) -> list[str]:
    tp = [f"{start.tp_form}{start.tp}"] if start.tp_form.endswith("=") else [start.tp_form, str(start.tp)]
    argv = [model, *tp, "--max-model-len", str(start.max_model_len), "--max-num-seqs", str(start.max_num_seqs)]
    argv += ["--enable-prefix-caching"] if start.prefix_caching else ["--no-enable-prefix-caching"]
    argv += ["--block-size", str(start.block_size)] if start.block_size is not None else []
    text = json.dumps({recipes.VLLM_OVERRIDE_KEY: override})
    return argv + ([f"{start.config_form}{text}"] if start.config_form.endswith("=") else [start.config_form, text])


def materialize(start: Start, stack: SimpleNamespace, template: Path, hf_source: Path, tmp: Path) -> Materialized:
    """The configuration on disk: a private copy of the tiny checkpoint, MODEL, the compiled directory."""
    ckpt = Path(shutil.copytree(template, tmp / "models" / "tiny"))
    tiktoken = tmp / "tiktoken"
    tiktoken.mkdir()
    (tiktoken / serving_host.HARMONY_VOCABULARY).write_bytes(VOCABULARY)
    environ = {ENV[name]: getattr(start, name) for name in ENV if getattr(start, name) is not None}
    environ[serving_host.ENV_TIKTOKEN] = str(tiktoken)
    qpath = {"ckpt": str(ckpt), "placeholder": PLACEHOLDER_PATH, "missing": str(tmp / "nowhere")}.get(start.qpath)
    if qpath is None:
        qpath = str(shutil.copytree(template, tmp / "other" / "tiny"))
    extra = {key: list(value) if isinstance(value, tuple) else value for key, value in start.extra}
    override = {**recipes.neuron_config_keys(qpath, start.padded, start.padded), **extra}
    model = {"ckpt": str(ckpt), "hf-mxfp4": str(hf_source), "missing": str(tmp / "missing")}.get(start.model, str(ckpt))
    if start.model == "bad-scale":
        key = next(k for k in json.loads((ckpt / fmt.INDEX_FILE).read_text())["weight_map"] if k.endswith(".scale"))
        ckpt_edit.replace_tensor(ckpt, key, -ckpt_edit.load_shard(ckpt, ckpt_edit.shard_of(ckpt, key))[key])
    elif start.model == "shard-removed":
        (ckpt / ckpt_edit.shards(ckpt)[0]).unlink()
    compiled = tmp / "compiled"
    if start.compiled == "unset":
        pass
    elif start.compiled in ("model", "model/"):
        environ[serving_host.ENV_COMPILED] = model + ("/" if start.compiled == "model/" else "")
    elif start.compiled == "symlink":
        (tmp / "link").symlink_to(model)
        environ[serving_host.ENV_COMPILED] = str(tmp / "link")
    elif start.compiled == "file":
        compiled.write_text("")
        environ[serving_host.ENV_COMPILED] = str(compiled)
    elif start.compiled == "inside":
        environ[serving_host.ENV_COMPILED] = str(Path(model) / "compiled")
    else:
        environ[serving_host.ENV_COMPILED] = str(compiled)
    if start.compiled.startswith(("precompiled", "rank-", "manifest-", "tp-")):
        _precompile(start, stack, ckpt, compiled, tiktoken)
    return Materialized(_argv(start, model, override), environ, ckpt)


def _precompile(start: Start, stack: SimpleNamespace, ckpt: Path, compiled: Path, tiktoken: Path) -> None:
    """A first start of the recipe (pre-sharded unless plain ``precompiled``), then the tampering."""
    sharded = start.compiled != "precompiled"
    override = {**recipes.neuron_config_keys(str(ckpt), 64, 64), **({"save_sharded_checkpoint": True} if sharded else {})}
    _serve(stack, _argv(Start(), str(ckpt), override), {
        nxdi_hook.ENV_VAR: "normalized_fp8", fmt.ALLOW_CUSTOM_ENV: "1", serving_host.ENV_COMPILED: str(compiled),
        serving_host.ENV_TIKTOKEN: str(tiktoken)})
    weights = compiled / "weights"
    if start.compiled == "rank-removed":
        (weights / "tp1_sharded_checkpoint.safetensors").unlink()
    elif start.compiled == "manifest-removed":
        (weights / MANIFEST_FILE).unlink()
    elif start.compiled == "tp-4":
        document = json.loads((compiled / "neuron_config.json").read_text())
        document["neuron_config"]["tp_degree"] = 4
        (compiled / "neuron_config.json").write_text(json.dumps(document))


def test_the_configurations_cover_every_change_and_are_several_hundred() -> None:
    assert len(CONFIGURATIONS) == COUNT == len(set(CONFIGURATIONS))
    for name, values in CHANGES.items():
        assert {getattr(start, name) for start in CONFIGURATIONS} >= set(values), name


@pytest.mark.parametrize("index", range(COUNT), ids=[start.describe()[:90] for start in CONFIGURATIONS])
def test_doctor_agrees_with_the_real_start(stack: SimpleNamespace, hf_source: Path, tiny_template: Path,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """Doctor's verdict on the configuration, then the start itself: 0 exactly when it loads."""
    start = CONFIGURATIONS[index]
    case = materialize(start, stack, tiny_template, hf_source, tmp_path)
    monkeypatch.setattr(serving_host, "O200K_BASE_SHA256", hashlib.sha256(VOCABULARY).hexdigest())
    report = serving_host.lint_serving_host(["vllm", "serve", *case.argv], case.environ)
    assert not report.built_by or "own functions" in report.built_by, report.built_by  # the installed release decides
    try:
        loaded = _serve(stack, list(case.argv), case.environ)
        why = "" if loaded else "it loaded without the hook (the entry point was not loaded)"
    except (Exception, SystemExit) as exc:  # any way the start ends without a model
        loaded, why = False, f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    assert report.ok is loaded, (f"{start.describe()}: the start {'loaded' if loaded else 'failed: ' + why}; "
                                 f"doctor:\n{report.render_text()}")
