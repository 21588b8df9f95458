# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Uniform selection: every item that may be drawn is drawn with the same probability.

The drawable items are kept densely packed (insertion appends, removal moves
the last member into the hole), so a draw is one random index and one load,
whatever the capacity, and the state costs 16 bytes per item instead of a
tree's 48.  The state lives in one caller-owned int64 array (heap or shared
segment)::

    state[0]                      the number of drawable items, n
    state[1 : 1 + capacity]       members: the drawable items, the first n of them valid
    state[1 + capacity :]         position of each item in members, -1 when not drawable

``position`` is the truth and written first: a holder of the table's lock that
dies between two stores leaves ``rebuild`` enough to recompute the rest.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t

import numpy as np


STATE_DTYPE = np.int64


def state_size(Py_ssize_t capacity):
    """Number of int64 entries the state of a selector over ``capacity`` items needs."""
    if capacity < 1:
        raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
    return 1 + 2 * capacity


cdef class UniformSelector(Selector):
    """Selects the drawable items of ``capacity`` uniformly; ``state`` as laid out above.

    ``reset`` starts with no drawable item; pass False to attach to a state that
    another process already initialised.
    """

    @staticmethod
    def check_state(state, Py_ssize_t capacity, drawable):
        """What disagrees in ``state`` (laid out above) with ``drawable`` (per item: whether the
        slot states let it be drawn), as sentences: the count, the packed members and each
        item's place among them."""
        state = np.asarray(state)
        count, members, position = int(state[0]), state[1 : 1 + capacity], state[1 + capacity :]
        placed = position >= 0
        problems = []
        wrong = np.flatnonzero(placed != np.asarray(drawable, dtype=bool))
        if wrong.size:
            problems.append(f"members: drawable slots and the selector's members differ at slots {wrong[:5].tolist()}")
        if count != int(np.count_nonzero(placed)):
            problems.append(f"members: the count is {count}, but {int(np.count_nonzero(placed))} slots have a place")
        elif ((members[:count] < 0) | (members[:count] >= capacity)).any():
            problems.append(f"members: a member is no slot in [0, {capacity})")
        elif not (position[members[:count]] == np.arange(count)).all():
            problems.append("members: the packed members and the slots' places disagree")
        past = np.flatnonzero(position >= max(count, 0))
        if past.size:
            problems.append(f"members: a slot's place is past the member count at slots {past[:5].tolist()}")
        return problems

    def __init__(self, int64_t[::1] state not None, Py_ssize_t capacity, bint reset=True):
        if state.shape[0] != state_size(capacity):
            raise ValueError(f"state: expected {state_size(capacity)} int64 entries for capacity "
                             f"{capacity}, got {state.shape[0]}")
        self._state = state
        self._count = &state[0]
        self._members = &state[1]
        self._position = &state[1 + capacity]
        self.capacity = capacity
        self.max_priority = 1e300  # priorities are accepted and play no part in selection
        if reset:
            self._count[0] = 0
            for i in range(capacity):
                self._position[i] = -1

    cdef void insert_item(self, Py_ssize_t item, double priority) noexcept nogil:
        cdef int64_t n = self._count[0]
        if self._position[item] >= 0:
            return
        self._position[item] = n
        self._members[n] = item
        self._count[0] = n + 1

    cdef void remove_item(self, Py_ssize_t item) noexcept nogil:
        cdef int64_t at = self._position[item], last
        if at < 0:
            return
        self._position[item] = -1
        last = self._members[self._count[0] - 1]
        if last != item:
            self._members[at] = last
            self._position[last] = at
        self._count[0] -= 1

    cdef void fix(self, Py_ssize_t item) noexcept nogil:
        pass  # nothing is derived from one item's weight

    cdef void fix_range(self, Py_ssize_t first, Py_ssize_t last) noexcept nogil:
        pass

    cdef void rebuild(self) noexcept nogil:
        cdef Py_ssize_t i
        cdef int64_t n = 0
        for i in range(self.capacity):
            if self._position[i] >= 0:
                self._position[i] = n
                self._members[n] = i
                n += 1
        self._count[0] = n

    cdef double default_priority(self) noexcept nogil:
        return 1.0

    cdef double total(self) noexcept nogil:
        return <double>self._count[0]

    cdef double smallest(self) noexcept nogil:
        return 1.0 if self._count[0] > 0 else INFINITY

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return 1.0 if self._position[item] >= 0 else 0.0

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        return 1.0 if self._position[item] >= 0 else 0.0

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        cdef Py_ssize_t j
        cdef int64_t n = self._count[0], at
        for j in range(k):
            at = <int64_t>(((j if nstrata > 1 else 0) + rng.next_double(rng.state)) * n / nstrata)
            items[j] = self._members[at if at < n else n - 1]

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        cdef int64_t n = self._count[0], at = <int64_t>(rng.next_double(rng.state) * n)
        return self._members[at if at < n else n - 1]
