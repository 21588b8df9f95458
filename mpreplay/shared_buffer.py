"""Buffers in shared memory: :class:`SharedMemoryBuffer` (a segment behind a process-shared lock,
pickled as a handle that attaches to it), the MP classes built on it, and what a forked child
must not inherit of its parent's buffers."""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from . import manifest
from ._ext.lock import LOCK_NBYTES, SharedLock
from ._ext.schema import LOCK_ARRAY, LOCK_HOLDS, LOCK_WAIT_NS
from ._ext.slots import Slots
from .buffer import ReplayBuffer
from .buffer_core import BufferCore, open_handle
from .memory import Layout, SharedMemory
from .prioritized_buffer import PrioritizedReplayBuffer

__all__ = ["SharedMemoryBuffer", "MPReplayBuffer", "MPPrioritizedReplayBuffer"]


def _attach(cls: type[BufferCore], config: dict[str, Any], name: str) -> BufferCore:
    """Unpickle a shared buffer: map the creator's segment (never owning it), once its manifest
    says it holds the layout this process computes from ``config`` (IncompatibleSegmentError if not)."""

    def attach(layout: Layout, expected: dict[str, Any]) -> SharedMemory:
        return SharedMemory(layout, name=name, verify=lambda buf: manifest.check_segment(name, buf, expected))

    return open_handle(cls, config, attach)


class SharedMemoryBuffer(BufferCore):
    """The memory of a buffer is a shared-memory segment behind a process-shared lock.

    Pickling sends a small handle (the segment's name and the buffer's
    configuration); unpickling in another process maps the same segment.
    The creating process owns the segment and unlinks it on ``close()``,
    when its last reference is dropped and at exit; other processes only
    unmap it (a dropped handle at once).
    """

    _memory: SharedMemory
    _LOCK_NBYTES = LOCK_NBYTES

    def _allocate(self, layout: Layout) -> SharedMemory:
        if self._mmap_prefix is not None:
            raise ValueError(
                "mmap_prefix: a shared buffer lives in a shared-memory segment; only local buffers "
                "map their arrays to files"
            )
        return SharedMemory(layout)

    def _make_lock(self, create: bool, slots: Slots) -> SharedLock:
        # A holder that died may have left slots, counters and tree nodes half
        # updated: the next owner makes them agree with the slot states again.
        self._thread_lock = None  # processes take the segment's lock
        self._lock = SharedLock(
            self._memory.arrays[LOCK_ARRAY],
            create,
            on_recover=slots.recover,
            counters=self._header[LOCK_WAIT_NS : LOCK_HOLDS + 1],
        )
        return self._lock

    def _bind(self, create: bool, rng: np.random.Generator) -> None:
        super()._bind(create, rng)
        _FORK_SENSITIVE.add(self)

    def _release(self) -> None:
        _FORK_SENSITIVE.discard(self)
        super()._release()

    def _after_fork(self) -> None:
        # A forked child must not replay its parent's random stream, judge
        # priority updates by what its parent sampled, or fold its steps onto
        # the ones its parent had pending.
        self._ring.after_fork(np.random.default_rng())
        self._forget_pending()

    def __reduce__(self) -> tuple[Any, ...]:
        return _attach, (type(self), self._config(), self._memory.name)

    @property
    def name(self) -> str:
        """Name of the shared-memory segment."""
        return self._memory.name


class MPReplayBuffer(SharedMemoryBuffer, ReplayBuffer):
    """:class:`ReplayBuffer` in shared memory, written and sampled by many processes."""


class MPPrioritizedReplayBuffer(SharedMemoryBuffer, PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` in shared memory, written and sampled by many processes."""


_FORK_SENSITIVE: weakref.WeakSet[SharedMemoryBuffer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for buffer in list(_FORK_SENSITIVE):
        buffer._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
