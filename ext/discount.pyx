# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Discounted cumulative sums and n-step folding, accumulated in float64.

Every kernel works on 2-D views shaped ``(rows, time)`` with any strides (the
caller moves the time axis last; zero strides express broadcast discounts).
The coefficient linking step ``t`` to step ``t + 1`` is::

    a[t] = gamma[t] * (not dones[t])

so the right sum is ``y[t] = x[t] + a[t] * y[t+1]`` and the left sum, its
transpose, is ``y[t] = x[t] + a[t-1] * y[t-1]``.  Both are written in
"processing order" ``u`` (``t = T-1-u`` going right-to-left, ``t = u``
otherwise), where step ``u`` reads the link at ``c = t`` or ``c = t - 1``.

A single recurrence is latency bound (one multiply-add per step, each waiting
for the last), so the kernels always keep several independent recurrences in
flight: blocks of _ROW_BLOCK neighbouring rows, and for the rows left over,
chunks of one row that are stitched together afterwards.
"""
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

cdef inline double _link(const links_t* links, Py_ssize_t r, Py_ssize_t c) noexcept nogil:
    if links_t is _Constant:
        return links.gamma
    else:
        if links.d[r * links.d_row + c * links.d_step]:
            return 0.0
        return (<const double*>(links.g + r * links.g_row + c * links.g_step))[0]


cdef inline Py_ssize_t _time(Py_ssize_t u, Py_ssize_t T, bint right) noexcept nogil:
    return T - 1 - u if right else u


cdef void _sweep_block(const real[:, :] x, real[:, :] out, const links_t* links, Py_ssize_t r0,
                       bint right) noexcept nogil:
    """Rows ``r0 : r0 + _ROW_BLOCK`` advance one step together, one chain per row.

    The fixed width lets the compiler keep every accumulator in a register.
    """
    cdef Py_ssize_t T = x.shape[1], u, t, c, i
    cdef double acc[_ROW_BLOCK]
    t = _time(0, T, right)
    for i in range(_ROW_BLOCK):
        acc[i] = x[r0 + i, t]
        out[r0 + i, t] = <real>acc[i]
    for u in range(1, T):
        t = _time(u, T, right)
        c = t if right else t - 1
        for i in range(_ROW_BLOCK):
            acc[i] = x[r0 + i, t] + _link(links, r0 + i, c) * acc[i]
            out[r0 + i, t] = <real>acc[i]


cdef void _chunked_row(const real[:, :] x, real[:, :] out, Py_ssize_t r, const links_t* links,
                       double* loc, double* prod, bint right) noexcept nogil:
    """One row, in blocks of _CHAINS chunks of ``L`` steps recurred side by side.

    Within a block, chunk k starts from zero and records its local sum
    ``loc`` and the product ``prod`` of links back to the chunk's start; the
    true value is then ``loc + prod * y_before_chunk``.  With a constant
    discount ``prod`` is ``gamma ** (j + 1)`` for every chunk, computed once.
    """
    cdef Py_ssize_t T = x.shape[1], u0, u, t, c, j, k, i, L = 0
    cdef double y, a
    cdef double lk[_CHAINS]
    cdef double pk[_CHAINS]
    cdef double cin[_CHAINS]
    cdef Py_ssize_t stride
    if T > _CHAINS * _MIN_CHUNK:
        # Step 0 starts the row; the rest is cut into equal blocks leaving a tail of < blocks * _CHAINS.
        L = (T - 1) // (_CHAINS * ((T - 2) // (_CHAINS * _CHUNK) + 1))
    # chunk k's product back to its start at step j is prod[k * stride + j]
    stride = 0 if links_t is _Constant else L
    if links_t is _Constant:
        prod[0] = links.gamma
        for j in range(1, L):
            prod[j] = prod[j - 1] * links.gamma
    t = _time(0, T, right)
    y = x[r, t]
    out[r, t] = <real>y
    u0 = 1
    while L and u0 + _CHAINS * L <= T:
        for k in range(_CHAINS):
            lk[k] = 0.0
            if links_t is _Stepwise:
                pk[k] = 1.0
        for j in range(L):
            if j % 8 == 0 and u0 + 2 * _CHAINS * L <= T:
                # The chunks read the block in _CHAINS interleaved streams, which hardware
                # prefetchers do not follow: fetch the next block ahead.
                for k in range(_CHAINS):
                    _prefetch(&x[r, _time(u0 + (_CHAINS + k) * L + j, T, right)])
            for k in range(_CHAINS):
                u = u0 + k * L + j
                t = _time(u, T, right)
                c = t if right else t - 1
                a = _link(links, r, c)
                lk[k] = x[r, t] + a * lk[k]
                loc[k * L + j] = lk[k]
                if links_t is _Stepwise:
                    pk[k] = a * pk[k]
                    prod[k * L + j] = pk[k]
        for k in range(_CHAINS):
            cin[k] = y
            y = loc[k * L + L - 1] + prod[k * stride + L - 1] * y
        for k in range(_CHAINS):
            for j in range(L):
                i = k * L + j
                t = _time(u0 + i, T, right)
                out[r, t] = <real>(loc[i] + prod[k * stride + j] * cin[k])
        u0 += _CHAINS * L
    for u in range(u0, T):
        t = _time(u, T, right)
        c = t if right else t - 1
        y = x[r, t] + _link(links, r, c) * y
        out[r, t] = <real>y


cdef int _run(const real[:, :] x, real[:, :] out, const links_t* links, bint right) except -1:
    """Rows in blocks of _ROW_BLOCK, leftover rows chunk by chunk."""
    cdef Py_ssize_t R = x.shape[0], blocked = R - R % _ROW_BLOCK, r
    cdef double* scratch = <double*>malloc(2 * _CHAINS * _CHUNK * sizeof(double))
    if scratch == NULL:
        raise MemoryError()
    with nogil:
        for r in range(blocked // _ROW_BLOCK):
            _sweep_block(x, out, links, r * _ROW_BLOCK, right)
        for r in range(blocked, R):
            _chunked_row(x, out, r, links, scratch, scratch + _CHAINS * _CHUNK, right)
    free(scratch)
    return 0


def discounted_cumsum(const real[:, :] x, real[:, :] out, double gamma,
                      const double[:, :] gammas, const unsigned char[:, :] dones, bint right):
    """Fill ``out`` with the discounted cumulative sum of ``x`` along axis 1.

    ``gammas`` (per-step discounts, broadcast views allowed) replaces the
    scalar ``gamma`` when given; ``dones`` (0/1 bytes) cuts the links.  ``out``
    may be ``x`` itself but must not otherwise overlap the inputs.
    """
    cdef _Constant constant
    cdef _Stepwise stepwise
    cdef unsigned char never_done = 0
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    if gammas is None and dones is None:
        constant.gamma = gamma
        _run(x, out, &constant, right)
        return
    stepwise = _Stepwise(<const char*>&gamma, 0, 0, <const char*>&never_done, 0, 0)
    if gammas is not None:
        stepwise.g = <const char*>&gammas[0, 0]
        stepwise.g_row, stepwise.g_step = gammas.strides[0], gammas.strides[1]
    if dones is not None:
        stepwise.d = <const char*>&dones[0, 0]
        stepwise.d_row, stepwise.d_step = dones.strides[0], dones.strides[1]
    _run(x, out, &stepwise, right)


def n_step_fold(const real[:, :] rewards, const unsigned char[:, :] dones, double gamma,
                Py_ssize_t n, real[:, :] returns, real[:, :] discounts, int64_t[:, :] steps):
    """Fold up to ``n`` rewards forward from every step, stopping after a done.

    ``steps[r, t]`` is the number ``m`` of rewards folded, ``discounts`` is
    ``gamma ** m`` and ``returns`` is ``sum_{k<m} gamma**k rewards[r, t+k]``.
    """
    cdef Py_ssize_t R = rewards.shape[0], T = rewards.shape[1], r, t, k, m, left
    cdef bint has_d = dones is not None
    cdef double acc
    cdef double* powers = <double*>malloc((n + 1) * sizeof(double))
    if powers == NULL:
        raise MemoryError()
    with nogil:
        powers[0] = 1.0
        for k in range(1, n + 1):
            powers[k] = powers[k - 1] * gamma
        for r in range(R):
            left = 0
            for t in range(T - 1, -1, -1):
                # left: steps from t to the end of its episode (or of the array)
                left = 1 if has_d and dones[r, t] else left + 1
                m = n if left > n else left
                acc = 0.0
                for k in range(m):
                    acc = acc + powers[k] * rewards[r, t + k]
                returns[r, t] = <real>acc
                discounts[r, t] = <real>powers[m]
                steps[r, t] = m
    free(powers)
