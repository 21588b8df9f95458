# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Sum, min and max trees of wide nodes over one caller-owned float64 array.

The array may live on the process heap or in a shared-memory segment: the
tree keeps no state of its own beyond the view (and what it derives from the
capacity), so every process that maps the same bytes sees the same tree.

Layout of ``buf`` (see docs/architecture.md, "The priority tree"): a header of
8 entries (entry 0: ``max_ever``, the rest padding), then the trees one after
the other -- sums, maxes, then mins.  A tree is levels of *nodes* of 8 float64
entries (one 64-byte cache line when ``buf`` is 64-byte aligned), stored
contiguous, level 0 (the root node) first.  The last level of the sum and max
trees holds the leaves: entry ``i`` of it is slot ``i``.  The min tree has no
leaf level: its lowest level takes the min of the sum leaves that are
positive, so an update writes and reads one line fewer.  Entry ``i`` of an
inner level sums (or takes the min or max of) the 8 entries of node ``i`` of
the level below.  Levels have ``ceil(n / 8)`` nodes for ``n`` entries
below; entries past the end (slots ``>= capacity``, or nodes that do not
exist) are neutral: sum 0, min +inf, max -inf.  ``total()`` sums the root
node's entries.  The descent reads only the sum tree: one cache line a level.

Every entry is recomputed from its node of children -- never adjusted by a
delta -- in the order the descent adds them, so rounding cannot drift however
many updates are made.

Leaf semantics: the sum and min trees hold the sampling weight ``v`` of a slot
(``v == 0`` means "not sampleable", and the min leaf is then +inf); the max
tree holds the *raw* priority of the slot (-inf when not sampleable), so
``max()`` answers "largest priority stored now" exactly.  The header keeps
the largest raw priority ever given a sampleable leaf (``max_ever()``; -inf
until one is, and again after ``forget_max_ever()``).
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t

from mpreplay._ext.tree_node cimport mpr_max8, mpr_min8, mpr_min8_positive, node_child, node_pick, node_prefixes, node_sum

import numpy as np

cdef extern from *:
    void __builtin_prefetch(const void* addr, ...) noexcept nogil


TREE_HEAD_LEN = TREE_HEAD

# Trees larger than a core's L2 cache (1 MiB on the development machine) miss on the leaves
# of most updates: from there prefetch_paths prefetches them; below, it costs more than it saves.
cdef Py_ssize_t PREFETCH_PATHS_ABOVE = 1 << 20


cdef Py_ssize_t _shape(Py_ssize_t capacity, Py_ssize_t* start, Py_ssize_t* levels) noexcept nogil:
    # Fills start[0..levels] (start[levels]: the entries of one tree) and levels;
    # returns the entries of one tree.
    cdef Py_ssize_t nodes[TREE_MAX_LEVELS]
    cdef Py_ssize_t n = (capacity + 7) // 8, m = 1, d
    nodes[0] = n
    while n > 1:
        n = (n + 7) // 8
        nodes[m] = n
        m += 1
    start[0] = 0
    for d in range(m):
        start[d + 1] = start[d] + 8 * nodes[m - 1 - d]
    levels[0] = m
    return start[m]


def tree_buffer_size(Py_ssize_t capacity):
    """Number of float64 entries a tree over ``capacity`` slots needs."""
    cdef Py_ssize_t start[TREE_MAX_LEVELS]
    cdef Py_ssize_t levels
    if capacity < 1:
        raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
    cdef Py_ssize_t entries = _shape(capacity, start, &levels)
    return TREE_HEAD + 2 * entries + start[levels - 1]


def leaf_views(buf, Py_ssize_t capacity):
    """``(weights, raw)``: views of the leaves of a tree over ``capacity`` slots held in ``buf``.

    ``weights[i]`` is slot ``i``'s sampling weight (0: not sampleable) and ``raw[i]`` its raw
    priority (-inf when not sampleable).  The views share ``buf``'s memory: a reader that
    wants one consistent picture while writers run copies them.
    """
    cdef Py_ssize_t start[TREE_MAX_LEVELS]
    cdef Py_ssize_t levels, entries, need = tree_buffer_size(capacity)
    a = np.asarray(buf)
    if a.dtype != np.float64 or a.ndim != 1:
        raise ValueError(f"buf: expected a one-dimensional float64 array, got {a.dtype} of shape {a.shape}")
    if a.shape[0] < need:
        raise ValueError(f"buf: expected at least {need} float64 entries, got {a.shape[0]}")
    entries = _shape(capacity, start, &levels)
    leaf = TREE_HEAD + start[levels - 1]
    return a[leaf:leaf + capacity], a[leaf + entries:leaf + entries + capacity]


cdef class PriorityTree:
    """Sum/min/max trees over ``buf`` for ``capacity`` slots.

    Parameters
    ----------
    buf : float64 array of ``tree_buffer_size(capacity)`` entries
        Storage owned by the caller (heap or shared memory); 64-byte aligned
        for every node to be one cache line.
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
        self._entries = _shape(capacity, self._start, &self._levels)
        self._leaf = self._start[self._levels - 1]
        self._head = &buf[0]
        self._sum = &buf[TREE_HEAD]
        self._max = self._sum + self._entries
        self._min = self._max + self._entries
        self._large = (2 * self._entries + self._leaf) * sizeof(double) > PREFETCH_PATHS_ABOVE
        if reset:
            self.reset()

    def reset(self):
        """Make every slot unsampleable (and forget ``max_ever``)."""
        cdef Py_ssize_t i
        with nogil:
            for i in range(TREE_HEAD):
                self._head[i] = 0.0
            self._head[0] = -INFINITY
            for i in range(self._entries):
                self._sum[i] = 0.0
                self._max[i] = -INFINITY
            for i in range(self._leaf):
                self._min[i] = INFINITY

    # -- the kernels' interface ------------------------------------------------------

    cdef void write_leaf(self, Py_ssize_t slot, double value, double raw) noexcept nogil:
        # A leaf alone; its ancestors are brought up to date by one of the fix methods.
        cdef Py_ssize_t n = self._leaf + slot
        if value > 0.0 and raw > self._head[0]:
            self._head[0] = raw
        self._sum[n] = value
        self._max[n] = raw if value > 0.0 else -INFINITY

    cdef void fix_up(self, Py_ssize_t slot) noexcept nogil:
        cdef Py_ssize_t d, i = slot
        for d in range(self._levels - 2, -1, -1):
            i >>= 3
            self._recompute(d, i)

    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        # fix_up of every slot in [first, last], each ancestor recomputed once:
        # a run of k leaves costs about k / 8 + depth recomputes, not k * depth.
        cdef Py_ssize_t d, i, lo = first, hi = last
        for d in range(self._levels - 2, -1, -1):
            lo >>= 3
            hi >>= 3
            for i in range(lo, hi + 1):
                self._recompute(d, i)

    cdef void fix_each(self, const int64_t* slots, Py_ssize_t k) noexcept nogil:
        # fix_up of each slot, the paths walked together one level at a time: one
        # path is a chain of dependent recomputes, several side by side are not.  Every
        # path is as long as the others, so a level's entries are recomputed after all
        # the entries below them; a later chunk of paths recomputes the ancestors it
        # shares with an earlier one after its own lower levels.
        # Every entry on a path gets its sum, min and max recomputed: stopping a min or
        # max where it stopped changing costs a branch per entry that the random
        # priorities make unpredictable, more than the recomputes it spares.
        # Near the root a level has fewer entries than there are paths: from there up,
        # every entry is recomputed once instead of once per path through it.
        cdef Py_ssize_t path[64]
        cdef Py_ssize_t start, j, m, d
        for start in range(0, k, 64):
            m = min(64, k - start)
            for j in range(m):
                path[j] = slots[start + j]
            for d in range(self._levels - 2, -1, -1):
                if self._parents(d) <= m:
                    while d >= 0:
                        self._recompute_level(d)
                        d -= 1
                    break
                for j in range(m):
                    path[j] >>= 3
                    self._recompute(d, path[j])

    cdef void prefetch_paths(self, const int64_t* slots, Py_ssize_t k) noexcept nogil:
        # Ahead of writing the leaves of slots[0..k) and fixing their paths: ask for the
        # lines of the two lowest levels of all three trees (the leaves, and the entries
        # the first recompute of each path writes and compares), which miss in a large
        # tree; the levels above are few enough lines to stay cached.
        cdef Py_ssize_t j, leaf, parent, up = self._start[self._levels - 2] if self._levels > 1 else 0
        if not self._large:
            return
        for j in range(k):
            leaf, parent = self._leaf + slots[j], up + (slots[j] >> 3)
            __builtin_prefetch(self._sum + leaf, 1)
            __builtin_prefetch(self._max + leaf, 1)
            __builtin_prefetch(self._sum + parent, 1)
            __builtin_prefetch(self._min + parent, 1)
            __builtin_prefetch(self._max + parent, 1)

    cdef inline double _min_below(self, Py_ssize_t d, Py_ssize_t c) noexcept nogil:
        # The min of the node at entry c of level d + 1: of the positive sum leaves there
        # (what the min tree has no level of), else of the min tree's node.
        if d == self._levels - 2:
            return mpr_min8_positive(self._sum + c)
        return mpr_min8(self._min + c)

    cdef inline void _recompute(self, Py_ssize_t d, Py_ssize_t i) noexcept nogil:
        # Entry i of inner level d from the 8 entries of its node of children.
        cdef Py_ssize_t e = self._start[d] + i, c = self._start[d + 1] + 8 * i
        self._sum[e] = node_sum(self._sum + c)
        self._min[e] = self._min_below(d, c)
        self._max[e] = mpr_max8(self._max + c)

    cdef inline Py_ssize_t _parents(self, Py_ssize_t d) noexcept nogil:
        # The entries of inner level d that have children: the nodes of level d + 1.
        return (self._start[d + 2] - self._start[d + 1]) // 8

    cdef void _recompute_level(self, Py_ssize_t d) noexcept nogil:
        # Every entry of inner level d that has children, from them.
        cdef Py_ssize_t i
        for i in range(self._parents(d)):
            self._recompute(d, i)

    cdef void rebuild_inner(self) noexcept nogil:
        # Every inner entry from the leaves, bottom level first; entries past the last
        # node of a level, and leaves past the capacity, back to neutral.  An unsampleable
        # leaf's raw priority is -inf, in case a writer died between the stores of write_leaf.
        cdef Py_ssize_t d, i
        for i in range(self._leaf, self._leaf + self.capacity):
            if not self._sum[i] > 0.0:
                self._max[i] = -INFINITY
        for i in range(self._leaf + self.capacity, self._entries):
            self._sum[i] = 0.0
            self._max[i] = -INFINITY
        for d in range(self._levels - 2, -1, -1):
            self._recompute_level(d)
            for i in range(self._start[d] + self._parents(d), self._start[d + 1]):
                self._sum[i] = 0.0
                self._min[i] = INFINITY
                self._max[i] = -INFINITY

    cdef Py_ssize_t descend(self, double u) noexcept nogil:
        # The slot whose cumulative range holds prefix sum u (total_mass() > 0).
        cdef Py_ssize_t d, n = 0
        u = u if u > 0.0 else 0.0  # below the first slot (or NaN): the first sampleable slot
        for d in range(self._levels):
            n = 8 * n + node_pick(self._sum + self._start[d] + 8 * n, &u)
        return n

    cdef void descend_many(self, double* prefix, int64_t* out, Py_ssize_t k) noexcept nogil:
        # descend() of prefix[0..k) into out[0..k) (prefix is consumed), all draws one
        # level at a time, so the cache misses of different draws overlap instead of
        # queueing.  total_mass() > 0.
        # Each draw's next node is prefetched as soon as it is known, so all k
        # misses of a level are in flight before the first of them is read.
        # Every draw starts in the root node: its prefix sums are added up once for all.
        cdef Py_ssize_t d, j, n, last = self._levels - 1
        cdef const double* level
        cdef const double* below = self._sum + self._start[1] if last > 0 else NULL
        cdef double root[9]
        node_prefixes(self._sum, root)
        for j in range(k):
            prefix[j] = prefix[j] if prefix[j] > 0.0 else 0.0
            out[j] = n = node_child(root, &prefix[j])
            if below != NULL:
                __builtin_prefetch(below + 8 * n)
        if last == 0:
            return
        for d in range(1, last):
            level = self._sum + self._start[d]
            below = self._sum + self._start[d + 1]
            for j in range(k):
                n = 8 * out[j]
                n = n + node_pick(level + n, &prefix[j])
                out[j] = n
                __builtin_prefetch(below + 8 * n)
        level = self._sum + self._leaf
        for j in range(k):
            n = 8 * out[j]
            out[j] = n + node_pick(level + n, &prefix[j])
            if self._large:
                # A drawn slot's priority is usually updated next: its max leaf (a line of a tree
                # the descent does not read) is asked for now, so the update finds it cached
                # (the PER loop at 1e6: about 0.05 µs a frame).  Its other lines are the descent's.
                __builtin_prefetch(self._max + self._leaf + n, 1)

    cdef double total_mass(self) noexcept nogil:
        # The descent's prefix of the whole root node.
        return node_sum(self._sum)

    cdef double min_weight(self) noexcept nogil:
        # The min of the root node, which sits below level -1 (the sum leaves when it is the only level).
        return self._min_below(-1, 0)

    cdef double max_raw(self) noexcept nogil:
        return mpr_max8(self._max)

    cdef double max_raw_ever(self) noexcept nogil:
        return self._head[0]

    cdef double leaf_weight(self, Py_ssize_t slot) noexcept nogil:
        return self._sum[self._leaf + slot]

    cdef double leaf_raw(self, Py_ssize_t slot) noexcept nogil:
        return self._max[self._leaf + slot]

    # -- Python ------------------------------------------------------------------------

    def set(self, const int64_t[::1] slots not None, const double[::1] values not None,
            const double[::1] raw not None):
        """Set leaf weights ``values`` (0 = unsampleable) and raw priorities.

        Duplicated slots are allowed: the last occurrence wins.  The caller
        has validated slots and values.
        """
        # All leaves first, then the paths: a path walked later reads children
        # that are already final, so duplicates and shared ancestors come out right.
        self.write_leaves(slots, values, raw)
        if slots.shape[0]:
            with nogil:
                self.fix_each(&slots[0], slots.shape[0])

    def fix_slots(self, Py_ssize_t first, Py_ssize_t last):
        """Bring the ancestors of slots ``first..last`` up to date (``fix_range``; for tests)."""
        if not 0 <= first <= last < self.capacity:
            raise IndexError(f"expected 0 <= first <= last < {self.capacity}, got {first}, {last}")
        with nogil:
            self.fix_range(first, last)

    def write_leaves(self, const int64_t[::1] slots not None, const double[::1] values not None,
                     const double[::1] raw not None):
        """Write leaves without fixing their ancestors (for tests of the fix methods)."""
        cdef Py_ssize_t k = slots.shape[0], j
        if values.shape[0] != k or raw.shape[0] != k:
            raise ValueError("slots, values and raw must have the same length")
        with nogil:
            for j in range(k):
                self.write_leaf(slots[j], values[j], raw[j])

    def search(self, const double[::1] prefix not None, int64_t[::1] out not None):
        """For each prefix sum, the slot whose cumulative range contains it (one path at a time)."""
        cdef Py_ssize_t k = prefix.shape[0], j
        if out.shape[0] < k:
            raise ValueError("out is shorter than prefix")
        if not self.total_mass() > 0.0:
            raise ValueError("the tree holds no sampleable slot")
        with nogil:
            for j in range(k):
                out[j] = self.descend(prefix[j])

    def search_many(self, const double[::1] prefix not None, int64_t[::1] out not None):
        """As :meth:`search`, every path descended together (what sampling does)."""
        cdef Py_ssize_t k = prefix.shape[0]
        if out.shape[0] < k:
            raise ValueError("out is shorter than prefix")
        if not self.total_mass() > 0.0:
            raise ValueError("the tree holds no sampleable slot")
        cdef double[::1] scratch = np.array(prefix, dtype=np.float64)
        if k:
            with nogil:
                self.descend_many(&scratch[0], &out[0], k)

    def rebuild(self):
        """Recompute every inner entry from the leaves (after a crash mid-update)."""
        with nogil:
            self.rebuild_inner()

    def total(self):
        """Sum of all leaf weights."""
        return self.total_mass()

    def min(self):
        """Smallest positive leaf weight (+inf when nothing is sampleable)."""
        return self.min_weight()

    def max(self):
        """Largest raw priority among sampleable slots (-inf when none)."""
        return self.max_raw()

    def max_ever(self):
        """Largest raw priority ever written to a sampleable leaf (-inf when none)."""
        return self.max_raw_ever()

    def forget_max_ever(self):
        """Start :meth:`max_ever` afresh (a buffer's ``clear``)."""
        self._head[0] = -INFINITY
