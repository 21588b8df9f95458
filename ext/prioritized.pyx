# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Proportional prioritized selection (Schaul et al. 2016) over a sum / min / max tree.

Item ``i`` with priority ``p_i`` has weight ``(p_i + eps) ** alpha`` and is drawn
with probability weight / total; ``alpha = 0`` gives uniform selection over the
items that may be drawn.  The tree lives in the caller's memory (heap or shared
segment), so every process that maps it selects from the same weights.
"""
from libc.float cimport DBL_MAX
from libc.math cimport INFINITY, NAN, pow
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t

from mpreplay._ext.batch_math cimport mpr_batch_lanes, mpr_exp_each, mpr_log_each
from mpreplay._ext.sumtree cimport PriorityTree

import numpy as np

from mpreplay._ext.sumtree import TREE_HEAD_LEN, leaf_views, tree_buffer_size


def weight_lanes(lanes=None):
    """How many weights one vector exp or log computes: 4 (AVX2), 2 (other x86-64 with glibc's
    vector math library) or 1 (libm).  ``lanes`` 2 or 4 changes that for this process where the
    CPU allows (the tests run both paths); returns the setting before."""
    return mpr_batch_lanes(0 if lanes is None else lanes)


STATE_DTYPE = np.float64


def state_size(Py_ssize_t capacity):
    """Number of float64 entries the tree of a selector over ``capacity`` items needs."""
    return tree_buffer_size(capacity)


def priority_views(state, Py_ssize_t capacity):
    """``(weights, priorities)`` of every item, views of ``state`` (see ``sumtree.leaf_views``)."""
    return leaf_views(state, capacity)


def cut_parts(state, Py_ssize_t capacity):
    """``(items, rest)``: the parts of tree ``state`` nothing derives -- ``items``, arrays of an
    entry per item (the leaves: weights and raw priorities), and ``rest`` (the header: the
    largest priority ever set) -- as views.  A checkpoint's cut copies the items a block at a
    time and :func:`derive` recomputes the rest of its copy (ext/sumtree.pyx: every inner entry
    is recomputed from its children, so the copy of a tree no update changed meanwhile is the
    tree, bit for bit)."""
    return list(leaf_views(state, capacity)), [np.asarray(state)[:TREE_HEAD_LEN]]


def derive(state, Py_ssize_t capacity):
    """Recompute every inner entry of tree ``state`` from its leaves (see :func:`cut_parts`)."""
    PriorityTree(state, capacity, reset=False).rebuild()


def _where(bad, what):
    # ``what`` with the first items where ``bad`` holds, as a sentence; None when it holds nowhere.
    items = np.flatnonzero(bad)
    if not items.size:
        return None
    more = f" and {items.size - 5} more" if items.size > 5 else ""
    return f"{what} at slots {items[:5].tolist()}{more}"


cdef class PrioritizedSelector(Selector):
    """Selects items in proportion to ``(priority + eps) ** alpha``, over the priority tree held
    in ``state`` (``state_size(capacity)`` float64 entries, heap or shared segment).

    ``reset`` starts with no drawable item; pass False to attach to a tree another process
    already initialised.  A new item without a priority gets the largest stored now, or with
    ``max_ever`` the largest ever set, at least 1.0 (cpprb's running maximum, which never falls).
    """

    def __init__(self, double[::1] state not None, Py_ssize_t capacity, bint reset=True, double alpha=0.6,
                 double eps=1e-4, bint max_ever=False):
        if state.shape[0] != state_size(capacity):
            raise ValueError(f"state: expected {state_size(capacity)} float64 entries for capacity {capacity}, "
                             f"got {state.shape[0]}")
        self.tree = PriorityTree(state, capacity, reset=reset)
        self._max_ever = max_ever
        self.capacity = capacity
        self.alpha = alpha
        self.eps = eps
        self._last_priority = NAN
        # No weight may exceed DBL_MAX / (2 * capacity), so no sum of weights
        # can overflow; that bounds the priorities accepted.
        self.max_priority = (min(1e300, pow(DBL_MAX / (2.0 * self.capacity + 2.0), 1.0 / alpha) - eps)
                             if alpha > 0.0 else 1e300)

    @staticmethod
    def check_state(state, Py_ssize_t capacity, drawable):
        """What disagrees in the tree ``state`` with ``drawable`` (per item: whether the slot states
        let it be drawn), as sentences: each leaf against its item, the header against the leaves,
        and every inner entry against the one recomputed from its children (bit for bit: none is
        ever adjusted by a delta)."""
        state = np.asarray(state)
        drawable = np.asarray(drawable, dtype=bool)
        weights, raw = leaf_views(state, capacity)
        problems = [
            _where(~(weights >= 0) | ~np.isfinite(weights), "tree: a leaf weight is negative or not finite"),
            _where((weights > 0) & ~drawable, "tree: a slot that may not be drawn has a weight"),
            _where((weights > 0) != (raw > -np.inf), "tree: a leaf's raw priority disagrees with its weight"),
        ]
        stored = raw[raw > -np.inf]
        if stored.size and not state[0] >= stored.max():
            problems.append(f"tree: max_ever {state[0]} is below the largest raw priority stored, {stored.max()}")
        rebuilt = state.copy()
        PriorityTree(rebuilt, capacity, reset=False).rebuild()
        inner = np.flatnonzero(rebuilt[TREE_HEAD_LEN:].view(np.uint64) != state[TREE_HEAD_LEN:].view(np.uint64))
        if inner.size:
            problems.append(
                f"tree: {inner.size} inner entries differ from their children's, first at entry "
                f"{int(inner[0]) + TREE_HEAD_LEN}: {state[inner[0] + TREE_HEAD_LEN]} where its children make "
                f"{rebuilt[inner[0] + TREE_HEAD_LEN]}"
            )
        return [p for p in problems if p is not None]

    def forget_history(self):
        """With ``new_priority="max_ever"``: forget the largest priority ever set (``clear``)."""
        if self._max_ever:
            self.tree.forget_max_ever()

    def largest_priority(self):
        """The largest priority of a drawable item, -inf when none: the max tree's root."""
        return self.tree.max_raw()

    cdef void insert_item(self, Py_ssize_t item, double priority) noexcept nogil:
        cdef int64_t one = item
        self.weigh_each(&one, &priority, 1)

    cdef void update_items(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil:
        self.weigh_each(items, priorities, k)

    cdef void weigh_each(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil:
        # The weights of a chunk at a time, as one batch: (p + eps) ** alpha as
        # exp(alpha * log(p + eps)) through batch_math.pxd, some 2.5 times faster than pow a
        # priority.  Relative error within (1 + |alpha * ln(p + eps)|) * 1e-15 (where the weight
        # is a normal float): about 1e-14 for priorities between 1e-6 and 1e6.  alpha 0 and 1 are
        # exact: 1 and p + eps.  A lone priority (an add without one: the largest stored, over
        # and over) reuses the weight of the last lone one when it is the same.
        cdef double w[64]
        cdef Py_ssize_t c, j, m
        for c in range(0, k, 64):
            m = min(64, k - c)
            for j in range(m):
                w[j] = priorities[c + j] + self.eps
            if m == 1 and priorities[c] == self._last_priority:
                w[0] = self._last_weight
            elif self.alpha == 0.0:
                for j in range(m):
                    w[j] = 1.0
            elif self.alpha != 1.0:
                mpr_log_each(w, m)
                for j in range(m):
                    w[j] = self.alpha * w[j]
                mpr_exp_each(w, m)
            if m == 1:
                self._last_priority, self._last_weight = priorities[c], w[0]
            for j in range(m):
                self.tree.write_leaf(items[c + j], w[j], priorities[c + j])

    cdef void remove_item(self, Py_ssize_t item) noexcept nogil:
        self.tree.write_leaf(item, 0.0, 0.0)

    cdef void fix(self, Py_ssize_t item) noexcept nogil:
        self.tree.fix_up(item)

    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        self.tree.fix_range(first, last)

    cdef void prefetch(self, const int64_t* items, Py_ssize_t k) noexcept nogil:
        self.tree.prefetch_paths(items, k)

    cdef void fix_each(self, const int64_t* items, Py_ssize_t k) noexcept nogil:
        self.tree.fix_each(items, k)

    cdef void rebuild(self) noexcept nogil:
        self.tree.rebuild_inner()

    cdef double default_priority(self) noexcept nogil:
        cdef double p
        if self._max_ever:
            p = self.tree.max_raw_ever()
            return p if p > 1.0 else 1.0
        p = self.tree.max_raw()
        return 1.0 if p == -INFINITY else p

    cdef double total(self) noexcept nogil:
        return self.tree.total_mass()

    cdef double smallest(self) noexcept nogil:
        return self.tree.min_weight()

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return self.tree.leaf_weight(item)

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        # A leaf of weight zero keeps -inf as its raw priority: priority 0 with eps 0.
        cdef double p = self.tree.leaf_raw(item)
        return 0.0 if p == -INFINITY else p

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        # The prefix sums in `scratch`, then the tree descends them all together.
        cdef Py_ssize_t j
        cdef double width = self.tree.total_mass() / nstrata
        if nstrata > 1:
            for j in range(k):
                scratch[j] = (j + rng.next_double(rng.state)) * width
        else:
            for j in range(k):
                scratch[j] = rng.next_double(rng.state) * width
        self.tree.descend_many(scratch, items, k)

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        return self.tree.descend(rng.next_double(rng.state) * self.tree.total_mass())
