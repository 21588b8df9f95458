# Declarations shared with the draw path (ext/gather.pyx rebuilds compressed observations,
# ext/draws.pyx checks the slots a row reads while it samples), the slot table, and
# ext/episode.pyx, whose writer's episode writes its frames through a FrameCopier.
from libc.stdint cimport int64_t, uint8_t

from mpreplay._ext.frame_planner cimport FramePlan, FramePlanner

cdef enum:
    MAX_STACK = 64       # frames per stacked observation
    MAX_NEXT_OFFSET = 64  # slots between a row and the frame of its next observation


cdef class Frames:
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t _nkeys
    cdef int64_t* _nxt        # per slot: slot of the next observation's newest frame, -1: none
    cdef uint8_t* _depth      # per slot: earlier frames of the same episode, at most stack - 1
    cdef int64_t* _lanes      # (nlanes, LANE_LEN): see schema.pxd
    cdef Py_ssize_t _nlanes
    cdef uint8_t** _frames    # per key: (size, frame_bytes)
    cdef Py_ssize_t* _frame_bytes
    cdef Py_ssize_t* _elem_bytes
    cdef Py_ssize_t* _stack
    cdef bint* _has_next
    cdef readonly Py_ssize_t max_stack
    cdef readonly Py_ssize_t max_next   # largest slot distance from a row to its next frame
    cdef object _keep

    cdef inline Py_ssize_t next_slot(self, Py_ssize_t u) noexcept nogil:
        # The slot of row u's next observation (its newest frame), -1: none.
        return self._nxt[u]

    cdef void _bounds(self, Py_ssize_t u, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil
    cdef Py_ssize_t _back(self, Py_ssize_t u, Py_ssize_t b) noexcept nogil
    cdef void _sources(self, Py_ssize_t key, Py_ssize_t u, uint8_t** src) noexcept nogil
    cdef void rebuild(self, Py_ssize_t key, Py_ssize_t u, uint8_t* out) noexcept nogil
    cdef void rebuild_pair(self, Py_ssize_t key, Py_ssize_t u, uint8_t* out, uint8_t* next_out) noexcept nogil
    cdef Py_ssize_t read_set(self, Py_ssize_t u, int64_t* out) noexcept nogil
    cdef bint reads(self, Py_ssize_t r, Py_ssize_t s) noexcept nogil


cdef const uint8_t* array_bytes(object array, Py_ssize_t nbytes, object what, str prefix=*) except? NULL


cdef class FrameCopier:
    cdef readonly Py_ssize_t size
    cdef FramePlanner planner
    cdef uint8_t** frames     # per key: (size, frame bytes)
    cdef int64_t* nxt         # per slot: slot of the next observation's newest frame, -1: none
    cdef uint8_t* depth       # per slot: earlier frames of the same episode
    cdef object _keep

    cdef void write_frames(self, FramePlan p, const int64_t* slot) noexcept nogil
