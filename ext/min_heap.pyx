# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""MinHeap selection: the drawable items drawn lowest priority first
(an ordered selector, see ext/heap.pyx)."""
from libc.stdint cimport int64_t

from mpreplay._ext.heap import STATE_DTYPE, priority_views, state_size  # this kernel's state: the heap's


cdef class MinHeapSelector(HeapSelector):
    """The drawable items of ``state`` drawn lowest priority first; ties go to the one inserted first."""

    cdef double key_of(self, double priority, int64_t number) noexcept nogil:
        return priority
