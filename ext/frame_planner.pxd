# The planner of compressed batches (see frame_planner.pyx); declared here so its attributes are
# C fields, not Python ones, which the writer's episode (episode.pyx) and the frame store's
# write path (frames.pyx) read.
from libc.stdint cimport int64_t, uint8_t, uint64_t

from mpreplay._ext.episode_state cimport EpisodeState


cdef struct Observation:
    const uint8_t* data  # its first byte (of its first row, for the rows of a batch)
    bint planar          # frames contiguous one after another, else interleaved (stack axis last)


cdef class FramePlan


cdef class FramePlanner:
    cdef Py_ssize_t nkeys
    cdef Py_ssize_t max_next           # largest item distance from a row to its next observation
    cdef tuple names                   # per key: its field name
    cdef Py_ssize_t* row_bytes         # per key: bytes of one observation
    cdef Py_ssize_t* elem_bytes
    cdef Py_ssize_t* stack             # per key: frames per observation (1: not stacked)
    cdef bint* has_next                # per key: its next observation is stored by reference (next_of)
    cdef bint any_next
    cdef uint64_t** _masks             # per stacked key: which bytes of 8 are older frames than the newest
    cdef Py_ssize_t* _nmasks
    cdef Py_ssize_t _first_next        # the first next_of key, named in errors about next observations

    cdef bint _stack_ok(self, Py_ssize_t q, Observation obs, Observation before, Py_ssize_t t) noexcept nogil
    cdef bint _same(self, Py_ssize_t q, Observation a, Observation b) noexcept nogil
    cdef Observation row(self, Py_ssize_t q, Observation rows, Py_ssize_t i) noexcept nogil
    cdef FramePlan plan(self, Py_ssize_t k, const Observation* obs, const Observation* nexts, const uint8_t* flag,
                        EpisodeState episode, bint end_episode, object keep, Py_ssize_t resume, bint open_end)
    cdef Py_ssize_t _resumed_stack(self, Py_ssize_t q, Observation first, Py_ssize_t resume) except -1
    cdef tuple _finish(self, FramePlan p, Py_ssize_t ending, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail,
                       Py_ssize_t t, Observation* before)
    cdef tuple _trail(self, FramePlan p, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail, Py_ssize_t t,
                      Observation* before, bint unresolved, int64_t base)
    cdef Py_ssize_t _steps_past(self, FramePlan p, Py_ssize_t o, Observation* before, bint further) except -1
    cdef bint _same_nexts(self, FramePlan p, Py_ssize_t a, Py_ssize_t b) noexcept nogil
    cdef bint _equals_next(self, FramePlan p, Py_ssize_t o, Py_ssize_t i) noexcept nogil


cdef class FramePlan:
    cdef readonly Py_ssize_t items
    cdef readonly Py_ssize_t head      # pending ordinals resolved (the oldest ones)
    cdef readonly Py_ssize_t t         # steps of the episode in progress after the batch
    cdef readonly Py_ssize_t last_row  # row whose observation is the episode's newest, -1: an earlier call's
    cdef readonly Py_ssize_t waiting   # rows waiting for their next frame once the episode moves past it
    cdef FramePlanner planner
    cdef readonly Py_ssize_t rows      # rows planned
    cdef Py_ssize_t earlier            # pending rows of earlier calls (ordinals 0 .. earlier-1)
    cdef int64_t* item_row             # per item: its row, -1 for a frame of no row
    cdef int64_t* item_source          # per item of no row: the pending ordinal whose next observation holds
                                       # its frame, or -1: the first row's observation (a resumed row's)
    cdef int64_t* item_back            # per item of no row: the steps its frame is before that observation's
    cdef uint8_t* item_depth           # per item: earlier frames of its episode (at most 255)
    cdef int64_t* row_item             # per row: its item
    cdef int64_t* resolved_item        # per pending ordinal < head: the item holding its next frame
    cdef int64_t* _positions           # per earlier pending row: items the writer had written before it
    cdef Observation* obs              # per key: the rows' observations
    cdef Observation* nexts            # per key: the rows' next observations (NULL data without next_of)
    cdef Observation* _pending         # (earlier, nkeys): next observations of earlier calls' pending rows
    cdef object _keep

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier, Py_ssize_t extra)
    cdef Observation next_of(self, Py_ssize_t o, Py_ssize_t q) noexcept nogil
    cdef int64_t item_of(self, Py_ssize_t row) noexcept nogil
    cdef int64_t _position(self, Py_ssize_t o, int64_t base) noexcept nogil
