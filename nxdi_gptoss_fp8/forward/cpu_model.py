"""Run NxDI's real GPT-OSS application in NxDI's CPU mode and return its logits.

NxDI's ``NeuronApplicationBase.to_cpu()`` builds the model, loads the weights through the
application's ``checkpoint_loader_fn`` (so through our hook in normalized mode), shards them with
NxD for this rank and runs NxDI's own modules in float32 on the CPU: the model a Neuron device
would trace, minus NKI kernels, tracing and compilation. ``run_forward`` does one context pass
over ``plan.context`` tokens, then teacher-forced token steps, and returns one row of logits per
predicted position. ``run_forwards`` runs several checkpoints, in this process at tp 1 or in
``torchrun`` workers (gloo) at tp > 1.

Every adaptation to NxDI lives in ``NxdiCpuAdaptations`` (one method each, with the upstream
behaviour it works around and how to tell when it is no longer needed). The quantization fix
is applied to one application object while it moves to the CPU and undone afterwards; it is
never part of ``register()``.

Imports NxDI, NxD and torch lazily; without them ``CpuModelError`` says so in one line.
Run as ``python -m nxdi_gptoss_fp8.forward.cpu_model JOB.json``, it is the torchrun worker.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .. import format as fmt
from ..deps import importable, module_version
from ..errors import CpuModelError, CpuModelUnavailableError
from ..safeio.json_file import read_json_file
from ..units import plural

__all__ = [
    "CPU_EXTRA", "CPU_ROUTE", "MODELING", "NEURON_ONLY_ROOTS", "NXD", "NXDI", "ROUTE_HF", "ROUTE_LEGACY", "ROUTE_NORMALIZED",
    "SOURCE_ROOTS", "STANDIN_PYTHONPATH", "TOOL_ERROR_LINES", "TORCHRUN_TIMEOUT_S", "ForwardPlan", "NxdiCpuAdaptations",
    "RunSpec", "cpu_application", "cpu_route_advice", "environment", "fixed_plan", "import_failure", "neuron_settings",
    "require_nxdi", "run_forward", "run_forwards", "source_roots_problem", "standins_loaded",
]

NXDI = "neuronx_distributed_inference"
NXD = "neuronx_distributed"
MODELING = f"{NXDI}.models.gpt_oss.modeling_gpt_oss"
# the checkpoint routes: NxDI's own HF and legacy-FP8 converters, and our hook
ROUTE_HF, ROUTE_LEGACY, ROUTE_NORMALIZED = "hf", "legacy", "normalized"
_ROUTE_FORMAT = {ROUTE_HF: "hf", ROUTE_LEGACY: "legacy", ROUTE_NORMALIZED: "normalized_fp8"}
TOOL_ERROR_LINES = 3
# import roots that exist only on Neuron hosts (no wheel runs elsewhere)
NEURON_ONLY_ROOTS = ("torch_neuronx", "torch_xla", "libneuronxla", "neuronxcc", "nki", "nkilib")
# what a CPU host adds to run NxDI's model from its sources (the PyPI-real packages NxD imports)
CPU_EXTRA = "pip install 'nxdi-gptoss-fp8[nxdi-cpu]'"
TORCHRUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class ForwardPlan:
    """A fixed token sequence: a context pass over ``tokens[:context]``, then one teacher-forced
    step per further token. Logits are returned for ``positions`` (each predicts the next token)."""

    tokens: tuple[int, ...]
    context: int

    def __post_init__(self) -> None:
        if not 1 <= self.context < len(self.tokens):
            raise ValueError(f"context {self.context} must be at least 1 and below the {plural(len(self.tokens), 'token')}")

    @property
    def positions(self) -> range:
        return range(self.context - 1, len(self.tokens) - 1)

    @property
    def seq_len(self) -> int:
        """NxDI's ``seq_len`` (= ``max_context_length``): the tokens, rounded up to 16."""
        return -(-len(self.tokens) // 16) * 16


def fixed_plan(vocab_size: int, tokens: int = 12, steps: int = 6, *, seed: int = 0) -> ForwardPlan:
    """A deterministic token sequence (no tokenizer): ``tokens`` ids below ``vocab_size``,
    the last ``steps`` of them teacher-forced one at a time."""
    if tokens < 2 or not 1 <= steps < tokens:
        raise ValueError(f"need at least 2 tokens and 1 <= steps < tokens (got {plural(tokens, 'token')}, {plural(steps, 'step')})")
    state, ids = 0x9E3779B9 ^ seed, []
    for _ in range(tokens):
        state = (state * 1103515245 + 12345) % (1 << 31)
        ids.append(state % vocab_size)
    return ForwardPlan(tuple(ids), tokens - steps)


@dataclass
class RunSpec:
    """One NxDI run: a checkpoint, the route it loads through, extra NeuronConfig values."""

    checkpoint: str
    route: str
    neuron_config: dict[str, Any] = field(default_factory=dict)
    allow_custom_model: bool = False


# --------------------------------------------------------------------------- availability


def require_nxdi() -> None:
    """Raise ``CpuModelUnavailableError`` (a ``CpuModelError`` and a ``MissingDependencyError``, one
    line) unless NxDI's GPT-OSS model, NxD and transformers import.

    Finding the packages is not enough: sources on ``PYTHONPATH`` are found and may still fail
    to import (NxD imports ``boto3`` and ``tenacity`` at package import; ``torch_xla`` and
    ``torch_neuronx`` exist only on Neuron hosts), so the model's module is imported here, once,
    and any failure becomes one line that names what is missing and where to get it.
    """
    missing = [name for name in (NXDI, NXD) if not importable(name)]
    if missing:
        raise CpuModelUnavailableError(f"needs NxDI: {', '.join(missing)} cannot be imported here; "
                                       f"{cpu_route_advice(os.environ)}")
    if not importable("transformers"):
        raise CpuModelUnavailableError("needs transformers (the reference model): pip install 'nxdi-gptoss-fp8[forward]'")
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            importlib.import_module(MODELING)
    except Exception as exc:  # whatever NxDI's import raises: a missing module, a stand-in lacking a name, ...
        raise CpuModelUnavailableError(import_failure(exc)) from None


# the variables of the CPU route from source checkouts: variable -> (repository, package under src/)
SOURCE_ROOTS = {"NXDI_SRC": ("neuronx-distributed-inference", NXDI), "NXD_SRC": ("neuronx-distributed", NXD)}
# the CPU route (NxDI and NxD from source with the Neuron-only imports stood in) and what it puts on
# PYTHONPATH, relative to this project's clone
CPU_ROUTE = "docs/model-checks.md#where-selfcheck-and-check-forward-run"
STANDIN_PYTHONPATH = "test/support/nxdi_standin/cpu_site:."
_STANDIN_FINDER_MODULE = "nxdi_standin.neuron_stubs"  # the import finder the stand-ins install


def standins_loaded() -> bool:
    """Whether the CPU route's stand-ins for the Neuron-only imports are installed in this process."""
    return any(type(finder).__module__.endswith(_STANDIN_FINDER_MODULE) for finder in sys.meta_path)


def cpu_route_advice(environ: Mapping[str, str]) -> str:
    """What to do when NxDI or NxD cannot be imported: where to run, or what of ``NXDI_SRC`` /
    ``NXD_SRC`` is wrong; always the CPU route of docs/model-checks.md and whether its stand-ins
    were loaded (a relative ``PYTHONPATH`` run outside the clone finds none)."""
    loaded = "" if standins_loaded() else "not "
    stand_ins = f"the Neuron stand-ins were {loaded}loaded"
    problem = source_roots_problem(environ)
    if problem is not None:
        return f"{problem}; {stand_ins}"
    if any(environ.get(var) for var in SOURCE_ROOTS):  # both name source checkouts
        return (f"{' and '.join(SOURCE_ROOTS)} name source checkouts, but {stand_ins}: the CPU route's "
                f"PYTHONPATH={STANDIN_PYTHONPATH} is relative to this project's clone, so run it from the clone's "
                f"root ({CPU_ROUTE})")
    return ("run this where neuronx-distributed-inference is installed (its CPU mode needs no Neuron device), or on a "
            f"CPU host take the CPU route ({CPU_ROUTE}): NxDI and NxD source checkouts with this project's Neuron "
            f"stand-ins, which were {loaded}loaded here")


def source_roots_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with ``NXDI_SRC``/``NXD_SRC`` when either is set (None: neither is set, or
    both are repository roots): each must be its repository's root, the folder holding ``src/``."""
    wanted = {var: environ.get(var) for var in SOURCE_ROOTS}
    if not any(wanted.values()):
        return None
    problems = [f"{var} is not set" if not value else f"{var}={value} has no src/{package}"
                for var, value in wanted.items() for package in [SOURCE_ROOTS[var][1]]
                if not value or not os.path.isdir(os.path.join(value, "src", package))]
    if not problems:
        return None
    roots = " and ".join(f"{var} the root of a {repo} checkout" for var, (repo, _) in SOURCE_ROOTS.items())
    return (f"{'; '.join(problems)}: for the CPU route set {roots} (the folders that hold src/, not src/ "
            f"itself) and run from this project's clone with PYTHONPATH={STANDIN_PYTHONPATH} ({CPU_ROUTE})")


def import_failure(exc: BaseException) -> str:
    """One line for a failed import of NxDI's GPT-OSS model: what is missing and how to get it."""
    missing = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
    if missing in NEURON_ONLY_ROOTS:
        return (f"NxDI is importable here only in part: its GPT-OSS model needs {missing}, which exists only on a "
                "Neuron host (a Neuron DLAMI or container); run this there (docs/model-checks.md#where-selfcheck-and-check-forward-run "
                "says how a CPU host gets the rest)")
    if missing is not None:
        return (f"NxDI is importable here only in part: importing its GPT-OSS model needs the module {missing!r}; "
                f"NxD imports boto3 and tenacity on any host: {CPU_EXTRA}")
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"NxDI is importable here only in part: importing {MODELING} failed: {type(exc).__name__}: {first}"


def environment() -> dict[str, dict[str, str]]:
    """Version and import location of NxDI, NxD, torch and transformers (imports them)."""
    out = {}
    for name in (NXDI, NXD, "torch", "transformers"):
        module = importlib.import_module(name)
        out[name] = {"version": module_version(name), "path": os.path.dirname(os.path.abspath(module.__file__ or ""))}
    return out


# --------------------------------------------------------------------------- the adaptations


class NxdiCpuAdaptations:
    """Every adaptation to NxDI's CPU mode, each scoped to one run and undone afterwards.

    Written against NxDI 0.9 (4bcdc54) and NxD 0.18 (fbac349b).
    """

    # NeuronConfig values CPU mode needs; they replace the user's (and are reported).
    SETTINGS: ClassVar[dict[str, Any]] = {
        "on_cpu": True,
        # to_cpu refuses bfloat16 at tp > 1 (gloo has no bf16 collectives); float32 everywhere
        # also makes the comparison with transformers a float32 one
        "torch_dtype": "float32",
        # to_cpu builds ONE module for the context and token wrappers: both need the same shapes
        "batch_size": 1, "ctx_batch_size": 1, "tkg_batch_size": 1, "max_batch_size": 1,
        "enable_bucketing": False,
        # without it token steps fail on GPT-OSS's sliding-window cache (rounded up to 128
        # slots while the window mask has sliding_window slots)
        "apply_seq_ids_mask": True,
        # device-only parallelism and runtime features to_cpu does not set up
        "logical_nc_config": 1, "pp_degree": 1, "ep_degree": 1, "cp_degree": 1, "attention_dp_degree": 1,
        "moe_ep_degree": 1, "speculation_length": 0, "async_mode": False, "save_sharded_checkpoint": False,
        "on_device_sampling_config": None,
    }
    # keys dropped: derived by NeuronConfig from the ones above, or NKI kernel switches (the
    # kernels do not run on a CPU)
    DROPPED = ("moe_tp_degree", "world_size")
    DEVICE_ONLY_SUFFIXES = ("kernel_enabled", "_kernel", "kernel_config")

    def __init__(self, tp: int) -> None:
        self.tp = tp
        self.under_torchrun = "WORLD_SIZE" in os.environ

    @staticmethod
    def seq_len(plan: ForwardPlan, sliding_window: int) -> int:
        """``seq_len`` and ``max_context_length`` (equal: to_cpu builds one module for the context
        and token wrappers). NxDI's windowed context encoding keeps the last ``sliding_window −
        1`` positions of the padded context (``get_last_kv_window``), so the context must be at
        least one window long: a Neuron deployment always is; a short CPU check is not unless
        padded to the window. No longer needed when a context shorter than the window runs."""
        return max(plan.seq_len, -(-sliding_window // 16) * 16)

    @contextlib.contextmanager
    def process_group(self) -> Iterator[None]:
        """``to_cpu()`` starts a world-size-1 gloo group itself on ``MASTER_PORT`` (default 29500),
        so two CPU runs on one host collide; and it leaves NxD's model-parallel state and
        ``NXD_CPU_MODE=1`` behind, so a second model in the same process fails in
        ``initialize_model_parallel``. We start the group (world size 1: on a free port; under
        torchrun: from its environment), hand it to to_cpu (``move_to_cpu``) and tear NxD's state
        down after the run; a world-size-1 group we started is destroyed too (under torchrun the
        group lives as long as the worker: re-creating it on the same store hangs gloo). No
        longer needed when to_cpu takes an existing group and cleans up after itself."""
        import torch.distributed as dist

        if self.under_torchrun and int(os.environ["WORLD_SIZE"]) != self.tp:
            raise CpuModelError(f"torchrun started {plural(int(os.environ['WORLD_SIZE']), 'worker')} for tp {self.tp}: start exactly tp")
        saved = os.environ.get("NXD_CPU_MODE")
        created = False
        if not dist.is_initialized():
            if self.under_torchrun:
                dist.init_process_group("gloo")
            else:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
                created = True
        try:
            yield
        finally:
            from neuronx_distributed.parallel_layers import parallel_state

            parallel_state.destroy_model_parallel()
            if created and dist.is_initialized():
                dist.destroy_process_group()
            if saved is None:
                os.environ.pop("NXD_CPU_MODE", None)
            else:
                os.environ["NXD_CPU_MODE"] = saved

    def move_to_cpu(self, app: Any) -> None:
        """``app.to_cpu()`` with the group from ``process_group`` and the quantization fix.

        to_cpu calls ``init_process_group`` whenever ``WORLD_SIZE`` is set, even when a group
        exists (which raises); it is hidden while to_cpu runs (``process_group`` checked it).
        No longer needed when to_cpu skips the call for an initialized group."""
        world_size = os.environ.pop("WORLD_SIZE", None)
        try:
            with self.quantized_modules(app):
                app.to_cpu()
        finally:
            if world_size is not None:
                os.environ["WORLD_SIZE"] = world_size

    @staticmethod
    def stdout_to_stderr() -> contextlib.AbstractContextManager[Any]:
        """NxDI's attention ``print``s each layer's KV-cache shape while the model is built; our
        reports (JSON included) own stdout, so NxDI's prints go to stderr. No longer needed
        when building NxDI's GPT-OSS prints nothing to stdout."""
        return contextlib.redirect_stdout(sys.stderr)

    @contextlib.contextmanager
    def quantized_modules(self, app: Any) -> Iterator[None]:
        """``to_cpu()`` builds ``model_cls(config)`` and never applies NxD's quantization
        ``convert()``, which on the device path happens in ``DecoderModelInstance.load_module()``:
        with ``quantized=True`` the FP8 expert bytes are cast into float parameters, the
        ``.scale`` keys are dropped as redundant and the logits are wrong. While to_cpu runs,
        each wrapper's ``model_cls`` builds through NxDI's own ``load_module()`` instead, giving
        the module the device path traces (NxD ``QuantizedExpertFused*`` layers with FP8 weights
        and their scales). No longer needed when, after a plain ``to_cpu()`` of a quantized
        model, the experts' ``gate_up_proj`` is a ``QuantizedExpertFusedColumnParallel``.

        The expert weights are held one decoder layer at a time (``layer_experts``): to_cpu
        would otherwise build every layer's experts in float32 and hold every layer's FP8
        copy (≈ 3 GiB per gpt-oss-20b layer). No longer needed when to_cpu builds quantized
        modules without float32 weights and loads them without a copy."""
        from .layer_experts import quantized_one_layer_at_a_time

        quantized = app.neuron_config.quantized or app.neuron_config.is_mlp_quantized()
        if not quantized:
            yield
            return
        with quantized_one_layer_at_a_time(app, self.tp):
            yield


# --------------------------------------------------------------------------- one run


def neuron_settings(spec: RunSpec, plan: ForwardPlan, tp: int, layers: int,
                    sliding_window: int = 0) -> tuple[dict[str, Any], list[str]]:
    """The NeuronConfig keyword arguments of a run, and the user keys CPU mode replaced or dropped.

    The user's settings (``spec.neuron_config``) are kept unless CPU mode dictates them
    (``NxdiCpuAdaptations.SETTINGS``, tp, ``seq_len == max_context_length``); quantized routes
    get the FP8 settings of the format and attention and ``lm_head`` left unconverted.
    """
    import torch

    adapt = NxdiCpuAdaptations
    seq_len = adapt.seq_len(plan, sliding_window)
    forced = {**adapt.SETTINGS, "tp_degree": tp, "seq_len": seq_len, "max_context_length": seq_len}
    user = dict(spec.neuron_config)
    dropped = [key for key in user if key in adapt.DROPPED or key.endswith(adapt.DEVICE_ONLY_SUFFIXES)]
    changed = [key for key in user if key in forced and str(user[key]) != str(forced[key])]
    settings = {key: value for key, value in user.items() if key not in dropped}
    settings.update(forced)
    settings["torch_dtype"] = torch.float32
    if spec.route != ROUTE_HF:
        excluded = list(settings.get("modules_to_not_convert") or [])
        for module in ("lm_head", *(f"layers.{layer}.self_attn" for layer in range(layers))):
            if module not in excluded:
                excluded.append(module)
        settings.update(quantized=True, quantized_checkpoints_path=spec.checkpoint,
                        quantization_type=fmt.QUANTIZATION_TYPE, quantization_dtype=fmt.QUANTIZATION_DTYPE,
                        modules_to_not_convert=excluded)
    else:
        settings["quantized"] = False
    return settings, sorted(set(dropped + changed))


@contextlib.contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _hook_for(route: str) -> Iterator[None]:
    """Our hook registered for the normalized route (and removed again if we added it)."""
    from ..nxdi import hook as nxdi_hook

    added = route == ROUTE_NORMALIZED and not nxdi_hook.is_registered()
    if added:
        nxdi_hook.register()
    try:
        yield
    finally:
        if added:
            nxdi_hook.unregister()


@contextlib.contextmanager
def cpu_application(spec: RunSpec, plan: ForwardPlan, *, tp: int = 1) -> Iterator[Any]:
    """NxDI's ``NeuronGptOssForCausalLM`` for ``spec.checkpoint`` moved to the CPU (``to_cpu`` with
    ``NxdiCpuAdaptations``), sized for ``plan``; everything is undone on leaving. What
    ``run_forward`` computes with, and what NxDI's accuracy check can be run on."""
    require_nxdi()
    modeling = importlib.import_module(MODELING)
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    model_config = read_json_file(os.path.join(spec.checkpoint, fmt.CONFIG_FILE), what=fmt.CONFIG_FILE)
    settings, _ = neuron_settings(spec, plan, tp, int(model_config["num_hidden_layers"]),
                                  int(model_config.get("sliding_window") or 0))
    env = {"CHECKPOINT_FORMAT": _ROUTE_FORMAT[spec.route]}
    if spec.allow_custom_model:
        env[fmt.ALLOW_CUSTOM_ENV] = "1"
    adapt = NxdiCpuAdaptations(tp)
    with _environ(env), _hook_for(spec.route), warnings.catch_warnings(), adapt.stdout_to_stderr(), \
            adapt.process_group():
        warnings.simplefilter("ignore")
        neuron_config = modeling.GptOssNeuronConfig(**settings)
        config = modeling.GptOssInferenceConfig(neuron_config, load_config=load_pretrained_config(spec.checkpoint))
        app = modeling.NeuronGptOssForCausalLM(spec.checkpoint, config)
        adapt.move_to_cpu(app)
        try:
            yield app
        finally:
            del app
            gc.collect()  # NxDI's modules hold reference cycles: free the model before the caller's next one


def run_forward(spec: RunSpec, plan: ForwardPlan, *, tp: int = 1) -> Any:
    """NxDI's logits for ``plan`` from ``spec.checkpoint``: float32 [len(plan.positions), V].

    Runs in this process; at tp > 1 it must be one of ``tp`` torchrun ranks (``run_forwards``
    starts them). Raises ``CpuModelError`` when NxDI is missing.
    """
    require_nxdi()
    import torch

    ids = torch.tensor([plan.tokens], dtype=torch.int64)
    rows = []
    with cpu_application(spec, plan, tp=tp) as app, torch.no_grad():
        vocab = app.config.vocab_size  # a padded lm_head (lm_head_pad) must not widen the rows
        context = plan.context
        out = app(input_ids=ids[:, :context], attention_mask=torch.ones(1, context, dtype=torch.int64),
                  position_ids=torch.arange(context).unsqueeze(0), seq_ids=torch.tensor([0]))
        rows.append(out.logits[0, -1, :vocab].float().clone())
        for pos in range(context, len(plan.tokens) - 1):
            # a token step's mask covers the tokens before it (NxDI's hf_adapter convention)
            out = app(input_ids=ids[:, pos:pos + 1], attention_mask=torch.ones(1, pos, dtype=torch.int64),
                      position_ids=torch.tensor([[pos]]), seq_ids=torch.tensor([0]))
            rows.append(out.logits[0, -1, :vocab].float().clone())
    return torch.stack(rows)


def run_forwards(specs: Sequence[RunSpec], plan: ForwardPlan, *, tp: int = 1) -> list[Any]:
    """``run_forward`` for each spec: here at tp 1, else in ``tp`` torchrun workers (gloo)."""
    require_nxdi()
    if tp == 1:
        return [run_forward(spec, plan) for spec in specs]
    import torch

    with tempfile.TemporaryDirectory(prefix="nxdi-gptoss-fp8-cpu-") as work:
        job, out = os.path.join(work, "job.json"), os.path.join(work, "logits.pt")
        with open(job, "w", encoding="utf-8") as handle:
            json.dump({"specs": [asdict(spec) for spec in specs], "tokens": list(plan.tokens),
                       "context": plan.context, "tp": tp, "out": out}, handle)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
                   "-m", __name__, job]
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CpuModelError(f"NxDI's model did not finish in {TORCHRUN_TIMEOUT_S} s in the tp {plural(tp, 'torchrun worker')}") from None
        if done.returncode != 0 or not os.path.exists(out):
            lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
            errors = [line for line in lines if "Error" in line or "error" in line] or lines
            tail = " | ".join(errors[-TOOL_ERROR_LINES:]) or f"exit status {done.returncode}"
            raise CpuModelError(f"NxDI's model failed in the tp {plural(tp, 'torchrun worker')}: {tail}")
        return list(torch.load(out))


def _worker(job_path: str) -> int:
    """torchrun entry: every rank runs every spec; rank 0 saves the logits."""
    import torch

    with open(job_path, encoding="utf-8") as handle:
        job = json.load(handle)
    plan = ForwardPlan(tuple(job["tokens"]), job["context"])
    results = [run_forward(RunSpec(**spec), plan, tp=job["tp"]) for spec in job["specs"]]
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
