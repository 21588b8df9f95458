# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The lock of a local replay table, between the threads of its one process
(:class:`ThreadLock`); a shared table's lock, which lives in its segment, is
:class:`mpreplay._ext.lock.SharedLock`.
"""
from libc.stdlib cimport free, malloc

from mpreplay._ext.mutex cimport (
    EBUSY,
    ETIMEDOUT,
    FOREVER_S,
    check_rc,
    mpr_mutex_lock_within,
    pthread_mutex_destroy,
    pthread_mutex_init,
    pthread_mutex_lock,
    pthread_mutex_t,
    pthread_mutex_trylock,
    pthread_mutex_unlock,
)

import os
import weakref


cdef class ThreadLock:
    """The lock of a local table, between the threads of its one process; every
    handle of the table (its episode writers too) takes the same one.

    A plain pthread mutex: taking it when free reads no clock and makes no
    system call (a Python lock's non-blocking try reads the clock).  Like
    SharedLock it belongs to the thread that took it; the caller (the gate)
    releases it only from that thread.
    """

    def __cinit__(self):
        self._renew()
        _THREAD_LOCKS.add(self)

    def __dealloc__(self):
        if self._mutex != NULL:
            pthread_mutex_destroy(self._mutex)
            free(self._mutex)

    cdef int _renew(self) except -1:
        # The lock a thread of a parent held at a fork stays held in the child, where
        # that thread does not exist: the child takes a fresh one.  The old one is
        # left as it is (a few bytes): destroying a mutex held by a thread that does
        # not exist is undefined.
        cdef pthread_mutex_t* m = <pthread_mutex_t*>malloc(sizeof(pthread_mutex_t))
        cdef int rc
        if m == NULL:
            raise MemoryError("cannot allocate a lock")
        rc = pthread_mutex_init(m, NULL)
        if rc != 0:
            free(m)
            check_rc(rc, "pthread_mutex_init")
        self._mutex = m
        return 0

    cdef int lock(self, double limit) except -1:
        # 1: held, 0: timed out.  ``limit`` < 0 (or beyond FOREVER_S) waits forever.
        cdef int rc = pthread_mutex_trylock(self._mutex)
        if rc == EBUSY:
            if limit == 0.0:
                return 0
            if limit < 0.0 or limit > FOREVER_S:
                with nogil:
                    rc = pthread_mutex_lock(self._mutex)
            else:
                with nogil:
                    rc = mpr_mutex_lock_within(self._mutex, <long long>(limit * 1e9))
                if rc == ETIMEDOUT:
                    return 0
        check_rc(rc, "ThreadLock: pthread_mutex_lock")
        return 1

    cdef void unlock(self) noexcept nogil:
        pthread_mutex_unlock(self._mutex)


_THREAD_LOCKS = weakref.WeakSet()


def _renew_thread_locks():
    for lock in list(_THREAD_LOCKS):
        (<ThreadLock>lock)._renew()


os.register_at_fork(after_in_child=_renew_thread_locks)
