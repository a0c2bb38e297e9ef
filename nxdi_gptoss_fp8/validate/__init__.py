"""The fail-closed preflight, one module per check family. Standard library only (numpy for ``--deep`` alone, imported lazily).

``pipeline.preflight`` runs the families in order over one ``view.CheckpointView``; each family adds ``findings`` to one report.
"""

__all__ = []
