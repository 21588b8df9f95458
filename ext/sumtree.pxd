# Declarations shared with the other kernels (ext/ring.pyx draws from and
# updates the tree without going through Python).
from libc.stdint cimport int64_t


cdef struct Node:
    double sum   # sum of the leaf weights below
    double min   # smallest positive leaf weight below (+inf: none)
    double max   # largest raw priority of a sampleable leaf below (-inf: none)


cdef class PriorityTree:
    cdef double[::1] _buf
    cdef Node* _nodes
    cdef readonly Py_ssize_t capacity
    cdef Py_ssize_t _cap

    cdef void _write_leaf(self, Py_ssize_t slot, double value, double raw) noexcept nogil
    cdef void _fix_up(self, Py_ssize_t slot) noexcept nogil
    cdef void _fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil
    cdef void _fix_each(self, const int64_t* slots, Py_ssize_t k) noexcept nogil
    cdef Py_ssize_t _descend(self, double u) noexcept nogil
    cdef void _rebuild(self) noexcept nogil
