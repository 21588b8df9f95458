# Atomic operations on words of the shared segment (GCC/Clang builtins), for kernels that touch
# a word without the lock or beside it.  A header only: cimport it.
from libc.stdint cimport int32_t, int64_t

cdef extern from *:
    """
    #define _mpreplay_acquire_fence() __atomic_thread_fence(__ATOMIC_ACQUIRE)
    #define _mpreplay_compiler_fence() __atomic_signal_fence(__ATOMIC_SEQ_CST)
    #define _atomic_add(p, v) ((void)__atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST))
    #define _atomic_add32(p, v) ((void)__atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST))
    #define _atomic_load(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
    #define _atomic_store(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
    #define _atomic_cas(p, expected, v) __atomic_compare_exchange_n((p), (expected), (v), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
    """
    void _mpreplay_acquire_fence() noexcept nogil
    # No store moves across it in the compiled code, and it costs no instruction: what a process
    # killed at any instruction leaves in memory then follows its program order (the next owner
    # of the lock reads it only after the kernel saw the process die, so the CPU adds no reordering).
    void _mpreplay_compiler_fence() noexcept nogil
    void _atomic_add(int64_t* p, int64_t v) noexcept nogil
    void _atomic_add32(int32_t* p, int32_t v) noexcept nogil
    int64_t _atomic_load(int64_t* p) noexcept nogil
    void _atomic_store(int64_t* p, int64_t v) noexcept nogil
    bint _atomic_cas(int64_t* p, int64_t* expected, int64_t v) noexcept nogil

