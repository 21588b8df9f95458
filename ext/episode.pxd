# A compressed writer's episode (see episode.pyx); declared here so its attributes are C
# fields, not Python ones, which the kernel's add of exact rows (ext/writes.pyx, add_rows) reads and calls.
from libc.stdint cimport int64_t, uint8_t, uint64_t

from mpreplay._ext.frame_planner cimport FramePlan, FramePlanner, Observation
from mpreplay._ext.episode_state cimport EpisodeState
from mpreplay._ext.frames cimport FrameCopier


cdef class Episode(EpisodeState):
    cdef readonly FramePlanner planner
    cdef readonly FrameCopier store         # the buffer's frame stores, written through this writer's planner
    cdef public Py_ssize_t lane            # the lane the writer fills, -1: none claimed yet
    cdef readonly tuple flags              # the fields whose nonzero value ends an episode (done, truncated)
    cdef readonly Py_ssize_t observations  # the observation values a step carries (keys and next_ keys)
    cdef tuple _next_names                 # per key: its next observation's field name (None without next_of)
    cdef int64_t* done_slots               # what settle() leaves: the earlier waiting rows it completes,
    cdef uint64_t* done_generations
    cdef double* done_priorities
    cdef tuple _key_shapes                 # per key: the observation's shape,
    cdef int* _key_types                   # its numpy type number
    cdef Observation* _step_obs            # per key: the rows take_rows() found, and their next observations
    cdef Observation* _step_next

    cdef bint take_rows(self, dict values, Py_ssize_t k) except -1
    cdef bint _view(self, Py_ssize_t q, object value, Py_ssize_t k, Observation* out) except -1
    cdef FramePlan plan_rows(self, Py_ssize_t k, const uint8_t* flag, object keep)
    cdef void copy_frames(self, FramePlan p, const int64_t* slot) noexcept nogil
    cdef Py_ssize_t settle(self, FramePlan p, const int64_t* slot, const double* row_priority, uint8_t* states,
                           double* item_priority) noexcept nogil
    cdef int advance_past(self, FramePlan p, const int64_t* slot, const uint64_t* reserved,
                          const double* row_priority) except -1
