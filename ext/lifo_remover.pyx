# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Lifo removal: a write into a full lane replaces its newest rows (a remover, see
ext/remover.pyx).  While the lane fills, a write takes the slots from its cursor, as the ring
does; once they hold items, it takes the k slots before the cursor -- the newest -- and the
cursor stays.  Rows only: an episode's next steps read the newest frames."""
from libc.stdint cimport int64_t

from mpreplay._ext.slots cimport Slots


cdef class LifoRemover(Remover):
    """A write into a full lane replaces its newest rows."""

    def __init__(self):
        self.overwrites = True

    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3:
        cdef Slots s = <Slots>slots
        if skip or not s.holds_items(k, lane):
            return s.run_at_cursor(k, lane, skip, busy)
        return s.run_at_cursor(k, lane, -k, busy)

    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept:
        cdef Slots s = <Slots>slots
        cdef Py_ssize_t cursor = s.lane_cursor(lane)
        return s.slot(lane, start, k) if start == cursor else cursor
