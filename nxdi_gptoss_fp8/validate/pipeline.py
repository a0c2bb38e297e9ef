"""The preflight: every check family, in order, over one checkpoint, into one report (docs/format.md).

Reads only ``config.json``, the index, each shard's header and the expert scale tensors (small);
never a weight byte. It reads them through a ``safeio.reader.CheckpointReader``: a directory here,
or a Hub repo at one commit (``safeio.hub_reader``), judged by the same checks. Stdlib only, so it runs on any host. Data flows one way: files → parsed headers
→ findings. The loader maps tensors only when the report is clean.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .. import format as fmt
from ..deps import missing
from ..errors import HubAccessError
from ..safeio.reader import CheckpointReader, LocalReader
from .binding import seal
from .config import (
    _check_config,
    _check_inference_config,
    _check_metadata_against_config,
    bound_config,
    check_neuron_config,
)
from .directory import _check_directory, _check_stray_files
from .findings import PreflightReport, Severity
from .index import _check_index
from .integrity import check_digests
from .namespace import _check_dtype_shape, _check_namespace, _check_sidecars
from .nxdi_config import describe, read_config_file, switch_from_env
from .scales import _check_scale_values, _check_total_size, _scales_trusted
from .shards import _check_collisions, _check_ownership, _read_headers
from .view import CheckpointView

__all__ = ["NOT_CHECKED_SCALES", "allow_custom_from_env", "preflight"]


NOT_CHECKED_SCALES = "scale values"


def allow_custom_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``NXDI_GPTOSS_FP8_ALLOW_CUSTOM_MODEL`` opts in to custom-profile checkpoints
    (``nxdi_config.parse_switch``; ``ConfigError`` for a value that is neither on nor off)."""
    return switch_from_env(fmt.ALLOW_CUSTOM_ENV, os.environ if environ is None else environ,
                           "accept custom-profile checkpoints")


def preflight(
    path: str | os.PathLike[str] | CheckpointReader,
    *,
    neuron_config: Any = None,
    inference_config: Any = None,
    allow_custom_model: bool = False,
    read_scales: bool = True,
    deep: bool = False,
    verify_checksums: bool = False,
) -> PreflightReport:
    """Check the checkpoint directory ``path`` against the normalized-FP8 format (docs/format.md).

    Args:
        path: the checkpoint directory (a str or ``os.PathLike``), or a ``CheckpointReader``
            of one elsewhere (``safeio.hub_reader.HubReader``: a Hub repo at one commit, read
            over HTTP ranges; its findings name files ``REPO_ID@COMMIT:FILE``).
        neuron_config: NxDI's NeuronConfig, a mapping of its attributes (flat, or nested
            under ``"neuron_config"`` as NxDI saves it), or the path of such a JSON file (read
            as ``validate --neuron-config`` reads it); enables the ``neuron_config`` checks.
        inference_config: NxDI's InferenceConfig (or a mapping, or a JSON file's path); its
            model dimensions must agree with the checkpoint's ``config.json``.
        allow_custom_model: accept a ``custom`` model profile (tiny test models).
        read_scales: read the expert scales and check their values (the default); False gives
            a headers-only verdict and an info finding saying the values were not checked.
        deep: also read every FP8 expert byte once (``deep_scan``: values beyond ±240 or
            NaN, non-zero padding, all-zero experts); needs numpy (``MissingDependencyError``
            without it) and a directory on this machine (``HubAccessError`` for a remote reader).
        verify_checksums: hash every shard against the index's ``shard_sha256``
            (``integrity``); without digests that is an error (else only a warning). A Hub
            repo's shards are not read: their LFS SHA-256 records are compared.

    Returns:
        A ``PreflightReport`` with every finding; ``report.ok`` is the verdict. Never raises
        for a malformed checkpoint; raises ``TypeError`` for an argument of the wrong type (a
        flag that is not a bool, a config that is a number or a list), ``ConfigError`` for a
        config file that cannot be read, ``MissingDependencyError`` for a missing optional
        dependency. Example::

            report = preflight("/ckpt/gpt-oss-120b-fp8")
            report.raise_if_failed()
    """
    reader = path if isinstance(path, CheckpointReader) else LocalReader(_checked_path(path))
    neuron_config = _checked_config(neuron_config, "neuron_config")
    inference_config = _checked_config(inference_config, "inference_config")
    for name, flag in (("allow_custom_model", allow_custom_model), ("read_scales", read_scales), ("deep", deep),
                       ("verify_checksums", verify_checksums)):
        if not isinstance(flag, bool):
            raise TypeError(f"preflight({name}=...) takes True or False, not {type(flag).__name__} {describe(flag)}")
    if deep and not reader.local:
        raise HubAccessError(f"--deep reads every weight byte, which {reader.root} does not give without a download: "
                             "download the repo (hf download REPO_ID --local-dir DIR), then validate DIR --deep")
    if deep:
        from . import deep_scan

        if deep_scan.np is None:  # fail before reading anything: the environment, not the checkpoint
            raise missing("numpy", "the deep scan (deep=True, validate --deep)")
    started = time.perf_counter()
    # The cyclic garbage collector would re-walk every object a large index creates, many
    # times over while it is parsed; the checks build no cycles, so it pauses until the verdict.
    collecting = gc.isenabled()
    gc.disable()
    try:
        report = _run_checks(reader, neuron_config=neuron_config, inference_config=inference_config,
                             allow_custom_model=allow_custom_model, read_scales=read_scales, deep=deep,
                             verify_checksums=verify_checksums)
    finally:
        if collecting:
            gc.enable()
    report.elapsed_s = time.perf_counter() - started
    return report


def _checked_path(path: Any) -> str:
    """``path`` as a str: a str or ``os.PathLike`` of str, else ``TypeError``."""
    try:
        root = os.fspath(path)
    except TypeError:
        raise TypeError(f"preflight(path) takes the checkpoint directory as a str or os.PathLike, not "
                        f"{type(path).__name__}") from None
    if not isinstance(root, str):
        raise TypeError(f"preflight(path) takes a str path, not {type(root).__name__}: decode it first")
    return root


# config values that can only be a mistake (NxDI's configs are objects or mappings)
_NOT_A_CONFIG = (bool, int, float, complex, bytes, bytearray, list, tuple, set, frozenset)


def _checked_config(config: Any, name: str) -> Any:
    """A config argument as the checks take it: a path is read as a JSON file (``ConfigError``
    when it cannot be), a number, string of bytes or sequence is a ``TypeError``."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not isinstance(path, str):
            raise TypeError(f"preflight({name}=...) takes a str path, not {type(path).__name__}")
        return read_config_file(path, f"{name} {path}")
    if isinstance(config, _NOT_A_CONFIG):
        raise TypeError(f"preflight({name}=...) takes NxDI's config object, a mapping of its attributes or the "
                        f"path of its JSON file, not {type(config).__name__}")
    return config


def _run_checks(reader: CheckpointReader, *, neuron_config: Any, inference_config: Any, allow_custom_model: bool,
                read_scales: bool, deep: bool, verify_checksums: bool) -> PreflightReport:
    root = reader.root
    report = PreflightReport(path=root)
    view = CheckpointView(root=root, reader=reader)
    if _check_directory(view, report):
        _check_config(view, report)
        _check_index(view, report)
        _check_stray_files(view, report)
        _read_headers(view, report)
        _check_ownership(view, report)
        _check_collisions(view, report)
        _check_metadata_against_config(view, report, allow_custom_model)
        _check_namespace(view, report)
        _check_dtype_shape(view, report)
        _check_sidecars(view, report)
        _check_total_size(view, report)
        if not read_scales:
            report.not_checked.append(NOT_CHECKED_SCALES)
            report.add("values", "not_checked", "scale values were not read (headers-only preflight)", severity=Severity.INFO)
        elif _scales_trusted(view, report):
            _check_scale_values(view, report)
        check_digests(view, report, verify=verify_checksums)
        if deep:
            from .deep_scan import deep_scan

            deep_scan(view, report)
        if inference_config is not None:
            _check_inference_config(view, report, inference_config)
        if neuron_config is not None:
            check_neuron_config(view, report, neuron_config)
    report.profile = view.metadata.get("model_profile") if isinstance(view.metadata.get("model_profile"), str) else None
    report.target = view.metadata["target"][:200] if isinstance(view.metadata.get("target"), str) else None
    report.shards = len(view.headers)
    report.tensors = len(view.locations)
    report.checked = seal(
        view, root=root if "\x00" in root or not reader.local else os.path.realpath(root), headers_only=not read_scales, errors=report.error_count,
        allow_custom_model=allow_custom_model,
        deep=deep, verify_checksums=verify_checksums, config=bound_config(neuron_config, inference_config),
        json_files=view.json_files,
    )
    if not reader.local:  # findings name REPO_ID@COMMIT:FILE
        report.findings[:] = [replace(f, file=reader.label(f.file)) if f.file else f for f in report.findings]
    return report
