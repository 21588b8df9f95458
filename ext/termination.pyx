# cython: language_level=3
"""The end of a process that owns segments: told to end, it unlinks them and ends, whatever it is doing.

memory.py gives SIGTERM and SIGHUP, where a program left them at their default action, a Python
handler that unlinks the segments this process created, tells the resource tracker, and then ends
the process with the signal's default action.  But a Python handler runs only when the main thread
next runs Python code, which may be late, or never:

* the kernel hands a signal sent to a process to any thread that does not block it.  Landing on
  another thread (a BLAS worker, a queue's feeder thread, a prefetching sampler), it interrupts no
  wait of the main thread;
* landing on the main thread after the interpreter last looked for signals but before the main
  thread enters a wait, it interrupts nothing either: the wait has not begun;
* the main thread may be in a long call into C that holds the GIL.

guard(sig) puts a C handler in front of Python's.  It sends a signal that landed on another thread
on to the main thread, whose wait it then interrupts, and wakes a watchdog thread.  The watchdog
sends the signal to the main thread again every 50 ms (a wait begun since is interrupted then);
if the process still runs 0.5 s later, it unlinks the segments itself and ends the process
with the signal's default action.  (The resource tracker is then not told: at its own exit it reports the
segments as leaked, and finds them gone.)

The table of owned segments lives in C, where the watchdog and the handler can read it without
the GIL.  The handler and the watchdog call only what may be called in a signal handler (sem_post,
pthread_kill, getpid, sigaction, kill); shm_unlink is unlink() on a path under /dev/shm.
"""
from libc.errno cimport EINTR
from libc.stdint cimport int64_t
from libc.string cimport memcpy, strcmp
from posix.mman cimport shm_unlink
from posix.time cimport nanosleep, timespec
from posix.types cimport sigset_t
from posix.unistd cimport getpid

import os

from mpreplay._ext.atomics cimport _atomic_cas, _atomic_load, _atomic_store

ctypedef void (*handler_t)(int) noexcept nogil


cdef extern from *:
    """
    #include <errno.h>
    static inline int mpr_errno(void) { return errno; }
    static inline void mpr_set_errno(int value) { errno = value; }
    """
    int mpr_errno() noexcept nogil
    void mpr_set_errno(int value) noexcept nogil


cdef extern from "<signal.h>" nogil:
    handler_t SIG_DFL
    handler_t SIG_IGN
    enum: SA_SIGINFO
    enum: SIG_SETMASK
    enum: SIG_UNBLOCK

    cdef struct action "sigaction":
        handler_t sa_handler
        sigset_t sa_mask
        int sa_flags

    int sigaction(int, const action*, action*)
    int sigemptyset(sigset_t*)
    int sigfillset(sigset_t*)
    int sigaddset(sigset_t*, int)
    int pthread_sigmask(int, const sigset_t*, sigset_t*)
    int kill(int, int)


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t  # opaque: only stored and passed back
    pthread_t pthread_self()
    int pthread_equal(pthread_t, pthread_t)
    int pthread_kill(pthread_t, int)
    int pthread_create(pthread_t*, const void*, void* (*)(void*) noexcept nogil, void*)
    int pthread_detach(pthread_t)


cdef extern from "<semaphore.h>" nogil:
    ctypedef struct sem_t:
        pass
    int sem_init(sem_t*, int, unsigned int)
    int sem_wait(sem_t*)
    int sem_post(sem_t*)


cdef enum:
    _SIGNALS = 65   # Linux numbers signals 1..64
    _NAME = 64      # bytes per name, the NUL included; mpreplay's are "/mpreplay-<pid>-<8 hex>"
    _OWNED_MAX = 4096

# How long the watchdog gives Python's handler (the launcher waits 1 s before it sends SIGKILL).
cdef int64_t _GRACE_NS = 500_000_000
cdef int _NUDGES = 10  # times the watchdog sends the signal to the main thread again meanwhile
OWNED_MAX = _OWNED_MAX


cdef struct Owned:
    int64_t pid  # the creator; 0: a free slot.  Set after the name, cleared before it changes
    char name[_NAME]


cdef Owned _owned[_OWNED_MAX]
cdef handler_t _python_handler[_SIGNALS]
# The process whose main thread and watchdog these are.  A forked child inherits them but not the
# watchdog thread: until the fork hook below starts its own, its guard calls Python's handler alone.
cdef int64_t _guarded_pid = 0
cdef pthread_t _main
cdef sem_t _wake
cdef int64_t _ending = 0  # the first signal the guard caught


cdef void _unlink_owned_by(int64_t pid) noexcept nogil:
    cdef int i
    for i in range(_OWNED_MAX):
        if _atomic_load(&_owned[i].pid) == pid:
            shm_unlink(_owned[i].name)
            _atomic_store(&_owned[i].pid, 0)


cdef void _end_with(int sig) noexcept nogil:
    cdef action default
    cdef sigset_t just_sig
    default.sa_handler = SIG_DFL
    sigemptyset(&default.sa_mask)
    default.sa_flags = 0
    sigaction(sig, &default, NULL)
    sigemptyset(&just_sig)
    sigaddset(&just_sig, sig)
    pthread_sigmask(SIG_UNBLOCK, &just_sig, NULL)
    kill(getpid(), sig)


cdef void* _watch(void* unused) noexcept nogil:
    cdef timespec left
    cdef int nudge, sig
    while sem_wait(&_wake) != 0:
        if mpr_errno() != EINTR:  # a platform without unnamed semaphores: Python's handler alone
            return NULL
    sig = <int>_atomic_load(&_ending)
    for nudge in range(_NUDGES):
        left.tv_sec = 0
        left.tv_nsec = _GRACE_NS // _NUDGES
        while nanosleep(&left, &left) != 0:
            pass
        # A signal that reached the main thread just before it began a wait interrupted nothing;
        # sent again, it interrupts the wait, and Python's handler runs.
        pthread_kill(_main, sig)
    _unlink_owned_by(getpid())
    _end_with(sig)
    return NULL


cdef void ending_signal_handler(int sig) noexcept nogil:
    cdef int saved_errno = mpr_errno()  # the interrupted code may be about to read it
    cdef int64_t none = 0
    if _atomic_load(&_guarded_pid) == getpid():
        if _atomic_cas(&_ending, &none, sig):
            sem_post(&_wake)
        if not pthread_equal(pthread_self(), _main) and pthread_kill(_main, sig) == 0:
            mpr_set_errno(saved_errno)
            return
    _python_handler[sig](sig)
    mpr_set_errno(saved_errno)


cdef int _start_watchdog() except -1:
    global _main
    cdef sigset_t everything, previous
    cdef pthread_t watchdog
    cdef int failed
    if sem_init(&_wake, 0, 0) != 0:
        return 0  # macOS has no unnamed semaphores: Python's handler alone, as without the guard
    _atomic_store(&_ending, 0)
    _main = pthread_self()
    # The watchdog blocks every signal: a signal sent to the process goes to a thread that runs Python.
    sigfillset(&everything)
    pthread_sigmask(SIG_SETMASK, &everything, &previous)
    failed = pthread_create(&watchdog, NULL, _watch, NULL)
    pthread_sigmask(SIG_SETMASK, &previous, NULL)
    if failed:
        raise OSError(failed, "cannot start the termination watchdog thread")
    pthread_detach(watchdog)
    _atomic_store(&_guarded_pid, getpid())
    return 0


def guard(int sig) -> bool:
    """Make sure a process told to end by ``sig`` ends, its segments unlinked.

    Call from the main thread after ``signal.signal(sig, handler)``, whose handler should end the
    process.  Returns whether ``sig`` is guarded; an action that is not a Python-installed plain
    handler (default, ignored, ``SA_SIGINFO``) is left as it is.  Setting another handler with
    ``signal.signal`` later removes the guard.
    """
    cdef action current
    if not 0 < sig < _SIGNALS:
        raise ValueError(f"sig: expected a signal number in 1..{_SIGNALS - 1}, got {sig}")
    sigaction(sig, NULL, &current)
    if current.sa_handler == ending_signal_handler:
        return True
    if current.sa_flags & SA_SIGINFO or current.sa_handler == SIG_DFL or current.sa_handler == SIG_IGN:
        return False
    if _atomic_load(&_guarded_pid) != getpid():
        _start_watchdog()
    _python_handler[sig] = current.sa_handler
    current.sa_handler = ending_signal_handler
    sigaction(sig, &current, NULL)
    return True


def own(str name) -> None:
    """Note that this process created segment ``name`` (as shm_open names it, with its leading slash)."""
    cdef bytes encoded = name.encode()
    cdef int64_t pid = getpid()
    cdef int i
    if not 0 < len(encoded) < _NAME:
        raise ValueError(f"name: expected a segment name of 1..{_NAME - 1} bytes, got {name!r}")
    for i in range(_OWNED_MAX):
        # Free: no owner, or another process's (a forked child's copy of its parent's table).
        if _owned[i].pid != pid:
            memcpy(_owned[i].name, <const char*>encoded, len(encoded) + 1)
            _atomic_store(&_owned[i].pid, pid)
            return
    raise OSError(f"this process already owns {_OWNED_MAX} shared-memory segments; close some first")


def disown(str name) -> None:
    """Forget segment ``name`` (this process unlinked it, or will not)."""
    cdef bytes encoded = name.encode()
    cdef int64_t pid = getpid()
    cdef int i
    for i in range(_OWNED_MAX):
        if _owned[i].pid == pid and strcmp(_owned[i].name, encoded) == 0:
            _atomic_store(&_owned[i].pid, 0)


def owned() -> list:
    """The names of the segments this process owns."""
    cdef int64_t pid = getpid()
    return [_owned[i].name.decode() for i in range(_OWNED_MAX) if _owned[i].pid == pid]


def unlink_owned() -> list:
    """Unlink every segment this process owns, and return their names."""
    names = owned()
    _unlink_owned_by(getpid())
    return names


def _watch_in_forked_child() -> None:
    # Python runs this in the child's only thread, which Python makes its main thread.
    if _atomic_load(&_guarded_pid) not in (0, getpid()):
        _start_watchdog()


os.register_at_fork(after_in_child=_watch_in_forked_child)
