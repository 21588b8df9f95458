# Declarations shared with the other kernels (ext/prioritized.pyx draws from and
# updates the tree without going through Python; it uses only the methods below).
from libc.stdint cimport int64_t

cdef enum:
    TREE_WIDTH = 8          # entries per node: one 64-byte cache line of float64
    TREE_HEAD = 8           # float64 entries before the trees (max_ever, then padding to a cache line)
    TREE_MAX_LEVELS = 22    # levels of nodes enough for any Py_ssize_t capacity


cdef class PriorityTree:
    cdef double[::1] _buf
    cdef double* _sum        # the sum tree's entries, level 0 (the root node) first
    cdef double* _max        # the max tree's entries, laid out as _sum
    cdef double* _min        # the min tree's entries: _sum's inner levels (of the positive sum leaves below)
    cdef double* _head       # the header: _head[0] is max_ever
    cdef Py_ssize_t _levels              # levels of nodes; the last holds the leaves
    cdef Py_ssize_t _entries             # entries of each of the three trees
    cdef Py_ssize_t _start[TREE_MAX_LEVELS]   # first entry of each level
    cdef Py_ssize_t _leaf                # _start[_levels - 1]
    cdef readonly Py_ssize_t capacity
    cdef bint _large                     # the trees outgrow a core's cache: prefetch_paths prefetches

    # The kernels' interface (the table's lock held by the caller).
    cdef void write_leaf(self, Py_ssize_t slot, double value, double raw) noexcept nogil
    cdef void fix_up(self, Py_ssize_t slot) noexcept nogil
    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil
    cdef void fix_each(self, const int64_t* slots, Py_ssize_t k) noexcept nogil
    cdef void prefetch_paths(self, const int64_t* slots, Py_ssize_t k) noexcept nogil
    cdef void rebuild_inner(self) noexcept nogil
    cdef Py_ssize_t _parents(self, Py_ssize_t d) noexcept nogil
    cdef double _min_below(self, Py_ssize_t d, Py_ssize_t c) noexcept nogil
    cdef void _recompute(self, Py_ssize_t d, Py_ssize_t i) noexcept nogil
    cdef void _recompute_level(self, Py_ssize_t d) noexcept nogil
    cdef Py_ssize_t descend(self, double u) noexcept nogil
    cdef void descend_many(self, double* prefix, int64_t* out, Py_ssize_t k) noexcept nogil
    cdef double total_mass(self) noexcept nogil
    cdef double min_weight(self) noexcept nogil
    cdef double max_raw(self) noexcept nogil
    cdef double max_raw_ever(self) noexcept nogil
    cdef double leaf_weight(self, Py_ssize_t slot) noexcept nogil
    cdef double leaf_raw(self, Py_ssize_t slot) noexcept nogil
