# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""MaxHeap selection: the drawable items drawn highest priority first
(an ordered selector, see ext/heap.pyx)."""
from libc.stdint cimport int64_t

from mpreplay._ext.heap import STATE_DTYPE, priority_views, state_size  # this kernel's state: the heap's


cdef class MaxHeapSelector(HeapSelector):
    """The drawable items of ``state`` drawn highest priority first; ties go to the one inserted first."""

    cdef double key_of(self, double priority, int64_t number) noexcept nogil:
        return -priority
