"""Streaming a large file to the disk as it is written, without filling the page cache.

A checkpoint writes as many bytes as the table's memory.  Left to the kernel, they pile up as
dirty pages, are written back in bursts, are flushed all at once by the final ``fsync``, and stay
cached until the file is deleted -- and deleting a checkpoint of gigabytes then frees all those
pages at once: on the 2-core machine of docs/benchmarks.md the writer and learner processes of
the table stalled for 0.5-0.7 s while a previous checkpoint's cached file was removed.
:class:`Writeback` starts the write-back of each range as soon as it is written
(``sync_file_range``), waits for it a few ranges later and drops those pages from the cache
(``posix_fadvise(DONTNEED)``): the disk writes all along and the cache holds a few ranges.
Where the system has no ``sync_file_range`` (not Linux) it does nothing and the final ``fsync``
flushes everything, as before.  It never replaces that ``fsync``: ``sync_file_range`` writes no
metadata and flushes no disk cache.
"""

from __future__ import annotations

import collections
import ctypes
import os

__all__ = ["IN_FLIGHT", "Writeback", "fsync_folder"]

IN_FLIGHT = 4  # ranges written back at once (4 checkpoint chunks: 64 MB)
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # SYNC_FILE_RANGE_* (linux/fs.h)


def _sync_file_range() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


_SYNC_FILE_RANGE = _sync_file_range()


class Writeback:
    """The write-back of file ``fd``'s ranges, started as each is written (:meth:`wrote`)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._ranges: collections.deque[tuple[int, int]] = collections.deque()
        self._on = _SYNC_FILE_RANGE is not None and hasattr(os, "posix_fadvise")

    def wrote(self, offset: int, nbytes: int) -> None:
        """``nbytes`` at ``offset`` were written: start writing them back; wait for the oldest
        ranges beyond IN_FLIGHT and drop their pages."""
        if not self._on or nbytes <= 0:
            return
        if not self._call(offset, nbytes, _WRITE):
            return
        self._ranges.append((offset, nbytes))
        while len(self._ranges) > IN_FLIGHT:
            self._settle(*self._ranges.popleft())

    def finish(self) -> None:
        """Wait for every range still in flight and drop its pages (call before the ``fsync``)."""
        while self._on and self._ranges:
            self._settle(*self._ranges.popleft())

    def _settle(self, offset: int, nbytes: int) -> None:
        if self._call(offset, nbytes, _WAIT_BEFORE | _WRITE | _WAIT_AFTER):
            os.posix_fadvise(self._fd, offset, nbytes, os.POSIX_FADV_DONTNEED)

    def _call(self, offset: int, nbytes: int, flags: int) -> bool:
        """``sync_file_range``; False (and off from now on) where the filesystem refuses it."""
        assert _SYNC_FILE_RANGE is not None  # self._on
        if _SYNC_FILE_RANGE(self._fd, offset, nbytes, flags) == 0:
            return True
        err = ctypes.get_errno()
        if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this filesystem; the fsync flushes
            self._on = False
            self._ranges.clear()
            return False
        raise OSError(err, os.strerror(err))


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the entries of ``folder`` durable: a file renamed or created there survives a power
    loss once this returns (OSError where the system cannot open a folder)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
