# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The selector interface (see selector.pxd): what each way of selecting implements.

A table calls the ``cdef`` methods with its lock held.  The ``def`` methods below
drive the same code from Python, one call at a time, for a selector's own tests
and for tools that own it alone.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t
from cpython.pycapsule cimport PyCapsule_GetPointer

import numpy as np


def importance_weights_of(weights, double smallest, double beta):
    """``(weights / smallest) ** -beta`` as a new float64 array, computed as a sample computes its
    importance weights: for a client that draws through others (a sharded learner)."""
    cdef double[::1] out = np.array(weights, dtype=np.float64, copy=True, order="C").reshape(-1)
    if not smallest > 0.0:
        raise ValueError(f"smallest: expected a positive weight, got {smallest}")
    with nogil:
        importance_weights(smallest, &out[0] if out.shape[0] else NULL, out.shape[0], beta)
    return np.asarray(out)


cdef int _check(Py_ssize_t item, Py_ssize_t capacity) except -1:
    if not 0 <= item < capacity:
        raise IndexError(f"item: expected an integer in [0, {capacity}), got {item}")
    return 0


cdef class Selector:
    """Abstract: a table is built with a subclass, one per entry of mpreplay.selectors."""

    def __init__(self, *args, **kwargs):
        if type(self) is Selector:
            raise TypeError("Selector is an interface: use a subclass such as PrioritizedSelector")

    def insert(self, Py_ssize_t item, double priority=1.0):
        """Make ``item`` drawable with ``priority`` (an item drawable already is left as it is)."""
        _check(item, self.capacity)
        if self.weight(item) == 0.0:
            self.insert_item(item, priority)
            self.fix(item)

    def update(self, Py_ssize_t item, double priority):
        """Give the drawable ``item`` a new ``priority`` (an item not drawable is left alone)."""
        cdef int64_t one = item
        _check(item, self.capacity)
        if self.weight(item) > 0.0:
            self.update_items(&one, &priority, 1)
            self.fix_each(&one, 1)

    def remove(self, Py_ssize_t item):
        """Make ``item`` not drawable."""
        _check(item, self.capacity)
        self.remove_item(item)
        self.fix(item)

    def recompute(self):
        """Recompute everything derived from the items (what crash recovery calls)."""
        self.rebuild()

    def sample_items(self, Py_ssize_t k, rng not None, bint stratified=False):
        """``k`` items drawn by the selector's rule with the numpy Generator ``rng``; draw ``j``
        in stratum ``j`` of ``k`` when ``stratified``.  Empty when nothing is drawable."""
        if k < 1:
            raise ValueError(f"k: expected an integer >= 1, got {k}")
        cdef int64_t[::1] items = np.empty(k, np.int64)
        cdef double[::1] scratch = np.empty(k, np.float64)
        cdef bitgen_t* bitgen = <bitgen_t*>PyCapsule_GetPointer(rng.bit_generator.capsule, "BitGenerator")
        if not self.total() > 0.0:
            return np.empty(0, np.int64)
        self.draw(&items[0], &scratch[0], k, k if stratified else 1, bitgen)
        return np.asarray(items)

    def item_weight(self, Py_ssize_t item):
        """The weight ``item`` is drawn with (0: not drawable)."""
        _check(item, self.capacity)
        return self.weight(item)

    def item_priority(self, Py_ssize_t item):
        """The priority ``item`` was given (0: not drawable)."""
        _check(item, self.capacity)
        return self.priority(item)

    @property
    def total_weight(self):
        """The sum of the weights of the drawable items."""
        return self.total()

    @property
    def smallest_weight(self):
        """The smallest positive weight (inf when nothing is drawable)."""
        return self.smallest()

    @property
    def new_item_priority(self):
        """The priority an item inserted without one gets now."""
        return self.default_priority()

    def item_arrival(self, Py_ssize_t item):
        """The drawable ``item``'s place in the order items were inserted, -1 where the selector
        keeps no such order or ``item`` is not drawable."""
        _check(item, self.capacity)
        return self.arrival(item)

    def forget_history(self):
        """Forget what the selector keeps of items that are gone (``clear``): a prioritized one's
        largest priority ever set, for ``new_priority="max_ever"``.  Most keep nothing of them."""

    def largest_priority(self):
        """The largest priority of a drawable item, -inf when none (a scan of every item)."""
        cdef Py_ssize_t i
        cdef double p, best = -INFINITY
        with nogil:
            for i in range(self.capacity):
                if self.weight(i) > 0.0:
                    p = self.priority(i)
                    if p > best:
                        best = p
        return best

    cdef void insert_item(self, Py_ssize_t item, double priority) noexcept nogil:
        pass

    cdef void update_items(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil:
        pass  # a selector that draws by no priority keeps none

    cdef void remove_item(self, Py_ssize_t item) noexcept nogil:
        pass

    cdef void fix(self, Py_ssize_t item) noexcept nogil:
        pass

    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        cdef Py_ssize_t item
        for item in range(first, last + 1):
            self.fix(item)

    cdef void prefetch(self, const int64_t* items, Py_ssize_t k) noexcept nogil:
        # Ask for the memory that update_items() and fix_each() of items[0..k) will touch, so its
        # cache misses overlap instead of stalling one by one.  A hint: doing nothing is correct.
        pass

    cdef void fix_each(self, const int64_t* items, Py_ssize_t k) noexcept nogil:
        cdef Py_ssize_t j
        for j in range(k):
            self.fix(items[j])

    cdef void rebuild(self) noexcept nogil:
        pass

    cdef double default_priority(self) noexcept nogil:
        return 1.0

    cdef double total(self) noexcept nogil:
        return 0.0

    cdef double smallest(self) noexcept nogil:
        return 0.0

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return 0.0

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        return 0.0

    cdef int64_t arrival(self, Py_ssize_t item) noexcept nogil:
        return -1

    cdef bint reorder_last(self, const int64_t* ranks, Py_ssize_t m) noexcept nogil:
        return False

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        pass

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        return -1
