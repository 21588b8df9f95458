# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The gate of a replay table: the lock, the rate limiter, and blocked callers.

Every call that changes or reads the table's shared state passes the gate:
it takes the lock by the call's deadline (:meth:`Gate.acquire`), asks the
rate limiter whether an insert or a sample may go (Reverb's rule, settings
in the "limits" array of the segment schema), and sleeps on a futex in the
segment while it may not (:meth:`Gate.block`).  A local buffer's gate takes
a :class:`ThreadLock` instead, for the threads of its one process (a learner's
prefetching thread samples while the training thread updates priorities);
nothing can unblock a local caller the rate limiter holds back, so that wait
raises at once.  See docs/architecture.md, "Concurrency protocol".
"""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident

from mpreplay._ext.atomics cimport _atomic_add, _atomic_add32, _atomic_load
from mpreplay._ext.processes cimport describe_process
from mpreplay._ext.schema cimport (CLOSED, ENDED_CLOSED, ENDED_CREATOR, EPOCH, LIMIT_MAX_DIFF, LIMIT_MIN_DIFF, LIMIT_MIN_SIZE, LIMIT_ON, LIMIT_SPI,
                                   RESERVED, SAMPLES, STORED, WAITERS)

import time


class BufferClosed(RuntimeError):
    """The buffer was closed: its memory is gone, or its owner closed it."""


class TableGone(BufferClosed):
    """The table ended under this handle: its creator died and it was not persistent, or it was
    removed (``mpreplay rm``, ``close(unlink=True)``).  No row written now would ever be read:
    every call of every surviving handle raises this, naming the cause."""


def ended_error(int64_t why):
    """The exception a call raises on a table whose header says it ended ``why`` (ENDED_*)."""
    if why == ENDED_CREATOR:
        return TableGone(
            "the table's creator died, and a table that is not persistent ends with its creator "
            "(Table(..., shared=True, persist=True) outlives it)"
        )
    if why == ENDED_CLOSED:
        return BufferClosed("the replay buffer was closed by its owner")
    return TableGone("the table was removed (mpreplay rm, or close(unlink=True) by one of its handles)")

cdef extern from *:
    """
    #include <time.h>
    #ifdef __linux__
    #include <limits.h>
    #include <linux/futex.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    /* Sleep until *word != seen, a wake, or `seconds` pass (a shared-memory futex). */
    static void _mpreplay_futex_wait(int32_t* word, int32_t seen, double seconds) {
        struct timespec ts;
        ts.tv_sec = (time_t)seconds;
        ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    static void _mpreplay_futex_wake(int32_t* word) {
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
    #else
    /* Without futexes blocked callers poll: a short sleep, never a spinning core. */
    static void _mpreplay_futex_wait(int32_t* word, int32_t seen, double seconds) {
        struct timespec ts = {0, 500000};
        if (seconds < 0.0005) { ts.tv_nsec = (long)(seconds * 1e9); }
        nanosleep(&ts, NULL);
    }
    static void _mpreplay_futex_wake(int32_t* word) {}
    #endif
    """
    void _mpreplay_futex_wait(int32_t* word, int32_t seen, double seconds) nogil
    void _mpreplay_futex_wake(int32_t* word) nogil


cdef double _WAIT_SLICE_S = 0.05  # blocked callers look at signals and deadlines this often
# The lock is held for microseconds at a time: even timeout=0 waits this long
# for it, so that "do not wait for the rate limiter" does not fail on every
# brush with another process.  A frozen holder is given up on after it.
cdef double _LOCK_GRACE_S = 0.002
cdef double _CLOSE_WAIT_S = 1.0  # close() sets the closed flag without the lock after this


cdef double deadline_of(object timeout) except? -1.0:
    """Monotonic deadline of a ``timeout`` in seconds (None: never)."""
    if timeout is None:
        return INFINITY
    t = float(timeout)
    if not t >= 0.0:
        raise ValueError(f"timeout: expected None or a number >= 0, got {timeout!r}")
    return time.monotonic() + t


def deadline(timeout):
    """The ``time.monotonic()`` moment a ``timeout`` in seconds ends (None: never, inf)."""
    return deadline_of(timeout)


cdef class Gate:
    """The lock of ``header``'s table and the rate limiter set in ``limits``.

    Parameters
    ----------
    header, limits : the int64 counters and float64 rate limiter settings of the segment schema
    lock : a SharedLock (a table shared by processes) or a ThreadLock (a local table)
    """

    def __init__(self, int64_t[::1] header not None, double[::1] limits not None, object lock not None):
        self._header = header
        self._limits = limits
        self._epoch = <int32_t*>&header[EPOCH]
        if isinstance(lock, SharedLock):
            self._lock = lock
        elif isinstance(lock, ThreadLock):
            self._threads = lock
        else:
            raise TypeError(f"lock: expected a SharedLock or a ThreadLock, got {type(lock).__name__}")
        self._holder = 0

    def forget_lock(self):
        """In a forked child: the parent's hold on the lock is not this process's."""
        self._holder = 0

    def hold(self, double deadline=INFINITY):
        """Take the lock as a call does (TimeoutError by ``deadline``, BufferClosed), for Python
        code that must see the table still: ``verify`` and ``mpreplay.inspect``.  A dead
        holder's repair runs first.  :meth:`let_go` gives it back."""
        self.acquire(deadline)

    def let_go(self):
        """Give back the lock :meth:`hold` took (a no-op unless this thread holds it)."""
        self.release()

    cdef int acquire(self, double deadline=INFINITY) except -1:
        # Take the lock by `deadline` (monotonic seconds), or raise TimeoutError
        # naming its holder.  Raises BufferClosed, without holding the lock, once
        # the owner closed the buffer.
        cdef double limit = -1.0 if deadline == INFINITY else max(deadline - time.monotonic(), _LOCK_GRACE_S)
        if self._threads is not None:
            if not self._threads.lock(limit):
                raise TimeoutError("timed out waiting for the buffer's lock, held by another thread of this process")
        elif not self._lock.lock(limit):
            holder = self._lock.holder()
            who = "another process" if holder is None else f"{describe_process(holder[0])}, for {holder[1]:.1f} s"
            raise TimeoutError(f"timed out waiting for the buffer's lock, held by {who}")
        self._holder = PyThread_get_thread_ident()
        if self._header[CLOSED]:
            self.release()
            raise ended_error(self._header[CLOSED])
        return 0

    cdef int release(self) except -1:
        # A no-op unless this thread holds the lock through this gate: a wait that
        # timed out while taking it back leaves it free, or held by another thread
        # of the process that shares the buffer object.
        if self._holder != 0 and self._holder == PyThread_get_thread_ident():
            self._holder = 0
            if self._threads is not None:
                self._threads.unlock()
            else:
                self._lock.unlock()
        return 0

    cdef bint progress(self) noexcept nogil:
        # Lock held, after a change that may let a blocked caller proceed.
        # True: call wake() once the lock is released.
        if _atomic_load(&self._header[WAITERS]) > 0:
            _atomic_add32(self._epoch, 1)
            return True
        return False

    cdef void wake(self) noexcept nogil:
        _mpreplay_futex_wake(self._epoch)

    def close(self, int64_t why=ENDED_CLOSED):
        """Mark the table ended (``why``, one of the schema's ENDED_*) for every process and wake
        all blocked callers: they raise BufferClosed (:class:`TableGone` for a table that is
        gone).  Never hangs: if the lock's holder is frozen, the flag is set without it (a
        single store)."""
        if self._lock is None:
            self._header[CLOSED] = why
            return
        held = self._lock.acquire(_CLOSE_WAIT_S)
        try:
            self._header[CLOSED] = why
            _atomic_add32(self._epoch, 1)
        finally:
            if held:
                self._lock.release()
        self.wake()

    cdef int block(self, double deadline, str why) except -1:
        # Lock held on entry.  Sleeps until another process makes progress, a
        # signal arrives or `deadline` (monotonic) passes; then takes the lock
        # back by the deadline (else TimeoutError, the lock not held).
        cdef int32_t seen = self._epoch[0]
        cdef double remaining = deadline - time.monotonic()
        if self._lock is None:
            raise TimeoutError(f"{why}; a local buffer has no other process to wait for")
        if remaining <= 0.0:
            raise TimeoutError(f"{why}; timed out")
        # Atomic: a waiter that cannot take the lock back must still sign off.
        _atomic_add(&self._header[WAITERS], 1)
        self.release()
        try:
            with nogil:
                _mpreplay_futex_wait(self._epoch, seen, min(remaining, _WAIT_SLICE_S))
            PyErr_CheckSignals()
        finally:
            _atomic_add(&self._header[WAITERS], -1)
        self.acquire(deadline)
        return 0

    cdef bint limited(self) noexcept nogil:
        return self._limits[LIMIT_ON] != 0.0

    cdef bint can_insert(self, Py_ssize_t k) noexcept nogil:
        # Reverb's rule: below min_size inserts always go; above, the
        # cursor inserts * spi - samples may not pass max_diff.
        if self._limits[LIMIT_ON] == 0.0 or self._header[STORED] + k <= self._limits[LIMIT_MIN_SIZE]:
            return True
        return ((self._header[RESERVED] + k) * self._limits[LIMIT_SPI]
                - self._header[SAMPLES]) <= self._limits[LIMIT_MAX_DIFF]

    cdef bint can_sample(self, Py_ssize_t b) noexcept nogil:
        if self._limits[LIMIT_ON] == 0.0:
            return True
        if self._header[STORED] < self._limits[LIMIT_MIN_SIZE]:
            return False
        return (self._header[RESERVED] * self._limits[LIMIT_SPI]
                - self._header[SAMPLES] - b) >= self._limits[LIMIT_MIN_DIFF]

    cdef int check_insert(self, Py_ssize_t k) except -1:
        # A batch the limiter could never let through would wait forever.
        if self.limited() and k * self._limits[LIMIT_SPI] > self._limits[LIMIT_MAX_DIFF] - self._limits[LIMIT_MIN_DIFF]:
            raise ValueError(f"add: {k} rows at once exceed the rate limiter's error buffer; add fewer per call")
        return 0

    cdef int check_sample(self, Py_ssize_t b) except -1:
        if self.limited() and b > self._limits[LIMIT_MAX_DIFF] - self._limits[LIMIT_MIN_DIFF]:
            raise ValueError(f"batch_size: {b} exceeds the rate limiter's error buffer; sample fewer per call")
        return 0


