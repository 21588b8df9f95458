# cython: language_level=3, boundscheck=False, wraparound=False, annotation_typing=False, auto_pickle=False
"""The per-step calls of a table -- ``add``, ``sample``, ``update_priorities`` -- as methods of
the C base class of :class:`mpreplay.TableParts`.

A training loop makes these calls every step.  Through a Python method each would pass a
Python frame on its way into the kernel; from here it reaches the kernel directly, which at
small capacities is a sizeable share of what the call costs.  An add of exact arrays -- one
transition or a batch, with priorities and a timeout, into rows or a compressed writer's
lane -- is the kernel's from the call to the publication; what is not (values that need
converting or are refused, n-step folding, sequences) goes to the table's Python methods and
the argument checks of :mod:`mpreplay.checks`.
"""
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact

from mpreplay._ext.table_handle cimport TableHandle

from typing import Any

import numpy as np

from mpreplay import checks
from mpreplay._ext.gate import BufferClosed
from mpreplay.errors import read_only

# Betas in [0, 1] pass the sample fast path: beyond 1 importance sampling over-corrects
# (beta anneals from about 0.4 to 1), and checks.number names the range it refuses.
cdef double _MAX_BETA = 1.0
# A table that draws by priority hands out importance weights with this beta unless told.
cdef object _DEFAULT_BETA = 0.4


cdef class TableCalls:
    """The calls of :class:`mpreplay.TableParts` that a loop makes every step."""

    def _bind_calls(self, TableHandle kernel, bint plain_rows, bint by_priority=False, bint float32_weights=False,
                    bint uint64_indexes=False, bint readonly=False, object frames=None) -> None:
        """Route the calls to ``kernel`` (None: the table is closed).  ``plain_rows``: rows go to
        the kernel as they are, not folded or planned first; ``by_priority``: the selector draws
        by the priorities given (they may be given and updated, and samples carry importance
        weights), handed out as float32 rather than float64, the indexes as uint64 rather than
        int64; ``readonly``: the calls that write refuse; ``frames``: the writer
        (:class:`~mpreplay.frame_store.FrameStore`) of a compressed table whose rows go to the
        kernel as they are, planned after its ``episode``."""
        self._kernel = kernel
        # A read-only handle's add takes the table's checked path, which refuses it: the
        # one-transition path stays as it was.
        self._plain = plain_rows and not readonly
        self._frames = None if readonly else frames
        self._readonly = readonly
        self._by_priority = by_priority
        self._weights_f32 = float32_weights
        self._indexes_u64 = uint64_indexes

    cdef TableHandle _open(self):
        if self._kernel is None:
            raise BufferClosed("the replay buffer is closed")
        return self._kernel

    def add(self, *, priorities: Any = None, timeout: float | None = None, **fields: Any) -> int:
        """Store one transition, or a batch with a leading dimension; returns the slot of the first
        row stored, or -1 when the call stored none (an n-step table holds a step back until the
        ``n`` steps its row folds are known).

        The batch is checked as a whole first: on any error nothing is stored.  ``priorities``
        (a table that draws by priority: one per transition, or one float for all) defaults to
        the largest priority stored now.  With a rate limiter, or a remover that keeps unread
        rows, waits at most ``timeout`` seconds (None: no limit) for room, then raises
        TimeoutError having stored nothing.
        """
        cdef TableHandle kernel = self._open()
        cdef Py_ssize_t slot
        if priorities is None and timeout is None and self._plain:
            slot = kernel.add_one(fields, -1.0, None)  # -1: not one row of plain values, nothing stored
            if slot >= 0:
                return slot
        if priorities is not None and not self._by_priority:
            raise TypeError("priorities: only a table whose selector draws by priority takes initial priorities")
        if self._plain:
            slot = kernel.add_rows(fields, priorities, timeout, None)
        elif self._frames is not None:
            # Read each call: the writer starts a new episode after a fork or clear.
            slot = kernel.add_rows(fields, priorities, timeout, self._frames.episode)
        else:
            slot = -1
        # -1: rows that need converting, checking by name or planning by the table's writer.
        return slot if slot >= 0 else self._add(fields, priorities, timeout)

    def add_row(self, fields: dict[str, Any]) -> int:
        """The kernel's add of one transition, for an adapter that holds its fields as a dict
        already (``mpreplay.compat.cpprb``): no keyword arguments to unpack and pack again.

        Stores ``fields`` (one value per field: Python scalars and arrays of the field's exact
        dtype and shape) with the default priority and returns the slot written; or returns
        -1, storing nothing, when the values need :meth:`add`'s checks and conversions, or this
        table plans its rows before storing them (n-step folding, compression, sequences).
        """
        cdef TableHandle kernel = self._open()
        if self._readonly:
            raise read_only("add_row")
        if type(fields) is not dict:
            raise TypeError(f"fields: expected a dict of the fields, got {type(fields).__name__}")
        return kernel.add_one(fields, -1.0, None) if self._plain else -1

    def sample(self, batch_size: int, beta: float | None = None, *, timeout: float | None = None,
               out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` items by the table's selector, with their ``indexes``.

        A table that draws by priority draws them stratified and adds importance ``weights``
        = (N·P(i))^-β / max_j (N·P(j))^-β, ``beta`` in [0, 1] (0.4 unless given), j over every
        stored item, drawn or not (the least likely one's weight is 1; a batch's largest may be less);
        any other takes no ``beta``.  With a rate limiter, waits at most ``timeout`` seconds (None: no limit)
        for it to allow the sample, then raises TimeoutError.  A batch handed out is filled again
        by a later sample once nothing refers to it or any of its arrays (no view, slice or
        tensor over them); ``out`` may hold arrays to fill instead (e.g. the previous batch,
        still held).
        """
        cdef TableHandle kernel = self._open()
        if self._by_priority:
            if beta is None:
                beta = _DEFAULT_BETA
            if not (PyLong_CheckExact(batch_size) and batch_size >= 1 and PyFloat_CheckExact(beta)
                    and 0.0 <= PyFloat_AS_DOUBLE(beta) <= _MAX_BETA and timeout is None):
                batch_size = checks.integer("batch_size", batch_size, low=1)
                beta, timeout = checks.number("beta", beta, low=0.0, high=1.0), checks.seconds("timeout", timeout)
            return kernel.sample(batch_size, True, beta, timeout, out, False, self._weights_f32,
                                 self._indexes_u64)
        if beta is not None:
            raise TypeError("beta: only a table whose selector draws by priority hands out importance weights")
        if not (PyLong_CheckExact(batch_size) and batch_size >= 1 and timeout is None):
            batch_size = checks.integer("batch_size", batch_size, low=1)
            timeout = checks.seconds("timeout", timeout)
        return kernel.sample(batch_size, False, -1.0, timeout, out)

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Set new priorities of sampled items (a table whose selector draws by priority).

        An update whose slot was overwritten since this process sampled it is dropped
        (counted in ``stats()["stale_updates_dropped"]``).
        """
        cdef TableHandle kernel = self._open()
        if self._readonly:
            raise read_only("update_priorities")
        if not self._by_priority:
            raise TypeError("update_priorities: this table's selector draws by no priority")
        if kernel.update(indexes, priorities) < 0:
            # Not the int64 and float64 arrays sample() hands out (a list, a tensor, other
            # dtypes, lengths that differ): converted and checked, they are.
            indexes = checks.indexes("indexes", indexes)
            kernel.update(indexes, checks.priorities("priorities", priorities, len(indexes), max_priority=None))
