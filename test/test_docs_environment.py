"""docs/environment-variables.md names every environment variable the package reads, found in the
source with ``ast`` (``os.environ``, ``os.getenv``, an ``environ``/``env`` mapping, the package's
switch parser; a variable named by a loop over a constant collection), and states the on/off grammar the parser accepts."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import documents

from nxdi_gptoss_fp8.validate.nxdi_config import SWITCH_OFF, SWITCH_ON

PAGE = "docs/environment-variables.md"
PACKAGE = documents.REPO / "nxdi_gptoss_fp8"
ENVIRON_NAMES = {"environ", "env"}  # the parameter or local an environment mapping is passed in as
READERS = {"get", "pop", "setdefault", "getenv"}
SWITCH_READERS = {"switch_from_env"}  # the package's switch parser: its first argument is the variable


def modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(PACKAGE.rglob("*.py"))]


def string_constants(trees: list[tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """Every module-level ``NAME = "text"`` (tuple assignments too), by name."""
    found: dict[str, set[str]] = {}
    for _, tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = zip(target.elts, node.value.elts, strict=False) \
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) else [(target, node.value)]
                for name, value in pairs:
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.setdefault(name.id, set()).add(value.value)
    return found


def collection_constants(trees: list[tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """Every module-level ``NAME = {"A": ..., ...}`` or ``NAME = ("A", ...)`` of strings, by name: what a
    loop over it (``for var in NAME``) binds its variable to."""
    found: dict[str, set[str]] = {}
    for _, tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                continue
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else \
                value.elts if isinstance(value, ast.Tuple | ast.List | ast.Set) else []
            strings = {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}
            if items and len(strings) == len(items):
                found.setdefault(node.targets[0].id, set()).update(strings)
    return found


def loop_variables(tree: ast.Module, collections: dict[str, set[str]]) -> dict[str, set[str]]:
    """In one module, each ``for var in NAME`` (a loop or a comprehension) over a collection of
    strings: ``var`` → those strings."""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.comprehension) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, ast.Name) and node.iter.id in collections:
            bound.setdefault(node.target.id, set()).update(collections[node.iter.id])
    return bound


def is_environ(node: ast.expr) -> bool:
    """``os.environ``, or a mapping named ``environ`` / ``env``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ENVIRON_NAMES


def names_of(node: ast.expr, constants: dict[str, set[str]]) -> set[str]:
    """The variable names an argument spells: a literal, or a constant the package defines."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    if isinstance(node, ast.Attribute):
        return constants.get(node.attr, set())
    return set()  # computed (a parameter): its callers are found instead


def read_variables() -> dict[str, set[str]]:
    """Variable → the modules that read (or set) it."""
    trees = modules()
    constants = string_constants(trees)
    collections = collection_constants(trees)
    found: dict[str, set[str]] = {}

    def arguments(tree: ast.Module) -> Iterator[ast.expr]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                environ_read = isinstance(func, ast.Attribute) and func.attr in READERS and \
                    (is_environ(func.value) or (isinstance(func.value, ast.Name) and func.value.id == "os"))
                switch_read = (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in SWITCH_READERS
                if environ_read or switch_read:
                    yield node.args[0]
            elif isinstance(node, ast.Subscript) and is_environ(node.value):
                yield node.slice
            elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) \
                    and is_environ(node.comparators[0]):
                yield node.left

    for path, tree in trees:
        known = {**constants, **loop_variables(tree, collections)}  # a loop variable: what its loop binds
        for argument in arguments(tree):
            for name in names_of(argument, known):
                found.setdefault(name, set()).add(str(path.relative_to(documents.REPO)))
    return found


def test_the_scan_finds_the_variables_it_must() -> None:
    found = read_variables()
    assert {"CHECKPOINT_FORMAT", "NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL", "NXDI_GPTOSS_FP8_VERIFY_AT_LOAD",
            "NXDI_GPTOSS_FP8_LOAD_MODE", "NXDI_GPTOSS_FP8_DEBUG", "NEURON_COMPILED_ARTIFACTS",
            "TIKTOKEN_ENCODINGS_BASE", "HF_HUB_OFFLINE", "WORLD_SIZE", "NXDI_SRC", "NXD_SRC"} <= set(found)


def test_every_variable_the_package_reads_is_on_the_page() -> None:
    page = documents.page(PAGE)
    missing = {name: sorted(where) for name, where in read_variables().items() if f"`{name}`" not in page}
    assert not missing, f"{PAGE} does not name: {missing}"


def test_the_page_states_the_switch_grammar_the_parser_accepts() -> None:
    grammar = documents.section(PAGE, "On and off: one grammar")
    for word in (*SWITCH_ON, *SWITCH_OFF[:-1]):
        assert f"`{word}`" in grammar, word
    assert "empty" in grammar and "refused" in grammar


def test_the_page_never_says_the_package_does_not_read_a_variable_it_reads() -> None:
    """A paragraph or table row that says the package "never reads" (or "does not read") names no
    variable the scan finds the package reading (``NXDI_SRC``/``NXD_SRC`` are read by ``selfcheck``)."""
    read = read_variables()
    denials = re.compile(r"never reads?|does not read|only the tests read|not read by the package")
    wrong = {}
    for part in re.split(r"\n\s*\n|\n(?=\|)", documents.page(PAGE)):
        named = sorted(name for name in read if f"`{name}`" in part)
        if denials.search(part) and named:
            wrong[part.strip()[:120]] = named
    assert not wrong, f"{PAGE} says the package does not read what it reads: {wrong}"
