# What a replay table's sample() draws.  A selector keeps the items (slots, or sequences) that
# may be drawn and draws among them by its rule; the table tells it which items come and go
# (Reverb's ItemSelector: insert, update, remove, sample).  A new way of selecting is a
# subclass in a kernel file of its own and one entry of mpreplay/selectors.py (the registry):
# see docs/architecture.md, "Selectors".
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t

from mpreplay._ext.batch_math cimport mpr_exp_each, mpr_log_each


cdef class Selector:
    cdef readonly Py_ssize_t capacity
    cdef readonly double max_priority   # the largest priority accepted (a prioritized one: no sum overflows)

    # Called with the table's lock held.  insert_item makes an item that may not be drawn
    # drawable; update_items gives drawable items new priorities (an item not drawable is left
    # alone); remove_item makes an item not drawable (nothing when it is not).  fix brings what
    # is derived from the items up to date again after them.
    cdef void insert_item(self, Py_ssize_t item, double priority) noexcept nogil
    cdef void update_items(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil
    cdef void remove_item(self, Py_ssize_t item) noexcept nogil
    cdef void fix(self, Py_ssize_t item) noexcept nogil
    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil  # fix of first..last
    cdef void fix_each(self, const int64_t* items, Py_ssize_t k) noexcept nogil  # fix of items[0..k)
    cdef void prefetch(self, const int64_t* items, Py_ssize_t k) noexcept nogil  # ahead of update_items and fix_each
    cdef void rebuild(self) noexcept nogil          # after a crash: everything derived, from the weights
    cdef double default_priority(self) noexcept nogil  # for a new item given none
    cdef double total(self) noexcept nogil
    cdef double smallest(self) noexcept nogil       # the smallest positive weight, inf when none
    cdef double weight(self, Py_ssize_t item) noexcept nogil    # 0: not drawable
    cdef double priority(self, Py_ssize_t item) noexcept nogil  # as given (0 for an item not drawn)
    # A drawable item's place in the order items were inserted (0 the first ever); -1 where the
    # selector keeps no such order (random selectors) or the item is not drawable.  An ordered
    # selector's order follows it, so a snapshot in this order, loaded again, draws the same.
    cdef int64_t arrival(self, Py_ssize_t item) noexcept nogil
    # Renumber the last m drawable items inserted: the one that arrived (m - 1 - j)-th last gets
    # place ranks[m - 1 - j] among them (ranks: a permutation of 0..m-1).  False (nothing
    # changed) where no order is kept.  A load of a file's episodes inserts them lane by lane:
    # this gives them back the order they were given the saving table's selector in.
    cdef bint reorder_last(self, const int64_t* ranks, Py_ssize_t m) noexcept nogil
    # k draws by the selector's rule (random ones: in proportion to the weights, draw j in
    # stratum j of nstrata, 1: unstratified; ordered ones: the first k in order, see the registry).
    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil
    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil


cdef inline void importance_weights(double smallest, double* weights, Py_ssize_t k, double beta) noexcept nogil:
    # Each of weights[0..k) becomes (weight / smallest) ** -beta: through logs, a batch of logs and
    # one of exps (batch_math.pxd: a third of a pow's time a row), so a ratio beyond the float range
    # (weights 1e300 and 1e-300 side by side) still gets its weight.  Within about 1e-13 of the
    # exact value at those extremes, 1e-15 for weights a few orders apart; never above 1: the
    # exponent is clamped at 0, where a log's last-bit error could make it positive.
    cdef double log_smallest = smallest, e
    cdef Py_ssize_t j
    mpr_log_each(&log_smallest, 1)
    mpr_log_each(weights, k)
    for j in range(k):
        e = log_smallest - weights[j]
        weights[j] = beta * e if e < 0.0 else 0.0
    mpr_exp_each(weights, k)
