# The sequence index of a sequence table (ext/sequences.pyx): what the slot table and the table kernel
# call to open, retire and read sequences.
from libc.stdint cimport int32_t, int64_t


cdef class Sequences:
    cdef int32_t* _steps      # per slot: real steps of the sequence starting there, 0: none starts there
    cdef int64_t* _lanes      # (nlanes, LANE_LEN): see schema.pxd
    cdef Py_ssize_t _nlanes
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t length
    cdef object _keep

    cdef Py_ssize_t steps(self, Py_ssize_t s) noexcept nogil
    cdef void open(self, Py_ssize_t s, Py_ssize_t steps) noexcept nogil
    cdef void close(self, Py_ssize_t s) noexcept nogil
    cdef Py_ssize_t window(self, Py_ssize_t s, Py_ssize_t steps, int64_t* out) noexcept nogil
