# An indexed binary heap of the drawable items, all of it in one caller-owned int64 array (heap or
# shared segment): the base of the ordered selectors (fifo, lifo, max_heap, min_heap), which
# differ only in the key an item is ordered by (key_of).  See ext/heap.pyx for the layout.
from libc.stdint cimport int64_t

from mpreplay._ext.selector cimport Selector


cdef class HeapSelector(Selector):
    cdef int64_t[::1] _state
    cdef int64_t* _count      # how many items may be drawn: the heap's length
    cdef int64_t* _inserts    # insertions ever: the next item's insertion number
    cdef int64_t* _heap       # the drawable items in heap order, the first `count` valid
    cdef int64_t* _position   # where each item sits in _heap, -1 when it may not be drawn
    cdef int64_t* _number     # each item's insertion number (ties go to the smaller)
    cdef double* _key         # each item's key: the heap's first item has the smallest
    cdef double* _priority    # each item's priority, as given

    # What an item is ordered by: its key, smallest first (ties: inserted first).
    cdef double key_of(self, double priority, int64_t number) noexcept nogil
    cdef bint _before(self, int64_t a, int64_t b) noexcept nogil
    cdef void _sift_up(self, Py_ssize_t at) noexcept nogil
    cdef void _sift_down(self, Py_ssize_t at) noexcept nogil
    cdef void _cand_up(self, Py_ssize_t* cand, Py_ssize_t at) noexcept nogil
    cdef void _cand_down(self, Py_ssize_t* cand, Py_ssize_t c, Py_ssize_t at) noexcept nogil
