# cython: language_level=3, boundscheck=False, wraparound=False, annotation_typing=False, auto_pickle=False
"""The per-step calls of a buffer -- ``add``, ``sample``, ``update_priorities`` -- as
methods of C base classes of the buffer classes (mpreplay/buffer.py).

A training loop makes these calls every step.  Through a Python method each would
pass a Python frame on its way into the kernel; from here it reaches the kernel
directly, which at small capacities is a sizeable share of what the call costs.
What is not the usual call (a batch, priorities given, a timeout, values that need
converting, n-step folding or compression) goes to the buffer's Python methods and
the argument checks of :mod:`mpreplay.checks`, as it always did.
"""
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact

from mpreplay._ext.ring cimport Ring

from typing import Any

import numpy as np

from mpreplay import checks
from mpreplay._ext.gate import BufferClosed

# Finite betas pass the sample fast path (checks.number refuses inf and NaN).
cdef double _MAX_BETA = 1.7976931348623157e308


cdef class BufferCalls:
    """The calls of :class:`mpreplay.ReplayBuffer` that a loop makes every step."""

    def _bind_calls(self, Ring kernel, bint plain_rows) -> None:
        """Route the calls to ``kernel`` (None: the buffer is closed); ``plain_rows``:
        one transition goes to the kernel as it is, not folded or planned first."""
        self._kernel = kernel
        self._plain = plain_rows

    cdef Ring _open(self):
        if self._kernel is None:
            raise BufferClosed("the replay buffer is closed")
        return self._kernel

    def add(self, *, timeout: float | None = None, **fields: Any) -> int:
        """Store one transition, or a batch with a leading dimension.

        Returns the slot of the first transition written.  The batch is
        checked as a whole first: on any error nothing is stored.  With a
        rate limiter, waits at most ``timeout`` seconds (None: no limit) for
        it to let the insert through, then raises TimeoutError.
        """
        cdef Ring kernel = self._open()
        cdef Py_ssize_t slot
        if "priorities" in fields:
            raise TypeError("priorities: only PrioritizedReplayBuffer.add takes initial priorities")
        if timeout is None and self._plain:
            slot = kernel.add_one(fields, -1.0, None)  # -1: not one row of plain values, nothing stored
            if slot >= 0:
                return slot
        return self._add(fields, None, timeout)

    def add_row(self, fields: dict[str, Any]) -> int:
        """The kernel's add of one transition, for an adapter that holds its fields as a dict
        already (``mpreplay.compat.cpprb``): no keyword arguments to unpack and pack again.

        Stores ``fields`` (one value per field: Python scalars and arrays of the field's exact
        dtype and shape) with the default priority and returns the slot written; or returns
        -1, storing nothing, when the values need :meth:`add`'s checks and conversions, or this
        buffer plans its rows before storing them (n-step folding, compression, sequences).
        """
        cdef Ring kernel = self._open()
        if type(fields) is not dict:
            raise TypeError(f"fields: expected a dict of the fields, got {type(fields).__name__}")
        return kernel.add_one(fields, -1.0, None) if self._plain else -1

    def sample(self, batch_size: int, *, timeout: float | None = None,
               out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions uniformly (with replacement), plus their ``indexes``.

        With a rate limiter, waits at most ``timeout`` seconds (None: no
        limit) for it to allow the sample, then raises TimeoutError.  ``out``
        may hold arrays to fill instead of fresh ones (e.g. the previous batch):
        for large observations that spares the page faults of new memory.
        """
        cdef Ring kernel = self._open()
        if not (PyLong_CheckExact(batch_size) and batch_size >= 1 and timeout is None):
            batch_size = checks.integer("batch_size", batch_size, low=1)
            timeout = checks.seconds("timeout", timeout)
        return kernel.sample(batch_size, False, -1.0, timeout, out)


cdef class PrioritizedCalls(BufferCalls):
    """The calls of :class:`mpreplay.PrioritizedReplayBuffer` that a loop makes every step."""

    def _bind_calls(self, Ring kernel, bint plain_rows, bint float32_weights=False, bint uint64_indexes=False):
        """As :meth:`BufferCalls._bind_calls`; also takes the types ``sample`` hands its weights
        and indexes out as (float32 rather than float64, uint64 rather than int64)."""
        BufferCalls._bind_calls(self, kernel, plain_rows)
        self._weights_f32 = float32_weights
        self._indexes_u64 = uint64_indexes

    def add(self, *, priorities: Any = None, timeout: float | None = None, **fields: Any) -> int:
        """Store one transition or a batch; ``priorities`` (one per transition, or one
        float for all) defaults to the largest priority stored now.  See :meth:`ReplayBuffer.add`."""
        cdef Ring kernel = self._open()
        cdef Py_ssize_t slot
        if priorities is None and timeout is None and self._plain:
            slot = kernel.add_one(fields, -1.0, None)  # -1: not one row of plain values, nothing stored
            if slot >= 0:
                return slot
        return self._add(fields, priorities, timeout)

    def sample(self, batch_size: int, beta: float = 0.4, *, timeout: float | None = None,
               out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions in proportion to their priority.

        Adds ``indexes`` and importance ``weights`` = (N·P(i))^-β / max_j (N·P(j))^-β.
        ``timeout`` and ``out`` as for :meth:`ReplayBuffer.sample`.
        """
        cdef Ring kernel = self._open()
        if not (PyLong_CheckExact(batch_size) and batch_size >= 1 and PyFloat_CheckExact(beta)
                and 0.0 <= PyFloat_AS_DOUBLE(beta) <= _MAX_BETA and timeout is None):
            batch_size = checks.integer("batch_size", batch_size, low=1)
            beta, timeout = checks.number("beta", beta, low=0.0), checks.seconds("timeout", timeout)
        return kernel.sample(batch_size, True, beta, timeout, out, False, self._weights_f32,
                             self._indexes_u64)

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Set new priorities of sampled transitions.

        An update whose slot was overwritten since this process sampled it is
        dropped (counted in ``stats()["stale_updates_dropped"]``).
        """
        cdef Ring kernel = self._open()
        if kernel.update(indexes, priorities) < 0:
            # Not the int64 and float64 arrays sample() hands out (a list, a tensor, other
            # dtypes, lengths that differ): converted and checked, they are.
            indexes = checks.indexes("indexes", indexes)
            kernel.update(indexes, checks.priorities("priorities", priorities, len(indexes), max_priority=None))
