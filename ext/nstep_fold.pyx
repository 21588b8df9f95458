# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The n-step fold of a vector of environments: a step written, folded and emitted in one call.

:class:`~mpreplay.nstep.NstepBuffer` keeps its state in rings (see there): per field, an array
``(num_envs, n) + shape`` whose column ``c`` holds the step of the add numbered ``c`` modulo
``n``, and per reward field a float64 accumulator of the same layout holding the running folded
reward of each column.  :meth:`FoldKernel.step` writes one converted step of every environment
into the newest column, folds its rewards into a new accumulator (the old one stays valid, so a
previewed step can be dropped), and gathers the rows the step completes -- ordered by
environment, then by time -- into new arrays, each field in one pass over the rows.
"""
from libc.stdint cimport int64_t, uint16_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from cpython.ref cimport Py_REFCNT

cimport numpy as cnp

import numpy as np

cnp.import_array()


cdef inline bint _nonzero(const char* p, char kind, int size) noexcept nogil:
    """Whether the scalar at ``p`` compares unequal to 0, as numpy's ``!= 0`` does (NaN does, -0 not)."""
    cdef int i
    if kind == b'c':
        return _nonzero(p, b'f', size // 2) or _nonzero(p + size // 2, b'f', size // 2)
    if kind == b'f':
        if size == 4:
            return (<const float*>p)[0] != 0
        if size == 8:
            return (<const double*>p)[0] != 0
        if size == sizeof(long double):
            return (<const long double*>p)[0] != 0
        if size == 2:  # a half: any bit but the sign's
            return ((<const uint16_t*>p)[0] & 0x7fff) != 0
    for i in range(size):
        if p[i]:
            return True
    return False


cdef inline Py_ssize_t _mod(Py_ssize_t a, Py_ssize_t n) noexcept nogil:
    a %= n
    return a + n if a < 0 else a


cdef inline void _put(char* dst, double value, Py_ssize_t size) noexcept nogil:
    if size == 4:
        (<float*>dst)[0] = <float>value
    else:
        (<double*>dst)[0] = value


cdef bint _native_float(object dtype):
    return dtype.kind == "f" and dtype.itemsize in (4, 8) and dtype.isnative


cdef class RowArena:
    """New arrays for rows handed out, made in memory that the rows handed out before let go of.

    A new array of a few hundred KB is new memory to the C library each time (it gives the top of
    its heap back when freed), and every 4 KB page of it costs a page fault on its first write:
    several times what copying the page costs.  The arena keeps the blocks of the large arrays it
    made (at most ``_ARENA_BLOCKS`` of them, ``_ARENA_BYTES`` together) and makes a new array in
    a block that nobody else holds any more -- no array, view or tensor over it, as ``sample``'s
    spare batches -- so a row handed out is never written again while anyone can read it.
    """

    def __init__(self):
        self.blocks = []
        self.kept = 0

    cpdef object empty(self, tuple shape, object dtype):
        """An uninitialized C-ordered array (numpy's own below ``_ARENA_MIN`` bytes)."""
        cdef Py_ssize_t i, nbytes = np.dtype(dtype).itemsize
        cdef cnp.ndarray block
        for i in range(len(shape)):
            nbytes *= <Py_ssize_t>shape[i]
        if nbytes < _ARENA_MIN:
            return np.empty(shape, dtype)
        for i in range(len(self.blocks)):
            block = <cnp.ndarray>self.blocks[i]
            # Held by the list and by `block` alone: free.  At most twice the size asked for, so
            # that a large block is not spent on a small array.
            if Py_REFCNT(block) == 2 and nbytes <= cnp.PyArray_NBYTES(block) <= 2 * nbytes:
                return block[:nbytes].view(dtype).reshape(shape)
        block = np.empty(nbytes, np.uint8)
        if len(self.blocks) < _ARENA_BLOCKS and self.kept + nbytes <= _ARENA_BYTES:
            self.blocks.append(block)
            self.kept += nbytes
        return block.view(dtype).reshape(shape)


cdef class FoldKernel:
    """The folding of one :class:`~mpreplay.nstep.NstepBuffer`: its output fields, where each is
    taken from, and the powers of gamma.

    Parameters
    ----------
    n, gamma, num_envs : the folder's
    specs : per output field in order, its ``(shape, dtype)``
    sources : per output field, its :class:`Source` (as an int)
    done, truncated : the names of the flag fields (truncated None without one)
    """

    def __cinit__(self, Py_ssize_t n, double gamma, Py_ssize_t num_envs, dict specs, dict sources,
                  str done, object truncated):
        cdef Py_ssize_t i, k
        cdef Field* f
        self.powers = <double*>malloc((n + 1) * sizeof(double))
        self.fields = <Field*>malloc(max(len(specs), 1) * sizeof(Field))
        if self.powers == NULL or self.fields == NULL:
            raise MemoryError()
        self.n, self.num_envs, self.nfields = n, num_envs, len(specs)
        # C's pow, as Python's gamma ** k: the folded sums and discounts are those of the folder
        # once written in numpy, to the last bit.
        for k in range(n + 1):
            self.powers[k] = float(gamma ** k)
        self.names, self.shapes, self.dtypes, self.rews, self.rings = [], [], [], [], []
        for i, (name, (shape, dtype)) in enumerate(specs.items()):
            f = &self.fields[i]
            f.source = <Source>sources[name]
            dtype = np.dtype(dtype)
            f.kind, f.itemsize = ord(dtype.kind), dtype.itemsize
            f.nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if f.source == FOLDED:
                f.nbytes = f.nbytes // dtype.itemsize  # doubles of the accumulator
                self.rews.append(name)
            elif f.source != DISCOUNT:
                self.rings.append(name)
            self.names.append(name)
            self.shapes.append(tuple(shape))
            self.dtypes.append(dtype)
            if name == done:
                self.done_field = f[0]
            if name == truncated:
                self.truncated_field = f[0]
        self.done, self.truncated = done, truncated
        self.arena = RowArena()

    def __dealloc__(self):
        free(self.powers)
        free(self.fields)

    def step(self, dict rings, dict held, dict rows, Py_ssize_t cur, cnp.ndarray pending):
        """Fold ``rows`` (one converted step per environment: ``(num_envs,) + shape`` in each
        field's dtype) into the state ``rings``, ``held`` (accumulators), ``cur``, ``pending``.

        Writes the step into column ``cur + 1`` of ``rings`` (it holds no pending step) and
        returns ``(out, accs, new_cur, new_pending)``: the rows the step completes, the new
        accumulators (``held`` unchanged) and the state's cursor and pending counts after it."""
        cdef Py_ssize_t n = self.n, E = self.num_envs, c = (cur + 1) % n, e, q, k, W, B, row, total = 0
        cdef char* dst
        cdef const char* src
        cdef const double* h
        cdef const double* r
        cdef double* a
        cdef double w
        cdef cnp.ndarray ring, step, acc, rew
        cdef const int64_t[::1] before = pending
        cdef int64_t[::1] after
        cdef int64_t count
        cdef int64_t* emit
        cdef bint ends
        for name in self.rings:
            ring, step = <cnp.ndarray>rings[name], <cnp.ndarray>rows[name]
            B = cnp.PyArray_NBYTES(ring) // (E * n)
            if cnp.PyArray_IS_C_CONTIGUOUS(step):
                dst, src = <char*>cnp.PyArray_DATA(ring), <const char*>cnp.PyArray_DATA(step)
                with nogil:
                    for e in range(E):
                        memcpy(dst + (e * n + c) * B, src + e * B, B)
            else:  # a converted step of other strides: numpy walks them
                ring[:, c] = step
        accs = {}
        for name in self.rews:
            acc = <cnp.ndarray>held[name]
            rew = <cnp.ndarray>cnp.PyArray_FROMANY(rows[name], cnp.NPY_DOUBLE, 0, 0, cnp.NPY_ARRAY_C_CONTIGUOUS)
            W = cnp.PyArray_SIZE(rew) // E
            new = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(acc), cnp.PyArray_DIMS(acc), cnp.NPY_DOUBLE, 0)
            h, r = <const double*>cnp.PyArray_DATA(acc), <const double*>cnp.PyArray_DATA(rew)
            a = <double*>cnp.PyArray_DATA(<cnp.ndarray>new)
            with nogil:
                for e in range(E):
                    for q in range(n):
                        # gamma ** (the age of column q once column c holds the newest step)
                        w = self.powers[_mod(c - q, n)]
                        row = (e * n + q) * W
                        for k in range(W):
                            a[row + k] = (0.0 if q == c else h[row + k]) + w * r[e * W + k]
            accs[name] = new
        new_pending = np.empty(E, np.int64)
        after = new_pending
        emit = <int64_t*>malloc(E * sizeof(int64_t))
        if emit == NULL:
            raise MemoryError()
        done = rings[self.done]
        truncated = None if self.truncated is None else rings[self.truncated]
        try:
            for e in range(E):
                ends = self._flag(self.done_field, done, e, c)
                if truncated is not None and not ends:
                    ends = self._flag(self.truncated_field, truncated, e, c)
                count = before[e] + 1
                emit[e] = count if ends else (count == n)
                after[e] = 0 if ends else min(count, n - 1)
                total += emit[e]
            return self._flush(rings, accs, c, emit, &before[0], 1, total, False), accs, c, new_pending
        finally:
            free(emit)

    cdef bint _flag(self, Field f, cnp.ndarray ring, Py_ssize_t e, Py_ssize_t c):
        return _nonzero(<const char*>cnp.PyArray_DATA(ring) + (e * self.n + c) * f.nbytes, f.kind, f.itemsize)

    def flush(self, dict rings, dict accs, Py_ssize_t cur, const int64_t[::1] emit, const int64_t[::1] count,
              bint truncate):
        """The ``emit[e]`` oldest of the ``count[e]`` steps of each environment ``e`` pending up to
        column ``cur``, folded up to it (``truncate``: flagged truncated, as an episode end's)."""
        cdef Py_ssize_t e, total = 0
        for e in range(self.num_envs):
            total += emit[e]
        return self._flush(rings, accs, cur, &emit[0], &count[0], 0, total, truncate)

    cdef dict _flush(self, dict rings, dict accs, Py_ssize_t cur, const int64_t* emit, const int64_t* count,
                     int64_t counted, Py_ssize_t total, bint truncate):
        """``count[e] + counted`` steps of environment ``e`` pending: the rows of its ``emit[e]`` oldest."""
        cdef Py_ssize_t e, j, row = 0, pending
        cdef int64_t* at = <int64_t*>malloc(3 * max(total, 1) * sizeof(int64_t))
        if at == NULL:
            raise MemoryError()
        try:
            with nogil:
                for e in range(self.num_envs):
                    pending = count[e] + counted
                    for j in range(emit[e]):
                        at[row] = e
                        at[total + row] = _mod(cur - pending + 1 + j, self.n)
                        at[2 * total + row] = pending - j  # m: the steps folded
                        row += 1
            return self._gather(rings, accs, cur, at, at + total, at + 2 * total, total, truncate)
        finally:
            free(at)

    cdef dict _gather(self, dict rings, dict accs, Py_ssize_t cur, const int64_t* envs,
                      const int64_t* cols, const int64_t* m, Py_ssize_t total, bint truncate):
        """Each output field's ``total`` rows starting at ``(envs, cols)`` and folded over ``m`` steps,
        in new arrays."""
        cdef Py_ssize_t i, row, k, n = self.n, B, col
        cdef Field f
        cdef char* dst
        cdef const char* src
        cdef const double* acc
        cdef dict out = {}
        for i in range(self.nfields):
            f = self.fields[i]
            name, dtype = self.names[i], self.dtypes[i]
            shape = (total,) + self.shapes[i]
            if f.source == FLAG and truncate:
                out[name] = np.ones(shape, dtype)
                continue
            native = f.source in (FOLDED, DISCOUNT) and _native_float(dtype)
            arr = self.arena.empty(shape, dtype if native or f.source not in (FOLDED, DISCOUNT) else np.float64)
            dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>arr)
            B = cnp.PyArray_ITEMSIZE(<cnp.ndarray>arr)
            if f.source == DISCOUNT:
                with nogil:
                    for row in range(total):
                        _put(dst + row * B, self.powers[m[row]], B)
            elif f.source == FOLDED:
                acc = <const double*>cnp.PyArray_DATA(<cnp.ndarray>accs[name])
                with nogil:
                    for row in range(total):
                        for k in range(f.nbytes):
                            _put(dst + (row * f.nbytes + k) * B, acc[(envs[row] * n + cols[row]) * f.nbytes + k], B)
            else:
                src = <const char*>cnp.PyArray_DATA(<cnp.ndarray>rings[name])
                B = f.nbytes
                with nogil:
                    for row in range(total):
                        col = cols[row] if f.source == FIRST_STEP else cur
                        memcpy(dst + row * B, src + (envs[row] * n + col) * B, B)
            out[name] = arr if native or f.source not in (FOLDED, DISCOUNT) else arr.astype(dtype)
        return out


cdef enum:
    _MAX_DIMS = 64  # numpy's limit


cdef inline void _stack_run(char* d, const char* s, Py_ssize_t inner, Py_ssize_t d_in, Py_ssize_t s_in,
                            Py_ssize_t s_depth) noexcept nogil:
    """A run of 4-byte groups: group k gathered from 4 bytes ``s_depth`` apart at ``s + k * s_in``."""
    cdef Py_ssize_t k
    cdef const char* p
    cdef const char* p1 = s + s_depth
    cdef const char* p2 = s + 2 * s_depth
    cdef const char* p3 = s + 3 * s_depth
    cdef char group[4]
    if s_in == 1 and d_in == 4:  # the frames' rows side by side: a loop the compiler vectorizes
        for k in range(inner):
            d[4 * k], d[4 * k + 1], d[4 * k + 2], d[4 * k + 3] = s[k], p1[k], p2[k], p3[k]
        return
    for k in range(inner):
        p = s + k * s_in
        group[0], group[1], group[2], group[3] = p[0], p[s_depth], p[2 * s_depth], p[3 * s_depth]
        memcpy(d + k * d_in, group, 4)


cdef inline void _run(char* d, const char* s, Py_ssize_t inner, Py_ssize_t d_in, Py_ssize_t s_in,
                      Py_ssize_t itemsize) noexcept nogil:
    cdef Py_ssize_t k
    if itemsize == 1:
        for k in range(inner):
            d[k * d_in] = s[k * s_in]
    elif itemsize == 4:  # a constant size: one move, aligned or not
        for k in range(inner):
            memcpy(d + k * d_in, s + k * s_in, 4)
    elif itemsize == 8:
        for k in range(inner):
            memcpy(d + k * d_in, s + k * s_in, 8)
    else:
        for k in range(inner):
            memcpy(d + k * d_in, s + k * s_in, itemsize)


def c_order(cnp.ndarray src, cnp.ndarray out):
    """Copy ``src``, whatever its strides, into ``out``, C-contiguous of its shape and dtype.

    numpy copies a transposed view (an actor's frame stacks, ``(envs, 84, 84, depth)`` over
    ``(envs, depth, 84, 84)``) element by element along its last axis, a few bytes apart in
    memory: 70 times a memcpy's time.  This walks the source in its memory's order instead
    (its axes by decreasing stride), reading runs and writing them strided; bytes stacked 4
    deep (uint8 stacks of 4 frames) are gathered a stack at a time.
    """
    cdef int nd = cnp.PyArray_NDIM(src), i, j, axis
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(src), inner, s_in, d_in, s_depth = 0
    cdef Py_ssize_t dims[_MAX_DIMS]
    cdef Py_ssize_t sstr[_MAX_DIMS]
    cdef Py_ssize_t dstr[_MAX_DIMS]
    cdef Py_ssize_t at[_MAX_DIMS]
    cdef const char* s
    cdef char* d
    cdef const char* s0
    cdef char* d0
    if (<object>out).shape != (<object>src).shape or out.dtype != src.dtype or not cnp.PyArray_IS_C_CONTIGUOUS(out):
        raise ValueError(f"out: expected a C-contiguous {src.dtype} array of shape {(<object>src).shape}")
    if cnp.PyArray_IS_C_CONTIGUOUS(src) or nd == 0 or cnp.PyArray_SIZE(src) == 0 or not src.dtype.isnative:
        np.copyto(out, src)
        return out
    axes = list(range(nd))
    if itemsize == 1 and nd > 1 and src.shape[nd - 1] == 4 and src.strides[nd - 1] != 1:
        s_depth = src.strides[nd - 1]  # the last axis is copied a group at a time
        axes.pop()
    # The other axes in the order of the source's memory, outermost first.
    axes.sort(key=lambda a: -abs(src.strides[a]))
    for i in range(len(axes)):
        axis = axes[i]
        dims[i], sstr[i], dstr[i] = src.shape[axis], src.strides[axis], out.strides[axis]
        at[i] = 0
    nd = len(axes)
    s0, d0 = <const char*>cnp.PyArray_DATA(src), <char*>cnp.PyArray_DATA(out)
    inner, s_in, d_in = dims[nd - 1], sstr[nd - 1], dstr[nd - 1]
    with nogil:
        while True:
            s, d = s0, d0
            for i in range(nd - 1):
                s += at[i] * sstr[i]
                d += at[i] * dstr[i]
            if s_depth:
                _stack_run(d, s, inner, d_in, s_in, s_depth)
            else:
                _run(d, s, inner, d_in, s_in, itemsize)
            # the next run: the odometer over the outer axes
            j = nd - 2
            while j >= 0:
                at[j] += 1
                if at[j] < dims[j]:
                    break
                at[j] = 0
                j -= 1
            if j < 0:
                break
    return out
