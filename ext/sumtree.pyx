# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Sum, min and max trees over one caller-owned float64 array.

The array may live on the process heap or in a shared-memory segment: the
tree keeps no state of its own beyond the view, so every process that maps
the same bytes sees the same tree.

Layout of ``buf`` (``cap`` = capacity rounded up to a power of two): ``2*cap``
nodes of three float64 each, ``(sum, min, max)``, so one update touches one
cache line per level.  Node 1 is the root, node ``cap + i`` the leaf of slot ``i``.  Every parent is
recomputed from its two children -- never adjusted by a delta -- so rounding
cannot drift however many updates are made.

Leaf semantics: the sum and min trees hold the sampling weight ``v`` of a slot
(``v == 0`` means "not sampleable", and the min leaf is then +inf); the max
tree holds the *raw* priority of the slot (-inf when not sampleable), so
``max()`` answers "largest priority stored now" exactly.  Node 0, outside the
tree, keeps in its max the largest raw priority ever given a sampleable leaf
(``max_ever()``; -inf until one is, and again after ``forget_max_ever()``).
"""
from libc.math cimport INFINITY, pow
from libc.stdint cimport int64_t

import numpy as np


cdef inline Py_ssize_t _pow2_at_least(Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t c = 1
    while c < n:
        c <<= 1
    return c


def tree_buffer_size(Py_ssize_t capacity):
    """Number of float64 entries a tree over ``capacity`` slots needs."""
    if capacity < 1:
        raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
    return 6 * _pow2_at_least(capacity)


cdef inline void _recompute(Node* nodes, Py_ssize_t n) noexcept nogil:
    cdef Node* l = &nodes[2 * n]
    cdef Node* r = &nodes[2 * n + 1]
    nodes[n].sum = l.sum + r.sum
    nodes[n].min = l.min if l.min < r.min else r.min
    nodes[n].max = l.max if l.max > r.max else r.max


cdef class PriorityTree:
    """Sum/min/max trees over ``buf`` for ``capacity`` slots.

    Parameters
    ----------
    buf : float64 array of ``tree_buffer_size(capacity)`` entries
        Storage owned by the caller (heap or shared memory).
    capacity : int
        Number of slots.
    reset : bool
        Fill the trees as empty; pass False to attach to a tree another
        process already initialised.
    """
    def __init__(self, double[::1] buf not None, Py_ssize_t capacity, bint reset=True):
        cdef Py_ssize_t need = tree_buffer_size(capacity)
        if buf.shape[0] < need:
            raise ValueError(f"buf: expected at least {need} float64 entries, got {buf.shape[0]}")
        self._buf = buf
        self.capacity = capacity
        self._cap = need // 6
        self._nodes = <Node*>&buf[0]
        if reset:
            self.reset()

    def reset(self):
        """Make every slot unsampleable."""
        cdef Py_ssize_t i
        with nogil:
            for i in range(2 * self._cap):
                self._nodes[i].sum = 0.0
                self._nodes[i].min = INFINITY
                self._nodes[i].max = -INFINITY

    cdef void _write_leaf(self, Py_ssize_t slot, double value, double raw) noexcept nogil:
        cdef Py_ssize_t n = slot + self._cap
        if value > 0.0 and raw > self._nodes[0].max:
            self._nodes[0].max = raw
        self._nodes[n].sum = value
        self._nodes[n].min = value if value > 0.0 else INFINITY
        self._nodes[n].max = raw if value > 0.0 else -INFINITY

    cdef void _fix_up(self, Py_ssize_t slot) noexcept nogil:
        cdef Py_ssize_t n = (slot + self._cap) >> 1
        while n >= 1:
            _recompute(self._nodes, n)
            n >>= 1

    cdef void _fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        # _fix_up of every slot in [first, last], each ancestor recomputed once:
        # a run of k leaves costs about k + log2(capacity) recomputes, not k * log2.
        cdef Py_ssize_t lo = (first + self._cap) >> 1, hi = (last + self._cap) >> 1, n
        while lo >= 1:
            n = lo
            while n <= hi:
                _recompute(self._nodes, n)
                n += 1
            lo >>= 1
            hi >>= 1

    cdef void _fix_each(self, const int64_t* slots, Py_ssize_t k) noexcept nogil:
        # _fix_up of each slot, the paths walked together one level at a time: one
        # path is a chain of dependent recomputes, several side by side are not.  Every
        # path is as long as the others, so a level's nodes are recomputed after all
        # the nodes below them; a later chunk of paths recomputes the ancestors it
        # shares with an earlier one after its own lower levels.
        cdef Py_ssize_t path[64]
        cdef Py_ssize_t start, j, m
        for start in range(0, k, 64):
            m = min(64, k - start)
            for j in range(m):
                path[j] = (slots[start + j] + self._cap) >> 1
            while path[0] >= 1:
                for j in range(m):
                    _recompute(self._nodes, path[j])
                    path[j] >>= 1

    def set(self, const int64_t[::1] slots not None, const double[::1] values not None,
            const double[::1] raw not None):
        """Set leaf weights ``values`` (0 = unsampleable) and raw priorities.

        Duplicated slots are allowed: the last occurrence wins.  The caller
        has validated slots and values.
        """
        cdef Py_ssize_t k = slots.shape[0], j
        if values.shape[0] != k or raw.shape[0] != k:
            raise ValueError("slots, values and raw must have the same length")
        with nogil:
            # All leaves first, then the paths: a path walked later reads
            # children that are already final, so duplicates and shared
            # ancestors come out right.
            for j in range(k):
                self._write_leaf(slots[j], values[j], raw[j])
            if k:
                self._fix_each(&slots[0], k)

    def set_priorities(self, const int64_t[::1] slots not None, const double[::1] priorities not None,
                       double alpha, double eps):
        """Set leaves to ``(p + eps) ** alpha`` and raw priority ``p``."""
        cdef Py_ssize_t k = slots.shape[0], j
        if priorities.shape[0] != k:
            raise ValueError("slots and priorities must have the same length")
        with nogil:
            for j in range(k):
                self._write_leaf(slots[j], pow(priorities[j] + eps, alpha), priorities[j])
            for j in range(k):
                self._fix_up(slots[j])

    def clear(self, const int64_t[::1] slots not None):
        """Make ``slots`` unsampleable."""
        cdef Py_ssize_t k = slots.shape[0], j
        with nogil:
            for j in range(k):
                self._write_leaf(slots[j], 0.0, 0.0)
            for j in range(k):
                self._fix_up(slots[j])

    def get(self, const int64_t[::1] slots not None, double[::1] values not None,
            double[::1] raw not None):
        """Read leaf weights and raw priorities of ``slots`` (raw is -inf when unsampleable)."""
        cdef Py_ssize_t k = slots.shape[0], j
        with nogil:
            for j in range(k):
                values[j] = self._nodes[slots[j] + self._cap].sum
                raw[j] = self._nodes[slots[j] + self._cap].max

    cdef Py_ssize_t _descend(self, double u) noexcept nogil:
        # Go left unless u is past the left mass; but never enter a child
        # whose sum is zero.  Starting from a root with positive sum, every
        # node entered then has a positive sum, so the leaf found is
        # sampleable whatever rounding did to u.
        cdef Py_ssize_t n = 1
        cdef double left
        while n < self._cap:
            n <<= 1
            left = self._nodes[n].sum
            if left > 0.0 and (u < left or self._nodes[n + 1].sum <= 0.0):
                continue
            u -= left
            n += 1
        return n - self._cap

    def search(self, const double[::1] prefix not None, int64_t[::1] out not None):
        """For each prefix sum, the slot whose cumulative range contains it."""
        cdef Py_ssize_t k = prefix.shape[0], j
        if out.shape[0] < k:
            raise ValueError("out is shorter than prefix")
        if not self._nodes[1].sum > 0.0:
            raise ValueError("the tree holds no sampleable slot")
        with nogil:
            for j in range(k):
                out[j] = self._descend(prefix[j])

    def sample(self, const double[::1] r not None, int64_t[::1] out not None,
               double[::1] values not None, bint stratified=True):
        """Draw ``len(r)`` slots from uniforms ``r`` in [0, 1).

        ``stratified``: draw j lands in the j-th of ``len(r)`` equal strata of
        the total mass (Ape-X); otherwise every draw covers the whole mass.
        Writes the chosen slots to ``out`` and their leaf weights to ``values``;
        returns the total mass the draws were made against.
        """
        cdef Py_ssize_t k = r.shape[0], j, s
        cdef double total = self._nodes[1].sum
        cdef double width
        if out.shape[0] < k or values.shape[0] < k:
            raise ValueError("out and values must hold len(r) entries")
        if not total > 0.0:
            raise ValueError("the tree holds no sampleable slot")
        with nogil:
            width = total / k if stratified else total
            for j in range(k):
                s = self._descend(((j if stratified else 0) + r[j]) * width)
                out[j] = s
                values[j] = self._nodes[s + self._cap].sum
        return total

    def rebuild(self):
        """Recompute every inner node from the leaves (after a crash mid-update)."""
        with nogil:
            self._rebuild()

    cdef void _rebuild(self) noexcept nogil:
        cdef Py_ssize_t n
        for n in range(self._cap - 1, 0, -1):
            _recompute(self._nodes, n)

    def total(self):
        """Sum of all leaf weights."""
        return self._nodes[1].sum

    def min(self):
        """Smallest positive leaf weight (+inf when nothing is sampleable)."""
        return self._nodes[1].min

    def max(self):
        """Largest raw priority among sampleable slots (-inf when none)."""
        return self._nodes[1].max

    def max_ever(self):
        """Largest raw priority ever written to a leaf (-inf when none)."""
        return self._nodes[0].max

    def forget_max_ever(self):
        """Start :meth:`max_ever` afresh (a buffer's ``clear``)."""
        self._nodes[0].max = -INFINITY
