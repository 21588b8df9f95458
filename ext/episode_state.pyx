# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A compressed writer's episode in progress: what its later rows are checked against.

Copied, because the caller may reuse its arrays once ``add()`` returns: the
episode's newest observation per stacked key, and the rows waiting for the
frame of their next observation (``next_of``), oldest first -- each one's
slot, the generation it was published with, the items the writer had
written before it, its priority and its next observations.  The planner
(frame_planner.pyx) plans every batch after it; the writer's episode
(episode.pyx), which it is the base of, moves it past each batch.
"""
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memmove


cdef class EpisodeState:
    """The state of one compressed writer's episode in progress (see the module docstring)."""

    def __cinit__(self):
        self.last = self.waiting_next = NULL
        self.last_planar = self.waiting_planar = NULL
        self.waiting_slot = self.waiting_position = NULL
        self.waiting_gen = NULL
        self.waiting_priority = NULL
        self.capacity = self.nkeys = 0

    cdef int allocate(self, Py_ssize_t nkeys, Py_ssize_t capacity, const Py_ssize_t* last_bytes) except -1:
        # Room for `capacity` waiting rows of `nkeys` keys, and per key with last_bytes[q] > 0
        # (a stacked key) its newest observation.
        cdef Py_ssize_t q
        self.nkeys, self.capacity = nkeys, capacity
        self.last = <uint8_t**>calloc(nkeys + 1, sizeof(uint8_t*))
        self.last_planar = <bint*>calloc(nkeys + 1, sizeof(bint))
        self.waiting_next = <uint8_t**>calloc(capacity * nkeys + 1, sizeof(uint8_t*))
        self.waiting_planar = <bint*>calloc(capacity * nkeys + 1, sizeof(bint))
        self.waiting_slot = <int64_t*>calloc(capacity, sizeof(int64_t))
        self.waiting_position = <int64_t*>calloc(capacity, sizeof(int64_t))
        self.waiting_gen = <uint64_t*>calloc(capacity, sizeof(uint64_t))
        self.waiting_priority = <double*>calloc(capacity, sizeof(double))
        if not (self.last and self.last_planar and self.waiting_next and self.waiting_planar and self.waiting_slot
                and self.waiting_position and self.waiting_gen and self.waiting_priority):
            raise MemoryError()
        for q in range(nkeys):
            if last_bytes[q] > 0:
                self.last[q] = <uint8_t*>malloc(last_bytes[q] + 1)
                if not self.last[q]:
                    raise MemoryError()
        return 0

    def __dealloc__(self):
        cdef Py_ssize_t j
        if self.last:
            for j in range(self.nkeys):
                free(self.last[j])
        if self.waiting_next:
            for j in range(self.capacity * self.nkeys):
                free(self.waiting_next[j])
        free(self.last)
        free(self.last_planar)
        free(self.waiting_next)
        free(self.waiting_planar)
        free(self.waiting_slot)
        free(self.waiting_position)
        free(self.waiting_gen)
        free(self.waiting_priority)

    cdef void drop(self, Py_ssize_t n) noexcept nogil:
        # Forget the n oldest waiting rows; their next-observation buffers go to the free end.
        cdef Py_ssize_t nk = self.nkeys, rest = self.waiting - n
        if n <= 0:
            return
        # Rotate the (capacity, keys) table of buffers left by n entries.
        _rotate(<void**>self.waiting_next, self.capacity * nk, n * nk)
        memmove(self.waiting_planar, self.waiting_planar + n * nk, rest * nk * sizeof(bint))
        memmove(self.waiting_slot, self.waiting_slot + n, rest * sizeof(int64_t))
        memmove(self.waiting_gen, self.waiting_gen + n, rest * sizeof(uint64_t))
        memmove(self.waiting_position, self.waiting_position + n, rest * sizeof(int64_t))
        memmove(self.waiting_priority, self.waiting_priority + n, rest * sizeof(double))
        self.waiting = rest


cdef void _reverse(void** items, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    # items[lo .. hi) in reverse order.
    cdef void* x
    hi -= 1
    while lo < hi:
        x = items[lo]
        items[lo] = items[hi]
        items[hi] = x
        lo += 1
        hi -= 1


cdef void _rotate(void** items, Py_ssize_t n, Py_ssize_t by) noexcept nogil:
    # items[0 .. n) rotated left by `by`: items[by] comes first, items[0 .. by) go last.
    _reverse(items, 0, by)
    _reverse(items, by, n)
    _reverse(items, 0, n)
