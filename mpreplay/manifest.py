"""The manifest at the start of every buffer's memory: what another process needs to read it.

A shared buffer's segment is found by name in ``/dev/shm``, but its configuration travels
only in the pickled handle its creator hands out.  The manifest makes the segment describe
itself, so that ``mpreplay ls`` / ``top`` / ``rm`` (:mod:`mpreplay.monitor`) can read it
from any process, and so that a process attaching a handle can check that the segment holds
the layout it computes (:func:`check_segment`): the buffer's class and capacity, its fields,
its compression, its owner, the mpreplay version that made it, and where each array lies.
It is plain JSON (never pickle), written once by the creator before any other process can
attach, and never changed afterwards; its ``build`` entry (the checked constructor arguments)
lets a process given only the segment's name build the table's configuration
(:func:`mpreplay.attach`), its ``persist`` entry says whether the table outlives its creator.

Layout of the ``manifest`` array (``NBYTES`` bytes, the segment's first array):
``MAGIC`` (8 bytes), the JSON's length (uint64, little endian), the JSON (UTF-8), zeros.

A segment's bytes are never trusted: :func:`decode` checks every entry a reader relies on
(types, numeric dtypes, ranks and lengths of the arrays readers index, every array inside the
segment) and names the first one that is wrong.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any

import numpy as np

from . import removers, selectors
from ._ext.lock import LOCK_NBYTES
from ._ext.processes import token_pid
from ._ext.schema import (
    HEADER_ARRAY,
    HEADER_LEN,
    LANE_LEN,
    LANES_ARRAY,
    LIMITS_ARRAY,
    LIMITS_LEN,
    LOCK_ARRAY,
    MANIFEST_NBYTES,
    MAX_WRITERS,
    WRITER_LEN,
    WRITERS_ARRAY,
)
from ._version import __version__
from .errors import IncompatibleSegmentError

__all__ = [
    "MAGIC",
    "NBYTES",
    "VERSION",
    "ManifestError",
    "check_segment",
    "decode",
    "creator_token",
    "encode",
    "readable",
]

MAGIC = b"mpreplay"
NBYTES = MANIFEST_NBYTES
# 2: the document names the mpreplay version that wrote it and the layout's size (``nbytes``).
# 3: ``selector`` names the selector (an entry of mpreplay.selectors), no longer its array.
# 4: ``remover`` names the remover (an entry of mpreplay.removers); the header records the run a
#    reservation is making.
# 5: ``build`` holds the table's checked constructor arguments (a process given only the name
#    builds the same configuration: mpreplay.attach) and ``persist`` whether it outlives its
#    creator; the magic is written last, once the segment is ready to attach.
VERSION = 5
_HEAD = struct.Struct("<8sQ")
_DTYPE = re.compile(r"[<>|][biufc][0-9]{1,2}")  # numpy's dtype.str of the numeric dtypes
_WORD = 8  # every array starts on an 8-byte boundary: readers load counters and lock words whole
_MAX_RANK = 32  # numpy's limit on dimensions (64 since numpy 2) with room to spare
_LATEST = 32503680000.0  # 3000-01-01: a later creation time is damage (and beyond what datetime prints)
# The arrays readers from outside index (monitor.py), with their dtype and this version's shape
# (None: any length, at least one).  Attaching compares the whole layout with its own.
_READ = {
    HEADER_ARRAY: (np.dtype(np.int64), (HEADER_LEN,)),
    LIMITS_ARRAY: (np.dtype(np.float64), (LIMITS_LEN,)),
    LANES_ARRAY: (np.dtype(np.int64), (None, LANE_LEN)),
    WRITERS_ARRAY: (np.dtype(np.int64), (MAX_WRITERS, WRITER_LEN)),
}
_IF_THERE = {LOCK_ARRAY: (np.dtype(np.uint8), (LOCK_NBYTES,))}  # local buffers have no lock in their memory


class ManifestError(ValueError):
    """A segment holds a manifest that this version of mpreplay cannot read; the message says why."""


def encode(description: dict[str, Any], out: np.ndarray, *, owner: int, created: float) -> None:
    """Write the manifest of a buffer into the manifest array ``out``: ``description`` (what its
    configuration and layout say, JSON-serialisable), the creator's process token ``owner`` and
    the creation time ``created``; the format and mpreplay versions are added.

    A document too large for the array loses its ``fields`` entry (``fields_omitted`` says
    so): the layout, which the reader needs, is always kept.
    """
    text = _text(_document(description, owner, created))
    data = np.frombuffer(_HEAD.pack(MAGIC, len(text)) + text, np.uint8)
    # The magic last: a process polling for the table by name (mpreplay.attach) takes a segment
    # without it for one still being made.
    out[len(MAGIC) : len(data)] = data[len(MAGIC) :]
    out[: len(MAGIC)] = data[: len(MAGIC)]


def _document(description: dict[str, Any], owner: int, created: float) -> dict[str, Any]:
    """The document :func:`encode` writes for these arguments, as :func:`decode` reads it back."""
    document = {"version": VERSION, "mpreplay_version": __version__, **description, "owner": owner, "created": created}
    if _HEAD.size + len(_text(document)) > NBYTES:
        document = {**document, "fields": {}, "fields_omitted": True}
    if _HEAD.size + len(_text(document)) > NBYTES:
        raise ValueError(f"manifest: {len(_text(document))} bytes of layout do not fit in {NBYTES}")
    return json.loads(_text(document))


def _text(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def decode(head: bytes, size: int | None = None) -> dict[str, Any] | None:
    """The document in ``head`` (the first ``NBYTES`` bytes of a segment, or more) of a segment
    of ``size`` bytes (None: not checked against the segment's size).

    None when ``head`` does not start with ``MAGIC`` (not a buffer's segment: a
    ``ParameterStore``'s, say); :class:`ManifestError` when it holds a manifest this version
    cannot read: damaged, of another format version, or describing arrays that readers could
    not index or that lie outside the segment.
    """
    document = _json(head)
    if document is not None:
        if document.get("version") != VERSION:
            raise ManifestError(
                f"manifest format {_short(document.get('version'))} (written by "
                f"{_maker(document)}); mpreplay {__version__} reads format {VERSION}"
            )
        _check(document, size)
    return document


def _json(head: bytes) -> dict[str, Any] | None:
    """The JSON object after the magic, unchecked; None without the magic."""
    if bytes(head[: len(MAGIC)]) != MAGIC:
        return None
    if len(head) < _HEAD.size:
        raise ManifestError(f"the manifest is cut after {len(head)} bytes")
    length = _HEAD.unpack_from(head)[1]
    room = min(len(head), NBYTES) - _HEAD.size
    if not 0 < length <= room:
        raise ManifestError(f"its length field says {length} bytes of JSON, the manifest holds 1 to {room}")
    try:
        document = json.loads(bytes(head[_HEAD.size : _HEAD.size + length]), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ManifestError(f"the manifest is not UTF-8 JSON ({type(exc).__name__}: {_short(str(exc))})") from None
    if not isinstance(document, dict):
        raise ManifestError(f"the manifest is {_short(document)}, not a JSON object")
    return document


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a manifest holds")


def _maker(document: dict[str, Any]) -> str:
    """Which mpreplay wrote ``document``, as far as it says."""
    version = document.get("mpreplay_version")
    return f"mpreplay {version}" if isinstance(version, str) else "an mpreplay version that does not say which"


def _whole(value: Any) -> bool:
    return type(value) is int and value >= 0


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _sequence(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict) and all(_whole(value.get(key)) and value[key] >= 1 for key in ("length", "period"))
    )


# What each entry of a document must be: (test, what the message says was expected).
_ENTRIES = {
    "mpreplay_version": (lambda v: isinstance(v, str), "a version string"),
    "class": (lambda v: isinstance(v, str) and v.isidentifier(), "a class name"),
    "owner": (lambda v: _whole(v) and v < 2**63 and token_pid(v) > 0, "a process token (a pid and a start time)"),
    "created": (lambda v: type(v) in (int, float) and 0 <= v <= _LATEST, "a time in seconds since 1970"),
    "selector": (lambda v: v in selectors.names(), f"a selector's name {list(selectors.names())}"),
    "remover": (lambda v: v in removers.names(), f"a remover's name {list(removers.names())}"),
    "fields": (lambda v: isinstance(v, dict), "an object"),
    "next_of": (_names, "a list of field names"),
    "stack_compress": (_names, "a list of field names"),
    "sequence": (_sequence, "null or {'length': integer >= 1, 'period': integer >= 1}"),
    "nbytes": (_whole, "a size in bytes"),
    "capacity": (lambda v: _whole(v) and v >= 1, "an integer >= 1"),
    "arrays": (lambda v: isinstance(v, list), "a list of [name, shape, dtype, offset]"),
    "persist": (lambda v: isinstance(v, bool), "true or false"),
    "build": (lambda v: isinstance(v, dict), "an object (the table's constructor arguments)"),
}


def _check(document: dict[str, Any], size: int | None) -> None:
    """Raise :class:`ManifestError` naming the first entry of ``document`` a reader cannot rely on."""
    for key, (test, expected) in _ENTRIES.items():
        if key not in document:
            raise ManifestError(f"manifest entry {key!r} is missing")
        if not test(document[key]):
            raise ManifestError(f"manifest entry {key!r}: expected {expected}, got {_short(document[key])}")
    nbytes, capacity = document["nbytes"], document["capacity"]
    if size is not None and nbytes > size:
        raise ManifestError(f"the manifest describes {nbytes} bytes, the segment holds {size}")
    if capacity > nbytes:  # every slot takes at least its state byte
        raise ManifestError(f"a capacity of {capacity} slots does not fit in {nbytes} bytes")
    arrays: dict[str, tuple[list[int], np.dtype]] = {}
    for entry in document["arrays"]:
        name, shape, dtype = _array(entry, nbytes)
        if name in arrays:
            raise ManifestError(f"the manifest lists array {_short(name)} twice")
        arrays[name] = shape, dtype
    need = {**_READ, **{name: want for name, want in _IF_THERE.items() if name in arrays}}
    array, length, dtype = selectors.state_array(document["selector"], capacity)
    need[array] = dtype, (length,)
    for name, (want_dtype, want_shape) in need.items():
        if name not in arrays:
            raise ManifestError(f"the manifest has no {name!r} array")
        have, have_dtype = arrays[name]
        if (
            have_dtype != want_dtype
            or len(have) != len(want_shape)
            or any(d < 1 if want is None else d != want for d, want in zip(have, want_shape, strict=True))
        ):
            raise ManifestError(
                f"array {name!r} is {have_dtype} of shape {tuple(have)}, readers index "
                f"{want_dtype} of shape {tuple('n' if d is None else d for d in want_shape)}"
            )


def _array(entry: Any, nbytes: int) -> tuple[str, list[int], np.dtype]:
    """``(name, shape, dtype)`` of one entry of ``arrays``, checked to lie within ``nbytes``."""
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
        raise ManifestError(f"an array entry is {_short(entry)}; expected [name, shape, dtype, offset]")
    name, shape, code, offset = entry
    if not (isinstance(shape, list) and len(shape) <= _MAX_RANK and all(_whole(d) for d in shape)):
        raise ManifestError(f"array {_short(name)}: shape {_short(shape)} is not a list of at most {_MAX_RANK} sizes")
    if not (isinstance(code, str) and _DTYPE.fullmatch(code)):
        raise ManifestError(f"array {_short(name)}: dtype {_short(code)} is not a numeric dtype")
    try:
        dtype = np.dtype(code)
    except TypeError:
        raise ManifestError(f"array {_short(name)}: dtype {_short(code)} is not a numeric dtype") from None
    if dtype.str != code:
        raise ManifestError(
            f"array {_short(name)}: dtype {_short(code)} is not written as numpy writes it ({dtype.str!r})"
        )
    if not (_whole(offset) and offset % _WORD == 0):
        raise ManifestError(f"array {_short(name)}: offset {_short(offset)} is not a multiple of {_WORD} bytes")
    # Empty dimensions aside, no array has more items than its segment has bytes (numpy refuses
    # shapes whose product overflows, even with an empty dimension).
    end = offset + math.prod(shape) * dtype.itemsize
    if math.prod(max(d, 1) for d in shape) > nbytes or end > nbytes:
        raise ManifestError(
            f"array {_short(name)} of shape {tuple(shape)} {dtype} at offset {offset} "
            f"lies past the {nbytes} bytes of the segment"
        )
    return name, shape, dtype


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def creator_token(head: np.ndarray) -> int:
    """The creator's process token in the manifest array ``head`` of a segment that
    :func:`check_segment` accepted."""
    document = _json(bytes(head))
    assert document is not None, "a segment check_segment accepted has a manifest"
    return int(document["owner"])


def readable(name: str, head: bytes, size: int) -> dict[str, Any] | None:
    """The manifest of segment ``name`` (``head``: its first ``NBYTES`` bytes; ``size``: its
    size), if this process may attach to what it describes; None when ``head`` holds no
    manifest (yet: a new segment's is written last).  Raises
    :class:`~mpreplay.IncompatibleSegmentError` for a manifest that is unreadable, of another
    format, or written by another minor version of mpreplay."""
    try:
        document = _json(head)
    except ManifestError as exc:
        raise IncompatibleSegmentError(
            f"{name}: its manifest is unreadable ({exc}); this process runs {_ours()}; refusing to attach"
        ) from None
    if document is None:
        return None
    try:
        decode(head, size)
    except ManifestError as exc:
        raise IncompatibleSegmentError(
            f"{name}: made by {_theirs(document)}, which {_ours()} cannot read: {exc}; refusing to attach"
        ) from None
    if _minor(document["mpreplay_version"]) != _minor(__version__):
        raise IncompatibleSegmentError(
            f"{name}: made by {_theirs(document)}, this process runs {_ours()}; segments are shared within a minor "
            f"version only (any patch version of {_minor(__version__)}.x attaches); refusing to attach"
        )
    return document


def _ours() -> str:
    return f"mpreplay {__version__} (manifest format {VERSION})"


def _theirs(document: dict[str, Any]) -> str:
    return f"{_maker(document)} (manifest format {_short(document.get('version'))})"


def check_segment(name: str, buf: memoryview, description: dict[str, Any]) -> None:
    """Raise :class:`~mpreplay.IncompatibleSegmentError` unless segment ``name``, mapped as
    ``buf``, holds the manifest a buffer of ``description`` writes (see :func:`encode`).

    What an attaching process calls before it uses a single offset: the segment must have been
    made by the same minor version of mpreplay (any patch version: 0.3.1 attaches to 0.3.0's),
    with the same manifest format, class, configuration and layout (every array's name, shape,
    dtype and offset, and the layout's size).  Only the patch version, the owner and the
    creation time may differ.  ``buf`` is not kept.
    """
    document = readable(name, bytes(buf[:NBYTES]), len(buf))
    if document is None:
        raise IncompatibleSegmentError(
            f"{name}: holds no mpreplay manifest (not a replay buffer's segment); refusing to attach"
        )
    # The formats and the layout decide, not the patch version (docs/stability.md).
    expected = {**_document(description, document["owner"], document["created"])}
    expected["mpreplay_version"] = document["mpreplay_version"]
    difference = _difference(document, expected)
    if difference is not None:
        raise IncompatibleSegmentError(
            f"{name}: made by {_theirs(document)}, this process runs {_ours()}; the segment is not what this "
            f"process expects: {difference}; refusing to attach (every process of a job must run the same minor "
            "version of mpreplay)"
        )


def _minor(version: str) -> str:
    """``version``'s major and minor parts, ``"0.3"`` of ``"0.3.1"`` (the whole string if it has none)."""
    match = re.match(r"\d+\.\d+", version)
    return match.group() if match else version


def _difference(found: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The first entry of ``found`` that differs from ``expected``, described; None if none does."""
    for key in [*expected, *(k for k in found if k not in expected)]:
        if key not in found or key not in expected:
            return f"{key!r} is {'missing' if key not in found else 'unknown'} in the segment"
        theirs, ours = found[key], expected[key]
        if _same(theirs, ours):
            continue
        if key == "arrays":
            for i in range(max(len(theirs), len(ours))):
                a = theirs[i] if i < len(theirs) else None
                b = ours[i] if i < len(ours) else None
                if not _same(a, b):
                    return (
                        f"array {i}: {_entry(a)} in the segment, {_entry(b)} expected "
                        f"(layouts of {found['nbytes']} and {expected['nbytes']} bytes)"
                    )
        return f"{key!r} is {_short(theirs)} in the segment, {_short(ours)} expected"
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same JSON (Python's == takes true for 1 and 1.0 for 1)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _entry(entry: list[Any] | None) -> str:
    if entry is None:
        return "none"
    name, shape, dtype, offset = entry
    return f"{name!r} of shape {tuple(shape)} {dtype} at offset {offset}"
