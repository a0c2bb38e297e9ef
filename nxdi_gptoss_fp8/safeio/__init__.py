"""Untrusted input, read strictly and bounded. Standard library only.

Files opened safely (``files``), strict JSON (``strict_json``), the one bounded JSON-file reader (``json_file``), safetensors headers (``safetensors_header``), SHA-256 (``hashing``). Nothing here imports torch, numpy, NxDI or any other tier of the package.
"""

__all__ = []
