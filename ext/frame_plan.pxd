# The planner of compressed writes (see frame_plan.pyx); declared here so its
# attributes are C fields, not Python ones.
from libc.stdint cimport int64_t, uint8_t, uint64_t


cdef struct Observation:
    const uint8_t* data  # its first byte (of its first row, for the rows of a batch)
    bint planar          # frames contiguous one after another, else interleaved (stack axis last)


cdef class FramePlan
cdef class Episode


cdef class FramePlanner:
    cdef Py_ssize_t _nkeys
    cdef Py_ssize_t _max_next
    cdef tuple _names           # per key: its field name
    cdef Py_ssize_t* _row_bytes  # per key: bytes of one observation
    cdef Py_ssize_t* _elem_bytes
    cdef Py_ssize_t* _stack      # per key: frames per observation (1: not stacked)
    cdef bint* _has_next         # per key: its next observation is stored by reference (next_of)
    cdef uint64_t** _masks       # per stacked key: which bytes of 8 are older frames than the newest
    cdef Py_ssize_t* _nmasks
    cdef bint _any_next
    cdef Py_ssize_t _first_next  # the first next_of key, named in errors about next observations

    cdef bint _stack_ok(self, Py_ssize_t q, Observation obs, Observation before, Py_ssize_t t) noexcept nogil
    cdef bint _same(self, Py_ssize_t q, Observation a, Observation b) noexcept nogil
    cdef Observation _row(self, Py_ssize_t q, Observation rows, Py_ssize_t i) noexcept nogil
    cdef FramePlan _plan(self, Py_ssize_t k, const Observation* obs, const Observation* nexts, const uint8_t* flag,
                         Episode episode, bint end_episode, object keep, Py_ssize_t resume)
    cdef Py_ssize_t _resumed_stack(self, Py_ssize_t q, Observation first, Py_ssize_t resume) except -1
    cdef tuple _finish(self, FramePlan p, Py_ssize_t ending, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail,
                       Py_ssize_t t, Observation* before)
    cdef bint _equals_next(self, FramePlan p, Py_ssize_t o, Py_ssize_t i) noexcept nogil


cdef class FramePlan:
    cdef readonly Py_ssize_t items
    cdef readonly Py_ssize_t head      # pending ordinals resolved (the oldest ones)
    cdef readonly Py_ssize_t t         # steps of the episode in progress after the batch
    cdef readonly Py_ssize_t last_row  # row whose observation is the episode's newest, -1: an earlier call's
    cdef readonly Py_ssize_t waiting   # rows waiting for their next frame once the episode moves past it
    cdef FramePlanner _planner
    cdef readonly Py_ssize_t rows      # rows planned
    cdef Py_ssize_t _earlier
    cdef int64_t* _item_row        # per item: its row, -1 for a frame of no row
    cdef int64_t* _item_source     # per item of no row: the pending ordinal whose last next frame it is,
                                   # or -1 - b: the frame b steps before a resumed first row
    cdef uint8_t* _item_depth      # per item: earlier frames of its episode (at most 255)
    cdef int64_t* _row_item        # per row: its item
    cdef int64_t* _resolved_item   # per pending ordinal < head: the item holding its next frame
    cdef int64_t* _positions       # per earlier pending row: items the writer had written before it
    cdef Observation* _obs      # per key: the rows' observations
    cdef Observation* _next     # per key: the rows' next observations (NULL data without next_of)
    cdef Observation* _pending  # (earlier, nkeys): next observations of earlier calls' pending rows
    cdef object _keep

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier, Py_ssize_t seeds)
    cdef Observation _next_of(self, Py_ssize_t o, Py_ssize_t q) noexcept nogil
    cdef int64_t item_of(self, Py_ssize_t row) noexcept nogil
    cdef int64_t _position(self, Py_ssize_t o, int64_t base) noexcept nogil


cdef class Episode:
    # One writer's episode in progress, copied (the caller may reuse its arrays once add()
    # returns): its newest stacks and the rows waiting for the frame of their next
    # observation; and where the writer's frames go in the buffer.
    cdef readonly FramePlanner planner
    cdef public Py_ssize_t lane        # the lane the writer fills, -1: none claimed yet
    cdef readonly Py_ssize_t t         # steps of the episode in progress stored so far
    cdef readonly int64_t written      # items the writer has reserved in its lane
    cdef readonly Py_ssize_t waiting   # rows waiting for the frame of their next observation
    cdef readonly tuple flags          # the fields whose nonzero value ends an episode (done, truncated)
    cdef readonly Py_ssize_t observations  # the observation values a step carries (keys and next_ keys)
    cdef tuple _next_names             # per key: its next observation's field name (None without next_of)
    cdef Py_ssize_t _capacity          # most rows that can wait at once
    cdef Py_ssize_t _nkeys             # the planner's keys (kept here: __dealloc__ may find the planner cleared)
    cdef uint8_t** _last               # per stacked key: the episode's newest observation
    cdef bint* _last_planar
    cdef int64_t* _slot                # per waiting row (oldest first): its slot,
    cdef uint64_t* _gen                # the generation it was published with,
    cdef int64_t* _position            # the items the writer had written before it,
    cdef double* _priority             # its priority once complete (NaN: the largest stored)
    cdef uint8_t** _next               # (capacity, keys): its next observations (NULL: not allocated yet)
    cdef bint* _next_planar
    cdef int64_t* done_slots           # what settle() leaves: the earlier waiting rows it completes,
    cdef uint64_t* done_generations
    cdef double* done_priorities
    # The buffer's arrays the writer writes.
    cdef Py_ssize_t _size
    cdef uint8_t** _frames             # per key: (size, frame bytes)
    cdef int64_t* _nxt
    cdef uint8_t* _depth
    cdef tuple _key_shapes             # per key: the observation's shape,
    cdef int* _key_types               # its numpy type number
    cdef Observation* _step_obs        # per key: the row take_step() found, and its next observation
    cdef Observation* _step_next
    cdef object _keep

    cdef bint take_step(self, dict values) except -1
    cdef bint _view(self, Py_ssize_t q, object value, Observation* out) except -1
    cdef void _drop(self, Py_ssize_t n) noexcept nogil
    cdef FramePlan plan_step(self, const uint8_t* flag, object keep)
    cdef void copy_frames(self, FramePlan p, const int64_t* slot) noexcept nogil
    cdef Py_ssize_t settle(self, FramePlan p, const int64_t* slot, const double* row_priority, uint8_t* states,
                           double* item_priority) noexcept nogil
    cdef int advance_past(self, FramePlan p, const int64_t* slot, const uint64_t* reserved,
                     const double* row_priority) except -1
