# The planner of compressed writes (see frame_plan.pyx); declared here so its
# attributes are C fields, not Python ones.
from libc.stdint cimport int64_t, uint8_t, uint64_t


cdef struct Observation:
    const uint8_t* data  # its first byte (of its first row, for the rows of a batch)
    bint planar          # frames contiguous one after another, else interleaved (stack axis last)


cdef class FramePlan


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
    cdef tuple _finish(self, FramePlan p, Py_ssize_t ending, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail,
                       Py_ssize_t t, Observation* before)
    cdef bint _equals_next(self, FramePlan p, Py_ssize_t o, Py_ssize_t i) noexcept nogil


cdef class FramePlan:
    cdef readonly Py_ssize_t items
    cdef readonly Py_ssize_t head      # pending ordinals resolved (the oldest ones)
    cdef readonly Py_ssize_t t         # steps of the episode in progress after the batch
    cdef readonly Py_ssize_t last_row  # row whose observation is the episode's newest, -1: an earlier call's
    cdef FramePlanner _planner
    cdef readonly Py_ssize_t rows      # rows planned
    cdef Py_ssize_t _earlier
    cdef int64_t* _item_row        # per item: its row, -1 for an episode's last next frame
    cdef int64_t* _item_source     # per item: for a last next frame, the pending ordinal it is taken from
    cdef uint8_t* _item_depth      # per item: earlier frames of its episode (at most 255)
    cdef int64_t* _row_item        # per row: its item
    cdef int64_t* _resolved_item   # per pending ordinal < head: the item holding its next frame
    cdef int64_t* _positions       # per earlier pending row: items the writer had written before it
    cdef Observation* _obs      # per key: the rows' observations
    cdef Observation* _next     # per key: the rows' next observations (NULL data without next_of)
    cdef Observation* _pending  # (earlier, nkeys): next observations of earlier calls' pending rows
    cdef object _keep

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier)
    cdef Observation _next_of(self, Py_ssize_t o, Py_ssize_t q) noexcept nogil
    cdef int64_t _position(self, Py_ssize_t o, int64_t base) noexcept nogil
