# The gate every call of a replay table passes: the lock, the rate limiter's rule, and the
# waits and wake-ups around them.  A table (ext/table_parts.pyx) holds one; see ext/gate.pyx.
from libc.stdint cimport int32_t, int64_t

from mpreplay._ext.lock cimport SharedLock
from mpreplay._ext.thread_lock cimport ThreadLock


cdef class Gate:
    cdef int64_t[::1] _header
    cdef double[::1] _limits
    cdef int32_t* _epoch
    cdef SharedLock _lock         # a shared table's (else None)
    cdef ThreadLock _threads      # a local table's (else None)
    cdef unsigned long _holder    # the thread of this process holding the lock through this gate (0: none)

    cdef int acquire(self, double deadline=*) except -1
    cdef int release(self) except -1
    cdef int block(self, double deadline, str why) except -1
    cdef bint limited(self) noexcept nogil
    cdef bint can_insert(self, Py_ssize_t k) noexcept nogil
    cdef bint can_sample(self, Py_ssize_t b) noexcept nogil
    cdef int check_insert(self, Py_ssize_t k) except -1
    cdef int check_sample(self, Py_ssize_t b) except -1
    cdef bint progress(self) noexcept nogil
    cdef void wake(self) noexcept nogil


cdef double deadline_of(object timeout) except? -1.0
