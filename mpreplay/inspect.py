"""The operator's and tester's view of a buffer's internals: :meth:`mpreplay.ReplayBuffer.inspection`.

A buffer's public API says what it stores; this module shows how it stores it,
for whoever must look underneath -- an operator chasing a damaged segment, a
test that checks a byte layout or a crash repair -- without naming a private
attribute of the library, so a refactor that keeps the behaviour keeps them
working.  ``buffer.inspection()`` gives an :class:`Inspection`:

* ``arrays``: every array of the buffer's memory by its segment schema name
  (``header``, ``generation``, ``state``, ``tree`` or ``members``, ``rows``,
  ``field:<name>``, ...; see docs/architecture.md, "Segment schema"), as
  read-only views; ``nbytes``, the size of the block; ``counters()``, the
  header by counter name.
* ``priorities(indexes)`` and ``total_weight``: what the selector holds.
* ``verify(timeout)``: the consistency check behind ``buffer.verify()``.
* ``time_lock_holds()`` and ``lock_holds()``: how long this handle's calls hold a shared
  buffer's lock (timed only when asked), for benchmarks.
* Test hooks, which change the buffer: ``writable(name)`` (a writable view, to
  damage a buffer on purpose), ``holding_lock(timeout)`` (hold the lock as a
  call does: a frozen or killed holder), ``reserve(k)`` (a write stopped
  between its reservation and its publication: a writer killed or frozen while
  copying), and ``arm_fault(site)`` (this process SIGKILLs itself at a site of
  ``FAULT_SITES`` inside a critical section).

A testing module, outside the stability promise (docs/stability.md): its names may change in
any release.  The fault hooks are importable from here for tests and left out of ``__all__``,
hence out of the reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import checks, selectors
from ._ext.gate import deadline
from ._ext.schema import HEADER_ARRAY
from ._ext.slots import FAULT_SITES as FAULT_SITES  # the test hooks: importable, not in __all__
from ._ext.slots import arm_fault as arm_fault
from .consistency import COUNTERS, check_arrays

__all__ = ["Inspection", "Reservation"]


# The header's counters by name (the schema's order; the rest of the header is spare).
class Reservation:
    """Slots a writer reserved and has not published (see :meth:`Inspection.reserve`)."""

    def __init__(self, reservation: Any):
        self._reservation = reservation

    @property
    def slots(self) -> np.ndarray:
        """The reserved slots, a run in their lane's order or a queue's free slots."""
        return np.array(self._reservation.slots)

    def publish(self, *, timeout: float | None = None) -> None:
        """Publish the slots as they are (the write's last step); TimeoutError gives them up."""
        self._reservation.publish(deadline=deadline(checks.seconds("timeout", timeout)))


class Inspection:
    """A buffer's memory, selector and lock as the buffer itself sees them (see the module).

    Made by :meth:`mpreplay.ReplayBuffer.inspection`; valid while the buffer is open.
    """

    def __init__(
        self,
        memory: Any,
        gate: Any,
        handle: Any,
        selector: Any,
        *,
        capacity: int,
        sequence_length: int | None,
        one_lane: bool,
        selector_name: str,
        lock: Any = None,
    ):
        self._memory, self._gate, self._handle, self._selector = memory, gate, handle, selector
        self._lock = lock  # a shared buffer's process-shared lock (None: a local buffer's)
        self.capacity = capacity
        self.sequence_length = sequence_length
        self.selector_name = selector_name  # its entry in mpreplay.selectors
        self._one_lane = one_lane  # every writer shares lane 0 (an uncompressed transition buffer)

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        """Read-only views of every array of the memory block, by segment schema name."""
        views = {}
        for name, array in self._memory.arrays.items():
            view = array.view()
            view.flags.writeable = False
            views[name] = view
        return views

    @property
    def nbytes(self) -> int:
        """Bytes of the memory block (the segment's layout)."""
        return int(self._memory.layout.nbytes)

    def counters(self) -> dict[str, int]:
        """The header's counters by name, as they are now (read without the lock)."""
        header = self._memory.arrays[HEADER_ARRAY]
        return {name: int(header[at]) for name, at in COUNTERS.items()}

    def priorities(self, indexes: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(weights, raw)`` copies at ``indexes``: each slot's weight in the selector (0: not
        drawable) and raw priority (-inf: not drawable).  A selector that keeps priorities only
        (TypeError for one that keeps none, such as ``"uniform"``)."""
        views = selectors.priority_views(self.selector_name, self._selector_state(), self.capacity)
        if views is None:
            raise TypeError(f"priorities: selector {self.selector_name!r} keeps no priorities")
        idx = checks.indexes("indexes", indexes)
        weights, raw = views
        return weights[idx].copy(), np.where(weights[idx] > 0, raw[idx], -np.inf)

    def _selector_state(self) -> np.ndarray:
        return self._memory.arrays[selectors.entry(self.selector_name).array_name]

    @property
    def total_weight(self) -> float:
        """The sum of the weights of the drawable items (a prioritized tree's total; a uniform
        selector's member count)."""
        return float(self._selector.total_weight)

    def verify(self, timeout: float | None = None) -> dict[str, Any]:
        """Check, under the lock, that everything derived agrees with the slot states (see
        ``mpreplay.consistency``): the report, or :class:`~mpreplay.errors.CorruptBufferError`."""
        with self.holding_lock(timeout):
            return check_arrays(self._memory.arrays, self.capacity, self.sequence_length, self.selector_name)

    def time_lock_holds(self, on: bool = True) -> None:
        """Start (or with ``on=False`` stop) timing how long the calls of this buffer object -- this
        handle, in this process -- hold the shared lock, each hold from acquisition to release;
        starting sets :meth:`lock_holds` back to zero.  For benchmarks: the hold time per call is
        what limits how many processes one lock serves.  Shared buffers only (TypeError otherwise)."""
        if self._lock is None:
            raise TypeError("time_lock_holds: a local buffer has no shared lock (its threads take a ThreadLock)")
        self._lock.time_holds(checks.flag("on", on))

    def lock_holds(self) -> tuple[float, int]:
        """``(seconds, holds)``: how long this buffer object held the shared lock, and how many
        times, since :meth:`time_lock_holds` started timing."""
        if self._lock is None:
            raise TypeError("lock_holds: a local buffer has no shared lock (its threads take a ThreadLock)")
        return self._lock.hold_times()

    # -- test hooks: these change the buffer -----------------------------------------------
    def writable(self, name: str) -> np.ndarray:
        """A writable view of array ``name``: to damage a buffer on purpose (tests of ``verify``)."""
        if name not in self._memory.arrays:
            raise KeyError(f"name: expected one of {sorted(self._memory.arrays)}, got {name!r}")
        return self._memory.arrays[name]

    @contextlib.contextmanager
    def holding_lock(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the buffer's lock as a call does: every other call waits meanwhile.  Taking it
        repairs what a holder that died left (see docs/architecture.md, "Crash handling");
        TimeoutError when it cannot be had within ``timeout``."""
        self._gate.hold(deadline(checks.seconds("timeout", timeout)))
        try:
            yield
        finally:
            self._gate.let_go()

    def reserve(self, k: int, *, timeout: float | None = None) -> Reservation:
        """Reserve ``k`` slots as a writer does before copying its rows, and stop there: the
        slots are being written (odd generations, this process's token) until
        :meth:`Reservation.publish`.  Uncompressed transition buffers only, whose writers share
        one lane (TypeError otherwise: a compressed or sequence writer writes in a lane of its own)."""
        if not self._one_lane:
            raise TypeError(
                "reserve: only the writers of an uncompressed transition buffer share a lane; a "
                "compressed or sequence buffer's writer claims its own"
            )
        k = checks.integer("k", k, low=1)
        return Reservation(self._handle.reserve(k, deadline(checks.seconds("timeout", timeout)), scatter=True))
