"""Deprecated since 0.3.0 (removed without warning in 0.2.0), removed in 0.4.0: the file format
is :mod:`mpreplay.fileformat`; a buffer saves and loads itself with its ``save_transitions`` and
``load_transitions`` methods."""

from __future__ import annotations

import os
from typing import IO

from . import deprecated
from .fileformat import FORMAT_VERSION, TransitionFileError, inspect, read_metadata
from .table import Table

__all__ = ["FORMAT_VERSION", "TransitionFileError", "inspect", "load_transitions", "read_metadata", "save_transitions"]

deprecated.moved("mpreplay.io", "mpreplay.fileformat and the buffers' save_transitions / load_transitions")


def save_transitions(
    buffer: Table,
    file: str | os.PathLike[str] | IO[bytes],
    *,
    safe: bool | None = None,
    compress: bool = True,
    priorities: bool = False,
) -> None:
    """0.1.0's ``save_transitions(buffer, file)``: ``buffer.save_transitions(file)``.  ``safe``
    changed nothing then (files hold the plain layout) and is ignored, with its own warning."""
    buffer.save_transitions(file, safe=safe, compress=compress, priorities=priorities)


def load_transitions(buffer: Table, file: str | os.PathLike[str] | IO[bytes]) -> int:
    """0.1.0's ``load_transitions(buffer, file)``: ``buffer.load_transitions(file)``."""
    return buffer.load_transitions(file)
