"""Running a model: NxDI's real GPT-OSS in its CPU mode (``cpu_model``), transformers' reference (``reference``), the comparison (``metrics``) and the two commands on top (``check``, ``selfcheck``). Needs torch, NxDI and transformers, all imported lazily.
"""

__all__ = []
