# The lock of a shared table, which lives inside its segment; see ext/lock.pyx (a local table's
# lock between threads is ext/thread_lock.pyx).  ext/gate.pyx takes and releases it through the
# C-level calls below (no Python call per lock operation).
from libc.stdint cimport int64_t, uint64_t

from mpreplay._ext.mutex cimport pthread_mutex_t


cdef struct LockWords:
    pthread_mutex_t mutex
    uint64_t magic       # written last by the creator; attachers check it
    uint64_t recoveries  # owner deaths survived, all processes together
    uint64_t pending     # nonzero: an owner died and no on_recover has succeeded since
    int64_t holder       # pid of the process holding the lock, 0: free (advisory, for diagnostics)
    int64_t since        # when the holder took it: coarse monotonic ns (see _coarse_ns)


cdef class SharedLock:
    cdef unsigned char[::1] _region  # keeps the memory under _sh alive
    cdef LockWords* _sh
    cdef int64_t[::1] _counters
    cdef object _on_recover
    # Called under the lock at most once every _watch_every_ns (coarse clock), by the acquisition
    # that finds _watch_at passed: a check too slow for every call (is the table still there?).
    cdef object _on_watch
    cdef int64_t _watch_at, _watch_every_ns
    # This object's own holds, timed only when asked (time_holds): a benchmark's measure of how
    # long a call keeps everyone else out.  Process-local, never in the segment.
    cdef bint _timing
    cdef int64_t _taken_ns, _held_ns, _holds

    # acquire() and release() without a Python call: lock(limit) waits at most `limit`
    # seconds (< 0: no limit) and returns 1 once held, 0 when the wait timed out.
    cdef int lock(self, double limit) except -1
    cdef int unlock(self) except -1
    cdef int _init_mutex(self) except -1
    cdef int _spin(self, int64_t until) noexcept nogil
    cdef int _wait(self, double limit, int64_t start) except -1
    cdef int _settle(self, int rc) except -1
    cdef int _recover(self) except -1
    cdef int _watch(self, int64_t now) except -1

