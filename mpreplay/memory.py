"""Where a buffer's arrays live: the process heap, files, or a shared-memory segment.

A :class:`Layout` places named arrays at aligned offsets in one block of
bytes.  The same layout over the heap gives a local buffer and over a
``multiprocessing.shared_memory`` segment gives a buffer every process can
map, so the buffer code above it is one and the same.  :class:`FileMemory`
puts each array of the layout in a file of its own, mapped into memory: a
local buffer larger than RAM, paged by the operating system.  A block in this
process's memory carries the lock its threads take.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import resource_tracker, shared_memory
from multiprocessing import util as mp_util
from typing import Any

import numpy as np

from ._ext import termination
from ._ext.lock import ThreadLock

__all__ = ["Layout", "HeapMemory", "FileMemory", "SharedMemory", "SharedMemoryError"]

SEGMENT_PREFIX = "mpreplay-"  # every segment is named mpreplay-<creator pid>-<random>, or mpreplay-<its name>
SHM_DIR = "/dev/shm"  # where Linux keeps the segments, as files
_ALIGN = 64  # one cache line: keeps hot counters and rows of different arrays apart


class SharedMemoryError(RuntimeError):
    """A shared-memory segment cannot be created or attached."""


@dataclass
class Layout:
    """Named arrays at 64-byte aligned offsets inside one block, and named views of
    columns of bytes in the rows of a 2-D uint8 array among them (fields side by side)."""

    entries: list[tuple[str, tuple[int, ...], str, int]] = field(default_factory=list)
    nbytes: int = 0
    row_views: list[tuple[str, str, tuple[int, ...], str, int]] = field(default_factory=list)

    def add(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        dt = np.dtype(dtype)
        offset = -(-self.nbytes // _ALIGN) * _ALIGN
        self.entries.append((name, tuple(int(d) for d in shape), dt.str, offset))
        self.nbytes = offset + int(np.prod(shape, dtype=np.int64)) * dt.itemsize

    def add_row_views(self, array: str, fields: list[tuple[str, tuple[int, ...], Any]], offsets: list[int]) -> None:
        """Name each of ``fields`` (``(name, shape, dtype)`` of one row) as the view of its bytes,
        at its offset in ``offsets``, in every row of ``array`` (a 2-D uint8 array added before)."""
        for (name, shape, dtype), offset in zip(fields, offsets, strict=True):
            self.row_views.append((name, array, tuple(int(d) for d in shape), np.dtype(dtype).str, int(offset)))

    def views(self, buf: memoryview) -> dict[str, np.ndarray]:
        """Arrays over ``buf`` (no copies)."""
        out = {}
        for name, shape, dtype, offset in self.entries:
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        return self.with_row_views(out)

    def with_row_views(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` (this layout's, by name) and the row views over them."""
        for name, array, shape, dtype, offset in self.row_views:
            rows, dt = arrays[array], np.dtype(dtype)
            inner = [dt.itemsize] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                inner[d] = inner[d + 1] * shape[d + 1]
            arrays[name] = np.ndarray(
                (rows.shape[0],) + shape, dt, buffer=rows, offset=offset, strides=(rows.strides[0],) + tuple(inner)
            )
        return arrays


def _aligned_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zeroed bytes starting at a 64-byte boundary, so the layout's offsets are
    cache-line aligned in memory too (numpy itself promises only 16 bytes)."""
    raw = np.zeros(nbytes + _ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % _ALIGN
    return raw[skip : skip + nbytes]


class HeapMemory:
    """A zeroed block on the process heap (or, from :meth:`handle`, another view of one), and
    the lock its threads take (every handle of the block shares it)."""

    shared = False

    def __init__(self, layout: Layout, *, block: np.ndarray | None = None, thread_lock: ThreadLock | None = None):
        self.layout = layout
        self.is_owner = block is None
        self._block = _aligned_zeros(max(layout.nbytes, 1)) if block is None else block
        self.arrays = layout.views(self._block.data)
        self.thread_lock = ThreadLock() if thread_lock is None else thread_lock

    def handle(self) -> HeapMemory:
        """Another view of the same block, which does not own it."""
        return HeapMemory(self.layout, block=self._block, thread_lock=self.thread_lock)

    def close(self) -> None:
        pass


class FileMemory:
    """Each array of a layout in a zeroed file of its own, mapped into memory (or, from
    :meth:`handle`, other views of the same maps).

    The file of array ``field:<name>`` (a field) is ``<prefix>_<name>.dat``, as cpprb names
    the files of its ``mmap_prefix`` buffers; every other array's is ``<prefix>.<array>.dat``.
    Existing files are overwritten; the files stay when the buffer is closed.
    """

    shared = False

    def __init__(
        self,
        layout: Layout,
        prefix: str,
        *,
        maps: dict[str, np.memmap] | None = None,
        thread_lock: ThreadLock | None = None,
    ):
        self.layout = layout
        self.prefix = prefix
        self.is_owner = maps is None
        self.thread_lock = ThreadLock() if thread_lock is None else thread_lock
        if maps is None:
            maps = {}
            for name, shape, dtype, _ in layout.entries:
                path = self.path(prefix, name)
                # A zero-length map is refused: an empty array gets one byte of file.
                maps[name] = np.memmap(
                    path,
                    dtype=np.uint8,
                    mode="w+",
                    shape=max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize),
                )
        self._maps = maps
        self.arrays = layout.with_row_views(
            {
                name: np.asarray(maps[name][: int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize])
                .view(dtype)
                .reshape(shape)
                for name, shape, dtype, _ in layout.entries
            }
        )

    @staticmethod
    def path(prefix: str, array: str) -> str:
        """The file of ``array`` for ``prefix``."""
        kind, _, name = array.partition(":")
        return f"{prefix}_{name}.dat" if kind == "field" and name else f"{prefix}.{array.replace(':', '_')}.dat"

    def handle(self) -> FileMemory:
        """Other views of the same maps, which do not own them."""
        return FileMemory(self.layout, self.prefix, maps=self._maps, thread_lock=self.thread_lock)

    def close(self) -> None:
        if self.is_owner:
            for m in self._maps.values():
                m.flush()


def _shm_free_bytes() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return None


def segment_name(name: str) -> str:
    """The segment a table called ``name`` lives in: ``mpreplay-<name>``, or ``name`` itself when
    it starts with ``mpreplay-`` already (what ``Table.name`` and ``mpreplay ls`` show)."""
    return name if name.startswith(SEGMENT_PREFIX) else SEGMENT_PREFIX + name


def _create_named(size: int, name: str | None, track: bool) -> shared_memory.SharedMemory:
    """A new segment called ``name`` (None: after the creator's pid, which tells whose segment a
    /dev/shm entry is, and a random part); ``track``: the resource tracker unlinks it should
    this process die without unlinking it."""
    if name is not None and (not name.startswith(SEGMENT_PREFIX) or "/" in name):
        raise ValueError(f"name: expected a segment name starting with {SEGMENT_PREFIX!r} (no '/'), got {name!r}")
    while True:
        try:
            return _segment(name or f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}", size, track)
        except FileExistsError:
            if name is None:
                continue
            raise SharedMemoryError(
                f"name: a shared-memory segment {name!r} exists already: join its table with "
                f"mpreplay.attach({name!r}), or remove it first (mpreplay rm {name})"
            ) from None


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach to an existing segment without registering it with the resource tracker.

    Python < 3.13 registers attached segments too; the tracker then unlinks
    them (or warns about "leaks") when the attaching process ends -- under the
    creator's feet.  Only the creator may own a segment.
    """
    return _segment(name, 0, False)


def _segment(name: str, size: int, track: bool) -> shared_memory.SharedMemory:
    """Segment ``name``: created with ``size`` bytes, or (``size`` 0) an existing one; registered
    with the resource tracker only where ``track`` (a persistent table's segment never is)."""
    create = size > 0
    if track or sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=create, size=size, **({} if track else {"track": False}))
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=size)
    finally:
        resource_tracker.register = register


def unlink_segment(name: str) -> bool:
    """Unlink segment ``name`` as ``mpreplay rm`` does (no resource tracker told: a persistent
    table's creator never registered it); False when it was gone already."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        return False
    return True


def _mapping(shm: shared_memory.SharedMemory) -> memoryview:
    """The whole mapping of a segment this process has open."""
    buf = shm.buf
    assert buf is not None, "an open segment is mapped"  # only close() makes it None
    return buf


class SharedMemory:
    """A named segment holding ``layout``.

    The creating process (``name`` None; ``create_as``: the name to create it under, else a
    fresh one) owns the segment and unlinks it on :meth:`close`
    (also when the object is freed, and at interpreter exit); attaching
    processes only unmap it.  An attaching process may pass ``verify``: it is
    called with the whole mapping before any view of ``layout`` is made, must
    not keep it, and refuses the segment by raising (the segment is then unmapped).
    A new segment is called ``create_as`` when given (FileExistsError if one is);
    a ``persist`` one is owned by nobody: no process unlinks it on its own, the
    resource tracker never hears of it, and it stays until :func:`unlink_segment`.
    """

    shared = True
    # Called once to unmap (and unlink, in the owner); the owner's and an attacher's differ in kind.
    _finalizer: Callable[[], object]

    def __init__(
        self,
        layout: Layout,
        *,
        name: str | None = None,
        verify: Callable[[memoryview], None] | None = None,
        create_as: str | None = None,
        persist: bool = False,
    ):
        self.layout = layout
        self.owner = name is None and not persist
        size = max(layout.nbytes, 1)
        if name is None:
            free = _shm_free_bytes()
            if free is not None and free < size:
                raise SharedMemoryError(
                    f"/dev/shm has {free / 2**20:.1f} MiB free but the buffer needs {size / 2**20:.1f} MiB; "
                    "lower the capacity, or give the container more shared memory "
                    "(docker run --shm-size=..., or mount a larger tmpfs on /dev/shm)"
                )
            self._shm = _create_named(size, create_as, not persist)
            # Reserve the pages now: a tmpfs that runs out later would kill
            # the process with SIGBUS at some random write instead.
            try:
                # The stdlib keeps the segment's descriptor private (typeshed declares no _fd).
                os.posix_fallocate(self._shm._fd, 0, size)  # type: ignore[attr-defined]
            except (AttributeError, OSError) as exc:
                self._shm.close()
                if persist:
                    unlink_segment(self._shm.name)
                else:
                    self._shm.unlink()
                raise SharedMemoryError(f"cannot reserve {size / 2**20:.1f} MiB in /dev/shm: {exc}") from exc
        else:
            try:
                self._shm = _attach_untracked(name)
            except FileNotFoundError:
                raise SharedMemoryError(
                    f"shared-memory segment {name!r} no longer exists (its owner closed it)"
                ) from None
            except PermissionError:
                raise SharedMemoryError(
                    f"shared-memory segment {name!r} belongs to another user: only its owner's processes may map it"
                ) from None
            if verify is not None:
                try:
                    verify(_mapping(self._shm))
                except BaseException:
                    self._shm.close()
                    raise
        self.name = self._shm.name
        self.arrays = layout.views(_mapping(self._shm))
        # A forked child inherits this object but not the ownership.
        self._owner_pid = os.getpid() if self.owner else None
        if self.owner:
            # multiprocessing's exit hook also runs in its child processes, which
            # leave through os._exit (no atexit): a segment a child created is
            # unlinked however the child's target returns or raises.
            self._finalizer = mp_util.Finalize(
                self, SharedMemory._release, (self._shm, self._owner_pid), exitpriority=0
            )
            _OWNED.add(self)
            _unlink_on_termination(self)
        else:
            self._finalizer = weakref.finalize(self, SharedMemory._release, self._shm, None)

    @property
    def is_owner(self) -> bool:
        """Whether this process created the segment (and will unlink it)."""
        return self._owner_pid == os.getpid()

    def handle(self) -> SharedMemory:
        """Another mapping of the same segment, which does not own it."""
        return SharedMemory(self.layout, name=self.name)

    def unlinked(self) -> bool:
        """Whether the segment's name is gone (``mpreplay rm``, another handle's unlink, the
        resource tracker of its dead creator): one ``fstat`` of the descriptor this mapping keeps."""
        # The stdlib keeps the segment's descriptor private (typeshed declares no _fd).
        return os.fstat(self._shm._fd).st_nlink == 0  # type: ignore[attr-defined]

    @staticmethod
    def _release(shm: shared_memory.SharedMemory, owner_pid: int | None) -> None:
        try:
            shm.close()
        except BufferError:
            # Arrays over the mapping are still alive somewhere: let the last
            # of them unmap it, and just close the file descriptor now.
            # The stdlib has no public way to drop its own references (typeshed declares neither).
            shm._buf = None  # type: ignore[attr-defined]
            shm._mmap = None  # type: ignore[attr-defined]
            shm.close()
        if owner_pid == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
            termination.disown(_shm_path(shm.name))

    def close(self) -> None:
        """Unmap, and unlink when this process created the segment (idempotent)."""
        self.arrays = {}
        _OWNED.discard(self)
        self._finalizer()


# The segments this process created and has not closed, for _release_inherited_after_fork.
_OWNED: weakref.WeakSet[SharedMemory] = weakref.WeakSet()


def _release_inherited_after_fork() -> None:
    """In a child made by ``os.fork()``, release the parent's segments as an attaching process does.

    The owner's finalizer is a ``multiprocessing.util.Finalize``, which runs only in the pid that
    made it: without this, a forked child that exits normally leaves the mapping to the standard
    library's ``SharedMemory.__del__``, which closes it while the buffer's arrays still export it
    and prints ``BufferError: cannot close exported pointers exist``.  The child unmaps at its exit
    (or at ``close()``); only the parent unlinks.
    """
    for memory in list(_OWNED):
        memory._finalizer = weakref.finalize(memory, SharedMemory._release, memory._shm, None)
    _OWNED.clear()


os.register_at_fork(after_in_child=_release_inherited_after_fork)

_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _unlink_owned_and_die(signum: int, frame: Any) -> None:
    try:
        for path in termination.unlink_owned():
            resource_tracker.unregister(path, "shared_memory")
    finally:
        # Then the default action, as if nothing had been installed: the exit
        # status still says "killed by SIGTERM".
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _unlink_on_termination(memory: SharedMemory) -> None:
    """Unlink ``memory`` also when this process is told to end by SIGTERM or SIGHUP.

    Their default action ends a process without running exit handlers.  Where
    the program left them at the default (and from the main thread, the only
    one that may install handlers), a handler unlinks this process's segments
    first and then lets the default action happen.  Handlers a program sets
    itself are left alone: it decides how it ends.  ext/termination.pyx guards
    the handler: should Python not run it soon (the signal landed on another
    thread, or the main thread is stuck in C), the process still unlinks its
    segments and ends.
    """
    termination.own(_shm_path(memory.name))
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _TERMINATING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _unlink_owned_and_die)
    guard_termination_signals()


def guard_termination_signals() -> None:
    """Guard the handler that unlinks segments on SIGTERM and SIGHUP, where it is installed.

    Setting a handler with ``signal.signal`` drops the C guard in front of the one it replaces:
    code that puts this module's handler back calls this again.  Outside the main thread it does
    nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _TERMINATING:
        if signal.getsignal(sig) is _unlink_owned_and_die:
            termination.guard(sig)


def _shm_path(name: str) -> str:
    """The name shm_open and the resource tracker know segment ``name`` by."""
    return "/" + name
