# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Proportional prioritized selection (Schaul et al. 2016) over a sum / min / max tree.

Item ``i`` with priority ``p_i`` has weight ``(p_i + eps) ** alpha`` and is drawn
with probability weight / total; ``alpha = 0`` gives uniform selection over the
items that may be drawn.  The tree lives in the caller's memory (heap or shared
segment), so every process that maps it selects from the same weights.
"""
from libc.float cimport DBL_MAX
from libc.math cimport INFINITY, pow
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t

from mpreplay._ext.sumtree cimport Node, PriorityTree


cdef class PrioritizedSelector(Selector):
    """Selects items of ``tree`` in proportion to ``(priority + eps) ** alpha``.

    A new item without a priority gets the largest stored now, or with ``max_ever``
    the largest ever set, at least 1.0 (cpprb's running maximum, which never falls).
    """

    def __init__(self, PriorityTree tree not None, double alpha, double eps, bint max_ever=False):
        self._tree = tree
        self._max_ever = max_ever
        self.capacity = tree.capacity
        self.alpha = alpha
        self.eps = eps
        # No weight may exceed DBL_MAX / (2 * capacity), so no sum of weights
        # can overflow; that bounds the priorities accepted.
        self.max_priority = (min(1e300, pow(DBL_MAX / (2.0 * self.capacity + 2.0), 1.0 / alpha) - eps)
                             if alpha > 0.0 else 1e300)

    cdef void set(self, Py_ssize_t item, double priority) noexcept nogil:
        self._tree._write_leaf(item, pow(priority + self.eps, self.alpha), priority)

    cdef void clear(self, Py_ssize_t item) noexcept nogil:
        self._tree._write_leaf(item, 0.0, 0.0)

    cdef void fix(self, Py_ssize_t item) noexcept nogil:
        self._tree._fix_up(item)

    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        self._tree._fix_range(first, last)

    cdef void fix_each(self, const int64_t* items, Py_ssize_t k) noexcept nogil:
        self._tree._fix_each(items, k)

    cdef void rebuild(self) noexcept nogil:
        self._tree._rebuild()

    cdef double default_priority(self) noexcept nogil:
        cdef double p
        if self._max_ever:
            p = self._tree._nodes[0].max
            return p if p > 1.0 else 1.0
        p = self._tree._nodes[1].max
        return 1.0 if p == -INFINITY else p

    cdef double total(self) noexcept nogil:
        return self._tree._nodes[1].sum

    cdef double smallest(self) noexcept nogil:
        return self._tree._nodes[1].min

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return self._tree._nodes[item + self._tree._cap].sum

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        # A leaf of weight zero keeps -inf as its raw priority: priority 0 with eps 0.
        cdef double p = self._tree._nodes[item + self._tree._cap].max
        return 0.0 if p == -INFINITY else p

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        # All draws descend together, one level at a time, so the cache misses
        # of different draws overlap instead of queueing.  `scratch` holds the
        # remaining prefix sums and `items` the nodes on the way down.  The
        # rule is PriorityTree._descend's: never enter a child of zero mass.  The way
        # down is random, so a branch per level would be mispredicted half the time:
        # the step is computed without one.
        cdef Py_ssize_t j, n, right, cap = self._tree._cap
        cdef double total = self._tree._nodes[1].sum, left
        cdef Node* nodes = self._tree._nodes
        for j in range(k):
            scratch[j] = ((j if nstrata > 1 else 0) + rng.next_double(rng.state)) * (total / nstrata)
            items[j] = 1
        while items[0] < cap:
            for j in range(k):
                n = 2 * items[j]
                left = nodes[n].sum
                right = not ((left > 0.0) & ((scratch[j] < left) | (nodes[n + 1].sum <= 0.0)))
                scratch[j] -= left * right
                items[j] = n + right
        for j in range(k):
            items[j] -= cap

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        return self._tree._descend(rng.next_double(rng.state) * self._tree._nodes[1].sum)
