"""The one reader of a JSON file: a regular file, bounded in size, strict JSON. Stdlib only.

Every JSON file the package reads from a checkpoint, a source or a Hub snapshot goes through
``read_json_file``: the bytes are read by ``read_bounded`` (a FIFO, socket, device or directory is
refused before it is opened; the size is checked on the opened file before a byte is read and
again on what was read, a file growing while it is read), they must be UTF-8, and the text is
parsed by ``parse_json_strict``. Every refusal is a
``JsonFileError`` whose ``code`` says which step refused and whose ``cause`` is the underlying
exception, so each caller words its own message (finding, note or error) as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import FileTooLargeError, NotRegularFileError, NxdiGptossFp8Error
from .files import FileIdentity, read_bounded
from .strict_json import JsonError, parse_json_strict

__all__ = ["MAX_JSON_FILE_BYTES", "JsonFileError", "parse_json_bytes", "read_json_file"]

MAX_JSON_FILE_BYTES = 64 * 1024 * 1024


class JsonFileError(NxdiGptossFp8Error):
    """A JSON file that cannot be read as strict JSON.

    ``code``: ``not_a_file`` (not a regular file, refused before it was opened), ``unreadable``
    (missing or unreadable: ``cause`` is the ``OSError``), ``too_large`` (``size`` bytes on
    disk, above ``limit``), ``grew`` (above ``limit`` once read), ``not_utf8``, or the
    ``JsonError`` code (``invalid_json``, ``duplicate_key``, ``too_deep``, ...; ``key`` as it
    gives). ``cause`` is the underlying exception; the message is its message.
    """

    def __init__(self, code: str, cause: BaseException | None, message: str, *, key: str | None = None,
                 size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.cause = cause
        self.key = key
        self.size = size
        self.limit = limit

    @property
    def not_read(self) -> bool:
        """Whether the file could not be read at all (``not_a_file`` or ``unreadable``)."""
        return self.code in ("not_a_file", "unreadable")

    @property
    def oversized(self) -> bool:
        """Whether the file is above the size limit (``too_large`` or ``grew``)."""
        return self.code in ("too_large", "grew")


def _read(path: str | os.PathLike[str], limit: int,
          on_read: Callable[[bytes, FileIdentity], None] | None) -> bytes:
    try:
        return read_bounded(path, limit, on_read=on_read)[0]
    except FileTooLargeError as exc:
        raise JsonFileError("grew" if exc.grew else "too_large", None, str(exc), size=exc.size, limit=exc.limit) from None
    except NotRegularFileError as exc:
        raise JsonFileError("not_a_file", exc, str(exc)) from None
    except OSError as exc:
        raise JsonFileError("unreadable", exc, f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from None


def read_json_file(path: str | os.PathLike[str], *, what: str, max_bytes: int | None = None,
                   on_read: Callable[[bytes, FileIdentity], None] | None = None, nxdi_constants: bool = False) -> Any:
    """The strict JSON document in the regular file ``path`` of at most ``max_bytes`` bytes
    (default ``MAX_JSON_FILE_BYTES``); ``what`` names it in messages.

    ``on_read``, when given, gets the bytes read and the identity of the file they came from
    before they are checked further (the preflight counts and hashes them). Only the text is
    kept while it is parsed (memory: an index may be 64 MB). ``nxdi_constants`` is
    ``parse_json_strict``'s: only for a file NxDI writes (``neuron_config.json``), never for a
    checkpoint's own JSON. Raises ``JsonFileError``.
    """
    limit = MAX_JSON_FILE_BYTES if max_bytes is None else max_bytes
    return parse_json_bytes(_read(path, limit, on_read), what=what, nxdi_constants=nxdi_constants)


def parse_json_bytes(raw: bytes, *, what: str, nxdi_constants: bool = False) -> Any:
    """The strict JSON document in ``raw``, the bytes of a file read elsewhere (a Hub repo's
    file read over HTTP): UTF-8, then ``parse_json_strict``, as ``read_json_file``. Raises ``JsonFileError``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonFileError("not_utf8", exc, f"{what} is not UTF-8 text") from None
    del raw
    try:
        return parse_json_strict(text, what=what, nxdi_constants=nxdi_constants)
    except JsonError as exc:
        raise JsonFileError(exc.code, exc, str(exc), key=exc.key) from None
