"""``goldens``: the file NxDI's ``inference_demo --expected-outputs-path`` reads, computed on a CPU.

NxDI's demo reads it with ``torch.load`` and, for token matching, passes it to ``check_accuracy``
(which takes ``.sequences`` when the object has them: prompt and generated ids, [batch, length]);
for logit matching, ``torch.stack(outputs.scores)`` gives the expected logits [steps, batch,
vocab]. What is written is a tensor (the sequences) carrying ``sequences`` and ``scores`` (a
tuple of [batch, vocab] tensors) as attributes: it serves both modes and loads with
``torch.load``'s default ``weights_only=True`` (no class of ours or of transformers is pickled).

The numbers are transformers' greedy generation from the reference ``forward.hf_reference``
builds (the checkpoint dequantized, or its recorded HF source), generated as NxDI's own check
generates its goldens: ``max_new_tokens = min_new_tokens = N``, ``do_sample=False``, the scores
after the logits processors. So the Neuron host need not hold the BF16 model. Requires torch and
transformers; never NxDI.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConversionError
from ..units import plural
from .hf_reference import ReferenceBuild, build_reference

__all__ = ["GoldensReport", "check_output", "expected_outputs", "generate_expected", "load_tokenizer", "make_goldens", "read_goldens"]


@dataclass
class GoldensReport:
    """What was written: where, from which reference, the prompt and the tokens generated."""

    output: str
    checkpoint: str
    build: ReferenceBuild
    prompt: str
    batch_size: int
    num_tokens: int
    input_ids: list[int] = field(default_factory=list)
    generated_ids: list[int] = field(default_factory=list)
    generated_text: str = ""
    token_matching_count: int = 0  # --num-tokens-to-check for token matching (NxDI drops pad tokens first)
    generate_s: float = 0.0
    ok: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "output": self.output, "checkpoint": self.checkpoint, **self.build.to_dict(),
                "prompt": self.prompt, "batch_size": self.batch_size, "num_tokens": self.num_tokens,
                "input_ids": self.input_ids, "generated_ids": self.generated_ids,
                "generated_text": self.generated_text, "token_matching_count": self.token_matching_count,
                "generate_s": round(self.generate_s, 3)}

    def render_text(self) -> str:
        return "\n".join([
            f"goldens: {self.output}",
            f"  reference  {self.build.describe()}",
            f"  memory     {self.build.memory}",
            f"  prompt     {plural(len(self.input_ids), 'token')} × batch {self.batch_size}; "
            f"{plural(self.num_tokens, 'token')} generated "
            f"greedily in {self.generate_s:.1f} s",
            f"  generated  {self.generated_text!r}",
            f"  use        inference_demo ... --expected-outputs-path {self.output} --check-accuracy-mode logit-matching "
            f"--num-tokens-to-check {self.num_tokens}, or token-matching --num-tokens-to-check {self.token_matching_count} "
            "(docs/accuracy.md)",
        ])


def load_tokenizer(directory: str) -> Any:
    """transformers' tokenizer from ``directory``, its pad token the end-of-sequence token as NxDI's
    demo sets it; ``ConversionError`` (one line) when the directory has none."""
    from ..inspection import companion_groups

    tokenizer_files = next(c for c in companion_groups(directory) if c.what == "tokenizer")
    if not tokenizer_files.present:
        raise ConversionError(f"{directory} holds no tokenizer (tokenizer.json, tokenizer_config.json): pass --tokenizer "
                              "DIR, the HF source's directory (convert copies these files when the source has them)")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConversionError(f"cannot load the tokenizer of {directory}: {first}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def generate_expected(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_tokens: int) -> Any:
    """transformers' greedy generation of exactly ``num_tokens`` tokens with the scores, as NxDI's
    ``check_accuracy_logits`` generates its own goldens."""
    with torch.no_grad():
        return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=num_tokens,
                              min_new_tokens=num_tokens, do_sample=False, return_dict_in_generate=True,
                              output_scores=True)


def expected_outputs(sequences: torch.Tensor, scores: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
    """The object written: ``sequences`` (a tensor) with ``.sequences`` and ``.scores`` attributes."""
    outputs = sequences.detach().clone()
    outputs.sequences = sequences.detach().clone()  # type: ignore[attr-defined]  # not itself: weights-only loads no cycle
    outputs.scores = tuple(score.detach().float().clone() for score in scores)  # type: ignore[attr-defined]
    return outputs


def read_goldens(path: str | os.PathLike[str]) -> Any:
    """A goldens file as NxDI's demo reads it (``torch.load``, weights only)."""
    return torch.load(os.fspath(path), weights_only=True)


def check_output(output: str) -> None:
    """``ConversionError`` when ``output`` cannot be the goldens file: a directory, or in a
    directory that does not exist (checked before the reference is built; the CLI's exit 2)."""
    parent = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        raise ConversionError(f"--output {output} is a directory: pass a file path, e.g. {os.path.join(output, 'goldens.pt')}")
    if not os.path.isdir(parent):
        raise ConversionError(f"--output {output}: its directory {parent} does not exist: create it first")


def make_goldens(ckpt: str | os.PathLike[str], reference: str, *, prompt: str, num_tokens: int,
                 output: str | os.PathLike[str], tokenizer: str | None = None, dtype: Any = None, batch_size: int = 1,
                 allow_custom_model: bool = False, progress: bool | None = None,
                 say: Callable[[str], None] | None = None, available: tuple[int | None, str] | None = None) -> GoldensReport:
    """Build the reference (``hf_reference.build_reference``), generate ``num_tokens`` tokens greedily
    from ``prompt`` (``batch_size`` copies, as NxDI's check batches it) and write ``output``
    atomically. Raises the reference's errors; ``ConversionError`` for an unusable tokenizer or
    output; ``ValueError`` for ``num_tokens`` or ``batch_size`` below 1. Example::

        make_goldens("/data/gpt-oss-20b-fp8", "dequantized", prompt="I believe", num_tokens=32,
                     output="/data/goldens.pt")
    """
    from ..safeio.files import write_atomically

    if num_tokens < 1 or batch_size < 1:
        raise ValueError(f"num_tokens and batch_size must be at least 1, not {num_tokens} and {batch_size}")
    ckpt, output = os.fspath(ckpt), os.fspath(output)
    check_output(output)
    tokenize = load_tokenizer(tokenizer or ckpt)
    inputs = tokenize([prompt] * batch_size, padding=True, return_tensors="pt")
    build = build_reference(ckpt, reference, dtype=dtype, allow_custom_model=allow_custom_model, option="--reference",
                            available=available, progress=progress, say=say)
    report = GoldensReport(output, ckpt, build, prompt, batch_size, num_tokens, input_ids=inputs.input_ids[0].tolist())
    started = time.perf_counter()
    generated = generate_expected(build.model, inputs.input_ids, inputs.attention_mask, num_tokens)
    report.generate_s = time.perf_counter() - started
    outputs = expected_outputs(generated.sequences, generated.scores)
    new = generated.sequences[0, inputs.input_ids.shape[1]:]
    report.generated_ids = new.tolist()
    report.generated_text = tokenize.decode(new, skip_special_tokens=True)
    # NxDI's token matching removes the pad token from both sequences (prompt included), then compares
    report.token_matching_count = int((generated.sequences[0] != tokenize.pad_token_id).sum())
    buffer = io.BytesIO()
    torch.save(outputs, buffer)
    write_atomically(output, buffer.getvalue())
    return report
