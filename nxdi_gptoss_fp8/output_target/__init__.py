"""Where an output directory is written, and what may be there already: the one overwrite rule.

Every writer of this package asks this package, and only it removes or replaces anything (an
AST test, ``test_output_target``, fails when another module removes or renames a path). Stdlib
only.
"""

__all__: list[str] = []
