# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The lock of a shared replay table: a process-shared lock that lives inside a
caller-owned byte region (:class:`SharedLock`).  A local table's lock between
the threads of one process, :class:`ThreadLock`, is ext/thread_lock.pyx (this
module gives it too, so both locks import from one place).

The region is normally part of a ``multiprocessing.shared_memory`` segment, so
every process that maps the segment shares the lock.  It holds a
``pthread_mutex_t`` set up as process-shared, error-checking and -- where the
platform has them -- robust, plus a few words of state::

    [ pthread_mutex_t | magic | recoveries | pending | holder | since ]   (LOCK_NBYTES, a multiple of 64)

Ownership
    Like any pthread mutex the lock belongs to the *thread* that acquired it:
    only that thread may release it (others get ``RuntimeError``), and
    acquiring it again from the owning thread raises instead of deadlocking.

Crash recovery (robust mutexes: Linux, FreeBSD)
    When the owner dies -- process killed, or thread ended -- while holding
    the lock, the next acquirer gets the lock with ``EOWNERDEAD``.  It records
    a repair as *pending* in the region, marks the mutex consistent, calls
    ``on_recover()`` (still holding the lock) to repair whatever the dead
    owner left half-written, clears the pending mark and carries on.
    ``recoveries`` counts these deaths across all processes.

    The mutex is made consistent *before* the repair because a mutex released
    while inconsistent becomes unusable for good; the pending mark carries the
    duty to repair instead.  So if ``on_recover`` raises (or its process dies
    in it), the lock is released, the exception propagates, and every later
    acquirer, in any process, runs its ``on_recover`` until one succeeds.
    All processes sharing a lock should therefore pass the same
    ``on_recover``; one passing ``None`` treats the repair as done.

Without robust mutexes (e.g. macOS) ``SharedLock.robust`` is False: a process
that dies holding the lock blocks every other one for good, ``on_recover``
is never called, and ``acquire(timeout=...)`` is the only way out.  Where
``pthread_mutex_timedlock`` is missing too (macOS), waits poll every 0.2 ms,
and the owning thread acquiring again waits instead of raising.

Lifecycle
    The creator initialises the lock once (``create=True``) before any other
    process attaches (``create=False``).  The mutex is never destroyed: other
    processes may still be using it, and none is needed on Linux -- the
    segment's owner simply unlinks the segment once everyone is done.  The
    lock keeps a reference to ``region``, so the mapping stays valid while
    the lock object lives.
"""
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport INT64_MAX, int64_t, uint64_t, uintptr_t

from mpreplay._ext.atomics cimport _atomic_load
from mpreplay._ext.mutex cimport (
    EBUSY,
    EDEADLK,
    EOWNERDEAD,
    EPERM,
    ETIMEDOUT,
    FOREVER_S,
    MPR_ROBUST,
    PTHREAD_MUTEX_ERRORCHECK,
    PTHREAD_PROCESS_SHARED,
    check_rc,
    mpr_mutex_consistent,
    mpr_mutex_lock_within,
    mpr_mutexattr_setrobust,
    pthread_mutex_init,
    pthread_mutex_trylock,
    pthread_mutex_unlock,
    pthread_mutexattr_destroy,
    pthread_mutexattr_init,
    pthread_mutexattr_setpshared,
    pthread_mutexattr_settype,
    pthread_mutexattr_t,
)
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from mpreplay._ext.thread_lock import ThreadLock

cdef extern from *:
    """
    #include <pthread.h>
    #include <sched.h>
    #include <time.h>
    #include <unistd.h>

    /* A spinning waiter's pause: lets the core's other thread run and saves power. */
    #if defined(__x86_64__) || defined(__i386__)
    #define mpr_pause() __builtin_ia32_pause()
    #elif defined(__aarch64__)
    #define mpr_pause() __asm__ __volatile__("yield")
    #else
    #define mpr_pause() ((void)0)
    #endif

    /* This process's pid, kept by a fork handler: the holder word is written on
       every acquisition, and getpid() is a system call. */
    #ifdef CLOCK_MONOTONIC_COARSE
    #define MPR_CLOCK_COARSE CLOCK_MONOTONIC_COARSE
    #else
    #define MPR_CLOCK_COARSE CLOCK_MONOTONIC
    #endif

    static long long mpr_pid = 0;
    static void mpr_refresh_pid(void) { mpr_pid = (long long)getpid(); }
    static int mpr_track_pid(void) {
        mpr_refresh_pid();
        return pthread_atfork(NULL, NULL, mpr_refresh_pid);
    }
    """
    void mpr_pause() nogil
    int sched_yield() nogil
    long long mpr_pid
    int mpr_track_pid()
    int MPR_CLOCK_COARSE


cdef uint64_t _MAGIC = 0x6d707265706c6b31  # "mpreplk1"
# Blocking waits are cut into slices so that Ctrl-C (and other signal
# handlers) run while a process waits; an unlock still wakes the waiter at once.
cdef int64_t _SLICE_NS = 50_000_000
# A holder lets go within microseconds (a batch's draws, an update, an add), so a waiter
# spins this long before it sleeps in the kernel: it takes the lock in the gap between two
# holds, where a sleeper woken by the unlock arrives after the holder took it again (a
# learner sampling flat out kept 1-row writers of a small-observation buffer at a few
# percent of their solo rate).
cdef int64_t _SPIN_NS = 50_000

check_rc(mpr_track_pid(), "pthread_atfork")

LOCK_NBYTES = (<Py_ssize_t>sizeof(LockWords) + 63) // 64 * 64  # whole cache lines
ROBUST = bool(MPR_ROBUST)


cdef inline int64_t _coarse_ns() noexcept nogil:
    # Stamped on every acquisition, inside the critical section: the coarse
    # clock costs a memory read where the precise one costs a clock read, and
    # a millisecond is precise enough to say how long a holder has held on.
    cdef timespec t
    clock_gettime(MPR_CLOCK_COARSE, &t)
    return <int64_t>t.tv_sec * 1_000_000_000 + t.tv_nsec


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <int64_t>t.tv_sec * 1_000_000_000 + t.tv_nsec


cdef double _timeout_seconds(double t) except -2.0:
    if not t >= 0.0:
        raise ValueError(f"timeout: expected a number of seconds >= 0 or None, got {t}")
    return t


cdef object _holder(const LockWords* sh):
    cdef int64_t pid = sh.holder, since = sh.since
    if pid == 0:
        return None
    return int(pid), max(0.0, (_coarse_ns() - since) * 1e-9)


cdef const LockWords* _words_in(const unsigned char[::1] region) except? NULL:
    # The lock's words in a mapping that may be read-only (a monitor's); NULL when it holds no lock.
    if region.shape[0] < LOCK_NBYTES or <uintptr_t>&region[0] % 8:
        raise ValueError(f"region: expected at least LOCK_NBYTES={LOCK_NBYTES} bytes aligned to 8")
    cdef const LockWords* sh = <const LockWords*>&region[0]
    return sh if sh.magic == _MAGIC else NULL


def read_holder(const unsigned char[::1] region not None):
    """What :meth:`SharedLock.holder` says of the lock in ``region``, read from a mapping
    that may be read-only (a monitor's); None when free or when ``region`` holds no lock."""
    cdef const LockWords* sh = _words_in(region)
    return None if sh == NULL else _holder(sh)


def read_recoveries(const unsigned char[::1] region not None):
    """What :attr:`SharedLock.recoveries` says of the lock in ``region``, read as
    :func:`read_holder` reads; None when ``region`` holds no lock."""
    cdef const LockWords* sh = _words_in(region)
    return None if sh == NULL else int(sh.recoveries)


cdef class SharedLock:
    """A lock shared by every process that maps ``region``.

    Parameters
    ----------
    region : writable uint8 buffer of at least ``LOCK_NBYTES`` bytes, 8-byte aligned
        Where the lock lives (64-byte alignment keeps it on its own cache line).
    create : bool
        True: initialise a new lock in ``region`` (one process, once, before
        anyone attaches).  False: attach to the lock another process created.
    on_recover : callable or None
        Called with the lock held when its previous owner died holding it
        (see the module documentation for the policy when it raises).
    counters : int64 buffer of at least 2 entries, or None
        When given, every acquisition adds the nanoseconds it waited to
        ``counters[0]`` and 1 to ``counters[1]`` (under the lock).
    """
    robust = ROBUST

    def __init__(self, unsigned char[::1] region not None, bint create, object on_recover=None,
                 int64_t[::1] counters=None):
        if region.shape[0] < LOCK_NBYTES:
            raise ValueError(f"region: expected at least LOCK_NBYTES={LOCK_NBYTES} bytes, got {region.shape[0]}")
        if <uintptr_t>&region[0] % 8:
            raise ValueError("region: expected a start address aligned to 8 bytes (64 recommended)")
        if on_recover is not None and not callable(on_recover):
            raise TypeError(f"on_recover: expected a callable or None, got {type(on_recover).__name__}")
        if counters is not None and counters.shape[0] < 2:
            raise ValueError(f"counters: expected at least 2 int64 entries, got {counters.shape[0]}")
        self._region = region
        self._sh = <LockWords*>&region[0]
        self._counters = counters
        self._on_recover = on_recover
        self._watch_at = INT64_MAX  # nothing to watch until watch() says what
        if create:
            self._init_mutex()
        elif self._sh.magic != _MAGIC:
            raise ValueError("region: holds no lock; create it (create=True) in the owning process first")

    cdef int _init_mutex(self) except -1:
        cdef pthread_mutexattr_t attr
        check_rc(pthread_mutexattr_init(&attr), "pthread_mutexattr_init")
        try:
            check_rc(pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED), "pthread_mutexattr_setpshared")
            # Error-checking: releasing a lock this thread does not hold
            # reports EPERM instead of corrupting it, also where not robust.
            check_rc(pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK), "pthread_mutexattr_settype")
            check_rc(mpr_mutexattr_setrobust(&attr), "pthread_mutexattr_setrobust")
            check_rc(pthread_mutex_init(&self._sh.mutex, &attr), "pthread_mutex_init")
        finally:
            pthread_mutexattr_destroy(&attr)
        self._sh.recoveries = 0
        self._sh.pending = 0
        self._sh.magic = _MAGIC
        return 0

    @property
    def recoveries(self) -> int:
        """How many times an owner died holding the lock and a successor took over."""
        return self._sh.recoveries

    def holder(self):
        """``(pid, seconds)``: the process holding the lock now and for how long, or None when free.

        Advisory: read without the lock, for diagnostics (a holder that died
        stays named until the next process takes the lock over).
        """
        return _holder(self._sh)

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock; wait at most ``timeout`` seconds (None: no limit).

        Returns True once the lock is held, False when the timeout expired
        first (``timeout=0`` only tries).  Raises RuntimeError if this
        thread already holds it: the lock is not reentrant.
        """
        return self.lock(-1.0 if timeout is None else _timeout_seconds(timeout)) == 1

    cdef int lock(self, double limit) except -1:
        # 1: held, 0: timed out.  ``limit`` < 0 (or beyond FOREVER_S) waits forever.
        cdef int64_t start, now, waited = 0
        cdef int rc = pthread_mutex_trylock(&self._sh.mutex)
        if rc == EBUSY:
            if limit == 0.0:
                return 0
            if limit > FOREVER_S:
                limit = -1.0
            start = _now_ns()
            with nogil:
                rc = self._spin(start + (_SPIN_NS if limit < 0.0 else min(_SPIN_NS, <int64_t>(limit * 1e9))))
            if rc == EBUSY:
                rc = self._wait(limit, start)
                if rc == ETIMEDOUT:
                    return 0
            waited = _now_ns() - start
        if rc != 0:
            self._settle(rc)
        if self._counters is not None:
            self._counters[0] += waited
            self._counters[1] += 1
        now = _coarse_ns()
        self._sh.since = now
        self._sh.holder = mpr_pid
        if self._sh.pending:
            self._recover()
        if now >= self._watch_at:
            self._watch(now)
        if self._timing:
            self._taken_ns = _now_ns()
        return 1

    cdef int _spin(self, int64_t until) noexcept nogil:
        # Try to take the lock whenever it looks free (no holder named: a read, not a write
        # to the mutex's line, which the holder needs), until `until` (monotonic ns).
        # Returns the pthread code of the attempt that took it, or EBUSY.
        # The pauses between looks double, so waiters that keep missing each other take the
        # line from the holder less and less often; past 64 a look yields the core instead,
        # in case the holder waits for this one (more processes than cores).
        cdef int rc, i, pauses = 1
        while True:
            if _atomic_load(&self._sh.holder) == 0:
                rc = pthread_mutex_trylock(&self._sh.mutex)
                if rc != EBUSY:
                    return rc
            if pauses > 64:
                sched_yield()
            else:
                for i in range(pauses):
                    mpr_pause()
                pauses *= 2
            if _now_ns() >= until:
                return EBUSY

    cdef int _wait(self, double limit, int64_t start) except -1:
        # Returns the pthread code of the attempt that ended the wait.
        cdef int64_t deadline = start + <int64_t>(limit * 1e9)
        cdef int64_t step
        cdef int rc
        while True:
            step = _SLICE_NS
            if limit > 0.0:
                step = min(step, deadline - _now_ns())
                if step <= 0:
                    return ETIMEDOUT
            with nogil:
                rc = mpr_mutex_lock_within(&self._sh.mutex, step)
            if rc != ETIMEDOUT:
                return rc
            PyErr_CheckSignals()

    cdef int _settle(self, int rc) except -1:
        # A lock attempt returned rc != 0: take over from a dead owner, or raise.
        if rc == EOWNERDEAD:
            self._sh.pending = 1
            self._sh.recoveries += 1
            check_rc(mpr_mutex_consistent(&self._sh.mutex), "pthread_mutex_consistent")
        elif rc == EDEADLK:
            raise RuntimeError("acquire: this thread already holds the lock (it is not reentrant)")
        else:
            check_rc(rc, "acquire: pthread_mutex_lock")
        return 0

    cdef int _recover(self) except -1:
        if self._on_recover is not None:
            try:
                self._on_recover()
            except BaseException:
                pthread_mutex_unlock(&self._sh.mutex)
                raise
        self._sh.pending = 0
        return 0

    cdef int _watch(self, int64_t now) except -1:
        self._watch_at = now + self._watch_every_ns
        try:
            self._on_watch()
        except BaseException:
            self.unlock()
            raise
        return 0

    def watch(self, object on_watch, double every) -> None:
        """Call ``on_watch()`` with the lock held from the first acquisition on, then again at
        most once every ``every`` seconds, as acquisitions come (none while nobody takes the
        lock).  What it raises is raised by that acquisition, the lock released.  A reading of
        the clock that every acquisition makes anyway decides: no cost to the acquisitions in
        between."""
        if not callable(on_watch):
            raise TypeError(f"on_watch: expected a callable, got {type(on_watch).__name__}")
        if not every > 0.0:
            raise ValueError(f"every: expected a number of seconds > 0, got {every}")
        self._on_watch = on_watch
        self._watch_every_ns = <int64_t>(every * 1e9)
        self._watch_at = 0

    def time_holds(self, bint on) -> None:
        """Start (``on``) or stop timing this object's holds, from acquisition to release; starting
        sets :meth:`hold_times` back to zero.  Two clock reads a hold while on, none while off."""
        self._timing = on
        if on:
            self._held_ns = self._holds = 0
            self._taken_ns = _now_ns()  # a hold under way now counts from here

    def hold_times(self):
        """``(seconds, holds)``: how long this object held the lock, and how many times, while timed."""
        return self._held_ns * 1e-9, int(self._holds)

    def release(self) -> None:
        """Release the lock; RuntimeError if this thread does not hold it."""
        self.unlock()

    cdef int unlock(self) except -1:
        cdef int64_t holder = self._sh.holder
        cdef int rc
        if self._timing and holder == mpr_pid:
            self._held_ns += _now_ns() - self._taken_ns
            self._holds += 1
        self._sh.holder = 0
        rc = pthread_mutex_unlock(&self._sh.mutex)
        if rc == EPERM:
            self._sh.holder = holder  # not ours to clear

            raise RuntimeError("release: this thread does not hold the lock")
        return check_rc(rc, "release: pthread_mutex_unlock")

    def __enter__(self) -> SharedLock:
        self.lock(-1.0)
        return self

    def __exit__(self, *exc_info) -> None:
        self.unlock()

    def __dealloc__(self):
        # A held robust mutex is linked into its thread's robust list through
        # the mutex's own memory: if that memory were freed (or unmapped)
        # while held, the C library would later write through a dangling
        # pointer.  Let go before the region can go; unlocking a mutex this
        # thread does not hold is a harmless EPERM.
        if self._sh != NULL and self._sh.holder == mpr_pid:
            self._sh.holder = 0
            if pthread_mutex_unlock(&self._sh.mutex) != 0:
                self._sh.holder = mpr_pid

    def __reduce__(self):
        raise TypeError("SharedLock cannot be pickled: pass the segment's name and attach with create=False")

