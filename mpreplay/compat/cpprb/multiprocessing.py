"""cpprb's ``cpprb.multiprocessing``: numpy-indexable arrays and values shared between processes.

cpprb builds its shared buffers from these and some programs use them directly.  Both backends
are kept: ``"sharedctypes"`` (multiprocessing's shared ctypes, inherited by child processes) and
``"SharedMemory"`` (a named segment that pickles to its name, so it also reaches processes that
are not children).  The segments are mpreplay's: the creating process unlinks its
segment on ``close()``, when the object is collected, at exit and on SIGTERM, where cpprb only
unlinks at exit.
"""

from __future__ import annotations

import ctypes
import multiprocessing
from multiprocessing import sharedctypes
from multiprocessing.managers import SyncManager
from typing import Any

import numpy as np

from ... import checks
from ...memory import Layout, SharedMemory

__all__ = ["RawArray", "RawValue", "SharedMemoryArray", "SharedMemoryValue", "ctypesArray"]

_has_SharedMemory = True  # noqa: N816 -- cpprb's name; its tests branch on it
_BACKENDS = ("SharedMemory", "sharedctypes")


def _dtype(ctype: Any) -> np.dtype:
    try:
        dtype = np.dtype(ctype)
    except TypeError:
        raise TypeError(f"ctype: expected a ctypes scalar type such as ctypes.c_double, got {ctype!r}") from None
    if dtype.itemsize != ctypes.sizeof(ctype):
        raise TypeError(f"ctype: {ctype.__name__} has no numpy dtype of its size")
    return dtype


class _Indexable:
    """Indexing, slicing and ``len`` through the numpy view ``ndarray``."""

    ndarray: np.ndarray

    def __len__(self) -> int:
        return len(self.ndarray)

    def __getitem__(self, i: Any) -> Any:
        return self.ndarray[i]

    def __setitem__(self, i: Any, value: Any) -> None:
        self.ndarray[i] = value


class _Segment(_Indexable):
    """``length`` elements of ``dtype`` in a segment of their own."""

    def __init__(self, dtype: np.dtype, length: int):
        layout = Layout()
        layout.add("data", (length,), dtype)
        self._memory = SharedMemory(layout)
        self.dtype = dtype
        self.ndarray = self._memory.arrays["data"]

    def __getstate__(self) -> tuple[Layout, str, np.dtype]:
        return self._memory.layout, self._memory.name, self.dtype

    def __setstate__(self, state: tuple[Layout, str, np.dtype]) -> None:
        layout, name, self.dtype = state
        self._memory = SharedMemory(layout, name=name)
        self.ndarray = self._memory.arrays["data"]

    @property
    def name(self) -> str:
        """The segment's name (under ``/dev/shm``)."""
        return self._memory.name

    def close(self) -> None:
        """Unmap the segment, and unlink it in the process that created it."""
        self.ndarray = np.empty(0, self.dtype)
        self._memory.close()


class SharedMemoryArray(_Segment):
    """``len_`` elements of ``ctype`` in a named shared-memory segment, zeroed."""

    def __init__(self, ctype: Any, len_: int):
        super().__init__(_dtype(ctype), checks.integer("len_", len_, low=0))
        self.len = len(self.ndarray)


class SharedMemoryValue(_Segment):
    """One ``ctype`` in a named shared-memory segment, read and written through ``value``."""

    def __init__(self, ctype: Any, init: Any = None):
        super().__init__(_dtype(ctype), 1)
        if init is not None:
            self.ndarray[0] = init

    @property
    def value(self) -> Any:
        return self.ndarray[0]

    @value.setter
    def value(self, v: Any) -> None:
        self.ndarray[0] = v


class ctypesArray(_Indexable):  # noqa: N801 -- cpprb's name
    """``len_`` elements of ``ctype`` in a ``sharedctypes`` array of the context ``ctx``."""

    def __init__(self, ctx: Any, ctype: Any, len_: int):
        _check_context(ctx)
        self.shm = sharedctypes.RawArray(ctype, checks.integer("len_", len_, low=0))
        self.ndarray = np.ctypeslib.as_array(self.shm)

    def __getstate__(self) -> Any:
        return self.shm

    def __setstate__(self, shm: Any) -> None:
        self.shm = shm
        self.ndarray = np.ctypeslib.as_array(shm)


def _check_context(ctx: Any) -> None:
    # Arrays without a lock are the same in every context: ctx is only checked.
    if ctx is None or isinstance(ctx, (SyncManager, multiprocessing.context.BaseContext)):
        return
    raise TypeError(f"ctx: expected None, a multiprocessing context or a SyncManager, got {type(ctx).__name__}")


def _backend(backend: Any) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")
    return backend


def RawArray(ctx: Any, ctype: Any, len_: int, backend: str) -> SharedMemoryArray | ctypesArray:
    """A shared array of ``len_`` elements of ``ctype`` on ``backend``."""
    if _backend(backend) == "SharedMemory":
        return SharedMemoryArray(ctype, len_)
    return ctypesArray(ctx, ctype, len_)


def RawValue(ctx: Any, ctype: Any, init: Any, backend: str) -> Any:
    """A shared value of ``ctype`` on ``backend``: its ``value`` is read and written."""
    if _backend(backend) == "SharedMemory":
        return SharedMemoryValue(ctype, init)
    _check_context(ctx)
    return sharedctypes.RawValue(ctype, init)
