# The arithmetic of one 8-wide node of the priority tree (ext/sumtree.pyx), a header only:
# cimport it.  Its min and max (SSE2 where the CPU has it), and the prefix sums the descent
# reads: every sum is added in one order, so an entry recomputed from its node and a
# descent through that node agree to the last bit.
cdef extern from *:
    """
    /* The min and max of a node's 8 entries, two lanes at a time where SSE2 is (every x86-64):
       a recompute is most of an update's work, and these take half the instructions of a
       scalar chain.  Entries are never NaN, so any order of comparisons gives the same result. */
    #include <math.h>
    #ifdef __SSE2__
    #include <emmintrin.h>
    static inline double mpr_min8(const double* c) {
        __m128d a = _mm_min_pd(_mm_min_pd(_mm_loadu_pd(c), _mm_loadu_pd(c + 2)),
                               _mm_min_pd(_mm_loadu_pd(c + 4), _mm_loadu_pd(c + 6)));
        return _mm_cvtsd_f64(_mm_min_sd(a, _mm_unpackhi_pd(a, a)));
    }
    static inline double mpr_max8(const double* c) {
        __m128d a = _mm_max_pd(_mm_max_pd(_mm_loadu_pd(c), _mm_loadu_pd(c + 2)),
                               _mm_max_pd(_mm_loadu_pd(c + 4), _mm_loadu_pd(c + 6)));
        return _mm_cvtsd_f64(_mm_max_sd(a, _mm_unpackhi_pd(a, a)));
    }
    /* The min of the positive ones (+inf when none): a weight of 0 is not sampleable. */
    static inline __m128d mpr_positive_or_inf(__m128d v) {
        __m128d keep = _mm_cmpgt_pd(v, _mm_setzero_pd());
        return _mm_or_pd(_mm_and_pd(keep, v), _mm_andnot_pd(keep, _mm_set1_pd(INFINITY)));
    }
    static inline double mpr_min8_positive(const double* c) {
        __m128d a = _mm_min_pd(_mm_min_pd(mpr_positive_or_inf(_mm_loadu_pd(c)), mpr_positive_or_inf(_mm_loadu_pd(c + 2))),
                               _mm_min_pd(mpr_positive_or_inf(_mm_loadu_pd(c + 4)), mpr_positive_or_inf(_mm_loadu_pd(c + 6))));
        return _mm_cvtsd_f64(_mm_min_sd(a, _mm_unpackhi_pd(a, a)));
    }
    #else
    static inline double mpr_min8(const double* c) {
        double m = c[0];
        for (int i = 1; i < 8; i++) m = c[i] < m ? c[i] : m;
        return m;
    }
    static inline double mpr_max8(const double* c) {
        double m = c[0];
        for (int i = 1; i < 8; i++) m = c[i] > m ? c[i] : m;
        return m;
    }
    static inline double mpr_min8_positive(const double* c) {
        double m = INFINITY;
        for (int i = 0; i < 8; i++) m = c[i] > 0.0 && c[i] < m ? c[i] : m;
        return m;
    }
    #endif
    """
    double mpr_min8(const double* c) noexcept nogil
    double mpr_max8(const double* c) noexcept nogil
    double mpr_min8_positive(const double* c) noexcept nogil


cdef inline void node_prefixes(const double* c, double* p) noexcept nogil:
    # The prefix sums of node c (8 sums) in the order the tree recomputes them:
    # p[0] = 0, p[j + 1] = c[0] + ... + c[j].
    p[0] = 0.0
    p[1] = c[0]
    p[2] = p[1] + c[1]
    p[3] = p[2] + c[2]
    p[4] = p[3] + c[3]
    p[5] = p[4] + c[4]
    p[6] = p[5] + c[5]
    p[7] = p[6] + c[6]
    p[8] = p[7] + c[7]


cdef inline Py_ssize_t node_child(const double* p, double* u) noexcept nogil:
    # The child of the node of prefix sums p that prefix u falls in, and u made relative to it.
    # The first child whose prefix exceeds u has positive mass (its prefix grew), so
    # the count of prefixes at or below u is the child -- unless rounding left u at or
    # past the node's mass (count 8): then the last child that grew it, so a node of
    # positive mass never leads into a child of zero mass.  The count has no branch
    # (the way down is random, a branch would be mispredicted); the rare overflow does.
    cdef double v = u[0]
    cdef Py_ssize_t cnt
    cnt = ((v >= p[1]) + (v >= p[2]) + (v >= p[3]) + (v >= p[4])
           + (v >= p[5]) + (v >= p[6]) + (v >= p[7]) + (v >= p[8]))
    if cnt == 8:
        cnt = ((p[1] < p[8]) + (p[2] < p[8]) + (p[3] < p[8]) + (p[4] < p[8])
               + (p[5] < p[8]) + (p[6] < p[8]) + (p[7] < p[8]))
    u[0] = v - p[cnt]
    return cnt


cdef inline Py_ssize_t node_pick(const double* c, double* u) noexcept nogil:
    # The child of node c (8 sums) that prefix u falls in, and u made relative to it.
    cdef double p[9]
    node_prefixes(c, p)
    return node_child(p, u)


cdef inline double node_sum(const double* c) noexcept nogil:
    # The sum of a node's 8 entries, in the order the descent adds them.
    return ((((((c[0] + c[1]) + c[2]) + c[3]) + c[4]) + c[5]) + c[6]) + c[7]
