"""Permissive stand-ins for the Neuron-only packages NxDI imports, so NxDI's pure-torch
conversion code can be imported and run on a CPU host from a source checkout.

``installed(src)`` puts a meta-path finder in front that answers every import of the packages
in ``STUBBED`` with an empty module whose attributes are dummy classes (subclassable, callable,
usable as decorators), adds ``src`` to ``sys.path``, and on exit removes the finder, the path
entry and every module imported meanwhile. Nothing here imitates Neuron behaviour: code that
really needs a Neuron package fails loudly when it uses a dummy.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Neuron SDK packages, plus optional third-party packages NxDI imports at module level for
# features the conversion code does not use (vision models, HF model classes).
STUBBED = ("neuronx_distributed", "torch_neuronx", "torch_xla", "libneuronxla", "neuronxcc", "nki", "nkilib",
           "transformers", "PIL", "torchvision")


class _DummyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _dummy(name)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


class _Dummy(metaclass=_DummyMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Dummy()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Dummy()

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getitem__(self, item: Any) -> Any:
        return _Dummy()

    def __bool__(self) -> bool:
        return False


def _dummy(name: str) -> type:
    return _DummyMeta(name, (_Dummy,), {"__module__": __name__})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _dummy(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...] = STUBBED) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextmanager
def installed(src: str, roots: tuple[str, ...] = STUBBED, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """Make NxDI importable from the source tree ``src`` with the packages ``roots`` stubbed; on
    exit the modules imported meanwhile are removed, except those of the packages ``keep`` (torch
    registers operator libraries once per process: its modules cannot be imported twice)."""
    before = set(sys.modules)
    finder = _Finder(roots)
    sys.meta_path.insert(0, finder)
    sys.path.insert(0, src)
    try:
        yield
    finally:
        if finder in (sys.meta_path or ()):  # (None while the interpreter shuts down)
            sys.meta_path.remove(finder)
        if src in (sys.path or ()):
            sys.path.remove(src)
        for name in set(sys.modules or ()) - before:
            if name.split(".")[0] not in keep:
                del sys.modules[name]
