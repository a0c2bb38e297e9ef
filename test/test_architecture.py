"""The package layout's rules (docs/architecture.md), read from the source with ``ast``: no import
circle (``TYPE_CHECKING`` imports included), the tiers import only downward, ``errors`` is a
leaf, every module declares ``__all__``, no module grows past ~500 lines unless its docstring says
why, at most 20 modules at the top, one module of ``cli/`` per command, named after it, ``machine``
the one reader of /proc and /sys, each public name defined in one module; and the test suite's:
only ``conftest.py`` puts ``test/support`` on ``sys.path``."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import nxdi_gptoss_fp8

PKG = "nxdi_gptoss_fp8"
ROOT = Path(nxdi_gptoss_fp8.__file__).resolve().parent
MAX_LINES = 500
# a module allowed over MAX_LINES says why it must stay one module in its docstring, after this
LONG_REASON = "One module over 500 lines: "
# stdlib tiers: never torch/numpy at module level, never a torch or NxDI tier
STDLIB_TIERS = (f"{PKG}.safeio", f"{PKG}.validate")
HEAVY = {"torch", "numpy", "safetensors", "transformers", "neuronx_distributed_inference", "neuronx_distributed"}
# ``nxdi/`` as a whole: it holds only what plugs into NxDI and vLLM (NxDI's config knowledge is
# ``validate.nxdi_config``)
ABOVE_STDLIB = tuple(f"{PKG}.{m}" for m in ("convert", "forward", "synthetic", "cli", "loader", "nxdi", "hub", "demo",
                                             "inspection"))
# numpy, optional, tried at import (``deep_scan.np`` is None without it: ``--deep`` then says so)
HEAVY_ALLOWED = {(f"{PKG}.validate.deep_scan", "numpy")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = (PKG, *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, str, int]]:
    """(imported module, kind, line): kind is 'module', 'type_checking' or 'lazy'."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            k = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                k = "lazy"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and kind == "module":
                k = "type_checking"
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1])
                    base = f"{base}.{child.module}" if child.module else base
                else:
                    base = child.module or ""
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    out.append((full if full in MODULES else base, k, child.lineno))
            elif isinstance(child, ast.Import):
                out.extend((alias.name, k, child.lineno) for alias in child.names)
            visit(child, k)

    visit(ast.parse(path.read_text(encoding="utf-8")), "module")
    return out


def _graph() -> dict[str, set[str]]:
    """Module-level and TYPE_CHECKING imports between the package's modules (a package's
    ``__init__`` counts as imported by whatever imports one of its modules)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for target, kind, _line in _imports(name):
            if kind == "lazy" or target not in MODULES or target == name:
                continue
            graph[name].add(target)  # the root too: ``from .. import __version__`` imports the face
            parts = target.split(".")
            for n in range(2, len(parts)):
                parent = ".".join(parts[:n])
                if parent in MODULES and parent != name and not name.startswith(parent + "."):
                    graph[name].add(parent)
    return graph


def test_the_walk_finds_the_package() -> None:
    assert f"{PKG}.validate.pipeline" in MODULES and f"{PKG}.cli" in MODULES and len(MODULES) > 40


def test_no_import_circle_not_even_through_type_checking() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert circles == []


def test_errors_is_a_leaf() -> None:
    assert [t for t, _k, _l in _imports(f"{PKG}.errors") if t.startswith(PKG)] == []


@pytest.mark.parametrize(("name", "allowed"), [("machine", set()), ("interrupts", set()),
                                               ("deps", {f"{PKG}.errors", f"{PKG}.interrupts"}),
                                               ("units", {f"{PKG}.format"})])
def test_the_machine_the_dependencies_and_units_are_leaves_the_validator_may_import(name: str, allowed: set[str]) -> None:
    """What this machine is, signals held over steps they must not cut, what is installed (its
    heavy imports hold the signals), values as text: stdlib (and only the leaves named)."""
    imported = {t for t, _k, _l in _imports(f"{PKG}.{name}") if t.startswith(PKG)}
    assert imported <= allowed
    assert {t.split(".")[0] for t, kind, _l in _imports(f"{PKG}.{name}") if kind == "module"} <= {
        *sys.stdlib_module_names, "__future__", PKG}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(STDLIB_TIERS)))
def test_stdlib_tiers_import_no_torch_and_no_tier_above(name: str) -> None:
    bad = []
    for target, kind, line in _imports(name):
        root = target.split(".")[0]
        if root in HEAVY and kind == "module" and (name, root) not in HEAVY_ALLOWED:
            bad.append(f"line {line}: {target} at module level")
        if target.startswith(ABOVE_STDLIB) and (target in MODULES or target.split(".")[:2] != [PKG, "convert"]):
            bad.append(f"line {line}: {target} ({kind})")
        if name.startswith(f"{PKG}.safeio") and target.startswith(f"{PKG}.validate"):
            bad.append(f"line {line}: safeio imports the validator ({target})")
    assert bad == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_declares_all(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    if MODULES[name].name == "__main__.py":
        return
    declared = [node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                and any(isinstance(t, ast.Name) and t.id == "__all__"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    assert declared, f"{name} has no __all__"
    module = __import__(name, fromlist=["_"]) if not name.startswith(f"{PKG}.forward") else None
    if module is not None and name != PKG:
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert missing == [], f"{name}.__all__ names what it does not define: {missing}"


def _says_why_it_is_long(name: str) -> bool:
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text(encoding="utf-8"))) or ""
    return LONG_REASON in doc and len(doc.split(LONG_REASON, 1)[1].strip()) > 20


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    if _says_why_it_is_long(name):
        return
    assert lines <= MAX_LINES, (f"{name} has {lines} lines: split it along its seams, or say in its docstring "
                                f"why it must stay one module ({LONG_REASON!r} and the reason)")


def test_every_module_claiming_to_be_long_is() -> None:
    claimed = [name for name in MODULES if _says_why_it_is_long(name)]
    short = [name for name in claimed if len(MODULES[name].read_text(encoding="utf-8").splitlines()) <= MAX_LINES]
    assert f"{PKG}.loader" in claimed and short == []


def test_lazy_top_level_names_are_declared_and_stay_lazy() -> None:
    import subprocess
    import sys

    code = ("import sys, nxdi_gptoss_fp8 as p\n"
            "lazy = {'register', 'unregister', 'is_registered', 'load_state_dict', 'make_tiny'}\n"
            "assert lazy <= set(p.__all__) and lazy <= set(dir(p)), sorted(lazy - set(dir(p)))\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_at_most_twenty_modules_at_the_top() -> None:
    top = sorted(path.name for path in ROOT.glob("*.py"))
    assert len(top) <= 20, f"{len(top)} top-level modules: a new one belongs in a subpackage ({top})"


def _module_level_path_edits(tree: ast.Module) -> list[int]:
    """Lines of calls at import time (outside any function) that change ``sys.path``; a function
    that puts a source tree on the path for a scenario and takes it off again is not one."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and ast.unparse(child.func.value) == "sys.path" and child.func.attr in {"insert", "append", "extend"}):
                found.append(child.lineno)
            visit(child)

    visit(tree)
    return found


def test_only_conftest_puts_test_support_on_the_path() -> None:
    tests = Path(__file__).resolve().parent
    # sitecustomize.py starts a child interpreter of the CPU-mode tests, where no conftest runs
    offenders = [f"{path.relative_to(tests)}:{line}" for path in sorted(tests.rglob("*.py"))
                 if path.name not in ("conftest.py", "sitecustomize.py")
                 for line in _module_level_path_edits(ast.parse(path.read_text(encoding="utf-8")))]
    assert offenders == []
    assert _module_level_path_edits(ast.parse("import sys\nsys.path.insert(0, 'support')")) == [2]


def test_the_command_line_has_one_module_per_command_named_after_it() -> None:
    """``cli/<command>.py`` (``-`` spelled ``_``) registers its command beside its handler; every other
    module of ``cli/`` is shared infrastructure (underscored) or the package face (the generator of
    docs/cli.md is ``scripts/cli_reference.py``, not a command)."""
    from nxdi_gptoss_fp8.cli import build_parser
    from nxdi_gptoss_fp8.cli._help import subcommands

    commands = {name.replace("-", "_") for name in subcommands(build_parser())}
    for name in commands:
        module = __import__(f"{PKG}.cli.{name}", fromlist=["_"])
        assert hasattr(module, f"add_{name}_command"), name
    others = {name.rsplit(".", 1)[1] for name in MODULES if name.startswith(f"{PKG}.cli.")} - commands
    assert {name for name in others if not name.startswith("_")} == set()


# --------------------------------------------------------------------------- /proc and /sys
# a path under /proc or /sys in a string literal (an f-string's text included), not in prose
# that merely mentions one: ``machine`` is the one reader of both, with its fallbacks
SYSTEM_PATH = re.compile(r"(?<![\w.-])/(?:proc|sys)\b")
SYSTEM_READER = f"{PKG}.machine"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of the module and of every class and function in it."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _system_paths(tree: ast.AST) -> list[int]:
    """Lines of string literals (docstrings aside) naming a path under /proc or /sys."""
    prose = _docstrings(tree)
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                   and SYSTEM_PATH.search(node.value)})


def test_the_detector_finds_system_paths_in_code_not_in_prose() -> None:
    code = ('"""Reads /proc/self/maps."""\n'
            'def f(fd):\n    """Where /proc/self/fd points."""\n    return open(f"/proc/self/fd/{fd}")\n'
            'CACHE = "/sys/devices/system/cpu"\nOTHER = "/usr/sysroot", "a/proc", "/procedure"\n')
    assert _system_paths(ast.parse(code)) == [4, 5]


def test_only_machine_reads_proc_and_sys() -> None:
    """``machine`` is the one reader of /proc and /sys (docs/architecture.md): every other module
    asks it, so each answer has one fallback where Linux's files are missing."""
    readers = {name: lines for name, path in MODULES.items() if name != SYSTEM_READER
               and (lines := _system_paths(ast.parse(path.read_text(encoding="utf-8"))))}
    assert readers == {}
    assert _system_paths(ast.parse(MODULES[SYSTEM_READER].read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- one name, one definition
# A public name (no leading underscore) bound at a module's top level — a def, a class or an
# assignment, also inside a top-level if/try/with; imports bind no new name — is defined in one
# module of the package: a second module imports it, or names its own concept differently.
# name → (the modules that may each define it, None: any; why)
ONE_DEFINITION_EXCEPTIONS: dict[str, tuple[frozenset[str] | None, str]] = {
    "logger": (None, "each module's own logging.getLogger(__name__), logging's convention"),
    "NAME": (frozenset(f"{PKG}.convert.kinds.{kind}" for kind in ("hf_mxfp4", "hf_bf16", "compressed_tensors")),
             "each source kind module's own kind name, the attribute its kinds/base.SourceKind class reads"),
    # still to merge (modules rewritten elsewhere): copies of one value, or one name for two values
    "MODEL_TYPE": (frozenset({f"{PKG}.format", f"{PKG}.nxdi.hook"}), "nxdi/hook.py's copy of format.MODEL_TYPE"),
    "SINGLE_FILE": (frozenset({f"{PKG}.recognize", f"{PKG}.convert.source"}),
                    "convert/source.py's copy of recognize.SINGLE_FILE"),
    "QUANT_METHOD": (frozenset({f"{PKG}.format", f"{PKG}.convert.kinds.compressed_tensors"}),
                     "the format's quant_method and compressed-tensors' under one name"),
}


def _public_definitions(tree: ast.Module) -> set[str]:
    """The public names a module binds at its top level (see ``ONE_DEFINITION_EXCEPTIONS``)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                       *(stmt for handler in getattr(node, "handlers", []) for stmt in handler.body)])

    visit(tree.body)
    return {name for name in names if not name.startswith("_")}


def _definitions() -> dict[str, set[str]]:
    """Public name → the modules that define it."""
    found: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for defined in _public_definitions(ast.parse(path.read_text(encoding="utf-8"))):
            found.setdefault(defined, set()).add(name)
    return found


def test_the_detector_finds_top_level_definitions_only() -> None:
    code = ("import os\nfrom x import Y\nA = 1\nB: int = 2\n_C = 3\nD, (E, F) = 1, (2, 3)\n"
            "def g():\n    H = 1\nclass K:\n    L = 1\n"
            "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n"
            "if os.name:\n    M = 1\nelse:\n    N = 2\n")
    assert _public_definitions(ast.parse(code)) == {"A", "B", "D", "E", "F", "g", "K", "np", "M", "N"}


def test_one_public_name_one_definition() -> None:
    """No public name defined in two modules (``Source`` was the converter's detected source and
    the manifest's recorded checkpoint): a reader of either module knows which one it holds."""
    twice = {name: modules for name, modules in _definitions().items() if len(modules) > 1}
    unexplained = {name: sorted(modules) for name, modules in twice.items()
                   if name not in ONE_DEFINITION_EXCEPTIONS
                   or not (ONE_DEFINITION_EXCEPTIONS[name][0] is None or modules <= ONE_DEFINITION_EXCEPTIONS[name][0])}
    assert unexplained == {}, "define each public name once: import it, or name the other concept differently"
    stale = sorted(set(ONE_DEFINITION_EXCEPTIONS) - set(twice))
    assert stale == [], f"no longer defined twice: remove from ONE_DEFINITION_EXCEPTIONS: {stale}"



# the optional dependencies a function-level import in nxdi/ may wait for (named in its comment)
OPTIONAL_DEPENDENCIES = {"NxDI": "neuronx_distributed_inference", "torch": "torch", "transformers": "transformers",
                         "huggingface_hub": "huggingface_hub"}


def _needs_an_optional_dependency(name: str, seen: set[str] | None = None) -> bool:
    """Whether importing package module ``name`` imports an optional dependency (at module level,
    itself or through the package modules it imports at module level)."""
    seen = set() if seen is None else seen
    if name in seen or name not in MODULES:
        return False
    seen.add(name)
    imports = [(target, kind) for target, kind, _line in _imports(name) if kind == "module"]
    if any(target.split(".")[0] in OPTIONAL_DEPENDENCIES.values() for target, _kind in imports):
        return True
    return any(_needs_an_optional_dependency(target, seen) for target, _kind in imports if target.startswith(PKG))


def test_nxdi_imports_lazily_only_for_an_optional_dependency_and_says_which() -> None:
    """No module of ``nxdi/`` imports another module (of the package or the stdlib) inside a function
    to dodge an import circle: a function-level import stays only for an optional dependency (NxDI,
    torch, transformers, huggingface_hub), the dependency named in its comment, and a package module
    imported so really needs one. The count is checked too, so a new one is a decision."""
    lazy, bad = [], []
    for name in sorted(n for n in MODULES if n.startswith(f"{PKG}.nxdi")):
        lines = MODULES[name].read_text(encoding="utf-8").splitlines()
        for target, kind, line in _imports(name):
            if kind != "lazy":
                continue
            lazy.append(f"{name}:{line} {target}")
            comment = lines[line - 1].partition("#")[2]
            named = [dep for dep in OPTIONAL_DEPENDENCIES if dep in comment]
            if not named:
                bad.append(f"{name}:{line} imports {target} in a function without a comment naming the optional "
                           f"dependency it waits for ({', '.join(OPTIONAL_DEPENDENCIES)}): import it at module level")
            elif target.startswith(PKG) and not _needs_an_optional_dependency(target):
                bad.append(f"{name}:{line} imports {target} in a function, which needs no optional dependency: import "
                           "it at module level")
            elif not target.startswith(PKG) and target.split(".")[0] not in OPTIONAL_DEPENDENCIES.values():
                bad.append(f"{name}:{line} imports {target} in a function: only an optional dependency may wait")
    assert bad == []
    assert len(lazy) <= 4, f"{len(lazy)} function-level imports in nxdi/ (each needs its reason): {lazy}"
