"""How a command's outcome reaches the terminal: the exit statuses, and one function, ``emit``, for
a result and a failure.

A result is a library report (``ok``, ``to_dict``, ``render_text``): with ``--json`` its
``to_dict()`` plus ``ok`` on stdout (``result_document``), else its text; the exit status is 0
when ``ok``, else 1, unless the command has statuses of its own (``validate``'s 3, ``inspect``'s).
A failure is one line on stderr and, with ``--json``, the one JSON error document on stdout
(``_errors.report_failure``). Either way ``ok`` says whether the command got what it was asked
for, and a report's ``hint`` is the library's, never the command line's.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "emit", "print_result", "result_document"]


EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3


def result_document(result: Any) -> dict[str, Any]:
    """``--json`` of a command's result: the library's ``to_dict()``, with ``ok`` first when it
    does not say it itself."""
    document = result.to_dict()
    return document if "ok" in document else {"ok": result.ok, **document}


def emit(document: Mapping[str, Any], text: str, *, as_json: bool, exit_code: int, failure: bool = False) -> int:
    """Print an outcome and return ``exit_code``: a result's ``text`` (or, with ``as_json``, its
    ``document``) on stdout; a ``failure``'s line on stderr always, its document on stdout too
    with ``as_json`` (flushed: the process is about to end)."""
    if failure:
        print(text, file=sys.stderr)
    elif not as_json:
        print(text)
    if as_json:
        print(json.dumps(document, indent=2))
        if failure:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
    return exit_code


def print_result(result: Any, as_json: bool, *, text: str | None = None, exit_code: int | None = None) -> int:
    """Print a command's result (``result_document`` as JSON, or ``text``, by default
    ``render_text()``) and return ``exit_code``, by default 0 when ``result.ok``, else 1."""
    code = exit_code if exit_code is not None else (EXIT_OK if result.ok else EXIT_FINDINGS)
    if as_json:
        return emit(result_document(result), "", as_json=True, exit_code=code)
    return emit({}, result.render_text() if text is None else text, as_json=False, exit_code=code)
