# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Keep-unread removal: a write never replaces a row not yet sampled; it waits for room (a
remover, see ext/remover.pyx).  With ``max_times_sampled=1`` and a fifo or lifo selector it
makes Reverb's Queue and Stack.

A table of rows writes into any free slots, wherever they lie: a stack frees its newest
slots first, a queue written by several processes frees them out of order.  A compressed
table's episode frames lie consecutive in the writer's lane, so there a write takes the run at
the cursor, as the ring does, once no slot of it holds an unread row or a frame one reads.
"""
from libc.stdint cimport int64_t

from mpreplay._ext.remover cimport SCATTERED, WAIT
from mpreplay._ext.slots cimport Slots


cdef class KeepUnreadRemover(Remover):
    """A write waits for slots that hold no unread row instead of replacing one."""

    def __init__(self):
        self.overwrites = False

    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3:
        cdef Slots s = <Slots>slots
        cdef Py_ssize_t start
        busy[0] = 0
        if free != NULL and s.frames is None and s.sequences is None:
            return SCATTERED if s.find_free(k, lane, free) else WAIT
        start = s.run_at_cursor(k, lane, skip, busy)
        if start >= 0 and s.free_run(k, lane, skip) < k:
            return WAIT
        return start

    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept:
        return (<Slots>slots).slot(lane, start, k)
