# exp and log over a batch of float64 values, in place, for the kernels' per-row loops (a header
# only: cimport it).  Where the build found glibc's vector math library (setup.py defines
# MPR_LIBMVEC: Linux on x86-64) a call of one of its vector variants takes four values at a time
# on a CPU with AVX2 and two on others (SSE2, every x86-64): the four-lane one halves the time of
# a batch of 32 again, and the two-lane one is about three times libm's speed for exp and half
# again for log, all within glibc's documented 1 ulp.  Elsewhere libm, one value at a time.  Each
# value's result depends on the value alone: a lone one or the tail of a batch goes through the
# same call, padded, so a value gets the same result alone as in a batch.  The CPU is asked once
# per process, so every batch of a process takes the same variant.
cdef extern from *:
    """
    #include <math.h>
    #include <string.h>
    #ifdef MPR_LIBMVEC
    #include <immintrin.h>
    __m128d _ZGVbN2v_exp(__m128d);
    __m128d _ZGVbN2v_log(__m128d);
    __m256d _ZGVdN4v_exp(__m256d);
    __m256d _ZGVdN4v_log(__m256d);
    #define MPR_EACH(name, lanes, load, store, f, attr)                       \\
        attr static inline void name(double* x, Py_ssize_t n) {              \\
            Py_ssize_t i = 0;                                                 \\
            double tail[lanes];                                               \\
            for (; i + lanes <= n; i += lanes) store(x + i, f(load(x + i)));  \\
            if (i < n) {                                                      \\
                for (int t = 0; t < lanes; t++) tail[t] = 1.0;                \\
                memcpy(tail, x + i, (n - i) * sizeof(double));                \\
                store(tail, f(load(tail)));                                   \\
                memcpy(x + i, tail, (n - i) * sizeof(double));                \\
            }                                                                 \\
        }
    MPR_EACH(mpr_exp_each2, 2, _mm_loadu_pd, _mm_storeu_pd, _ZGVbN2v_exp, )
    MPR_EACH(mpr_log_each2, 2, _mm_loadu_pd, _mm_storeu_pd, _ZGVbN2v_log, )
    MPR_EACH(mpr_exp_each4, 4, _mm256_loadu_pd, _mm256_storeu_pd, _ZGVdN4v_exp, __attribute__((target("avx2"))))
    MPR_EACH(mpr_log_each4, 4, _mm256_loadu_pd, _mm256_storeu_pd, _ZGVdN4v_log, __attribute__((target("avx2"))))
    static int mpr_lanes4 = -1;
    static inline int mpr_use_lanes4(void) {
        if (mpr_lanes4 < 0) mpr_lanes4 = __builtin_cpu_supports("avx2") ? 1 : 0;
        return mpr_lanes4;
    }
    /* Values per vector call in the module that includes this (each has its own setting);
       `set` 2 or 4 (tests of either path) changes it where the CPU allows, 0 only asks.
       Returns the old setting. */
    static inline int mpr_batch_lanes(int set) {
        int was = mpr_use_lanes4() ? 4 : 2;
        if (set == 2 || (set == 4 && __builtin_cpu_supports("avx2"))) mpr_lanes4 = set == 4;
        return was;
    }
    static inline void mpr_exp_each(double* x, Py_ssize_t n) {
        if (mpr_use_lanes4()) mpr_exp_each4(x, n); else mpr_exp_each2(x, n);
    }
    static inline void mpr_log_each(double* x, Py_ssize_t n) {
        if (mpr_use_lanes4()) mpr_log_each4(x, n); else mpr_log_each2(x, n);
    }
    #else
    #define MPR_EACH(name, f)                                                         \\
        static inline void name(double* x, Py_ssize_t n) {                           \\
            for (Py_ssize_t i = 0; i < n; i++) x[i] = f(x[i]);                        \\
        }
    MPR_EACH(mpr_exp_each, exp)
    MPR_EACH(mpr_log_each, log)
    static inline int mpr_batch_lanes(int set) { return 1; }
    #endif
    """
    void mpr_exp_each(double* x, Py_ssize_t n) noexcept nogil
    void mpr_log_each(double* x, Py_ssize_t n) noexcept nogil
    int mpr_batch_lanes(int set) noexcept nogil
