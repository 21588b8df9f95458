# exp and log over a batch of float64 values, in place, for the kernels' per-row loops (a header
# only: cimport it).  Where the build found glibc's vector math library (setup.py defines
# MPR_LIBMVEC: Linux on x86-64) two values go through each call of its SSE variants, about three
# times libm's speed for exp and half again for log, within glibc's documented 1 ulp of these;
# elsewhere libm, one value at a time.  Either way a value gets the same result alone as in a
# batch: a lone value goes through the same two-lane call.
cdef extern from *:
    """
    #include <math.h>
    #ifdef MPR_LIBMVEC
    #include <emmintrin.h>
    __m128d _ZGVbN2v_exp(__m128d);
    __m128d _ZGVbN2v_log(__m128d);
    #define MPR_EACH(name, f)                                                         \\
        static inline void name(double* x, Py_ssize_t n) {                           \\
            Py_ssize_t i = 0;                                                         \\
            for (; i + 2 <= n; i += 2) _mm_storeu_pd(x + i, f(_mm_loadu_pd(x + i))); \\
            if (i < n) x[i] = _mm_cvtsd_f64(f(_mm_set1_pd(x[i])));                    \\
        }
    MPR_EACH(mpr_exp_each, _ZGVbN2v_exp)
    MPR_EACH(mpr_log_each, _ZGVbN2v_log)
    #else
    #define MPR_EACH(name, f)                                                         \\
        static inline void name(double* x, Py_ssize_t n) {                           \\
            for (Py_ssize_t i = 0; i < n; i++) x[i] = f(x[i]);                        \\
        }
    MPR_EACH(mpr_exp_each, exp)
    MPR_EACH(mpr_log_each, log)
    #endif
    """
    void mpr_exp_each(double* x, Py_ssize_t n) noexcept nogil
    void mpr_log_each(double* x, Py_ssize_t n) noexcept nogil
