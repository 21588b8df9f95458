# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Lifo removal: a write into a full lane replaces its newest rows (a remover, see
ext/remover.pyx).  A lane's rows lie behind its cursor, the newest last.  A write of k rows
takes the free slots from the cursor first, as the ring does while the lane fills; the rows it
has no free slot for replace the newest stored ones, just behind the cursor, so a write never
replaces a row while a slot it could take stays free.  The cursor ends after the write's last
slot: its rows are the newest.  Rows only: an episode's next steps read the newest frames."""
from libc.stdint cimport int64_t

from mpreplay._ext.slots cimport Slots


cdef class LifoRemover(Remover):
    """A write into a full lane replaces its newest rows."""

    def __init__(self):
        self.overwrites = True

    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3:
        cdef Slots s = <Slots>slots
        if skip:
            return s.run_at_cursor(k, lane, skip, busy)
        return s.run_at_cursor(k, lane, s.free_run(k, lane, 0) - k, busy)

    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept:
        return (<Slots>slots).slot(lane, start, k)
