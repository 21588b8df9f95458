# What a replay table's sample() draws, in proportion to what.  A selector keeps one weight
# per item (a slot, or a sequence) and draws items by weight; the table tells it which items
# may be drawn.  A new way of selecting is a new subclass in a file of its own
# (ext/prioritized.pyx is the one there is).  See docs/architecture.md.
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t

from mpreplay._ext.batch_math cimport mpr_exp_each, mpr_log_each


cdef class Selector:
    cdef readonly Py_ssize_t capacity
    cdef readonly double alpha, eps
    cdef readonly double max_priority   # the largest priority whose weights cannot overflow a sum

    # Called with the table's lock held.  set/clear change one item's weight; fix
    # brings what is derived from the weights up to date again after them.
    cdef void set(self, Py_ssize_t item, double priority) noexcept nogil
    cdef void set_each(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil
    cdef void clear(self, Py_ssize_t item) noexcept nogil
    cdef void fix(self, Py_ssize_t item) noexcept nogil
    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil  # fix of first..last
    cdef void fix_each(self, const int64_t* items, Py_ssize_t k) noexcept nogil  # fix of items[0..k)
    cdef void prefetch(self, const int64_t* items, Py_ssize_t k) noexcept nogil  # ahead of set and fix_each
    cdef void rebuild(self) noexcept nogil          # after a crash: everything derived, from the weights
    cdef double default_priority(self) noexcept nogil  # for a new item without one: the largest stored
    cdef double total(self) noexcept nogil
    cdef double smallest(self) noexcept nogil       # the smallest positive weight, inf when none
    cdef double weight(self, Py_ssize_t item) noexcept nogil
    cdef double priority(self, Py_ssize_t item) noexcept nogil  # as given (0 for an item not drawn)
    # k draws in proportion to the weights, draw j in stratum j of nstrata (1: unstratified).
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
