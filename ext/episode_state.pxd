# A compressed writer's episode in progress, as the planner (frame_planner.pyx) reads it and the
# writer's episode (episode.pyx) moves it on; see episode_state.pyx.
from libc.stdint cimport int64_t, uint8_t, uint64_t


cdef class EpisodeState:
    cdef readonly Py_ssize_t t         # steps of the episode in progress stored so far
    cdef readonly int64_t written      # items the writer has reserved in its lane
    cdef readonly Py_ssize_t waiting   # rows waiting for the frame of their next observation
    cdef Py_ssize_t capacity           # most rows that can wait at once
    cdef Py_ssize_t nkeys              # the compressed keys
    cdef uint8_t** last                # per stacked key: the episode's newest observation
    cdef bint* last_planar
    cdef int64_t* waiting_slot         # per waiting row (oldest first): its slot,
    cdef uint64_t* waiting_gen         # the generation it was published with,
    cdef int64_t* waiting_position     # the items the writer had written before it,
    cdef double* waiting_priority      # its priority once complete (NaN: the largest stored)
    cdef uint8_t** waiting_next        # (capacity, keys): its next observations (NULL: not allocated yet)
    cdef bint* waiting_planar

    cdef int allocate(self, Py_ssize_t nkeys, Py_ssize_t capacity, const Py_ssize_t* last_bytes) except -1
    cdef void drop(self, Py_ssize_t n) noexcept nogil
