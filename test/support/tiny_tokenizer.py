"""A word-level tokenizer for the tiny test models (no download): ``w0`` … ``w{V-2}`` and ``<eos>``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["prompt_of", "write_tokenizer"]


def write_tokenizer(directory: str | Path, vocab_size: int) -> Path:
    """Save a transformers fast tokenizer of ``vocab_size`` ids (the last is ``<eos>``) in ``directory``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 1)} | {"<eos>": vocab_size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(str(directory))
    return Path(directory)


def prompt_of(ids: list[int]) -> str:
    """The text that tokenizes to ``ids``."""
    return " ".join(f"w{i}" for i in ids)
