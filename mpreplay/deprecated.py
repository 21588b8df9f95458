"""How a removed name keeps working for a minor version: a ``DeprecationWarning`` that names
its replacement (docs/stability.md).  The shim modules (``mpreplay.io``, ``mpreplay.storage``,
``mpreplay.buffer``, ``mpreplay.sequence_buffer``) call :func:`moved` when imported."""

from __future__ import annotations

import warnings

__all__ = ["moved"]


def moved(old: str, new: str, *, removal: str = "0.4.0") -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` and goes in ``removal``."""
    # Level 3: past this function and the shim's module body, at the line that used the old name
    # (for an import, the import system's frame; the category is what a test or filter matches).
    warnings.warn(
        f"{old} is deprecated and will be removed in mpreplay {removal}: use {new}", DeprecationWarning, stacklevel=3
    )
