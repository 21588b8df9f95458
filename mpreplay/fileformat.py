"""The transitions file format (version 3): rows of transitions <-> a file.

The buffers' ``save_transitions`` / ``load_transitions`` use it; this module knows rows, field
specs and files, and nothing of the buffers.  The archive around the arrays (opened only once its
members' sizes are possible, written atomically) is :mod:`mpreplay.npz_archive`'s.

File format
-----------
A transitions file is one ``.npz`` archive (a zip of ``.npy`` arrays, deflated or stored) holding
only plain numeric arrays:

``metadata.json``
    uint8, shape ``(n,)``: the UTF-8 bytes of a JSON object::

        {"format_version": 3,
         "mpreplay_version": "<the version that wrote it>",
         "fields": [{"name": "obs", "shape": [84, 84], "dtype": "|u1"},
                    {"name": "act", "shape": [], "dtype": "<i8"}, ...],
         "nstep": null,
         "compression": null,
         "safe": true,
         "count": 1000,
         "priorities": false,
         "episodes": false,
         "order": false}

    ``fields`` are the buffer's field specs (dtype as numpy's ``dtype.str``); ``nstep`` is
    ``null`` for one-step transitions, else ``{"size": n, "gamma": g}``: the rewards were already
    folded over ``n`` steps; ``compression`` is the layout of the arrays, ``null`` for plain
    transitions (other values are reserved for the compressed internal layout ``safe=False`` may
    store in a later version); ``safe`` is the flag the file was saved with; ``count`` is the
    number of transitions; ``priorities``, ``episodes`` and ``order`` tell which of the arrays
    below are present.

``<field>``, one per entry of ``fields``
    shape ``(count,) + shape``, the field's dtype, C order, oldest transition first.

``priorities``, only when ``"priorities": true``
    float64, shape ``(count,)``: each transition's raw priority (before ``eps`` and ``alpha``).

``episode.id`` and ``episode.lane``, only when ``"episodes": true``
    int64, shape ``(count,)``: each row's episode, numbered 0, 1, ... in the order of the rows (an
    episode's rows are consecutive), and the lane of the saving buffer it was stored in (a lane's
    rows are consecutive, oldest first; an episode is in one lane).  Its first row may be a later
    step than the episode's first (a lane keeps the newest rows).  The names are no identifiers,
    so no field can take them.  A compressed buffer (``next_of``, ``stack_compress``) rebuilds a
    row from the rows around it in its episode, and a sequence buffer's rows are steps, so their
    files record them; an uncompressed transition buffer's does not.

``insertion.order``, only when ``"order": true``
    int64, shape ``(count,)``, a permutation of ``0 .. count - 1``: each row's place in the order
    the saving buffer's selector was given the rows -- in the file of a compressed buffer with an
    ordered selector (``fifo``, ``lifo``, heaps), whose rows are listed by episode, lane by lane,
    while its selector draws in the order the lanes' rows were inserted.  Loading gives the rows
    that order back.

Version 2 is version 3 without ``order`` (nor its array), version 1 version 2 without
``episodes``; both are still read (a version 2 file of several lanes loads lane by lane), except
version 1 by a sequence buffer, which needs each step's lane and episode (a compressed
transition buffer loads it as one episode, as before).

Plain numpy reads it all (``np.load(path, allow_pickle=False)``, docs/files.md).  Loading never
unpickles either: each array's ``.npy`` header (shape, dtype, byte count) is checked against the
metadata before its data is read, and only numeric dtypes are accepted.  Every way a file can be
wrong -- not an archive, damaged or truncated bytes, an unknown format version, fields, shapes,
dtypes or n-step settings that differ from the buffer's (a scalar field is one whether saved as
``()`` or as ``(1,)``), a count that disagrees with the arrays, negative or non-finite
priorities, episodes or lanes whose rows are not consecutive, an order that is no permutation --
raises :class:`TransitionFileError` (a ``ValueError``) before the buffer changes.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checks
from ._version import __version__
from .npz_archive import (
    NPY_HEADERS,
    File,
    TransitionFileError,
    damaged,
    open_archive,
    read_npy_header,
    short,
    write_archive,
)
from .spec import FieldSpec, parse_env_dict

__all__ = [
    "EPISODE_ID",
    "EPISODE_LANE",
    "FORMAT_VERSION",
    "INSERTION_ORDER",
    "TransitionFileError",
    "inspect",
    "read_metadata",
    "read_transitions",
    "write_transitions",
]

FORMAT_VERSION = 3  # what this module writes; it reads 1 to 3
METADATA = "metadata.json"  # not an identifier, so no field can take the name
PRIORITIES = "priorities"  # reserved by the field specs, so no field can take it either
EPISODE_ID = "episode.id"  # no identifiers either
EPISODE_LANE = "episode.lane"
INSERTION_ORDER = "insertion.order"
_KEYS_V1 = {"format_version", "mpreplay_version", "fields", "nstep", "compression", "safe", "count", "priorities"}
_KEYS = {1: _KEYS_V1, 2: _KEYS_V1 | {"episodes"}, 3: _KEYS_V1 | {"episodes", "order"}}
_MAX_METADATA_BYTES = 1 << 20
_CHUNK = 1 << 22  # bytes read from a member at a time: no second copy of a large array


# -- public API --------------------------------------------------------------------------------


def write_transitions(
    file: File,
    rows: dict[str, np.ndarray],
    specs: dict[str, FieldSpec],
    *,
    nstep: tuple[int, float] | None = None,
    priorities: np.ndarray | None = None,
    episodes: tuple[np.ndarray, np.ndarray] | None = None,
    order: np.ndarray | None = None,
    safe: bool = True,
    compress: bool = True,
) -> None:
    """Write ``rows`` (fields of the same length, oldest first) to ``file`` (a path or a binary file object).

    ``specs`` are the fields' specs, ``nstep`` the ``(size, gamma)`` the rows were
    folded with, ``priorities`` their raw priorities, if any; ``episodes`` the
    ``(episode.id, episode.lane)`` of steps, ``order`` the rows' ``insertion.order`` (see the
    module docstring).  ``compress`` deflates
    the arrays (as ``np.savez_compressed``), else stores them (as ``np.savez``);
    ``safe`` is recorded.  A path is written atomically: a temporary file in the
    same folder, flushed to disk, then renamed over ``file``.
    """
    safe, compress = checks.flag("safe", safe), checks.flag("compress", compress)
    record = {
        "format_version": FORMAT_VERSION,
        "mpreplay_version": __version__,
        "fields": [spec.to_json() for spec in specs.values()],
        "nstep": _nstep_json(nstep),
        "compression": None,
        "safe": safe,
        "count": len(next(iter(rows.values()))),
        "priorities": priorities is not None,
        "episodes": episodes is not None,
        "order": order is not None,
    }
    metadata = np.frombuffer(json.dumps(record, allow_nan=False).encode(), dtype=np.uint8)
    arrays: dict[str, np.ndarray] = {METADATA: metadata}
    arrays.update((name, rows[name]) for name in specs)
    if priorities is not None:
        arrays[PRIORITIES] = priorities
    if episodes is not None:
        arrays[EPISODE_ID], arrays[EPISODE_LANE] = (np.asarray(a, dtype=np.int64) for a in episodes)
    if order is not None:
        arrays[INSERTION_ORDER] = np.asarray(order, dtype=np.int64)

    write_archive(file, arrays, compress)


def read_transitions(
    file: File,
    specs: dict[str, FieldSpec],
    *,
    nstep: tuple[int, float] | None = None,
    episodes: bool | None = False,
    order: bool = False,
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """``(rows, priorities or None)`` saved in ``file``, checked to be transitions of ``specs``
    folded with ``nstep`` (as :func:`write_transitions` takes them); a scalar field saved as
    ``(1,)`` (cpprb's shape of a field given none, which its compat layer keeps) is read as ``()``,
    and the reverse, each in its field's shape in ``specs``.  With ``episodes``
    the file must record each step's episode and lane, and ``rows`` holds them as
    ``rows[EPISODE_ID]`` and ``rows[EPISODE_LANE]``; with None, ``rows`` holds them when
    the file records them; with False, they are left out.  With ``order``, ``rows`` holds
    ``rows[INSERTION_ORDER]`` when the file records it.

    The whole file is read and checked first; anything wrong raises
    :class:`TransitionFileError`.
    """
    with open_archive(file) as archive:
        meta = _read_metadata(archive)
        _check_fits(meta, specs, nstep)
        if episodes and not meta.episodes:
            if meta.version == 1:
                raise TransitionFileError(
                    f"file: format version 1 records no episode or lane per step, which a sequence buffer needs "
                    f"to load its episodes apart; mpreplay {__version__} writes format version {FORMAT_VERSION} "
                    "(read the old file's arrays with numpy and add() its episodes)"
                )
            raise TransitionFileError(
                "file: it records no episode or lane per step (it was not saved by a sequence buffer)"
            )
        arrays = _read_arrays(archive, meta)
    for name, spec in specs.items():
        # In the buffer's shape: a scalar field may have been saved as (1,), cpprb's shape, or ().
        arrays[name] = arrays[name].reshape((meta.count,) + spec.shape)
    if episodes is False:
        for name in (EPISODE_ID, EPISODE_LANE):
            arrays.pop(name, None)
    if not order:
        arrays.pop(INSERTION_ORDER, None)
    return arrays, arrays.pop(PRIORITIES, None)


def read_metadata(file: File) -> dict[str, Any]:
    """The metadata record of a transitions file (checked, arrays not read)."""
    with open_archive(file) as archive:
        return _read_metadata(archive).record


def inspect(file: File) -> str:
    """A printable summary of a transitions file: its metadata and, per array,
    count, shape, dtype, min and max.  The whole file is read and checked."""
    with open_archive(file) as archive:
        meta = _read_metadata(archive)
        arrays = _read_arrays(archive, meta)
    width = max(len(key) for key in meta.record)
    lines = [f"{key:<{width}}  {json.dumps(value)}" for key, value in meta.record.items() if key != "fields"]
    table = [("array", "count", "shape", "dtype", "min", "max")]
    for name, array in arrays.items():
        low, high = (_scalar(array.min()), _scalar(array.max())) if array.size else ("-", "-")
        table.append((name, str(len(array)), str(array.shape[1:]), str(array.dtype), low, high))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines.append("")
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return "\n".join(lines)


# -- writing -----------------------------------------------------------------------------------


def _nstep_json(nstep: tuple[int, float] | None) -> dict[str, Any] | None:
    return None if nstep is None else {"size": nstep[0], "gamma": nstep[1]}


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Metadata:
    record: dict[str, Any]  # the JSON object, as stored
    version: int
    specs: dict[str, FieldSpec]
    nstep: tuple[int, float] | None
    count: int
    priorities: bool
    episodes: bool
    order: bool

    def arrays(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of every array besides the metadata record."""
        out = {name: ((self.count,) + spec.shape, spec.dtype) for name, spec in self.specs.items()}
        if self.priorities:
            out[PRIORITIES] = ((self.count,), np.dtype(np.float64))
        labels = [EPISODE_ID, EPISODE_LANE] * self.episodes + [INSERTION_ORDER] * self.order
        out.update((name, ((self.count,), np.dtype(np.int64))) for name in labels)
        return out


def _read_metadata(archive: zipfile.ZipFile) -> _Metadata:
    members = archive.namelist()
    if len(set(members)) != len(members):
        raise TransitionFileError("file: the archive lists an array twice")
    if f"{METADATA}.npy" not in members:
        raise TransitionFileError(f"file: not an mpreplay transitions file (no {METADATA!r} record)")
    meta = _parse_metadata(_read_array(archive, METADATA, None, np.dtype(np.uint8)).tobytes())
    expected = [f"{name}.npy" for name in meta.arrays()]  # in order: the first missing one is named
    for member in members:
        if member not in expected and member != f"{METADATA}.npy":
            raise TransitionFileError(
                f"file: unexpected array {short(member.removesuffix('.npy'))} (not in the metadata)"
            )
    for member in expected:
        if member not in members:
            raise TransitionFileError(
                f"file: the metadata lists {member.removesuffix('.npy')!r} but the archive has no such array"
            )
    return meta


def _parse_metadata(raw: bytes) -> _Metadata:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise TransitionFileError(f"file: the metadata record is not UTF-8 JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise TransitionFileError("file: the metadata record is not a JSON object")
    version = record.get("format_version")
    if type(version) is not int or version not in _KEYS:
        raise TransitionFileError(
            f"file: unsupported format version {short(version)}; "
            f"mpreplay {__version__} reads versions 1 to {FORMAT_VERSION}"
        )
    keys = _KEYS[version]
    if record.keys() != keys:
        missing, unknown = sorted(keys - record.keys()), sorted(record.keys() - keys)
        raise TransitionFileError(
            f"file: metadata keys of format version {version}: missing {missing}, unknown {short(unknown)}"
        )
    if not isinstance(record["mpreplay_version"], str):
        raise TransitionFileError("file: metadata 'mpreplay_version': expected a string")
    for key in ("safe", "priorities", "episodes", "order"):
        if key in record and type(record[key]) is not bool:
            raise TransitionFileError(f"file: metadata {key!r}: expected true or false, got {short(record[key])}")
    count = record["count"]
    if type(count) is not int or count < 0:
        raise TransitionFileError(f"file: metadata 'count': expected an integer >= 0, got {short(count)}")
    if record["compression"] is not None:
        raise TransitionFileError(
            f"file: compression layout {short(record['compression'])} is not supported "
            f"by mpreplay {__version__} (it reads plain transitions only)"
        )
    return _Metadata(
        record,
        version,
        _parse_fields(record["fields"]),
        _parse_nstep(record["nstep"]),
        count,
        record["priorities"],
        record.get("episodes", False),
        record.get("order", False),
    )


def _parse_fields(fields: Any) -> dict[str, FieldSpec]:
    if not isinstance(fields, list) or not fields:
        raise TransitionFileError("file: metadata 'fields': expected a non-empty list")
    env_dict: dict[str, dict[str, Any]] = {}
    for field in fields:
        if not (
            isinstance(field, dict)
            and field.keys() == {"name", "shape", "dtype"}
            and isinstance(field["name"], str)
            and isinstance(field["shape"], list)
            and isinstance(field["dtype"], str)
        ):
            raise TransitionFileError(
                "file: metadata 'fields': expected objects "
                f"{{'name': str, 'shape': [int, ...], 'dtype': str}}, got {short(field)}"
            )
        if field["name"] in env_dict:
            raise TransitionFileError(f"file: metadata 'fields': {field['name']!r} is listed twice")
        env_dict[field["name"]] = {"shape": tuple(field["shape"]), "dtype": field["dtype"]}
    try:
        return parse_env_dict(env_dict)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TransitionFileError(f"file: metadata 'fields': {exc}") from exc


def _parse_nstep(nstep: Any) -> tuple[int, float] | None:
    if nstep is None:
        return None
    if (
        isinstance(nstep, dict)
        and nstep.keys() == {"size", "gamma"}
        and type(nstep["size"]) is int
        and nstep["size"] >= 1
        and type(nstep["gamma"]) in (int, float)
        and 0.0 <= nstep["gamma"] <= 1.0
    ):
        return nstep["size"], float(nstep["gamma"])
    raise TransitionFileError(
        "file: metadata 'nstep': expected null or {'size': integer >= 1, "
        f"'gamma': number in [0, 1]}}, got {short(nstep)}"
    )


def _check_fits(meta: _Metadata, ours: dict[str, FieldSpec], nstep: tuple[int, float] | None) -> None:
    """Raise unless the file's transitions are transitions of ``ours`` folded with ``nstep``."""
    if meta.nstep != nstep:
        raise TransitionFileError(
            f"nstep: the file holds {_describe_nstep(meta.nstep)} but the buffer stores "
            f"{_describe_nstep(nstep)}; loading would fold rewards twice or not at all"
        )
    theirs = meta.specs
    missing, extra = [n for n in ours if n not in theirs], [n for n in theirs if n not in ours]
    if missing or extra:
        raise TransitionFileError(
            f"file: its fields {list(theirs)} differ from the buffer's {list(ours)} (missing {missing}, extra {extra})"
        )
    for name, spec in ours.items():
        other = theirs[name]
        if other.dtype != spec.dtype or not _same_values(other.shape, spec.shape):
            raise TransitionFileError(
                f"field {name!r}: the file stores shape {other.shape} {other.dtype}, "
                f"the buffer expects shape {spec.shape} {spec.dtype}"
            )


def _same_values(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether a field of shape ``a`` holds the values of one of shape ``b``: the same shape, or one
    scalar per transition, ``()`` in the native buffers and ``(1,)`` in cpprb's (and its compat
    layer's) for a field given no shape."""
    return a == b or {a, b} == {(), (1,)}


def _read_arrays(archive: zipfile.ZipFile, meta: _Metadata) -> dict[str, np.ndarray]:
    arrays = {name: _read_array(archive, name, shape, dtype) for name, (shape, dtype) in meta.arrays().items()}
    priorities = arrays.get(PRIORITIES)
    if priorities is not None:
        bad = ~(np.isfinite(priorities) & (priorities >= 0))
        if bad.any():
            raise TransitionFileError(
                f"file: priorities must be finite and >= 0, found {priorities[bad][0]} "
                f"(transition {int(np.argmax(bad))})"
            )
    if meta.episodes:
        _check_episodes(arrays[EPISODE_ID], arrays[EPISODE_LANE])
    if meta.order and not np.array_equal(np.sort(arrays[INSERTION_ORDER]), np.arange(meta.count)):
        raise TransitionFileError(f"file: array {INSERTION_ORDER!r}: expected a permutation of 0 .. count - 1")
    return arrays


def _check_episodes(ids: np.ndarray, lanes: np.ndarray) -> None:
    """Raise unless ``ids`` number the episodes 0, 1, ... in the order of their rows, each
    episode in one lane, each lane's rows one after another."""
    if not len(ids):
        return
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    bad = np.flatnonzero(ids != np.cumsum(first) - 1)
    if bad.size:
        i = int(bad[0])
        raise TransitionFileError(
            f"file: array {EPISODE_ID!r}: expected the episodes numbered 0, 1, ... in the "
            f"order of their rows (each episode's rows one after another), row {i} has {ids[i]}"
        )
    bad = np.flatnonzero(lanes < 0)
    if bad.size:
        raise TransitionFileError(
            f"file: array {EPISODE_LANE!r}: expected lanes >= 0, row {int(bad[0])} has {lanes[bad[0]]}"
        )
    moved = np.flatnonzero(lanes[1:] != lanes[:-1]) + 1
    inside = moved[~first[moved]]
    if inside.size:
        i = int(inside[0])
        raise TransitionFileError(
            f"file: episode {ids[i]} is in lanes {lanes[i - 1]} and {lanes[i]} (rows {i - 1} "
            f"and {i}); an episode's steps are in one lane"
        )
    blocks = lanes[np.concatenate(([0], moved))]
    seen, where = np.unique(blocks, return_index=True)
    if len(seen) != len(blocks):
        again = int(blocks[np.setdiff1d(np.arange(len(blocks)), where)[0]])
        raise TransitionFileError(f"file: the rows of lane {again} are not one after another")


def _read_array(archive: zipfile.ZipFile, name: str, shape: tuple[int, ...] | None, dtype: np.dtype) -> np.ndarray:
    """Read member ``name`` after checking its header says ``shape`` (None: any
    1-D length up to the metadata limit) and ``dtype`` (in either byte order)."""
    info = archive.getinfo(f"{name}.npy")
    with damaged(f"array {name!r} is damaged or truncated"), archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in NPY_HEADERS:
            raise TransitionFileError(f"file: array {name!r} has .npy format version {version}, expected 1.0 or 2.0")
        file_shape, fortran, file_dtype = read_npy_header(version, member)
        if shape is None and len(file_shape) == 1 and file_shape[0] <= _MAX_METADATA_BYTES:
            shape = file_shape
        if fortran or file_shape != shape or file_dtype.newbyteorder("=") != dtype:
            order = ", Fortran order" if fortran else ""
            expected = f"shape {shape}" if shape is not None else f"at most {_MAX_METADATA_BYTES} items"
            raise TransitionFileError(
                f"file: array {name!r} is shape {file_shape} {file_dtype}{order}; expected {expected} {dtype}"
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if info.file_size != member.tell() + nbytes:
            raise TransitionFileError(
                f"file: array {name!r} holds {info.file_size - member.tell()} bytes of data, its header says {nbytes}"
            )
        out = np.empty(shape, file_dtype)
        flat = out.reshape(-1).view(np.uint8)
        for start in range(0, nbytes, _CHUNK):
            # zipfile checks the member's CRC once its last byte is read.
            chunk = member.read(min(_CHUNK, nbytes - start))
            if len(chunk) != min(_CHUNK, nbytes - start):
                raise TransitionFileError(f"file: array {name!r} is truncated")
            flat[start : start + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
    return out.astype(dtype, copy=False)


def _describe_nstep(nstep: tuple[int, float] | None) -> str:
    if nstep is None:
        return "one-step transitions"
    return f"rewards folded over {nstep[0]} steps with gamma {nstep[1]}"


def _scalar(value: np.generic) -> str:
    return f"{value.item():.6g}" if isinstance(value, np.floating) else str(value.item())
