"""The ``config`` and ``neuron_config`` checks: ``config.json``, its agreement with the index metadata
and with NxDI's configs.
"""

from __future__ import annotations

from typing import Any

from .. import format as fmt
from ..units import plural
from .config_fields import config_field_problems
from .directory import _read_json_file
from .findings import PreflightReport, Severity
from .foreign import nested_advice
from .nxdi_config import (
    Problem,
    bounded_int,
    has_model_fields,
    model_config_problems,
    model_part,
    neuron_config_problems,
    neuron_config_view,
)
from .view import CheckpointView

__all__ = ["bound_config", "check_neuron_config"]


def _check_config(view: CheckpointView, report: PreflightReport) -> None:
    if not view.reader.exists(fmt.CONFIG_FILE):
        fix = nested_advice(view) or "copy the model's Hugging Face config into the checkpoint directory"
        report.add("config", "missing", f"{fmt.CONFIG_FILE} is missing: {fix}", file=fmt.CONFIG_FILE)
        return
    config = _read_json_file(view, report, fmt.CONFIG_FILE, "config")
    if config is None:
        return
    if not isinstance(config, dict):
        report.add("config", "invalid_json", f"{fmt.CONFIG_FILE} is not a JSON object", file=fmt.CONFIG_FILE)
        return
    view.config = config
    name = fmt.CONFIG_FILE
    if config.get("model_type") != fmt.MODEL_TYPE:
        report.add("config", "wrong_model_type", f"model_type is {config.get('model_type')!r}, expected {fmt.MODEL_TYPE!r}", file=name, key="model_type")
    if config.get("architectures") != [fmt.ARCHITECTURE]:
        report.add("config", "wrong_architecture", f"architectures is {config.get('architectures')!r}, expected [{fmt.ARCHITECTURE!r}]", file=name, key="architectures")
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method == "mxfp4":
            report.add(
                "config", "mxfp4_quantization_config",
                "config.json declares quant_method 'mxfp4': this is an HF MXFP4 config, and tools "
                "would read the FP8 bytes as MXFP4. If the checkpoint is HF MXFP4, unset "
                "CHECKPOINT_FORMAT or convert it with `nxdi-gptoss-fp8 convert`; if it is "
                f"normalized, set quant_method to {fmt.QUANT_METHOD!r}",
                file=name, key="quantization_config.quant_method",
            )
        elif method != fmt.QUANT_METHOD:
            report.add(
                "config", "foreign_quantization_config",
                f"quantization_config.quant_method is {method!r}; a normalized checkpoint has "
                f"{fmt.QUANT_METHOD!r} or no quantization_config",
                file=name, key="quantization_config.quant_method",
            )
    try:
        view.dims = fmt.dims_from_config(config)
    except fmt.ConfigFieldError as exc:
        report.add("config", exc.reason, f"{exc.field}: {exc.problem}; the namespace cannot be derived", file=name, key=exc.field)
    _add_problems(report, model_config_problems(config, view.dims, check="config", what=name, compare_dims=False), file=name)
    _add_problems(report, config_field_problems(config, view.dims), file=name)


def _add_problems(report: PreflightReport, problems: list[Problem], *, file: str | None = None) -> None:
    for problem in problems:
        report.add(problem.check, problem.reason, problem.message, file=file, key=problem.key,
                   severity=Severity.WARNING if problem.warning else Severity.ERROR)


def _check_metadata_against_config(view: CheckpointView, report: PreflightReport, allow_custom_model: bool) -> None:
    if view.dims is None or not _dims_in_proportion(view, report):
        return
    dims, name = view.dims, fmt.CONFIG_FILE
    profile = view.metadata.get("model_profile")
    profile = profile if isinstance(profile, str) else None
    if profile in fmt.PROFILES:
        for field_name, expected in fmt.PROFILES[profile].as_dict().items():
            found = getattr(dims, field_name)
            if found != expected:
                report.add("config", "profile_mismatch", f"{field_name} is {found} but profile {profile} has {expected}", file=name, key=field_name)
    elif profile == fmt.PROFILE_CUSTOM and not allow_custom_model:
        matching = fmt.profile_for_dims(dims)
        hint = f" (its dimensions are those of {matching}: set model_profile to {matching!r})" if matching != fmt.PROFILE_CUSTOM else ""
        report.add(
            "config", "custom_profile_not_allowed",
            f"the checkpoint declares model_profile 'custom'{hint}; custom models load only on "
            f"request: pass allow_custom_model=True, --allow-custom-model, or set {fmt.ALLOW_CUSTOM_ENV}=1",
            file=fmt.INDEX_FILE, key="metadata.model_profile",
        )
    padded_h, padded_i = bounded_int(view.metadata.get("padded_hidden_size")), bounded_int(view.metadata.get("padded_intermediate_size"))
    if padded_h is None or padded_i is None:
        return
    layout = fmt.Layout(dims, padded_h, padded_i)
    problems = layout.padding_problems()
    for problem in problems:
        report.add("config", "padding_mismatch", f"index metadata {problem} (config.json)", file=fmt.INDEX_FILE, key="metadata")
    if not problems:
        view.layout = layout


def _dims_in_proportion(view: CheckpointView, report: PreflightReport) -> bool:
    """Refuse a config whose namespace is far larger than what the checkpoint lists.

    Every later check enumerates the expected namespace (and neuron_config the layers), so a
    config.json claiming 10^11 layers must not be believed: the work stays proportional to
    the files' size. Forgets the dimensions (one finding) when they are out of proportion.
    """
    unit = fmt.Layout.unpadded(view.dims)  # type: ignore[arg-type]
    layers = view.dims.num_hidden_layers  # type: ignore[union-attr]
    expected = len(fmt.global_specs(unit)) + layers * len(fmt.layer_specs(unit, 0))
    present = len(view.weight_map) + len(view.locations.keys() - view.weight_map.keys())
    if expected <= 2 * present + 1024:
        return True
    report.add(
        "config", "dims_out_of_proportion",
        f"num_hidden_layers={layers} means {plural(expected, 'tensor')} but the checkpoint lists {present:,}: "
        "this config.json does not describe the checkpoint; no namespace is derived from it",
        file=fmt.CONFIG_FILE, key="num_hidden_layers",
    )
    view.dims = None
    return False


def _check_inference_config(view: CheckpointView, report: PreflightReport, config: Any) -> None:
    """NxDI's InferenceConfig must describe the checkpoint's model and build it with biases.

    It holds the padded sizes in hidden/intermediate_size and the checkpoint's in
    ``original_*``; ``attention_bias`` must be true (the same rules as for ``config.json``).
    """
    if view.dims is None:
        return
    _add_problems(report, model_config_problems(config, view.dims, check="config", what="NxDI's config", compare_dims=True), file=fmt.CONFIG_FILE)


def check_neuron_config(view: CheckpointView, report: PreflightReport, neuron_config: Any) -> None:
    """The ``neuron_config`` checks (docs/format.md, Findings by check): what NxDI needs to run this checkpoint.

    One rule set (``nxdi_config.neuron_config_problems``) for NxDI's objects and for JSON
    (flat, or nested as NxDI saves it: then its model part is held against ``config.json``).
    """
    nc = neuron_config_view(neuron_config)
    stored = {key: view.metadata.get(key) for key in ("padded_hidden_size", "padded_intermediate_size")}
    _add_problems(report, neuron_config_problems(nc, dims=view.dims, layout=view.layout, stored_padding=stored))
    model = model_part(neuron_config)
    if model is not None and view.dims is not None and has_model_fields(model):
        # the same rules (and codes) as NxDI's InferenceConfig at load: it is one, serialized
        _add_problems(report, model_config_problems(model, view.dims, check="config", what="the NxDI config file", compare_dims=True))


def bound_config(neuron_config: Any, inference_config: Any) -> Any:
    """The one config object a report is bound to, as the loader receives it: the
    InferenceConfig (or nested mapping) when given, else the NeuronConfig; both when the
    NeuronConfig is not the one inside the InferenceConfig (no single load config matches that)."""
    if inference_config is None:
        return neuron_config
    if neuron_config is None or neuron_config is neuron_config_view(inference_config):
        return inference_config
    return (neuron_config, inference_config)
