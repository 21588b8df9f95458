# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fifo removal, the ring: a write takes the next slots of its lane from the cursor, replacing
the oldest rows there (a remover, see ext/remover.pyx)."""
from libc.stdint cimport int64_t

from mpreplay._ext.slots cimport Slots


cdef class FifoRemover(Remover):
    """Each lane a ring: a write replaces the oldest rows of its lane."""

    def __init__(self):
        self.overwrites = True

    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3:
        return (<Slots>slots).run_at_cursor(k, lane, skip, busy)

    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept:
        return (<Slots>slots).slot(lane, start, k)
