# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The ordered selectors' heap: the drawable items ordered by a key, the first one drawn first.

A subclass says what an item's key is (``key_of``: its insertion number for fifo, its negated
priority for max_heap, ...); ties go to the item inserted first.  All the state lives in one
caller-owned int64 array (heap or shared segment), so every process mapping it draws in the
same order::

    state[0]                        count: the number of drawable items, n
    state[1]                        insertions ever (the next item's insertion number)
    state[2 : 2 + c]                heap: the drawable items in heap order, the first n valid
    state[2 + c : 2 + 2c]           position of each item in heap, -1 when not drawable
    state[2 + 2c : 2 + 3c]          insertion number of each item
    state[2 + 3c : 2 + 4c]          key of each item (float64 bits)
    state[2 + 4c : 2 + 5c]          priority of each item (float64 bits)

An item's own entries (number, key, priority) and then whether it is drawable (the sign of
its position) are written before the heap is touched: a holder of the table's lock that dies
midway leaves ``rebuild`` enough to recompute the heap, the positions and the count.

A batch of k draws is the first k items in order, each once, found by a best-first walk of
the heap (O(k log k)); with n < k drawable items, those n in order, repeated from the first.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from numpy.random cimport bitgen_t

import numpy as np

STATE_DTYPE = np.int64
_HEAD = 2  # count, insertions
_PER_ITEM = 5  # heap, position, number, key, priority


def state_size(Py_ssize_t capacity):
    """Number of int64 entries the state of an ordered selector over ``capacity`` items needs."""
    if capacity < 1:
        raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
    return _HEAD + _PER_ITEM * capacity


def priority_views(state, Py_ssize_t capacity):
    """``(weights, priorities)`` of every item of ``state``: 1.0 where drawable, else 0 (a new
    array), and the priorities as given (a view)."""
    state = np.asarray(state)
    position = state[_HEAD + capacity:_HEAD + 2 * capacity]
    priorities = state[_HEAD + 4 * capacity:_HEAD + 5 * capacity].view(np.float64)
    return (position >= 0).astype(np.float64), priorities


cdef class HeapSelector(Selector):
    """An ordered selector over ``capacity`` items, ``state`` as laid out above; abstract (a
    subclass gives ``key_of``).  ``reset`` starts with no drawable item; pass False to attach to
    a state another process already initialised."""

    @staticmethod
    def check_state(state, Py_ssize_t capacity, drawable):
        """What disagrees in ``state`` (laid out above) with ``drawable`` (a bool per item: the
        items the slot states say may be drawn), as sentences; empty when all agrees: the count,
        each drawable item's place in the heap and back, and the heap's order by key."""
        state = np.asarray(state)
        count, inserts = int(state[0]), int(state[1])
        heap = state[_HEAD:_HEAD + capacity]
        position = state[_HEAD + capacity:_HEAD + 2 * capacity]
        number = state[_HEAD + 2 * capacity:_HEAD + 3 * capacity]
        key = state[_HEAD + 3 * capacity:_HEAD + 4 * capacity].view(np.float64)
        placed = position >= 0
        problems = []
        wrong = np.flatnonzero(placed != np.asarray(drawable, dtype=bool))
        if wrong.size:
            problems.append(f"heap: drawable slots and the heap's items differ at slots {wrong[:8].tolist()}")
        if count != int(np.count_nonzero(placed)):
            return problems + [f"heap: the count is {count}, but {int(np.count_nonzero(placed))} items have a place"]
        items = heap[:count]
        if ((items < 0) | (items >= capacity)).any():
            return problems + [f"heap: an entry is no item in [0, {capacity})"]
        if not (position[items] == np.arange(count)).all():
            return problems + ["heap: its entries and the items' places disagree"]
        if (number[placed] >= inserts).any():
            problems.append(f"heap: an item's insertion number is not below the {inserts} insertions")
        child = np.arange(1, count)
        a, b = items[(child - 1) >> 1], items[child]  # each parent before its child
        out_of_order = (key[a] > key[b]) | ((key[a] == key[b]) & (number[a] > number[b]))
        if out_of_order.any():
            problems.append(f"heap: {int(np.count_nonzero(out_of_order))} entries come before their parent")
        return problems

    def __init__(self, int64_t[::1] state not None, Py_ssize_t capacity, bint reset=True):
        cdef Py_ssize_t i
        if type(self) is HeapSelector:
            raise TypeError("HeapSelector is abstract: use an ordered selector such as FifoSelector")
        if state.shape[0] != state_size(capacity):
            raise ValueError(f"state: expected {state_size(capacity)} int64 entries for capacity "
                             f"{capacity}, got {state.shape[0]}")
        self._state = state
        self._count = &state[0]
        self._inserts = &state[1]
        self._heap = &state[_HEAD]
        self._position = &state[_HEAD + capacity]
        self._number = &state[_HEAD + 2 * capacity]
        self._key = <double*>&state[_HEAD + 3 * capacity]
        self._priority = <double*>&state[_HEAD + 4 * capacity]
        self.capacity = capacity
        self.max_priority = 1e300
        if reset:
            self._count[0] = 0
            self._inserts[0] = 0
            for i in range(capacity):
                self._position[i] = -1

    cdef double key_of(self, double priority, int64_t number) noexcept nogil:
        return 0.0

    cdef bint _before(self, int64_t a, int64_t b) noexcept nogil:
        # Whether item a comes before item b.
        return self._key[a] < self._key[b] or (self._key[a] == self._key[b] and self._number[a] < self._number[b])

    cdef void _sift_up(self, Py_ssize_t at) noexcept nogil:
        cdef int64_t item = self._heap[at]
        cdef Py_ssize_t parent
        while at > 0:
            parent = (at - 1) >> 1
            if not self._before(item, self._heap[parent]):
                break
            self._heap[at] = self._heap[parent]
            self._position[self._heap[at]] = at
            at = parent
        self._heap[at] = item
        self._position[item] = at

    cdef void _sift_down(self, Py_ssize_t at) noexcept nogil:
        cdef int64_t item = self._heap[at], n = self._count[0]
        cdef Py_ssize_t child
        while True:
            child = 2 * at + 1
            if child >= n:
                break
            if child + 1 < n and self._before(self._heap[child + 1], self._heap[child]):
                child += 1
            if not self._before(self._heap[child], item):
                break
            self._heap[at] = self._heap[child]
            self._position[self._heap[at]] = at
            at = child
        self._heap[at] = item
        self._position[item] = at

    cdef void insert_item(self, Py_ssize_t item, double priority) noexcept nogil:
        cdef int64_t n = self._count[0], number = self._inserts[0]
        if self._position[item] >= 0:
            return
        self._inserts[0] = number + 1
        self._number[item] = number
        self._priority[item] = priority
        self._key[item] = self.key_of(priority, number)
        self._position[item] = n
        self._heap[n] = item
        self._count[0] = n + 1
        self._sift_up(n)

    cdef void update_items(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil:
        cdef Py_ssize_t j, at
        cdef int64_t item
        cdef double key
        for j in range(k):
            item = items[j]
            at = self._position[item]
            if at < 0:
                continue
            self._priority[item] = priorities[j]
            key = self.key_of(priorities[j], self._number[item])
            if key != self._key[item]:
                self._key[item] = key
                self._sift_up(at)
                self._sift_down(self._position[item])

    cdef void remove_item(self, Py_ssize_t item) noexcept nogil:
        cdef Py_ssize_t at = self._position[item]
        cdef int64_t last
        if at < 0:
            return
        self._position[item] = -1
        self._count[0] -= 1
        last = self._heap[self._count[0]]
        if last != item:
            self._heap[at] = last
            self._position[last] = at
            self._sift_up(at)
            self._sift_down(self._position[last])

    cdef void rebuild(self) noexcept nogil:
        # The drawable items (a position >= 0) into heap order again, bottom-up.
        cdef Py_ssize_t i, n = 0
        cdef int64_t inserts = self._inserts[0]
        for i in range(self.capacity):
            if self._position[i] >= 0:
                self._heap[n] = i
                self._position[i] = n
                n += 1
                if self._number[i] >= inserts:
                    inserts = self._number[i] + 1
        self._count[0] = n
        self._inserts[0] = inserts
        for i in range(n // 2 - 1, -1, -1):
            self._sift_down(i)

    cdef double total(self) noexcept nogil:
        return <double>self._count[0]

    cdef double smallest(self) noexcept nogil:
        return 1.0 if self._count[0] > 0 else INFINITY

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return 1.0 if self._position[item] >= 0 else 0.0

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        return self._priority[item] if self._position[item] >= 0 else 0.0

    cdef int64_t arrival(self, Py_ssize_t item) noexcept nogil:
        return self._number[item] if self._position[item] >= 0 else -1

    cdef bint reorder_last(self, const int64_t* ranks, Py_ssize_t m) noexcept nogil:
        cdef Py_ssize_t i
        cdef int64_t n, first = self._inserts[0] - m
        if first < 0:
            return False
        for i in range(self.capacity):
            n = self._number[i] - first
            if self._position[i] >= 0 and 0 <= n < m:
                self._number[i] = first + ranks[n]
                self._key[i] = self.key_of(self._priority[i], self._number[i])
        self.rebuild()
        return True

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        # Best-first over the heap: a small heap of candidate positions (at most k + 1), the
        # best popped, its children pushed.
        cdef Py_ssize_t n = self._count[0], m = min(k, n), j, c = 0, at, child, i, best
        cdef Py_ssize_t* cand
        if n == 0:
            return
        cand = <Py_ssize_t*>malloc((m + 2) * sizeof(Py_ssize_t))
        if cand == NULL:  # no memory for the walk: the first item, over and over
            for j in range(k):
                items[j] = self._heap[0]
            return
        cand[0] = 0
        c = 1
        for j in range(m):
            at = cand[0]
            items[j] = self._heap[at]
            c -= 1
            cand[0] = cand[c]
            self._cand_down(cand, c, 0)
            for child in range(2 * at + 1, min(2 * at + 3, n)):
                cand[c] = child
                c += 1
                self._cand_up(cand, c - 1)
        free(cand)
        for j in range(m, k):
            items[j] = items[j - m]

    cdef void _cand_up(self, Py_ssize_t* cand, Py_ssize_t at) noexcept nogil:
        cdef Py_ssize_t p, v = cand[at]
        while at > 0:
            p = (at - 1) >> 1
            if not self._before(self._heap[v], self._heap[cand[p]]):
                break
            cand[at] = cand[p]
            at = p
        cand[at] = v

    cdef void _cand_down(self, Py_ssize_t* cand, Py_ssize_t c, Py_ssize_t at) noexcept nogil:
        cdef Py_ssize_t child, v
        if c == 0:
            return
        v = cand[at]
        while True:
            child = 2 * at + 1
            if child >= c:
                break
            if child + 1 < c and self._before(self._heap[cand[child + 1]], self._heap[cand[child]]):
                child += 1
            if not self._before(self._heap[cand[child]], self._heap[v]):
                break
            cand[at] = cand[child]
            at = child
        cand[at] = v

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        return self._heap[0] if self._count[0] > 0 else -1
