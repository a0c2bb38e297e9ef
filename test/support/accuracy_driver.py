"""Test-only: run NxDI's own accuracy check on its CPU-mode model of a normalized checkpoint.

``python accuracy_driver.py JOB.json`` in an interpreter with ``nxdi_standin/cpu_site`` on
``PYTHONPATH`` (the real NxDI from ``NXDI_SRC``). The job names the checkpoint, the prompt, the
number of tokens and either ``check_accuracy_logits`` (``"call": "logits"``, the reference from
the hooked ``load_hf_model``, chosen by ``reference``) or inference_demo's ``run_accuracy_check``
(``"call": "demo"``, with ``mode`` and ``expected_outputs_path``). The last stdout line is JSON:
whether it passed, the exception type if not, and what each tolerance would have had to be
(``needs``: per top-k tier the smallest rtol at atol 1e-5, the largest divergence difference, the
largest absolute error of the expected top-5 logits, after NxDI removes the constant shift).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from nxdi_standin import accuracy_cpu

__all__ = ["run"]


def _needs() -> dict[str, float]:
    needs: dict[str, float] = {}
    for results in accuracy_cpu.RESULTS:
        for batch in results:
            for token in batch:
                for tier, error in token["error_map"].items():
                    needs[tier] = max(needs.get(tier, 0.0), float(error))
                needs["divergence"] = max(needs.get("divergence", 0.0), float(token["divergence_difference"]))
                needs["shift"] = max(needs.get("shift", 0.0), abs(float(token["shift"])))
                top = token["expected_logits"].topk(min(5, token["expected_logits"].numel())).indices
                error = (token["actual_logits"][top] - token["expected_logits"][top]).abs().max()
                needs["top5_abs"] = max(needs.get("top5_abs", 0.0), float(error))
    return needs


def run(job: dict[str, Any]) -> dict[str, Any]:
    accuracy_cpu.install()
    from neuronx_distributed_inference.utils import accuracy

    from nxdi_gptoss_fp8 import format as fmt
    from nxdi_gptoss_fp8.forward import cpu_model
    from nxdi_gptoss_fp8.forward.goldens import load_tokenizer

    if job.get("reference"):
        os.environ[fmt.REFERENCE_ENV] = job["reference"]
    else:
        os.environ.pop(fmt.REFERENCE_ENV, None)
    tokenizer = load_tokenizer(job["ckpt"])
    prompt, count = job["prompt"], job["num_tokens"]
    ids = tokenizer(prompt).input_ids
    plan = cpu_model.ForwardPlan(tuple(ids) + (0,) * count, len(ids))
    spec = cpu_model.RunSpec(job["ckpt"], cpu_model.ROUTE_NORMALIZED, dict(job.get("neuron_config", {})),
                             allow_custom_model=True)
    outcome: dict[str, Any] = {"passed": False, "error": None, "message": None}
    with cpu_model.cpu_application(spec, plan) as app:
        try:
            if job["call"] == "logits":
                accuracy.check_accuracy_logits(app, tokenizer, None, prompt=prompt, num_tokens_to_check=count,
                                               tol_map=job.get("tol_map"),
                                               divergence_difference_tol=job.get("divergence", 0.001))
            else:
                from neuronx_distributed_inference import inference_demo

                tol_map = job.get("tol_map")
                inference_demo.run_accuracy_check(
                    app, tokenizer, None, prompt, inference_demo.CheckAccuracyMode(job["mode"]),
                    job.get("divergence", 0.001), repr(tol_map) if tol_map else None,
                    num_tokens_to_check=job.get("num_tokens_to_check", count),
                    expected_outputs_path=job.get("expected_outputs_path"))
            outcome["passed"] = True
        except Exception as exc:  # the verdict is the exception's type: the test asserts on it
            outcome["error"] = type(exc).__name__
            outcome["message"] = str(exc).splitlines()[0][:500] if str(exc) else ""
            traceback.print_exc(file=sys.stderr)
    outcome["needs"] = _needs()
    return outcome


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        result = run(json.load(handle))
    print(json.dumps(result))
