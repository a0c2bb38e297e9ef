"""Made-up checkpoints for demos, tests and benchmarks: tiny normalized ones (``tiny`` with torch, ``tiny_stdlib`` without) and synthetic sources of every kind ``convert`` reads (``sources``).
"""

__all__ = []
