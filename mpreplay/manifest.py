"""The manifest at the start of every buffer's memory: what another process needs to read it.

A shared buffer's segment is found by name in ``/dev/shm``, but its configuration travels
only in the pickled handle its creator hands out.  The manifest makes the segment describe
itself, so that ``mpreplay ls`` / ``top`` / ``rm`` (:mod:`mpreplay.monitor`) can read it
from any process: the buffer's class and capacity, its fields, its compression, its owner
and where each array lies.  It is plain JSON (never pickle), written once by the creator
before any other process can attach, and never changed afterwards.

Layout of the ``manifest`` array (``MANIFEST_NBYTES`` bytes, the segment's first array):
``MAGIC`` (8 bytes), the JSON's length (uint64, little endian), the JSON (UTF-8), zeros.
"""
from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from ._ext.schema import MANIFEST_NBYTES

__all__ = ["MAGIC", "VERSION", "encode", "decode"]

MAGIC = b"mpreplay"
VERSION = 1
_HEAD = struct.Struct("<8sQ")


def encode(document: dict[str, Any], out: np.ndarray) -> None:
    """Write ``document`` (JSON-serialisable, ``version`` added) into the manifest array ``out``.

    A document too large for the array loses its ``fields`` entry (``fields_omitted`` says
    so): the layout, which the reader needs, is always kept.
    """
    document = {"version": VERSION, **document}
    text = json.dumps(document, separators=(",", ":")).encode()
    if _HEAD.size + len(text) > MANIFEST_NBYTES:
        document = {**document, "fields": {}, "fields_omitted": True}
        text = json.dumps(document, separators=(",", ":")).encode()
    if _HEAD.size + len(text) > MANIFEST_NBYTES:
        raise ValueError(f"manifest: {len(text)} bytes of layout do not fit in {MANIFEST_NBYTES}")
    data = _HEAD.pack(MAGIC, len(text)) + text
    out[:len(data)] = np.frombuffer(data, np.uint8)


def decode(head: bytes) -> dict[str, Any] | None:
    """The document in ``head`` (the first ``MANIFEST_NBYTES`` bytes of a segment, or more);
    None when they hold no manifest of a version this code reads."""
    if len(head) < _HEAD.size:
        return None
    magic, length = _HEAD.unpack_from(head)
    if magic != MAGIC or not 0 < length <= min(len(head), MANIFEST_NBYTES) - _HEAD.size:
        return None
    try:
        document = json.loads(bytes(head[_HEAD.size:_HEAD.size + length]))
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("version") != VERSION or not _well_formed(document):
        return None
    return document


def _well_formed(document: dict[str, Any]) -> bool:
    """Whether the entries a reader relies on are there, with their types."""
    def whole(x: Any) -> bool:
        return type(x) is int and x >= 0

    arrays = document.get("arrays")
    return (whole(document.get("capacity")) and whole(document.get("owner"))
            and isinstance(document.get("created"), (int, float)) and isinstance(document.get("class"), str)
            and isinstance(document.get("selector"), str) and isinstance(arrays, list)
            and all(isinstance(a, list) and len(a) == 4 and isinstance(a[0], str) and isinstance(a[2], str)
                    and isinstance(a[1], list) and all(whole(d) for d in a[1]) and whole(a[3]) for a in arrays))
