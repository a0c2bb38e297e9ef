"""One module per source kind the converter reads, each following ``SourceKind``.
"""

__all__ = []
