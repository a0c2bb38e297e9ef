"""An import-only stand-in for the proprietary ``nki`` and ``neuron_dtypes`` packages, and for the
one test-tree enum the NKI library's ``moe_cte`` torch reference imports.

The NKI library (``NKILIB_SRC``) imports ``nki`` at module level everywhere, kernels included;
nothing here can run a kernel. Every ``nki.*`` / ``neuron_dtypes.*`` module and attribute is a
placeholder: attribute access, indexing, arithmetic and calls give another placeholder, and a
call with one function and nothing else gives that function back, so ``@nki.jit`` and
``@nki.jit(...)`` leave the decorated function as it is. Only the library's torch reference
implementations are meant to be called with it installed.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STOOD_IN = ("nki", "neuron_dtypes")
# the module moe_cte_torch_ref imports its variant enum from (the library's test tree, not its package)
BWMM_MODULE = "test.integration.nkilib.core.moe.moe_cte.test_moe_cte_common"


class BWMMFunc(enum.Enum):
    """The ``moe_cte`` variants the torch reference tells apart (same names and values as the library's)."""

    SHARD_ON_BLOCK = 1
    SHARD_ON_HIDDEN = 2
    SHARD_ON_INTERMEDIATE = 3
    SHARD_ON_INTERMEDIATE_AFFINITY_ON_INTERMEDIATE = 4
    SHARD_ON_INTERMEDIATE_HW = 5
    SHARD_ON_INTERMEDIATE_DROPPING = 6


class Placeholder:
    """Anything of ``nki``: every operation gives a placeholder; a call with one function returns it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<nki stand-in {self._name}>"

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Placeholder):
            return args[0]
        return Placeholder(f"{self._name}()")

    def __getitem__(self, key: Any) -> Placeholder:
        return Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return True

    def __int__(self) -> int:
        return 1

    def __index__(self) -> int:
        return 1

    def __hash__(self) -> int:
        return hash(self._name)

    def __eq__(self, other: object) -> bool:
        return self is other

    def _same(self, *_: Any) -> Placeholder:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __neg__ = __or__ = __ror__ = __and__ = _same
    __lt__ = __le__ = __gt__ = __ge__ = _same


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every module under the stood-in names (each a package, so any submodule imports)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STOOD_IN:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def library_root(checkout: str | Path) -> Path:
    """The directory that holds the ``nkilib`` package in an NKI library checkout (``src/nkilib_src``)."""
    root = Path(checkout)
    for candidate in (root / "src" / "nkilib_src", root):
        if (candidate / "nkilib" / "__init__.py").is_file():
            return candidate
    raise FileNotFoundError(f"{checkout} holds no nkilib package (looked in src/nkilib_src and the directory itself)")


@contextmanager
def installed(checkout: str | Path) -> Iterator[types.ModuleType]:
    """The stand-ins importable and the library's ``nkilib`` on ``sys.path``; yields ``nkilib``.
    Everything added (modules, the finder, the path entry) is removed afterwards."""
    finder = _Finder()
    before = set(sys.modules)
    bwmm = types.ModuleType(BWMM_MODULE)
    bwmm.BWMMFunc = BWMMFunc  # type: ignore[attr-defined]
    sys.meta_path.insert(0, finder)
    sys.path.insert(0, str(library_root(checkout)))
    sys.modules[BWMM_MODULE] = bwmm
    try:
        import nkilib

        yield nkilib
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(library_root(checkout)))
        for name in set(sys.modules) - before:
            del sys.modules[name]
