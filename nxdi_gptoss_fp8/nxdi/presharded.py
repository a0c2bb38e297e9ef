"""The NxDI hook's pre-sharded weights (``save_sharded_checkpoint=True``): the ``shard_weights``
and ``load_weights`` wrappers.

NxDI's ``load_weights`` hands ``weights/tp{rank}_sharded_checkpoint.safetensors`` to the device
without calling the checkpoint loader. In normalized mode ``shard_weights`` is wrapped to record a
manifest of the files NxDI just wrote (``validate.presharded_manifest.write_manifest``, atomically and last;
the old one is removed first), and ``load_weights`` to check the ranks it will read against that
manifest, the loaded NeuronConfig, the checkpoint the application is built from (its fingerprint
must be the one the shards were written from) and the recorded source before NxDI opens a single
file (``validate.presharded.check_presharded``; ``ShardedWeightsError`` with every finding). Its own
module because it is one concern with its own state (the sources read during one
``shard_weights`` call); ``nxdi.hook`` installs these wrappers and passes in its mode decision.
Importing it does not import NxDI.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from ..errors import IntegrityError, refusals_stop_the_start
from ..validate.presharded import changed_since, loader_source
from ..validate.presharded_manifest import ManifestSource, checkpoint_identity, remove_manifest, write_manifest
from .start_plan import StartInputs, run_check

__all__ = ["SHARD_SOURCES", "fingerprint_or_none", "record_source", "wrap_load_weights", "wrap_shard_weights"]

logger = logging.getLogger(f"{__package__}.hook")  # the hook's messages, under the hook's one logger

# the checkpoints the normalized loader read during one shard_weights call (None outside one)
SHARD_SOURCES: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("nxdi_gptoss_fp8_shard_sources", default=None)


def fingerprint_or_none(path: str) -> dict[str, Any] | None:
    """The source fingerprint taken before the preflight (None: unreadable, the preflight says why)."""
    try:
        return checkpoint_identity(path)
    except (OSError, IntegrityError):
        return None


def record_source(sources: list[Any], path: str, fingerprint: dict[str, Any] | None) -> None:
    if os.path.abspath(path) not in (source.path for source in sources):  # once per checkpoint
        sources.append(ManifestSource(os.path.abspath(path), fingerprint if fingerprint is not None else checkpoint_identity(path)))


def _writes_shards(neuron_config: Any) -> bool:
    """Whether NxDI's ``shard_weights`` writes rank files with this config (and ``load_weights`` reads them)."""
    return bool(getattr(neuron_config, "save_sharded_checkpoint", False)) and not getattr(neuron_config, "skip_sharding", False)


def _loader_source(app: Any) -> str:
    """The directory NxDI's ``checkpoint_loader_fn`` reads (its config's directory, else the model
    path; ``quantized_checkpoints_path`` when quantized): the checkpoint the application names."""
    return loader_source(app.config, app.model_path) or os.fspath(app.model_path)


def _ranks(neuron_config: Any, start: Any = None, count: Any = None) -> range:
    start = neuron_config.start_rank_id if start is None else start
    count = neuron_config.local_ranks_size if count is None else count
    return range(int(start), int(start) + int(count))


def wrap_shard_weights(func: Callable[..., Any], is_normalized: Callable[[Any], bool]) -> Callable[..., Any]:
    """NxDI's ``shard_weights``, in normalized mode (``is_normalized(config)``) followed by the
    manifest of the rank files it wrote (the old manifest removed first); else ``func`` itself."""
    signature = inspect.signature(func)

    def shard_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_normalized(getattr(self, "config", None)):
            return func(self, *args, **kwargs)
        try:
            compiled = os.fspath(signature.bind(self, *args, **kwargs).arguments["compiled_model_path"])
        except (TypeError, KeyError):
            return func(self, *args, **kwargs)  # let NxDI raise the caller's TypeError
        with refusals_stop_the_start():
            if _writes_shards(self.neuron_config) and remove_manifest(compiled):
                logger.info("removed the manifest of the earlier pre-sharded weights in %s before re-sharding", compiled)
        sources: list[Any] = []
        token = SHARD_SOURCES.set(sources)
        try:
            result = func(self, *args, **kwargs)
        finally:
            SHARD_SOURCES.reset(token)
        if not _writes_shards(self.neuron_config):
            return result
        with refusals_stop_the_start():
            if not sources:  # NxD reused state dicts without calling the loader: bind what it would read
                path = _loader_source(self)
                sources.append(ManifestSource(os.path.abspath(path), checkpoint_identity(path)))
            manifest = write_manifest(compiled, ranks=_ranks(self.neuron_config), config=self.config, sources=sources)
        logger.info("recorded %d pre-sharded rank files of %s (from %s) in their manifest", len(manifest.ranks),
                    compiled, ", ".join(source.path for source in sources))
        return result

    return shard_weights


def wrap_load_weights(func: Callable[..., Any], is_normalized: Callable[[Any], bool]) -> Callable[..., Any]:
    """NxDI's ``load_weights``, in normalized mode with pre-sharded weights preceded by the check
    of the ranks it will read against their manifest (and followed by a did-they-change check)."""
    signature = inspect.signature(func)

    def load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        # NxDI reads the rank files whenever save_sharded_checkpoint is set (skip_sharding only
        # stops shard_weights writing them)
        if not is_normalized(getattr(self, "config", None)) or not getattr(self.neuron_config, "save_sharded_checkpoint", False):
            return func(self, *args, **kwargs)  # HF/legacy, or sharded at load (the preflight runs then)
        try:
            arguments = signature.bind(self, *args, **kwargs).arguments
        except TypeError:
            return func(self, *args, **kwargs)
        compiled = os.fspath(arguments["compiled_model_path"])
        ranks = _ranks(self.neuron_config, arguments.get("start_rank_id"), arguments.get("local_ranks_size"))
        inputs = StartInputs(os.environ, self.config, model=_loader_source(self), compiled=compiled, ranks=ranks)
        with refusals_stop_the_start():  # a ConfigError or an OSError here must not become a recompile
            try:
                check = run_check("presharded", inputs)  # the start plan's check (validate COMPILED's)
            except IntegrityError as error:
                logger.error("%s", error)
                raise
        verify = bool(check.bytes_hashed)
        for finding in check.report.warnings:
            logger.warning("%s", finding.render())
        logger.info("pre-sharded weights of %s: ranks %d…%d match their manifest%s (%.1f ms)", compiled, ranks.start,
                    ranks.stop - 1, " and digests" if verify else "", check.elapsed_s * 1000)
        result = func(self, *args, **kwargs)
        changes = changed_since(check)
        if changes:
            raise IntegrityError(f"pre-sharded weights of {compiled} changed while NxDI read them: {'; '.join(changes)}; "
                                 "the model must not be used: load again once the files are stable")
        return result

    return load_weights
