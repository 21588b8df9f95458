"""How long a shared table lives, and how its handles learn that it ended.

A table that is not persistent ends with its creator: closed, or ended by a signal, it unlinks
its segment; SIGKILLed, its resource tracker unlinks it once every process that shares the
tracker (its multiprocessing children) has ended.  A persistent table has no owner: it stays
until ``mpreplay rm`` or ``close(unlink=True)``.

A handle whose table ended must not go on writing rows nobody will read.  Each handle's lock
(ext/lock.pyx, ``SharedLock.watch``) calls a :class:`Watch` at the first acquisition and then
at most once every :data:`WATCH_EVERY` seconds, as its calls take the lock: the watch looks
whether the segment's name is gone (``fstat`` of the descriptor: no link left) or, for a table
that is not persistent, whether its creator died (its process token), and if so sets the
header's ``CLOSED`` word to why (and unlinks the segment of a creator that died, as its
resource tracker would, later: once every process sharing the tracker has ended).  Every call
of every handle reads that word when it takes the lock already, and raises
:class:`~mpreplay.TableGone` naming the cause.  The per-call
cost is a comparison with a clock reading the lock makes anyway; the watch's system calls
(a few microseconds) run once a second per handle.  See docs/processes.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ext.lock import SharedLock
from ._ext.processes import token_alive
from ._ext.schema import CLOSED, ENDED_CREATOR, ENDED_REMOVED
from .errors import read_only
from .memory import SharedMemory, unlink_segment

__all__ = ["WATCH_EVERY", "Watch", "check_unlink", "watch"]

# Seconds between two looks of one handle (as its calls come): how long a handle may go on
# after its table ended, at most, before its calls raise TableGone.
WATCH_EVERY = 0.5


class Watch:
    """Looks whether the table of ``header`` in ``memory`` ended; its creator ``creator`` (a
    process token; None for a persistent table, which its creator's death does not end)."""

    __slots__ = ("_creator", "_header", "_memory")

    def __init__(self, memory: SharedMemory, header: np.ndarray, creator: int | None):
        self._memory, self._header, self._creator = memory, header, creator

    def __call__(self) -> None:
        # Called with the lock held (SharedLock.watch): the word is set once, by one handle.
        if self._header[CLOSED]:
            return
        if self._creator is not None and not token_alive(self._creator):
            self._header[CLOSED] = ENDED_CREATOR
            # What its resource tracker would do once every process sharing the tracker has
            # ended: the memory goes as soon as the last handle unmaps, and the name is free
            # for a new table (a restarted creator's).
            unlink_segment(self._memory.name)
        elif self._memory.unlinked():
            self._header[CLOSED] = ENDED_REMOVED


def watch(lock: SharedLock, memory: SharedMemory, header: np.ndarray, creator: int | None) -> None:
    """Have ``lock`` watch the table in ``memory`` (see :class:`Watch`)."""
    lock.watch(Watch(memory, header, creator), WATCH_EVERY)


def check_unlink(memory: Any, unlink: bool, persist: bool, readonly: bool) -> None:
    """Refuse ``close(unlink=unlink)`` of a handle over ``memory`` where it cannot be done:
    ValueError naming ``unlink``, :class:`~mpreplay.ReadOnlyError` for a read-only handle."""
    if not isinstance(memory, SharedMemory):
        raise ValueError("unlink: a local table has no segment to keep or unlink")
    if unlink and readonly:
        raise read_only("close(unlink=True)")
    if unlink and not (memory.is_owner or persist):
        raise ValueError("unlink: a table that is not persistent is unlinked by its creator, when it closes or ends")
    if not unlink and memory.is_owner:
        raise ValueError("unlink: a table that is not persistent ends with its creator (build it persist=True)")
