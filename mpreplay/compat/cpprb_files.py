"""Reading the files cpprb's ``ReplayBuffer.save_transitions`` writes, without running any code from them.

cpprb's own ``load_transitions`` calls ``np.load(file, allow_pickle=True)``: a
crafted file runs whatever it likes on loading.  This reader unpickles with an
unpickler that admits only the handful of numpy constructors cpprb's files
use, checks every argument before any numpy code sees it, and refuses the
rest with :class:`~mpreplay.fileformat.TransitionFileError` (a ``ValueError``).

What cpprb writes
-----------------
``save_transitions`` exists since cpprb 10.1.0 and has not changed up to 11.0.0;
it defines one format version, 1.  (cpprb 9 has no ``save_transitions``.)  The
file is an ``np.savez_compressed`` archive of six ``.npy`` members:

``safe``, ``Nstep``
    0-d bool: the layout of ``data``; whether the buffer folded rewards over
    n steps (the stored rows are already folded).
``version``
    0-d integer: 1.
``data``
    a pickled 0-d object array holding ``{field: array}``.
``cache``
    a pickled 0-d object array holding None (safe layout) or ``{slot: {key: array}}``.
``next_of``
    a pickled 0-d object array holding None, or (unsafe layout of a buffer
    with ``next_of``) a plain unicode array of the field names.

*Safe layout* (``safe=True``, or a buffer with neither ``next_of`` nor
``stack_compress``): ``data`` is the buffer's ``get_all_transitions()``.

*Unsafe layout* (``safe=False`` on a buffer with ``next_of`` or
``stack_compress``): ``data`` is the buffer's storage, slots ``0 .. n-1`` for
``n`` stored transitions, without the ``next_<name>`` fields.  Transition ``i``
is row ``i`` of ``data`` with ``next_<name>`` = ``data[name][(i + 1) % n]``,
except for the slots ``cache`` lists (episode ends, the newest transition,
rows whose stacked frames were overwritten): their entries hold the true
``next_<name>`` and stacked values.  Slot order is the buffer's, as
``get_all_transitions()`` returns it.

What the reader admits
----------------------
Plain members are read by numpy with pickles disallowed, after their ``.npy``
header has been checked against the bytes that follow (numpy allocates what a
header says before it reads).  A pickled member is read by the restricted
unpickler of :mod:`mpreplay.compat.cpprb_pickles`, which builds numpy's array
pickles and nothing else; this module then accepts only the dicts of arrays
described above, and copies them into arrays of its own (peak memory: the
transitions plus their largest field).
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from ..npz_archive import (
    NPY_HEADERS,
    File,
    TransitionFileError,
    damaged,
    open_archive,
    quiet_npy_parser,
    read_npy_header,
)
from .cpprb_pickles import (
    describe_array,
    describe_found,
    is_unicode,
    numeric_view,
    scan,
    short,
    unpickle,
    unwrap,
)

__all__ = ["CpprbFile", "read_cpprb_file", "read_cpprb_transitions"]

_VERSION = 1  # the only format version cpprb has written
_MEMBERS = ("safe", "version", "data", "Nstep", "cache", "next_of")


@dataclass(frozen=True)
class CpprbFile:
    """What a cpprb transitions file holds."""

    transitions: dict[str, np.ndarray]
    """Field name -> rows, as the saving buffer's ``get_all_transitions()`` returned them."""
    nstep: bool
    """The saving buffer folded rewards over n steps (cpprb refuses to load such a file into a
    buffer without ``Nstep``, and the other way round)."""
    safe: bool
    """The file has the safe layout (``data`` was ``get_all_transitions()``)."""


def read_cpprb_transitions(file: File) -> dict[str, np.ndarray]:
    """The transitions in ``file`` (a path or a binary file object), a file cpprb's
    ``ReplayBuffer.save_transitions`` wrote (cpprb 10.1 to 11, either layout, with or
    without ``next_of``, ``stack_compress`` and ``Nstep``).

    Returns field name -> array, exactly as ``get_all_transitions()`` of the saving
    buffer returned them (same names, order, shapes, dtypes and values, slot order),
    in native byte order; the caller owns the arrays.  Nothing in the file is
    executed: anything but the plain dict of numeric arrays cpprb writes raises
    :class:`~mpreplay.fileformat.TransitionFileError` (a ``ValueError``) naming the
    file and what was found, as do damaged, truncated and malformed files.
    """
    return read_cpprb_file(file).transitions


def read_cpprb_file(file: File) -> CpprbFile:
    """The transitions of ``file`` (see :func:`read_cpprb_transitions`) with the file's
    ``Nstep`` and ``safe`` flags."""
    label = _label(file)
    with open_archive(file, label=label) as archive:
        _check_members(archive, label)
        version = _plain(archive, "version", label)
        if version.shape != () or version.dtype.kind not in "iu":
            raise TransitionFileError(f"{label}: member 'version' is {describe_array(version)}; expected an integer")
        if int(version) != _VERSION:
            raise TransitionFileError(
                f"{label}: unknown cpprb format version {int(version)}; cpprb has only written version {_VERSION}"
            )
        safe, nstep = _flag(archive, "safe", label), _flag(archive, "Nstep", label)
        data = _fields(_pickled(archive, "data", label), "data", label)
        cache = _pickled(archive, "cache", label)
        next_of = _next_of(archive, label)
    if safe:
        if cache is not None or next_of is not None:
            raise TransitionFileError(
                f"{label}: the safe layout holds no cache and no next_of, "
                f"found {describe_found(cache)} and {describe_found(next_of)}"
            )
        return CpprbFile(data, nstep, safe)
    return CpprbFile(_rebuild(data, cache, next_of or [], label), nstep, safe)


# -- the archive -------------------------------------------------------------------------------


def _label(file: Any) -> str:
    """How messages name ``file``."""
    if isinstance(file, (str, bytes, os.PathLike)):
        return f"cpprb file {os.fsdecode(file)!r}"
    name = getattr(file, "name", None)
    return f"cpprb file {name!r}" if isinstance(name, str) else f"cpprb file ({type(file).__name__})"


def _check_members(archive: zipfile.ZipFile, label: str) -> None:
    names = archive.namelist()
    expected = sorted(f"{member}.npy" for member in _MEMBERS)
    if sorted(names) != expected:
        raise TransitionFileError(
            f"{label}: not a file of cpprb's save_transitions: its members are "
            f"{short(sorted(names))}, expected {expected}"
        )


def _header(stream: IO[bytes], member: str, label: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from the ``.npy`` header at the start of ``stream``."""
    version = np.lib.format.read_magic(stream)
    if version not in NPY_HEADERS:
        raise TransitionFileError(
            f"{label}: member {member!r} has .npy format version {version}; "
            "numpy's savez writes 1.0 or 2.0 for these arrays"
        )
    return read_npy_header(version, stream)


def _member(archive: zipfile.ZipFile, member: str, label: str) -> Any:
    """Member ``member``: a plain ``np.ndarray``, read by numpy with pickles disallowed, or,
    for a 0-d object array, what its pickle holds (never an ``np.ndarray``)."""
    info = archive.getinfo(f"{member}.npy")
    with damaged(f"member {member!r} is damaged or truncated", label=label):
        with archive.open(info) as stream:
            shape, _fortran, dtype = _header(stream, member, label)
            if dtype.hasobject:
                if dtype != np.dtype(object) or shape != ():
                    raise TransitionFileError(
                        f"{label}: member {member!r} is an object array of shape {shape}, "
                        f"dtype {dtype}; cpprb writes 0-d object arrays"
                    )
                scan(stream, member, label)
            # numpy allocates what the header says before reading: check that the member holds it.
            elif dtype.itemsize == 0 or math.prod(shape) * dtype.itemsize != info.file_size - stream.tell():
                raise TransitionFileError(
                    f"{label}: member {member!r} holds {info.file_size - stream.tell()} "
                    f"bytes of data; its header says shape {shape} {dtype}"
                )
        with archive.open(info) as stream:
            if dtype.hasobject:
                _header(stream, member, label)
                return unpickle(stream, member, label)
            with quiet_npy_parser():
                array = np.lib.format.read_array(stream, allow_pickle=False)
            stream.read(1)  # reaching the end checks the member's CRC
    return array


def _plain(archive: zipfile.ZipFile, member: str, label: str) -> np.ndarray:
    value = _member(archive, member, label)
    if not isinstance(value, np.ndarray):
        raise TransitionFileError(f"{label}: member {member!r} is a pickle; cpprb stores it as a plain array")
    return value


def _pickled(archive: zipfile.ZipFile, member: str, label: str) -> Any:
    """The object that the pickled 0-d object array ``member`` holds."""
    value = _member(archive, member, label)
    if isinstance(value, np.ndarray):
        raise TransitionFileError(
            f"{label}: member {member!r} is a plain array of {describe_array(value)}; "
            "cpprb stores it as a pickled object"
        )
    return unwrap(value, member, label)


def _flag(archive: zipfile.ZipFile, member: str, label: str) -> bool:
    value = _plain(archive, member, label)
    if value.shape != () or value.dtype != np.bool_:
        raise TransitionFileError(f"{label}: member {member!r} is {describe_array(value)}; expected a bool")
    return bool(value)


def _next_of(archive: zipfile.ZipFile, label: str) -> list[str] | None:
    """The ``next_of`` field names: a pickled None, or a plain 1-d unicode array."""
    value = _member(archive, "next_of", label)
    if not isinstance(value, np.ndarray):
        held = unwrap(value, "next_of", label)
        if held is not None:
            raise TransitionFileError(
                f"{label}: member 'next_of' holds {describe_found(held)}; expected None or an array of field names"
            )
        return None
    if (
        value.ndim != 1
        or value.dtype.kind != "U"
        or not len(value)
        or not is_unicode(value)
        or len(set(value.tolist())) != len(value)
    ):
        raise TransitionFileError(
            f"{label}: member 'next_of' is {describe_array(value)}; expected distinct field names"
        )
    return value.tolist()


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=")


def _fields(value: Any, member: str, label: str) -> dict[str, np.ndarray]:
    """``value``, checked to be {field: array of rows}, every array as long, as arrays of our own."""
    if not isinstance(value, dict) or not value:
        raise TransitionFileError(
            f"{label}: member {member!r} holds {describe_found(value)}; "
            "expected a non-empty dict of field name -> array"
        )
    views = {}
    for name, array in value.items():
        if type(name) is not str:
            raise TransitionFileError(
                f"{label}: member {member!r} has the key {describe_found(name)}; expected field names"
            )
        views[name] = numeric_view(array, f"{member}[{name!r}]", label)
        if views[name].ndim == 0:
            raise TransitionFileError(f"{label}: {member}[{name!r}] is a 0-d array; expected rows")
    lengths = {name: len(array) for name, array in views.items()}
    if len(set(lengths.values())) != 1:
        raise TransitionFileError(f"{label}: the fields of member {member!r} differ in length: {short(lengths)}")
    if len({id(array) for array in value.values()}) != len(value):
        raise TransitionFileError(f"{label}: member {member!r} holds one array under two names")
    # Copy field by field, letting each view go once copied: the pickle's bytes are freed as we go.
    value.clear()
    fields = {}
    for name in list(views):
        view = views.pop(name)
        fields[name] = np.array(view, dtype=_native(view.dtype), order="C")
    return fields


def _rebuild(data: dict[str, np.ndarray], cache: Any, next_of: list[str], label: str) -> dict[str, np.ndarray]:
    """``get_all_transitions()`` of the buffer whose storage is ``data`` (unsafe layout)."""
    count = len(next(iter(data.values())))
    for name in next_of:
        if name not in data:
            raise TransitionFileError(f"{label}: next_of names {name!r}, which is not a field of {list(data)}")
    if not isinstance(cache, dict):
        raise TransitionFileError(
            f"{label}: member 'cache' holds {describe_found(cache)}; the unsafe layout holds a dict"
        )
    # Each cache entry holds the next_<name> of every next_of field and the stacked fields' rows.
    bases = {f"next_{name}": name for name in next_of}
    keys = None
    entries = {}
    for slot, entry in cache.items():
        if not (type(slot) is int or isinstance(slot, np.integer)) or not 0 <= slot < count:
            raise TransitionFileError(
                f"{label}: member 'cache' has the slot {describe_found(slot)}; expected slots in [0, {count})"
            )
        if not isinstance(entry, dict) or (keys is not None and entry.keys() != keys) or not set(bases) <= entry.keys():
            raise TransitionFileError(
                f"{label}: cache[{int(slot)}] holds {describe_found(entry)}; expected the same keys as "
                f"every entry, including {sorted(bases)}"
            )
        keys = entry.keys()
        rows = {}
        for key, value in entry.items():
            base = bases.get(key, key)
            if type(key) is not str or base not in data:
                raise TransitionFileError(
                    f"{label}: cache[{int(slot)}] has the key {describe_found(key)}, which is no field of {list(data)}"
                )
            rows[key] = numeric_view(value, f"cache[{int(slot)}][{key!r}]", label)
            if rows[key].shape != data[base].shape[1:] or _native(rows[key].dtype) != data[base].dtype:
                raise TransitionFileError(
                    f"{label}: cache[{int(slot)}][{key!r}] is {describe_array(rows[key])}; "
                    f"expected one row of {base!r}: {_describe_row(data[base])}"
                )
        entries[int(slot)] = rows
    transitions = dict(data)
    for key, name in bases.items():  # row (i + 1) % count, from the stored rows before the cache corrects them
        transitions[key] = np.roll(data[name], -1, axis=0)
    for slot, rows in entries.items():
        for key, row in rows.items():
            transitions[key][slot] = row
    return transitions


# -- messages ----------------------------------------------------------------------------------


def _describe_row(array: np.ndarray) -> str:
    return f"shape {array.shape[1:]} {array.dtype}"
