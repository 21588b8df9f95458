"""The restricted unpickler of cpprb's pickled file members: numpy's array pickles, and nothing else.

cpprb's ``save_transitions`` pickles its ``data``, ``cache`` and ``next_of``
members inside 0-d object arrays (see :mod:`mpreplay.compat.cpprb_files`, which
reads the rest of the file and checks the structure of what this module builds).
A pickled member is read twice.  First
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
import pickle
import pickletools
import re
import zipfile
from collections.abc import Callable
from typing import IO, Any, Protocol

import numpy as np

from ..npz_archive import TransitionFileError

__all__ = ["describe_array", "describe_found", "is_unicode", "numeric_view", "scan", "short", "unpickle", "unwrap"]

_NUMERIC = "biufc"  # dtype kinds: bool, signed, unsigned, float, complex
_MULTIARRAY = ("numpy.core.multiarray", "numpy._core.multiarray")  # numpy 1.x, numpy 2.x
_DTYPE_CODE = re.compile(r"[biufcOU][0-9]{1,4}")  # what numpy's dtype pickles name: 'f4', 'O8', 'U3'
_CHUNK = 1 << 22  # bytes read from a member at a time
# The globals numpy's pickles of these arrays name.
_ADMITTED = frozenset(
    {("numpy", "ndarray"), ("numpy", "memmap"), ("numpy", "dtype")}
    | {(module, name) for module in _MULTIARRAY for name in ("_reconstruct", "scalar")}
)
# The pickle opcodes of those pickles (protocols 3 and 4): builtins, memo, globals, calls.  Left
# out, among others: INST, OBJ, NEWOBJ (which call classes), EXT (the extension registry), PERSID,
# and protocol 5's out-of-band buffers.
_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "GLOBAL",
        "STACK_GLOBAL",
        "REDUCE",
        "BUILD",
        "MEMOIZE",
        "BINPUT",
        "LONG_BINPUT",
        "BINGET",
        "LONG_BINGET",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG1",
        "BINFLOAT",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "SHORT_BINBYTES",
        "BINBYTES",
        "BINBYTES8",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "EMPTY_DICT",
        "SETITEM",
        "SETITEMS",
    }
)


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
        if not (
            type(state) is tuple
            and len(state) == 8
            and state[0] == 3
            and state[1] in ("<", ">", "|", "=")
            and state[2] is None
            and state[3] is None
            and state[4] is None
            and all(type(v) is int for v in state[5:])
            and state[5] in (-1, base.itemsize)
        ):
            raise _Refused(f"dtype {self.code!r} with the state {short(state)}")
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
        if not (
            type(state) is tuple
            and len(state) == 5
            and state[0] == 1
            and type(state[1]) is tuple
            and all(type(n) is int and n >= 0 for n in state[1])
            and isinstance(state[2], _Dtype)
            and state[2].dtype is not None
            and type(state[3]) is bool
        ):
            raise _Refused(f"an array state {short(state)}")
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


class _Readable(Protocol):
    """What the pickle readers call on a stream."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...


class _Unpickler(pickle.Unpickler):
    """Builds only :class:`_Array`, :class:`_Dtype` and numpy scalars; refuses every other global."""

    def __init__(self, stream: _Readable) -> None:
        super().__init__(stream)
        # Fresh stand-ins per file: nothing one file does to them reaches another.
        builds = {
            "ndarray": None,
            "memmap": None,
            "dtype": self._dtype,
            "_reconstruct": self._reconstruct,
            "scalar": self._scalar,
        }
        self._admitted = {(module, name): _Admitted(f"{module}.{name}", builds[name]) for module, name in _ADMITTED}
        self._array_types = (self._admitted["numpy", "ndarray"], self._admitted["numpy", "memmap"])

    def find_class(self, module: str, name: str) -> Any:
        found = self._admitted.get((module, name))
        if found is None:
            raise _Refused(f"a reference to {short(f'{module}.{name}')}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"the persistent id {short(pid)}")

    def _reconstruct(self, *args: Any) -> _Array:
        # numpy pickles every array as _reconstruct(type, (0,), b'b') followed by its state.
        if not (
            len(args) == 3
            and any(args[0] is t for t in self._array_types)
            and args[1] == (0,)
            and type(args[1]) is tuple
            and args[2] == b"b"
        ):
            raise _Refused(f"_reconstruct{short(args)}")
        return _Array()

    def _dtype(self, *args: Any) -> _Dtype:
        if not (
            len(args) == 3
            and type(args[0]) is str
            and _DTYPE_CODE.fullmatch(args[0])
            and type(args[1]) is bool
            and type(args[2]) is bool
        ):
            raise _Refused(f"numpy.dtype{short(args)}")
        try:
            valid = np.dtype(args[0]).itemsize > 0
        except TypeError:
            valid = False
        if not valid:
            raise _Refused(f"numpy.dtype{short(args)}")
        return _Dtype(args[0])

    def _scalar(self, *args: Any) -> Any:
        if not (len(args) == 2 and isinstance(args[0], _Dtype) and args[0].dtype is not None):
            raise _Refused(f"scalar{short(args)}")
        dtype, data = args[0].dtype, args[1]
        if dtype.kind not in _NUMERIC + "U":
            raise _Refused(f"a scalar of dtype {dtype}")
        if type(data) is not bytes or len(data) != dtype.itemsize:
            raise _Refused(f"scalar data that is not one {dtype}")
        value = np.frombuffer(data, dtype).astype(dtype.newbyteorder("="))
        if dtype.kind != "U":
            return value[0]
        if not is_unicode(value):
            raise _Refused("a string scalar beyond Unicode")
        return str(value[0])


def scan(stream: IO[bytes], member: str, label: str) -> None:
    """Check the pickle in ``stream`` opcode by opcode, building nothing: only the opcodes and the
    globals of numpy's array pickles, every length within the bytes that follow.  (The
    unpickler allocates what a length says before it reads; pickletools reads what is there.)"""
    memo = 0  # entries in the unpickler's memo: pickle numbers them 0, 1, 2, ...
    try:
        # typeshed wants IO[bytes] here; genops only calls read() (and tell() where there is one).
        for opcode, arg, _ in pickletools.genops(_Chunked(stream)):  # type: ignore[arg-type]
            if opcode.name not in _OPCODES:
                raise _Refused(f"the pickle opcode {opcode.name}")
            if opcode.name == "GLOBAL":
                assert isinstance(arg, str)  # pickletools reads it as "module name"
                if tuple(arg.split(" ", 1)) not in _ADMITTED:
                    raise _Refused(f"a reference to {short(arg.replace(' ', '.'))}")
            elif opcode.name == "MEMOIZE":
                memo += 1
            elif opcode.name in ("BINPUT", "LONG_BINPUT"):
                assert isinstance(arg, int)  # pickletools reads it as the memo index
                # The unpickler grows its memo to the largest index it is given.
                if arg > memo:
                    raise ValueError(f"memo index {arg} after {memo} entries")
                memo = max(memo, arg + 1)
    except _Refused as exc:
        raise TransitionFileError(
            f"{label}: member {member!r} holds {exc}, which cpprb never writes; refused without running it"
        ) from None
    except (ValueError, OverflowError) as exc:  # what pickletools raises on bad bytes
        raise TransitionFileError(
            f"{label}: member {member!r} is not a readable pickle ({type(exc).__name__}: {short(str(exc))})"
        ) from exc


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
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        return filled

    def readline(self, size: int = -1) -> bytes:
        return self._stream.readline(size)


def unpickle(stream: IO[bytes], member: str, label: str) -> Any:
    try:
        held = _Unpickler(_Chunked(stream)).load()
        trailing = stream.read(1)  # reading to the end also checks the member's CRC
    except _Refused as exc:
        raise TransitionFileError(
            f"{label}: member {member!r} holds {exc}, which cpprb never writes; refused without running it"
        ) from None
    except (zipfile.BadZipFile, OSError, MemoryError):
        raise  # a damaged archive (the caller's message says so), or a file too large for memory
    except Exception as exc:  # whatever the pickle machine raises on bad bytes
        raise TransitionFileError(
            f"{label}: member {member!r} is not a readable pickle ({type(exc).__name__}: {short(str(exc))})"
        ) from exc
    if trailing:
        raise TransitionFileError(f"{label}: member {member!r} has bytes after its pickle")
    return held


# -- what the unpickler built -------------------------------------------------------------------


def unwrap(held: Any, member: str, label: str) -> Any:
    """The object inside the 0-d object array that numpy pickles for a member."""
    if not (isinstance(held, _Array) and isinstance(held.value, _Object)):
        raise TransitionFileError(
            f"{label}: member {member!r} holds {describe_found(held)}; expected a 0-d object array"
        )
    return held.value.item


def numeric_view(value: Any, where: str, label: str) -> np.ndarray:
    """The read-only numeric array an unpickled :class:`_Array` holds."""
    if not (isinstance(value, _Array) and isinstance(value.value, np.ndarray)):
        raise TransitionFileError(f"{label}: {where} is {describe_found(value)}; expected a numeric array")
    return value.value


def is_unicode(array: np.ndarray) -> bool:
    """Whether every character of the unicode ``array`` is a Unicode code point (numpy raises
    SystemError converting one beyond)."""
    codes = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")).view(np.uint32)
    return bool((codes <= 0x10FFFF).all())


def short(value: Any, limit: int = 80) -> str:
    """``value`` (a string as it is, anything else as its repr) cut to ``limit`` characters for a message."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_array(array: np.ndarray) -> str:
    """An array's shape and dtype, for a message."""
    return f"shape {array.shape} {array.dtype}"


def describe_found(value: Any) -> str:
    """A short description of something found in a pickle."""
    if isinstance(value, _Array):
        if isinstance(value.value, np.ndarray):
            return f"an array of {describe_array(value.value)}"
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
        return short(repr(value))
    return f"a {type(value).__name__}"
