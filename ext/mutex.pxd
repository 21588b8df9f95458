# The pthread mutex calls of a table's locks (ext/lock.pyx, ext/thread_lock.pyx): among them
# the timed wait both make (on the monotonic clock where the C library has it), robust mutexes
# where the platform has them, and the check of a pthread return code.  A header only: cimport it.
from libc.string cimport strerror

cdef extern from "<pthread.h>":
    ctypedef struct pthread_mutex_t:
        pass

cdef extern from *:
    """
    #include <errno.h>
    #include <pthread.h>
    #include <time.h>

    /* Timeouts beyond this many seconds (~285 years) mean "wait forever" and keep the
       nanosecond arithmetic far from int64 overflow. */
    #define MPR_FOREVER_S 9e9

    #if defined(__linux__) || defined(__FreeBSD__)
    #define MPR_ROBUST 1
    #define mpr_mutexattr_setrobust(attr) pthread_mutexattr_setrobust((attr), PTHREAD_MUTEX_ROBUST)
    #define mpr_mutex_consistent(m) pthread_mutex_consistent(m)
    #else
    #define MPR_ROBUST 0
    #define mpr_mutexattr_setrobust(attr) 0
    #define mpr_mutex_consistent(m) 0
    #endif

    /* Wait at most ns nanoseconds for the mutex (inline: every kernel that cimports the
       locks gets this header, most never call it).  A monotonic deadline where
       the C library takes one; a realtime deadline elsewhere, where a clock
       step distorts the current slice (callers keep the overall deadline on
       the monotonic clock). */
    static inline int mpr_mutex_lock_within(pthread_mutex_t *m, long long ns) {
        struct timespec t;
    #if defined(__GLIBC__) && defined(__USE_GNU) && __GLIBC_PREREQ(2, 30)
        const clockid_t clock = CLOCK_MONOTONIC;
    #else
        const clockid_t clock = CLOCK_REALTIME;
    #endif
        clock_gettime(clock, &t);
        t.tv_sec += (time_t)(ns / 1000000000LL);
        t.tv_nsec += (long)(ns % 1000000000LL);
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec += 1;
            t.tv_nsec -= 1000000000L;
        }
    #if defined(__GLIBC__) && defined(__USE_GNU) && __GLIBC_PREREQ(2, 30)
        return pthread_mutex_clocklock(m, clock, &t);
    #elif MPR_ROBUST
        return pthread_mutex_timedlock(m, &t);
    #else
        for (;;) {
            struct timespec now, nap = {0, 200000};
            int rc = pthread_mutex_trylock(m);
            if (rc != EBUSY) return rc;
            clock_gettime(clock, &now);
            if (now.tv_sec > t.tv_sec || (now.tv_sec == t.tv_sec && now.tv_nsec >= t.tv_nsec)) return ETIMEDOUT;
            nanosleep(&nap, NULL);
        }
    #endif
    }
    """
    const double FOREVER_S "MPR_FOREVER_S"
    ctypedef struct pthread_mutexattr_t:
        pass
    enum:
        MPR_ROBUST
        PTHREAD_PROCESS_SHARED
        PTHREAD_MUTEX_ERRORCHECK
        EBUSY
        EDEADLK
        EOWNERDEAD
        EPERM
        ETIMEDOUT
    int pthread_mutexattr_init(pthread_mutexattr_t* attr)
    int pthread_mutexattr_destroy(pthread_mutexattr_t* attr)
    int pthread_mutexattr_setpshared(pthread_mutexattr_t* attr, int pshared)
    int pthread_mutexattr_settype(pthread_mutexattr_t* attr, int kind)
    int mpr_mutexattr_setrobust(pthread_mutexattr_t* attr)
    int pthread_mutex_init(pthread_mutex_t* m, const pthread_mutexattr_t* attr)
    int pthread_mutex_destroy(pthread_mutex_t* m)
    int pthread_mutex_trylock(pthread_mutex_t* m) nogil
    int pthread_mutex_lock(pthread_mutex_t* m) nogil
    int pthread_mutex_unlock(pthread_mutex_t* m) nogil
    int mpr_mutex_consistent(pthread_mutex_t* m)
    int mpr_mutex_lock_within(pthread_mutex_t* m, long long ns) nogil


cdef inline int check_rc(int rc, str what) except -1:
    # A pthread call's return code: 0, or the error it names, raised as OSError.
    if rc != 0:
        raise OSError(rc, f"{what} failed: {strerror(rc).decode()}")
    return 0
