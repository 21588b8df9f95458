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
header says before it reads).  A pickled member is read twice.  First
``pickletools`` walks its opcodes, building nothing: only the opcodes of
numpy's array pickles (protocols 3 and 4: builtins, memo, globals, REDUCE,
BUILD) pass -- no INST, OBJ, NEWOBJ, EXT, PERSID or out-of-band buffer --,
every ``GLOBAL`` must be admitted, and every length must fit the bytes that
follow and every memo index the memo so far (the unpickler allocates both
before it reads).  Then the unpickler builds it, its ``find_class`` admitting
``numpy.core.multiarray`` (numpy 1.x) or ``numpy._core.multiarray`` (numpy
2.x) ``_reconstruct`` and ``scalar``, ``numpy.ndarray`` and ``numpy.memmap``
(as the type argument of ``_reconstruct`` only: a buffer kept in
``mmap_prefix`` files pickles its arrays as memmaps), and ``numpy.dtype`` --
as stand-ins that accept only the arguments numpy's own pickles pass: dtypes
of kinds bool, integer, float and complex, object only for the 0-d arrays that
wrap a member, unicode only for scalars (cpprb's cache keys its stacked
fields by ``numpy.str_``); states with no fields, sub-arrays or metadata;
array data exactly as long as its shape and dtype say.  No numpy constructor
or ``__setstate__`` ever runs on the file's values: arrays are views made by
``np.frombuffer`` over checked bytes, copied into arrays of our own once the
structure has been checked (peak memory: the transitions plus their largest
field).  Any other global, a persistent id, or a state set on anything but an
array or a dtype is refused before it is called.  The objects the pickle
machine builds by itself (dicts, lists, tuples, strings, numbers, None) run no
code; the structure check then accepts only the dicts of arrays described
above.
"""
from __future__ import annotations

import math
import os
import pickle
import pickletools
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from ..fileformat import File, TransitionFileError, damaged, open_archive

__all__ = ["CpprbFile", "read_cpprb_file", "read_cpprb_transitions"]

_VERSION = 1  # the only format version cpprb has written
_MEMBERS = ("safe", "version", "data", "Nstep", "cache", "next_of")
_NUMERIC = "biufc"  # dtype kinds: bool, signed, unsigned, float, complex
_MULTIARRAY = ("numpy.core.multiarray", "numpy._core.multiarray")  # numpy 1.x, numpy 2.x
_DTYPE_CODE = re.compile(r"[biufcOU][0-9]{1,4}")  # what numpy's dtype pickles name: 'f4', 'O8', 'U3'
_CHUNK = 1 << 22  # bytes read from a member at a time
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# The globals numpy's pickles of these arrays name.
_ADMITTED = frozenset({("numpy", "ndarray"), ("numpy", "memmap"), ("numpy", "dtype")}
                      | {(module, name) for module in _MULTIARRAY for name in ("_reconstruct", "scalar")})
# The pickle opcodes of those pickles (protocols 3 and 4): builtins, memo, globals, calls.  Left
# out, among others: INST, OBJ, NEWOBJ (which call classes), EXT (the extension registry), PERSID,
# and protocol 5's out-of-band buffers.
_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD",
    "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT", "SETITEM", "SETITEMS",
})


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
            raise TransitionFileError(f"{label}: member 'version' is {_describe(version)}; expected an integer")
        if int(version) != _VERSION:
            raise TransitionFileError(f"{label}: unknown cpprb format version {int(version)}; "
                                      f"cpprb has only written version {_VERSION}")
        safe, nstep = _flag(archive, "safe", label), _flag(archive, "Nstep", label)
        data = _fields(_pickled(archive, "data", label), "data", label)
        cache = _pickled(archive, "cache", label)
        next_of = _next_of(archive, label)
    if safe:
        if cache is not None or next_of is not None:
            raise TransitionFileError(f"{label}: the safe layout holds no cache and no next_of, "
                                      f"found {_what(cache)} and {_what(next_of)}")
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
        raise TransitionFileError(f"{label}: not a file of cpprb's save_transitions: its members are "
                                  f"{_short(sorted(names))}, expected {expected}")


def _header(stream: IO[bytes], member: str, label: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from the ``.npy`` header at the start of ``stream``."""
    version = np.lib.format.read_magic(stream)
    if version not in _NPY_HEADERS:
        raise TransitionFileError(f"{label}: member {member!r} has .npy format version {version}; "
                                  "numpy's savez writes 1.0 or 2.0 for these arrays")
    return _NPY_HEADERS[version](stream)


def _member(archive: zipfile.ZipFile, member: str, label: str) -> Any:
    """Member ``member``: a plain ``np.ndarray``, read by numpy with pickles disallowed, or,
    for a 0-d object array, what its pickle holds (never an ``np.ndarray``)."""
    info = archive.getinfo(f"{member}.npy")
    with damaged(f"member {member!r} is damaged or truncated", label=label):
        with archive.open(info) as stream:
            shape, _fortran, dtype = _header(stream, member, label)
            if dtype.hasobject:
                if dtype != np.dtype(object) or shape != ():
                    raise TransitionFileError(f"{label}: member {member!r} is an object array of shape {shape}, "
                                              f"dtype {dtype}; cpprb writes 0-d object arrays")
                _scan(stream, member, label)
            # numpy allocates what the header says before reading: check that the member holds it.
            elif dtype.itemsize == 0 or math.prod(shape) * dtype.itemsize != info.file_size - stream.tell():
                raise TransitionFileError(f"{label}: member {member!r} holds {info.file_size - stream.tell()} "
                                          f"bytes of data; its header says shape {shape} {dtype}")
        with archive.open(info) as stream:
            if dtype.hasobject:
                _header(stream, member, label)
                return _unpickle(stream, member, label)
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
        raise TransitionFileError(f"{label}: member {member!r} is a plain array of {_describe(value)}; "
                                  "cpprb stores it as a pickled object")
    return _unwrap(value, member, label)


def _flag(archive: zipfile.ZipFile, member: str, label: str) -> bool:
    value = _plain(archive, member, label)
    if value.shape != () or value.dtype != np.bool_:
        raise TransitionFileError(f"{label}: member {member!r} is {_describe(value)}; expected a bool")
    return bool(value)


def _next_of(archive: zipfile.ZipFile, label: str) -> list[str] | None:
    """The ``next_of`` field names: a pickled None, or a plain 1-d unicode array."""
    value = _member(archive, "next_of", label)
    if not isinstance(value, np.ndarray):
        held = _unwrap(value, "next_of", label)
        if held is not None:
            raise TransitionFileError(f"{label}: member 'next_of' holds {_what(held)}; "
                                      "expected None or an array of field names")
        return None
    if (value.ndim != 1 or value.dtype.kind != "U" or not len(value) or not _unicode(value)
            or len(set(value.tolist())) != len(value)):
        raise TransitionFileError(f"{label}: member 'next_of' is {_describe(value)}; expected distinct field names")
    return value.tolist()


def _unicode(array: np.ndarray) -> bool:
    """Whether every character of the unicode ``array`` is a Unicode code point (numpy raises
    SystemError converting one beyond)."""
    codes = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")).view(np.uint32)
    return bool((codes <= 0x10FFFF).all())


# -- the restricted unpickler ------------------------------------------------------------------


class _Refused(Exception):
    """The pickle holds something a cpprb file never holds; the message says what."""


class _Admitted:
    """What ``find_class`` hands the unpickler for an admitted global: a stand-in that
    checks its arguments (``build``) or, for a type, may not be called at all."""

    __slots__ = ("build", "name")

    def __init__(self, name: str, build: Callable[..., Any] | None) -> None:
        self.name, self.build = name, build

    def __call__(self, *args: Any) -> Any:
        if self.build is None:
            raise _Refused(f"a call of {self.name}")
        return self.build(*args)

    def __setstate__(self, state: Any) -> None:
        # Without this, BUILD would set attributes on the stand-in.
        raise _Refused(f"a state set on {self.name}")


class _Dtype:
    """A numpy dtype being unpickled: ``numpy.dtype(code, False, True)`` then its state."""

    __slots__ = ("code", "dtype")

    def __init__(self, code: str) -> None:
        self.code = code
        self.dtype: np.dtype | None = None  # set by the state, which numpy always pickles

    def __setstate__(self, state: Any) -> None:
        if self.dtype is not None:
            raise _Refused(f"a second state for dtype {self.code!r}")
        base = np.dtype(self.code)
        # (version, byte order, subarray, names, fields, item size, alignment, flags)
        if not (type(state) is tuple and len(state) == 8 and state[0] == 3 and state[1] in ("<", ">", "|", "=")
                and state[2] is None and state[3] is None and state[4] is None
                and all(type(v) is int for v in state[5:]) and state[5] in (-1, base.itemsize)):
            raise _Refused(f"dtype {self.code!r} with the state {_short(state)}")
        self.dtype = base.newbyteorder(state[1]) if state[1] in "<>" else base


class _Array:
    """A numpy array being unpickled: ``_reconstruct(ndarray, (0,), b'b')`` then its state.

    ``value`` becomes a read-only numeric array over the pickle's bytes (copied once the
    structure is checked), or an :class:`_Object` for a 0-d object array.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: np.ndarray | _Object | None = None

    def __setstate__(self, state: Any) -> None:
        if self.value is not None:
            raise _Refused("a second state for an array")
        # (version, shape, dtype, Fortran order, data: bytes, or a list of objects)
        if not (type(state) is tuple and len(state) == 5 and state[0] == 1 and type(state[1]) is tuple
                and all(type(n) is int and n >= 0 for n in state[1]) and isinstance(state[2], _Dtype)
                and state[2].dtype is not None and type(state[3]) is bool):
            raise _Refused(f"an array state {_short(state)}")
        _, shape, dtype, fortran, data = state
        dtype = dtype.dtype
        if dtype.kind == "O":
            if shape != () or type(data) is not list or len(data) != 1:
                raise _Refused(f"an object array of shape {shape} (cpprb pickles 0-d ones only)")
            self.value = _Object(data[0])
        elif dtype.kind in _NUMERIC:
            if type(data) is not bytes or len(data) != math.prod(shape) * dtype.itemsize:
                raise _Refused(f"array data that is not {math.prod(shape)} items of {dtype}")
            self.value = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
        else:
            raise _Refused(f"an array of dtype {dtype}")


class _Object:
    """The item of a 0-d object array."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class _Unpickler(pickle.Unpickler):
    """Builds only :class:`_Array`, :class:`_Dtype` and numpy scalars; refuses every other global."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(stream)
        # Fresh stand-ins per file: nothing one file does to them reaches another.
        builds = {"ndarray": None, "memmap": None, "dtype": self._dtype, "_reconstruct": self._reconstruct,
                  "scalar": self._scalar}
        self._admitted = {(module, name): _Admitted(f"{module}.{name}", builds[name]) for module, name in _ADMITTED}
        self._array_types = (self._admitted["numpy", "ndarray"], self._admitted["numpy", "memmap"])

    def find_class(self, module: str, name: str) -> Any:
        found = self._admitted.get((module, name))
        if found is None:
            raise _Refused(f"a reference to {_short(f'{module}.{name}')}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"the persistent id {_short(pid)}")

    def _reconstruct(self, *args: Any) -> _Array:
        # numpy pickles every array as _reconstruct(type, (0,), b'b') followed by its state.
        if not (len(args) == 3 and any(args[0] is t for t in self._array_types) and args[1] == (0,)
                and type(args[1]) is tuple and args[2] == b"b"):
            raise _Refused(f"_reconstruct{_short(args)}")
        return _Array()

    def _dtype(self, *args: Any) -> _Dtype:
        if not (len(args) == 3 and type(args[0]) is str and _DTYPE_CODE.fullmatch(args[0])
                and type(args[1]) is bool and type(args[2]) is bool):
            raise _Refused(f"numpy.dtype{_short(args)}")
        try:
            valid = np.dtype(args[0]).itemsize > 0
        except TypeError:
            valid = False
        if not valid:
            raise _Refused(f"numpy.dtype{_short(args)}")
        return _Dtype(args[0])

    def _scalar(self, *args: Any) -> Any:
        if not (len(args) == 2 and isinstance(args[0], _Dtype) and args[0].dtype is not None):
            raise _Refused(f"scalar{_short(args)}")
        dtype, data = args[0].dtype, args[1]
        if dtype.kind not in _NUMERIC + "U":
            raise _Refused(f"a scalar of dtype {dtype}")
        if type(data) is not bytes or len(data) != dtype.itemsize:
            raise _Refused(f"scalar data that is not one {dtype}")
        value = np.frombuffer(data, dtype).astype(dtype.newbyteorder("="))
        if dtype.kind != "U":
            return value[0]
        if not _unicode(value):
            raise _Refused("a string scalar beyond Unicode")
        return str(value[0])


def _scan(stream: IO[bytes], member: str, label: str) -> None:
    """Check the pickle in ``stream`` opcode by opcode, building nothing: only the opcodes and the
    globals of numpy's array pickles, every length within the bytes that follow.  (The
    unpickler allocates what a length says before it reads; pickletools reads what is there.)"""
    memo = 0  # entries in the unpickler's memo: pickle numbers them 0, 1, 2, ...
    try:
        for opcode, arg, _ in pickletools.genops(_Chunked(stream)):
            if opcode.name not in _OPCODES:
                raise _Refused(f"the pickle opcode {opcode.name}")
            if opcode.name == "GLOBAL" and tuple(arg.split(" ", 1)) not in _ADMITTED:
                raise _Refused(f"a reference to {_short(arg.replace(' ', '.'))}")
            if opcode.name == "MEMOIZE":
                memo += 1
            elif opcode.name in ("BINPUT", "LONG_BINPUT"):
                # The unpickler grows its memo to the largest index it is given.
                if arg > memo:
                    raise ValueError(f"memo index {arg} after {memo} entries")
                memo = max(memo, arg + 1)
    except _Refused as exc:
        raise TransitionFileError(f"{label}: member {member!r} holds {exc}, which cpprb never writes; "
                                  "refused without running it") from None
    except (ValueError, OverflowError) as exc:  # what pickletools raises on bad bytes
        raise TransitionFileError(f"{label}: member {member!r} is not a readable pickle "
                                  f"({type(exc).__name__}: {_short(str(exc))})") from exc


class _Chunked:
    """A member's stream, read at most :data:`_CHUNK` bytes at a time: the pickle readers fetch
    arrays of any size through it without zipfile building a temporary copy of each."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            return self._stream.read()
        parts = []
        while size > 0 and (chunk := self._stream.read(min(size, _CHUNK))):
            parts.append(chunk)
            size -= len(chunk)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and (chunk := self._stream.read(min(len(view) - filled, _CHUNK))):
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
        return filled

    def readline(self, size: int = -1) -> bytes:
        return self._stream.readline(size)


def _unpickle(stream: IO[bytes], member: str, label: str) -> Any:
    try:
        held = _Unpickler(_Chunked(stream)).load()
        trailing = stream.read(1)  # reading to the end also checks the member's CRC
    except _Refused as exc:
        raise TransitionFileError(f"{label}: member {member!r} holds {exc}, which cpprb never writes; "
                                  "refused without running it") from None
    except (zipfile.BadZipFile, OSError, MemoryError):
        raise  # a damaged archive (the caller's message says so), or a file too large for memory
    except Exception as exc:  # whatever the pickle machine raises on bad bytes
        raise TransitionFileError(f"{label}: member {member!r} is not a readable pickle "
                                  f"({type(exc).__name__}: {_short(str(exc))})") from exc
    if trailing:
        raise TransitionFileError(f"{label}: member {member!r} has bytes after its pickle")
    return held


# -- the structure -----------------------------------------------------------------------------


def _unwrap(held: Any, member: str, label: str) -> Any:
    """The object inside the 0-d object array that numpy pickles for a member."""
    if not (isinstance(held, _Array) and isinstance(held.value, _Object)):
        raise TransitionFileError(f"{label}: member {member!r} holds {_what(held)}; expected a 0-d object array")
    return held.value.item


def _view(value: Any, where: str, label: str) -> np.ndarray:
    """The read-only numeric array an unpickled :class:`_Array` holds."""
    if not (isinstance(value, _Array) and isinstance(value.value, np.ndarray)):
        raise TransitionFileError(f"{label}: {where} is {_what(value)}; expected a numeric array")
    return value.value


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=")


def _fields(value: Any, member: str, label: str) -> dict[str, np.ndarray]:
    """``value``, checked to be {field: array of rows}, every array as long, as arrays of our own."""
    if not isinstance(value, dict) or not value:
        raise TransitionFileError(f"{label}: member {member!r} holds {_what(value)}; "
                                  "expected a non-empty dict of field name -> array")
    views = {}
    for name, array in value.items():
        if type(name) is not str:
            raise TransitionFileError(f"{label}: member {member!r} has the key {_what(name)}; expected field names")
        views[name] = _view(array, f"{member}[{name!r}]", label)
        if views[name].ndim == 0:
            raise TransitionFileError(f"{label}: {member}[{name!r}] is a 0-d array; expected rows")
    lengths = {name: len(array) for name, array in views.items()}
    if len(set(lengths.values())) != 1:
        raise TransitionFileError(f"{label}: the fields of member {member!r} differ in length: {_short(lengths)}")
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
        raise TransitionFileError(f"{label}: member 'cache' holds {_what(cache)}; the unsafe layout holds a dict")
    # Each cache entry holds the next_<name> of every next_of field and the stacked fields' rows.
    bases = {f"next_{name}": name for name in next_of}
    keys = None
    entries = {}
    for slot, entry in cache.items():
        if not (type(slot) is int or isinstance(slot, np.integer)) or not 0 <= slot < count:
            raise TransitionFileError(f"{label}: member 'cache' has the slot {_what(slot)}; "
                                      f"expected slots in [0, {count})")
        if not isinstance(entry, dict) or (keys is not None and entry.keys() != keys) or \
                not set(bases) <= entry.keys():
            raise TransitionFileError(f"{label}: cache[{int(slot)}] holds {_what(entry)}; expected the same keys as "
                                      f"every entry, including {sorted(bases)}")
        keys = entry.keys()
        rows = {}
        for key, value in entry.items():
            base = bases.get(key, key)
            if type(key) is not str or base not in data:
                raise TransitionFileError(f"{label}: cache[{int(slot)}] has the key {_what(key)}, "
                                          f"which is no field of {list(data)}")
            rows[key] = _view(value, f"cache[{int(slot)}][{key!r}]", label)
            if rows[key].shape != data[base].shape[1:] or _native(rows[key].dtype) != data[base].dtype:
                raise TransitionFileError(f"{label}: cache[{int(slot)}][{key!r}] is {_describe(rows[key])}; "
                                          f"expected one row of {base!r}: {_describe_row(data[base])}")
        entries[int(slot)] = rows
    transitions = dict(data)
    for key, name in bases.items():  # row (i + 1) % count, from the stored rows before the cache corrects them
        transitions[key] = np.roll(data[name], -1, axis=0)
    for slot, rows in entries.items():
        for key, row in rows.items():
            transitions[key][slot] = row
    return transitions


# -- messages ----------------------------------------------------------------------------------


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(array: np.ndarray) -> str:
    return f"shape {array.shape} {array.dtype}"


def _describe_row(array: np.ndarray) -> str:
    return f"shape {array.shape[1:]} {array.dtype}"


def _what(value: Any) -> str:
    """A short description of something found in a pickle."""
    if isinstance(value, _Array):
        if isinstance(value.value, np.ndarray):
            return f"an array of {_describe(value.value)}"
        return "an object array" if value.value is not None else "an array without a state"
    if isinstance(value, _Dtype):
        return f"the dtype {value.code!r}"
    if isinstance(value, _Admitted):
        return value.name
    if isinstance(value, _Object):
        return "an object array"
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return _short(repr(value))
    return f"a {type(value).__name__}"
