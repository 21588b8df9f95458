# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Gathering a sample: the drawn rows copied into its outputs, without the lock.

Fields are copied row by row; compressed observations are rebuilt from their frames (a
stack and the next one in one pass); a sequence table copies the steps of each sequence,
padding with zeros.  The draw path (ext/draws.pyx) then checks that nothing it read moved
meanwhile.  See docs/architecture.md, "Data path".
"""
from libc.string cimport memcpy, memset


cdef void _gather(TableParts t, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
    # Copy rows (all k, or only rows[0..k) of the batch) without the lock.  Values of
    # 4, 8 and 16 bytes (scalars, small vectors: the common fields) are copied
    # with a constant size, which compiles to plain loads and stores.
    cdef Py_ssize_t i, j, r, rb, pitch
    cdef const uint8_t* src
    cdef uint8_t* dst
    for i in range(t.nfields):
        rb, pitch, src, dst = t.rowbytes[i], t.pitch[i], t.rows[i], d.dst[i]
        for j in range(k):
            r = rows[j] if rows != NULL else j
            if rb == 4:
                memcpy(dst + r * 4, src + d.sp[r] * pitch, 4)
            elif rb == 8:
                memcpy(dst + r * 8, src + d.sp[r] * pitch, 8)
            elif rb == 16:
                memcpy(dst + r * 16, src + d.sp[r] * pitch, 16)
            else:
                memcpy(dst + r * rb, src + d.sp[r] * pitch, rb)


cdef void _gather_frames(TableParts t, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
    # Rebuild the compressed observations of rows (all k, or rows[0..k)) without the lock.
    # Row by row, every output of the row together: obs and next_obs share all frames but
    # one, so the second rebuild reads them from cache instead of memory.
    cdef Py_ssize_t o, p, j, r, u, nf = t.nfields, n = t.outputs.n - t.nfields
    cdef Py_ssize_t* step_bytes = t.outputs.step_bytes
    for j in range(k):
        r = rows[j] if rows != NULL else j
        for o in range(n):
            p = t.outputs.frame_partner[o]
            if p >= 0:  # a stack and the next one, in one pass over their frames
                t.frames.rebuild_pair(t.outputs.frame_keys[o], d.sp[r], d.dst[nf + o] + r * step_bytes[nf + o],
                                      d.dst[nf + p] + r * step_bytes[nf + p])
            elif p == -1:
                u = t.frames.next_slot(d.sp[r]) if t.outputs.frame_next[o] else d.sp[r]
                t.frames.rebuild(t.outputs.frame_keys[o], u, d.dst[nf + o] + r * step_bytes[nf + o])


cdef void _gather_sequences(TableParts t, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
    # Copy the steps of sequences (all k, or rows[0..k)) without the lock, step
    # by step every output together; padding steps become zeros, the mask says so.
    cdef Py_ssize_t L = t.length, nf = t.nfields, no = t.outputs.n - t.nfields - 1
    cdef Py_ssize_t i, o, j, r, s, n, u, at, rb
    cdef Py_ssize_t n_out = nf + no
    cdef Py_ssize_t* step_bytes = t.outputs.step_bytes
    cdef uint8_t* mask = d.dst[n_out]
    for j in range(k):
        r = rows[j] if rows != NULL else j
        n = d.stp[r]
        t.sequences.window(d.sp[r], n, d.window)
        for s in range(L):
            at = r * L + s
            mask[at] = s < n
            if s >= n:
                for i in range(n_out):
                    memset(d.dst[i] + at * step_bytes[i], 0, step_bytes[i])
                continue
            u = d.window[s]
            for i in range(nf):
                rb = step_bytes[i]
                memcpy(d.dst[i] + at * rb, t.rows[i] + u * t.pitch[i], rb)
            for o in range(no):
                t.frames.rebuild(t.outputs.frame_keys[o], t.frames.next_slot(u) if t.outputs.frame_next[o] else u,
                                 d.dst[nf + o] + at * step_bytes[nf + o])


cdef void copy_rows(TableParts t, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
    # Copy what rows (all k, or rows[0..k)) of a sample read into its outputs.
    if t.sequences is not None:
        _gather_sequences(t, d, k, rows)
        return
    _gather(t, d, k, rows)
    if t.frames is not None:
        _gather_frames(t, d, k, rows)
