# A local table's lock, between the threads of its one process; see ext/thread_lock.pyx.
# ext/gate.pyx takes and releases it through the C-level calls below (no Python call per lock
# operation), as it does a shared table's SharedLock (ext/lock.pxd).
from mpreplay._ext.mutex cimport pthread_mutex_t


cdef class ThreadLock:
    cdef pthread_mutex_t* _mutex
    cdef object __weakref__

    # As SharedLock's: lock(limit) returns 1 once held, 0 when `limit` seconds passed first.
    cdef int _renew(self) except -1
    cdef int lock(self, double limit) except -1
    cdef void unlock(self) noexcept nogil
