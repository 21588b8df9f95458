"""The removers a table is built with: what a write replaces when it needs room.

A table's slots form lanes, rings its writers fill in order.  Its remover (Reverb's item
remover) decides where a write of ``k`` rows goes, and so which stored items it replaces.  Each
is a kernel in ``ext/<kernel>.pyx`` (with its ``.pxd``), a subclass of ``ext/remover.pyx``'s
``Remover``, and one entry of :data:`REMOVERS` below, which the buffers' constructor (``remover=``),
the manifest (its ``"remover"`` entry) and ``mpreplay ls`` read: adding a remover is its kernel
files and one line here.  A remover keeps no state of its own (the lanes' cursors and the slot
states are the table's), so it has no array in the segment.

* ``"fifo"``: the ring.  A write takes the next slots of its lane from the cursor, replacing the
  oldest rows there (the default).
* ``"lifo"``: a write takes the free slots at the lane's cursor first, as the ring while the lane
  fills; the rows it has no free slot for replace the newest stored rows (rows only: an episode's
  next steps read the newest frames).
* ``"keep_unread"``: a write never replaces a row not yet sampled; it waits for room, so a table
  needs ``max_times_sampled=`` with it (refused otherwise: nothing would free a slot).  A table of
  rows writes into any free slots; a compressed one (an episode's frames consecutive in its
  lane) into the run at its cursor once no unread row holds it or reads a frame there -- or,
  while unread rows hold it, moves its episode to the first run of its lane they leave free
  (see mpreplay/waiting_rows.py).  With ``max_times_sampled=1`` and a ``"fifo"`` or ``"lifo"``
  selector it is Reverb's Queue or Stack (:class:`mpreplay.Queue`, :class:`mpreplay.Stack` build it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["REMOVERS", "RemoverEntry", "entry", "make", "names"]


@dataclass(frozen=True)
class RemoverEntry:
    """One remover: what ``remover=`` and the manifest call it, its kernel, its rule."""

    name: str
    kernel: str  # the module mpreplay._ext.<kernel> (ext/<kernel>.pyx)
    cls: str  # its Remover subclass
    description: str  # one line: what a write replaces
    overwrites: bool = True  # a write may replace an item not yet sampled (else it waits for room)
    frames: bool = True  # it can keep an episode's frames consecutive in its lane (compressed, sequence tables)


REMOVERS: tuple[RemoverEntry, ...] = (
    RemoverEntry("fifo", "fifo_remover", "FifoRemover", "the oldest rows of the writer's lane (the ring)"),
    RemoverEntry("keep_unread", "keep_unread", "KeepUnreadRemover", "none: a write waits for room", overwrites=False),
    RemoverEntry("lifo", "lifo_remover", "LifoRemover", "free slots first, then the newest rows", frames=False),
)

_BY_NAME = {e.name: e for e in REMOVERS}


def names() -> tuple[str, ...]:
    """The registered removers' names."""
    return tuple(_BY_NAME)


def entry(name: str) -> RemoverEntry:
    """The registry entry of remover ``name``; ValueError naming the registered ones."""
    if not isinstance(name, str) or name not in _BY_NAME:
        raise ValueError(f"remover: expected one of {list(_BY_NAME)}, got {name!r}")
    return _BY_NAME[name]


def make(name: str) -> Any:
    """The kernel's remover ``name``."""
    e = entry(name)
    return getattr(importlib.import_module(f"mpreplay._ext.{e.kernel}"), e.cls)()
