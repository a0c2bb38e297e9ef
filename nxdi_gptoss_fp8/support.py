"""Where this package runs: the tested matrix (data) and what is installed here (``env``).

Versions come from package metadata (``importlib.metadata``), never from importing torch, NxDI
or vLLM, so ``env`` runs in a second on any host. Each component is *verified* (the versions
the ``nxdi`` tests and ``selfcheck`` ran against: final releases, their post-releases and local
builds), *expected to work* (the same API line, or a pre-release of the verified one;
``register()`` checks every signature it wraps before patching anything), *unsupported* (with
the reason and the way forward; a version string that is no PEP 440 version too), *not used*
(vLLM without a Neuron plugin: a GPU or CPU host, where the hook never runs) or *not installed*.
Stdlib only.

Which vLLM Neuron is installed matters most: the NxDI-backed one (``vllm-neuron`` 0.x, SDK
2.27-2.31; before it, a vLLM built for Neuron) loads GPT-OSS through NxDI, so the hook works in
it; the plugin introduced in SDK 2.31 (same distribution name, versions such as
0.24.0.1.1.0 = vLLM 0.24.0 + plugin 1.1.0) does not use NxDI at all. ``vllm_neuron_kind``
says how it is told apart (docs/supported-environments.md).
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ._version import __version__

VERIFIED, EXPECTED, UNSUPPORTED, ABSENT = "verified", "expected to work", "unsupported", "not installed"
NOT_USED = "not used"  # installed, but not on this package's path (vLLM without a Neuron plugin)

# AWS's notices: NxDI/NxD inference in maintenance since Neuron SDK 2.30; final NxDI 0.10.18399 in 2.31;
# 2026-10-16: end of support on Trn2/Trn3 announced for 2.34; 2026-11-17: not supported there from 2.34.0
# (released 2026-11-30). The docs cite them (docs/supported-environments.md).
SUPPORT_WINDOW = (
    "NxDI support window: since Neuron SDK 2.29 NxDI models run only on Trn2 and newer (NxD Inference release "
    "notes, 2.29.0), and since Neuron SDK 2.34.0 (2026-11-30; AWS notice of 2026-11-17) AWS no longer supports "
    "NxDI and the NxD Core inference APIs on Trn2/Trn3 (no releases, fixes or security patches). On Inf2/Trn1 they "
    "stay in maintenance (critical fixes and security patches only) at SDK 2.31, whose NxDI runs no model there: no "
    "route for this format. The last NxDI is 0.10.18399 (SDK 2.31); the 2.32 and later images have none. Serving "
    "normalized FP8 with this package needs a Trn2 with a Neuron SDK 2.27-2.31 image (2.29 verified). On a 2.32 or "
    "later host (2.33.1, 2.34) convert, validate, inspect and goldens work, serving this format does not: the vLLM "
    "Neuron plugin there runs on TorchNeuron without NxDI and serves GPT-OSS in BF16 on Trn2 (MXFP4 on Trn3), with "
    "no FP8 weight path for GPT-OSS (docs/vllm-neuron-plugin.md)"
)
# the one-clause form, for warnings that say why the hook is not there
SERVING_NEEDS = (
    "serving normalized FP8 needs NxDI on a Trn2 from a Neuron SDK 2.27-2.31 image (NxDI is not supported on "
    "Trn2/Trn3 since Neuron SDK 2.34.0; on Inf2/Trn1 it runs no model since 2.29)"
)
# what to do on a host without NxDI (the vLLM entry point's refusal says it)
WITHOUT_NXDI = (
    "normalized FP8 needs the NxDI-backed stack (NxDI with the NxDI-backed vllm-neuron 0.x: a Trn2 with a Neuron SDK "
    "2.27-2.31 image; NxDI is not supported on Trn2/Trn3 since Neuron SDK 2.34.0 and runs no model on Inf2/Trn1 "
    "since 2.29); on "
    "the newer vLLM Neuron plugin, which does not use NxDI, serve the published checkpoint instead (vllm serve "
    "openai/gpt-oss-120b: BF16 on Trn2, MXFP4 on Trn3; it has no FP8 weight path for GPT-OSS: "
    "docs/vllm-neuron-plugin.md)"
)

# torch-neuronx 2.13.3/2.14.3 and later: TorchNeuron, the native backend the newer vLLM Neuron plugin runs on
TORCHNEURON = (">=2.13.3",)
# what ``env`` says in one line on a host with the newer plugin's stack
NEWER_STACK = ("this format does not serve on this host ({found}: the vLLM Neuron plugin's stack, without NxDI); what "
               "serves GPT-OSS here is the published checkpoint (vllm serve openai/gpt-oss-120b: BF16 on Trn2, MXFP4 on "
               "Trn3); normalized FP8 serves from a Trn2 with a Neuron SDK 2.27-2.31 image")

# the vllm-project/vllm-neuron releases whose own model loader the client tests run through the hook
VLLM_NEURON_RUN_AGAINST = ("0.1.0", "0.2.0")

# vLLM Neuron kinds
NXDI_BACKED = "nxdi-backed"
WITHOUT_NXDI_KIND = "no-nxdi"
UNKNOWN_KIND = "unknown"
NEURON_PLUGIN_DISTRIBUTIONS = ("vllm-neuron", "neuronx-vllm-plugin")
NXDI_DISTRIBUTION = "neuronx-distributed-inference"
# files a wheel's RECORD lists: the NxDI-backed plugin's model loader, the newer plugin's own model registry
NXDI_BACKED_FILE = "vllm_neuron/worker/neuronx_distributed_model_loader.py"
WITHOUT_NXDI_FILE = "vllm_neuron/model/registry.py"


@dataclass(frozen=True)
class Rule:
    """One row of the tested matrix. Specs are alternatives, each comma-joined bounds on the
    release numbers (``==0.9.*``, ``>=2.1,<3``); local labels (``+cpu``, ``+lts``) are ignored."""

    component: str
    distribution: str | None  # None: Python itself
    verified: tuple[str, ...]
    expected: tuple[str, ...]
    verified_why: str
    expected_why: str
    unsupported_why: str
    forward: str  # the way forward when unsupported
    absent: str  # what its absence means


MATRIX: tuple[Rule, ...] = (
    Rule("Python", None, ("==3.11.*",), (">=3.10",),
         "the test suite, the nxdi tests and selfcheck run on Python 3.11",
         "setup.py supports Python 3.10 and later; the code uses nothing newer",
         "this package needs Python 3.10 or later", "use Python 3.10 or later", ""),
    Rule("torch", "torch", ("==2.13.0",), (">=2.1,<3",),
         "the loader, converter and selfcheck ran on torch 2.13.0 (CPU)",
         "the [torch] extra needs torch 2.1 or later (NxDI 0.9/0.10 run on torch-neuronx 2.9's torch 2.9)",
         "the loader and converter need torch 2.1 or later",
         "install torch 2.1 or later (on a Neuron host, the torch that torch-neuronx installed)",
         "validate and inspect need nothing more; convert, loading and make-tiny need torch"),
    Rule("transformers", "transformers", ("==4.57.*",), (">=4.55,<5",),
         "selfcheck's reference model and the nxdi tests ran on transformers 4.57 (what NxDI 0.9/0.10 pin)",
         "GptOssForCausalLM exists since 4.55 with the same expert layout",
         "transformers 5 changed GPT-OSS's expert layout and NxDI pins 4.57.*; before 4.55 there is no GPT-OSS",
         "pip install 'transformers>=4.55,<5' (4.57.* on a Neuron host)",
         "only selfcheck and check-forward need it"),
    Rule("NxDI", NXDI_DISTRIBUTION, ("==0.9.*",), ("==0.7.*", "==0.8.*", "==0.10.*"),
         "the hook, the nxdi tests and selfcheck ran against the public NxDI 0.9.0 source (the SDK 2.29 "
         "release, whose wheel is 0.9.17334)",
         "GPT-OSS is in NxDI since 0.7 (SDK 2.27); 0.10.x (SDK 2.30-2.31) has no public source: register() "
         "checks every signature it wraps and patches nothing if one differs",
         "NxDI before 0.7 has no GPT-OSS model, and no NxDI after 0.10.18399 exists",
         "use a Trn2 with a Neuron SDK 2.27-2.31 image (2.29 is the verified one: NxDI 0.9.17334)",
         "convert, validate, inspect and goldens work without it; serving this format (NxDI, vLLM) and selfcheck "
         "need it: a Neuron SDK 2.27-2.31 image (the 2.32 and later ones, 2.33.1 and 2.34 included, have no NxDI)"),
    Rule("NxD", "neuronx-distributed", ("==0.18.*",), (">=0.16,<0.20",),
         "the nxdi tests and selfcheck ran against the public NxD 0.18.0 source (SDK 2.29)",
         "the NxD releases paired with NxDI 0.7-0.10 (SDK 2.27-2.31; final 0.19.28492)",
         "not an NxD release paired with an NxDI that has GPT-OSS",
         "install the NxD that comes with your NxDI (same Neuron SDK release)",
         "NxDI needs it"),
    Rule("torch-neuronx", "torch-neuronx", (), (">=2.5,<2.10",),
         "",
         "what NxDI 0.7-0.10 require (0.9 and 0.10: 2.9.*); never run here (no Neuron device)",
         "not a torch-neuronx that NxDI 0.7-0.10 accept (2.13.3/2.14.3 and later are TorchNeuron, the native backend "
         "of Neuron SDK 2.33 and later that the vLLM Neuron plugin runs on: NxDI does not run on it)",
         "use a Neuron SDK 2.27-2.31 image, whose torch-neuronx NxDI runs on (2.9.* for NxDI 0.9/0.10)",
         "needed on a Neuron host to run NxDI on a device"),
    Rule("neuronx-cc", "neuronx-cc", (), (">=2,<3",),
         "",
         "NxDI compiles with it; this package never calls it; never run here (no Neuron device)",
         "not the neuronx-cc 2.x that NxDI uses",
         "install the neuronx-cc of your Neuron SDK release",
         "needed on a Neuron host to compile the model"),
)


# --------------------------------------------------------------------------- versions and specs


# a PEP 440 version: epoch, release, pre-release, post-release, dev-release, local label
_PEP440 = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?P<pre>[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(?P<post>-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?"
    r"(?P<dev>[-_.]?dev[-_.]?\d*)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Version:
    """What the matrix reads of a version: its release numbers, and whether it is a pre-release
    (``a``/``b``/``rc``) or development release (``.dev``). Post-releases and local labels
    (``+cpu``, ``+lts``, ``+neuron``) place a version like its release."""

    release: tuple[int, ...]
    prerelease: bool
    epoch: int = 0


def parse_version(version: str) -> Version | None:
    """``version`` as PEP 440 reads it, or None when it is not a version number at all."""
    match = _PEP440.match(version)
    if match is None:
        return None
    return Version(tuple(int(part) for part in match["release"].split(".")),
                   bool(match["pre"] or match["dev"]), int(match["epoch"] or 0))


def release(version: str) -> tuple[int, ...]:
    """The release numbers of ``version`` (``2.13.0+cpu`` → (2, 13, 0); ``0.2.2+lts`` → (0, 2, 2));
    () when it is not a PEP 440 version."""
    parsed = parse_version(version)
    return parsed.release if parsed is not None else ()


def _bound(numbers: tuple[int, ...], bound: str) -> bool:
    match = re.fullmatch(r"\s*(==|>=|<=|<|>)\s*(\d+(?:\.\d+)*)(\.\*)?\s*", bound)
    if match is None:
        raise ValueError(f"not a version bound: {bound!r}")
    op, target_text, wildcard = match.groups()
    target = tuple(int(part) for part in target_text.split("."))
    if op == "==" and wildcard:
        return numbers[: len(target)] == target
    width = max(len(numbers), len(target))
    left, right = numbers + (0,) * (width - len(numbers)), target + (0,) * (width - len(target))
    return {"==": left == right, ">=": left >= right, "<=": left <= right, "<": left < right, ">": left > right}[op]


def matches(version: str, specs: Iterable[str]) -> bool:
    """Whether ``version``'s release numbers satisfy one of ``specs`` (each comma-joined bounds,
    all must hold). A pre-release has its release's numbers (``5.0.0rc1`` is not ``<5``: it
    precedes 5.0.0, which ``<5`` excludes as pip does); an epoch other than 0 and a string that
    is no version never match."""
    parsed = parse_version(version)
    if parsed is None or parsed.epoch:
        return False
    return any(all(_bound(parsed.release, bound) for bound in spec.split(",")) for spec in specs)


def _distribution(name: str, path: Sequence[str] | None) -> metadata.Distribution | None:
    """The first installed distribution called ``name`` on ``path`` (default ``sys.path``):
    the one an import would pick."""
    try:
        found = metadata.distributions(name=name, path=list(sys.path if path is None else path))
        return next(iter(found), None)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- the report


@dataclass
class Component:
    """One installed (or absent) component and its place in the matrix."""

    component: str
    distribution: str | None
    version: str | None
    status: str
    reason: str
    forward: str = ""

    @property
    def label(self) -> str:
        same = self.distribution is None or self.distribution.lower() == self.component.lower()
        return self.component if same else f"{self.component} ({self.distribution})"


@dataclass
class VllmNeuron:
    """Which vLLM Neuron is installed, and the evidence the verdict rests on."""

    kind: str | None  # NXDI_BACKED, WITHOUT_NXDI_KIND, UNKNOWN_KIND; None: none installed
    distribution: str | None = None
    version: str | None = None
    evidence: str = ""


@dataclass
class EnvironmentReport:
    """Everything ``env`` prints: the package, each component, the vLLM Neuron kind, the window."""

    package: str
    python_executable: str
    components: list[Component] = field(default_factory=list)
    vllm_neuron: VllmNeuron = field(default_factory=lambda: VllmNeuron(None))
    support_window: str = SUPPORT_WINDOW
    serving: str = ""  # one line on a host with the newer plugin's stack (``newer_stack``), else empty

    @property
    def ok(self) -> bool:
        """No installed component is unsupported."""
        return not any(c.status == UNSUPPORTED for c in self.components)

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.component == name)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "package": self.package, "python_executable": self.python_executable,
                "components": [asdict(c) for c in self.components], "vllm_neuron": asdict(self.vllm_neuron),
                "serving": self.serving, "support_window": self.support_window}

    def render_text(self) -> str:
        lines = [f"nxdi-gptoss-fp8 {self.package} environment ({self.python_executable})"]
        if self.serving:
            lines.append(f"  {self.serving}")
        for c in self.components:
            lines.append(f"  {c.label:<38} {c.version or '-':<22} {c.status}")
            if c.reason:
                lines.append(f"      {c.reason}")
            if c.forward and c.status == UNSUPPORTED:
                lines.append(f"      way forward: {c.forward}")
        lines.append(self.support_window)
        return "\n".join(lines)


def vllm_neuron_kind(path: Sequence[str] | None = None) -> VllmNeuron:
    """Which vLLM Neuron is installed, from its metadata only (no import). The rule, in order:

    1. ``Requires-Dist`` names neuronx-distributed-inference → NxDI-backed;
    2. the wheel's RECORD lists ``vllm_neuron/worker/neuronx_distributed_model_loader.py`` →
       NxDI-backed; ``vllm_neuron/model/registry.py`` → the newer plugin (an editable install
       lists neither);
    3. the version: the newer plugin numbers itself vLLM's version followed by its own
       (0.21.0.1.0.0 in SDK 2.31, 0.24.0.1.1.0 in 2.32, 0.29.0.1.2.0 in 2.33, and so on in 2.33.1,
       2.34 and later: six numbers, or a plugin major of 1 or more); the NxDI-backed plugin is 0.x
       with at most three numbers (0.1.0 … 0.5.0, 0.5.3, 0.6.0, 0.2.2+lts);
    4. no plugin, but vLLM itself built for Neuron (a ``+neuron…`` local label, the fork and
       vLLM ≤ 0.9's own Neuron worker, which loaded through NxDI) → NxDI-backed.
    Anything else is unknown.
    """
    for name in NEURON_PLUGIN_DISTRIBUTIONS:
        dist = _distribution(name, path)
        if dist is None:
            continue
        version = dist.version or ""
        requires = [re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")
                    for req in (dist.requires or [])]
        if NXDI_DISTRIBUTION in requires:
            return VllmNeuron(NXDI_BACKED, name, version, f"Requires-Dist names {NXDI_DISTRIBUTION}")
        files = {str(f).replace("\\", "/") for f in (dist.files or [])}
        if NXDI_BACKED_FILE in files:
            return VllmNeuron(NXDI_BACKED, name, version, f"its files include {NXDI_BACKED_FILE}")
        if WITHOUT_NXDI_FILE in files:
            return VllmNeuron(WITHOUT_NXDI_KIND, name, version, f"its files include {WITHOUT_NXDI_FILE} (its own models)")
        numbers = release(version)
        if len(numbers) >= 6 or (numbers and numbers[0] >= 1):
            return VllmNeuron(WITHOUT_NXDI_KIND, name, version,
                              "its version is vLLM's followed by the plugin's (the plugin introduced in SDK 2.31)")
        if numbers and numbers[0] == 0 and len(numbers) <= 3:
            return VllmNeuron(NXDI_BACKED, name, version, "a 0.x plugin version (the NxDI-backed plugin, SDK 2.27-2.31)")
        return VllmNeuron(UNKNOWN_KIND, name, version, "neither its metadata nor its version tells which kind")
    vllm = _distribution("vllm", path)
    if vllm is not None and "+neuron" in (vllm.version or "").lower():
        return VllmNeuron(NXDI_BACKED, "vllm", vllm.version, "vLLM built for Neuron (a +neuron version): its Neuron "
                          "worker loads through NxDI")
    return VllmNeuron(None)


def newer_stack(kind: VllmNeuron, torch_neuronx: str | None) -> str:
    """``NEWER_STACK`` naming what was found when this host has the newer vLLM Neuron plugin (the
    kind without NxDI: ``vllm-neuron`` 0.21.0.1.0.0 and later) or TorchNeuron (``torch-neuronx``
    2.13.3 and later), the stack of Neuron SDK 2.32 and later; empty otherwise."""
    found = []
    if kind.kind == WITHOUT_NXDI_KIND:
        found.append(f"{kind.distribution} {kind.version}")
    if torch_neuronx is not None and matches(torch_neuronx, TORCHNEURON):
        found.append(f"torch-neuronx {torch_neuronx}, TorchNeuron")
    return NEWER_STACK.format(found="; ".join(found)) if found else ""


def _judge(rule: Rule, version: str | None) -> Component:
    """One component's place: verified only for a final release (or a post-release or local
    build of one) of the verified line; a pre-release or development release of it is expected
    to work; a version string that is no version at all is unsupported (it cannot be placed)."""
    if version is None:
        return Component(rule.component, rule.distribution, None, ABSENT, rule.absent)
    parsed = parse_version(version)
    if parsed is None or parsed.epoch:
        name = rule.distribution or "python"
        return Component(rule.component, rule.distribution, version, UNSUPPORTED,
                         f"{version!r} is not a version number (PEP 440), so it cannot be placed in the matrix",
                         f"reinstall {name} from a release (`pip show {name}` says what is installed)")
    if matches(version, rule.verified):
        if not parsed.prerelease:
            return Component(rule.component, rule.distribution, version, VERIFIED, rule.verified_why)
        return Component(rule.component, rule.distribution, version, EXPECTED,
                         f"a pre-release of the verified line (only its final releases are verified): {rule.verified_why}")
    if matches(version, rule.expected):
        pre = "a pre-release; " if parsed.prerelease else ""
        return Component(rule.component, rule.distribution, version, EXPECTED, pre + rule.expected_why)
    return Component(rule.component, rule.distribution, version, UNSUPPORTED, rule.unsupported_why, rule.forward)


def _vllm_rows(kind: VllmNeuron, vllm_version: str | None) -> list[Component]:
    plugin_name = kind.distribution if kind.distribution not in (None, "vllm") else "vllm-neuron"
    if kind.kind == NXDI_BACKED and kind.distribution != "vllm":
        run = ".".join(str(n) for n in release(kind.version or "")[:3]) in VLLM_NEURON_RUN_AGAINST
        plugin = Component("vLLM Neuron", plugin_name, kind.version, VERIFIED if run else EXPECTED,
                           f"NxDI-backed ({kind.evidence}): this package's vllm.general_plugins entry point installs "
                           "the hook and the MODEL_TYPES['gptoss'] entry it looks GPT-OSS up by in every vLLM process; "
                           f"the client tests ran the loaders of {', '.join(VLLM_NEURON_RUN_AGAINST)} (compiler and "
                           "device stood in; never run on a device here)")
    elif kind.kind == WITHOUT_NXDI_KIND:
        plugin = Component("vLLM Neuron", plugin_name, kind.version, UNSUPPORTED,
                           f"the newer plugin, which does not use NxDI ({kind.evidence}): the hook has nothing to "
                           "patch, so normalized FP8 cannot load through it",
                           "serve the published checkpoint on it (vllm serve openai/gpt-oss-120b: BF16 on Trn2, "
                           "MXFP4 on Trn3); for FP8 use a Trn2 with a Neuron SDK 2.27-2.31 image, NxDI and vllm-neuron 0.x "
                           "(NxDI is not supported on Trn2/Trn3 since SDK 2.34.0; docs/vllm-neuron-plugin.md)")
    elif kind.kind == UNKNOWN_KIND:
        plugin = Component("vLLM Neuron", plugin_name, kind.version, UNSUPPORTED,
                           f"cannot tell whether it uses NxDI: {kind.evidence}",
                           "normalized FP8 needs the NxDI-backed vllm-neuron 0.x (a Neuron SDK 2.27-2.31 image)")
    else:
        plugin = Component("vLLM Neuron", "vllm-neuron", None, ABSENT,
                           "only needed to serve with vLLM" if kind.kind is None
                           else f"none; {kind.evidence}")
    if vllm_version is None:
        engine = Component("vLLM", "vllm", None, ABSENT, "only needed to serve with vLLM")
    elif kind.kind == NXDI_BACKED:
        engine = Component("vLLM", "vllm", vllm_version, EXPECTED,
                           "served through NxDI" + (f" by {plugin_name} {kind.version}" if kind.distribution != "vllm"
                                                    else " by its own Neuron worker"))
    elif kind.kind is None:  # e.g. a GPU host: nothing of ours runs there, nothing is wrong
        engine = Component("vLLM", "vllm", vllm_version, NOT_USED,
                           "no vLLM Neuron plugin is installed, so this vLLM runs on another platform (a GPU or CPU "
                           "host) and this package's hook is not used there: normalized FP8 loads only through NxDI "
                           "on Neuron (with the NxDI-backed vllm-neuron 0.x, a Neuron SDK 2.27-2.31 image)")
    else:
        engine = Component("vLLM", "vllm", vllm_version, plugin.status, f"served by {plugin_name} {kind.version}: "
                           "see the vLLM Neuron row", plugin.forward)
    return [engine, plugin]


def from_source(report: EnvironmentReport, component: str, version: str | None, where: str) -> None:
    """Mark ``component``, absent from the installed distributions, as imported from a source
    tree at ``where`` (``selfcheck`` runs NxDI and NxD from checkouts on ``PYTHONPATH``), judged by
    the version the source declares. An installed component is left as it is."""
    for index, found in enumerate(report.components):
        if found.component == component and found.status == ABSENT:
            rule = next(rule for rule in MATRIX if rule.component == component)
            judged = (_judge(rule, version) if version
                      else Component(component, rule.distribution, None, UNSUPPORTED, "its version cannot be read"))
            judged.reason = f"from source at {where} (no installed distribution); {judged.reason}"
            report.components[index] = judged


def environment_report(path: Sequence[str] | None = None, *, python_version: str | None = None) -> EnvironmentReport:
    """What is installed on ``path`` (default ``sys.path``) and where it stands in the matrix.

    ``python_version`` replaces the running interpreter's (tests). Imports nothing it reports on.
    """
    python = python_version or ".".join(str(part) for part in sys.version_info[:3])
    report = EnvironmentReport(__version__, sys.executable or "python")
    for rule in MATRIX:
        if rule.distribution is None:
            report.components.append(_judge(rule, python))
            continue
        dist = _distribution(rule.distribution, path)
        report.components.append(_judge(rule, dist.version if dist is not None else None))
    kind = vllm_neuron_kind(path)
    vllm = _distribution("vllm", path)
    report.vllm_neuron = kind
    report.components += _vllm_rows(kind, vllm.version if vllm is not None else None)
    report.serving = newer_stack(kind, report.component("torch-neuronx").version)
    return report


# --------------------------------------------------------------------------- the hook's warning

_WARNED: set[str] = set()


def nxdi_version(module: Any = None) -> str | None:
    """The installed NxDI's version: its package metadata, else the imported module's ``__version__``."""
    dist = _distribution(NXDI_DISTRIBUTION, None)
    if dist is not None and dist.version:
        return str(dist.version)
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


def warn_unverified_nxdi(logger: logging.Logger, module: Any = None) -> None:
    """Log one warning per process when the installed NxDI is outside the verified set."""
    version = nxdi_version(module)
    rule = next(r for r in MATRIX if r.component == "NxDI")
    key = version or ""
    if key in _WARNED:
        return
    _WARNED.add(key)
    if version is None:
        logger.info("cannot tell the installed NxDI's version (no package metadata, no __version__); "
                    "the hook is verified against NxDI 0.9")
        return
    verdict = _judge(rule, version)
    if verdict.status == VERIFIED:
        return
    extra = f"; {verdict.forward}" if verdict.forward else ""
    logger.warning("NxDI %s is outside the verified set (NxDI 0.9): %s, %s%s. %s", version, verdict.status,
                   verdict.reason, extra, SUPPORT_WINDOW)


__all__ = ["ABSENT", "EXPECTED", "MATRIX", "NEWER_STACK", "NOT_USED", "NXDI_BACKED", "SERVING_NEEDS", "SUPPORT_WINDOW", "TORCHNEURON",
           "UNKNOWN_KIND", "UNSUPPORTED",
           "VERIFIED", "VLLM_NEURON_RUN_AGAINST", "WITHOUT_NXDI", "WITHOUT_NXDI_KIND", "Component", "EnvironmentReport",
           "Rule", "Version", "VllmNeuron", "environment_report", "from_source", "matches", "newer_stack", "nxdi_version",
           "parse_version", "release", "vllm_neuron_kind", "warn_unverified_nxdi"]
