# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Lifo selection: the drawable items drawn newest inserted first
(an ordered selector, see ext/heap.pyx)."""
from libc.stdint cimport int64_t

from mpreplay._ext.heap import STATE_DTYPE, state_size  # this kernel's state: the heap's


cdef class LifoSelector(HeapSelector):
    """The drawable items of ``state`` drawn newest inserted first (no two share an insertion number)."""

    cdef double key_of(self, double priority, int64_t number) noexcept nogil:
        return -<double>number
