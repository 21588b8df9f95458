# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compressed observations: frames stored once, stacks and next observations rebuilt.

A compressed key stores one frame per slot: the whole observation, or for a
stacked key (``stack_compress``, last axis = stack) only its newest frame.
Per slot, ``depth`` counts the earlier frames of the same episode (at most
``stack - 1``) and ``nxt`` names the slot whose frame is the row's next
observation (``next_of``).  A stack is rebuilt from the slot and the
``depth`` slots before it in its lane, repeating the episode's first frame
where the episode is younger than the stack -- the usual rule.

Slots of a lane are written in order, so every frame a row reads lies in a
short window of its lane: :meth:`Frames.read_set` lists them (the sampler
checks their generations), :meth:`Frames.reads` tells which rows an
overwrite breaks.

:class:`Frames` is the read side; :class:`FrameCopier` the write side, one per
writer: a planned batch's items (frame_planner.pyx) written into their slots.
"""
from libc.stdint cimport int64_t, uint32_t, uint8_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

cdef extern from *:
    """
    /* Frames f0..f3 interleaved byte by byte into out and f1..f4 into next_out, `width` bytes of
       each frame at a time from e on, while a whole vector of them is left; e ends past them. */
    #define MPR_PAIR_LOOP(width, vec, load, interleave)                                         \\
        for (; e + width <= n; e += width) {                                                  \\
            vec a = load((const vec*)(f0 + e)), b = load((const vec*)(f1 + e));               \\
            vec c = load((const vec*)(f2 + e)), d = load((const vec*)(f3 + e));               \\
            vec f = load((const vec*)(f4 + e));                                               \\
            interleave(a, b, c, d, out + 4 * e);                                              \\
            interleave(b, c, d, f, next_out + 4 * e);                                         \\
        }
    #ifdef __SSE2__
    #include <emmintrin.h>
    /* Four vectors of 16 bytes interleaved byte by byte into 64 bytes at out. */
    static inline void mpr_interleave16(__m128i a, __m128i b, __m128i c, __m128i d, uint8_t* out) {
        __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
        __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
        _mm_storeu_si128((__m128i*)out, _mm_unpacklo_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i*)(out + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i*)(out + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
        _mm_storeu_si128((__m128i*)(out + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
    #endif
    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <immintrin.h>
    /* As mpr_interleave16, 32 bytes of each frame: the unpacks work within 16-byte lanes, so
       the lanes' results are put back in order before the stores. */
    __attribute__((target("avx2")))
    static inline void mpr_interleave32(__m256i a, __m256i b, __m256i c, __m256i d, uint8_t* out) {
        __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
        __m256i cd_lo = _mm256_unpacklo_epi8(c, d), cd_hi = _mm256_unpackhi_epi8(c, d);
        __m256i q0 = _mm256_unpacklo_epi16(ab_lo, cd_lo), q1 = _mm256_unpackhi_epi16(ab_lo, cd_lo);
        __m256i q2 = _mm256_unpacklo_epi16(ab_hi, cd_hi), q3 = _mm256_unpackhi_epi16(ab_hi, cd_hi);
        /* q0..q3 hold bytes 0-3, 4-7, 8-11, 12-15 of the frames' lower lanes in their lower
           lanes, and bytes 16-19, ... of their upper lanes in their upper lanes. */
        _mm256_storeu_si256((__m256i*)out, _mm256_permute2x128_si256(q0, q1, 0x20));
        _mm256_storeu_si256((__m256i*)(out + 32), _mm256_permute2x128_si256(q2, q3, 0x20));
        _mm256_storeu_si256((__m256i*)(out + 64), _mm256_permute2x128_si256(q0, q1, 0x31));
        _mm256_storeu_si256((__m256i*)(out + 96), _mm256_permute2x128_si256(q2, q3, 0x31));
    }
    __attribute__((target("avx2")))
    static Py_ssize_t mpr_interleave_pair32(const uint8_t* f0, const uint8_t* f1, const uint8_t* f2, const uint8_t* f3,
                                            const uint8_t* f4, uint8_t* out, uint8_t* next_out, Py_ssize_t n) {
        Py_ssize_t e = 0;
        MPR_PAIR_LOOP(32, __m256i, _mm256_loadu_si256, mpr_interleave32)
        return e;
    }
    static int mpr_frames_avx2 = -1;
    #define MPR_FRAMES_AVX2 (mpr_frames_avx2 < 0 ? (mpr_frames_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0) : mpr_frames_avx2)
    #endif
    /* Whether the pair rebuild takes 32 bytes of a frame at a time; `set` 0 or 1 (tests of
       either path) changes that where the CPU allows, -1 only asks.  Returns the old setting. */
    static int mpr_frames_wide(int set) {
    #ifdef MPR_FRAMES_AVX2
        int was = MPR_FRAMES_AVX2;
        if (set == 0 || (set == 1 && __builtin_cpu_supports("avx2")))
            mpr_frames_avx2 = set;
        return was;
    #else
        return 0;
    #endif
    }
    /* Frames f0..f3 of n bytes interleaved byte by byte into out, and f1..f4 into next_out:
       a stack and the next one, each frame read once; 32 bytes of each frame at a time on a CPU
       with AVX2, 16 with SSE2 (every x86-64), then one. */
    static void mpr_interleave_pair(const uint8_t* f0, const uint8_t* f1, const uint8_t* f2, const uint8_t* f3,
                                    const uint8_t* f4, uint8_t* out, uint8_t* next_out, Py_ssize_t n) {
        Py_ssize_t e = 0;
    #ifdef MPR_FRAMES_AVX2
        if (MPR_FRAMES_AVX2)
            e = mpr_interleave_pair32(f0, f1, f2, f3, f4, out, next_out, n);
    #endif
    #ifdef __SSE2__
        MPR_PAIR_LOOP(16, __m128i, _mm_loadu_si128, mpr_interleave16)
    #endif
        for (; e < n; e++) {
            out[4 * e] = f0[e]; out[4 * e + 1] = f1[e]; out[4 * e + 2] = f2[e]; out[4 * e + 3] = f3[e];
            next_out[4 * e] = f1[e]; next_out[4 * e + 1] = f2[e]; next_out[4 * e + 2] = f3[e]; next_out[4 * e + 3] = f4[e];
        }
    }
    """
    void mpr_interleave_pair(const uint8_t* f0, const uint8_t* f1, const uint8_t* f2, const uint8_t* f3,
                             const uint8_t* f4, uint8_t* out, uint8_t* next_out, Py_ssize_t n) noexcept nogil
    int mpr_frames_wide(int set) noexcept nogil

cimport numpy as cnp

from mpreplay._ext.frame_planner cimport FramePlan, FramePlanner, Observation
from mpreplay._ext.schema cimport LANE_END, LANE_LEN, LANE_START

import numpy as np

cnp.import_array()


def wide_interleave(on=None):
    """Whether a stack of four uint8 frames and the next one are rebuilt 32 bytes of a frame at a
    time (AVX2, where the CPU has it) rather than 16 (SSE2).  ``on`` changes that for this process
    where the CPU allows (the tests run both paths); returns the setting before."""
    return bool(mpr_frames_wide(-1 if on is None else 1 if on else 0))


cdef class Frames:
    """Frame stores of the compressed keys of one buffer.

    Parameters
    ----------
    nxt, depth : per-slot metadata (int64, uint8)
    lanes : int64 array (nlanes, LANE_LEN): the lanes of schema.pxd
    stores : list of ``(frames, stack, has_next)``: ``frames`` is ``(size,) + frame_shape``,
        ``stack`` the frames per observation (1: not stacked), ``has_next`` whether the key's
        next observation is rebuilt too
    max_next : largest distance from a row to the slot of its next frame
    """

    def __cinit__(self):
        self._frames = NULL
        self._frame_bytes = NULL
        self._elem_bytes = NULL
        self._stack = NULL
        self._has_next = NULL

    def __init__(self, int64_t[::1] nxt not None, uint8_t[::1] depth not None,
                 int64_t[:, ::1] lanes not None, list stores not None, Py_ssize_t max_next):
        cdef Py_ssize_t i, n = len(stores)
        self.size = nxt.shape[0]
        self._nkeys = n
        self._nxt = &nxt[0]
        self._depth = &depth[0]
        self._lanes = &lanes[0, 0]
        self._nlanes = lanes.shape[0]
        self._frames = <uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self._frame_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._elem_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._stack = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._has_next = <bint*>malloc(n * sizeof(bint) + 1)
        if not (self._frames and self._frame_bytes and self._elem_bytes and self._stack and self._has_next):
            raise MemoryError()
        if not 0 <= max_next <= MAX_NEXT_OFFSET:
            raise ValueError(f"max_next: expected 0 <= max_next <= {MAX_NEXT_OFFSET}")
        self.max_next = max_next
        self.max_stack = 1
        for i, (frames, stack, has_next) in enumerate(stores):
            if not (frames.flags.c_contiguous and frames.shape[0] == self.size and 1 <= stack <= MAX_STACK):
                raise ValueError("frames: expected C-contiguous (size, ...) arrays and 1 <= stack <= 64")
            self._frames[i] = <uint8_t*>cnp.PyArray_DATA(frames)
            self._frame_bytes[i] = frames[0].nbytes
            self._elem_bytes[i] = frames.dtype.itemsize
            self._stack[i] = stack
            self._has_next[i] = has_next
            self.max_stack = max(self.max_stack, stack)
        self._keep = (nxt, depth, lanes, stores)

    def __dealloc__(self):
        free(self._frames)
        free(self._frame_bytes)
        free(self._elem_bytes)
        free(self._stack)
        free(self._has_next)

    cdef void _bounds(self, Py_ssize_t u, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
        cdef Py_ssize_t l
        for l in range(self._nlanes):
            if self._lanes[LANE_LEN * l + LANE_START] <= u < self._lanes[LANE_LEN * l + LANE_END]:
                lo[0] = self._lanes[LANE_LEN * l + LANE_START]
                hi[0] = self._lanes[LANE_LEN * l + LANE_END]
                return
        lo[0], hi[0] = 0, self.size

    cdef Py_ssize_t _back(self, Py_ssize_t u, Py_ssize_t b) noexcept nogil:
        # The slot b places before u in u's lane (lanes are rings).
        cdef Py_ssize_t lo, hi
        self._bounds(u, &lo, &hi)
        return lo + ((u - lo - b) % (hi - lo) + (hi - lo)) % (hi - lo)

    cdef void _sources(self, Py_ssize_t key, Py_ssize_t u, uint8_t** src) noexcept nogil:
        # The frames of the stack at slot u, oldest first (a stack of more than 1).
        cdef Py_ssize_t k = self._stack[key], fb = self._frame_bytes[key], d = self._depth[u], i, b
        for i in range(k):
            b = k - 1 - i
            if b > d:
                b = d  # older than the episode: repeat its first frame
            src[i] = self._frames[key] + self._back(u, b) * fb

    cdef void rebuild(self, Py_ssize_t key, Py_ssize_t u, uint8_t* out) noexcept nogil:
        """Write the observation of key ``key`` at slot ``u`` to ``out``."""
        cdef Py_ssize_t k = self._stack[key], fb = self._frame_bytes[key], eb = self._elem_bytes[key]
        cdef Py_ssize_t i, e, n = fb // eb
        cdef uint8_t* src[MAX_STACK]
        if k == 1:
            memcpy(out, self._frames[key] + u * fb, fb)
            return
        self._sources(key, u, src)
        if eb == 1 and k == 4:
            # The common pixel case: four uint8 frames interleave byte by byte.  Written as
            # plain byte stores with a constant stride, the compiler turns the loop into
            # byte/word unpacks, cheaper than widening every byte to 32 bits and or-ing.
            for e in range(n):
                out[4 * e] = src[0][e]
                out[4 * e + 1] = src[1][e]
                out[4 * e + 2] = src[2][e]
                out[4 * e + 3] = src[3][e]
        elif eb == 1:
            for e in range(n):
                for i in range(k):
                    out[e * k + i] = src[i][e]
        else:
            for e in range(n):
                for i in range(k):
                    memcpy(out + (e * k + i) * eb, src[i] + e * eb, eb)

    cdef void rebuild_pair(self, Py_ssize_t key, Py_ssize_t u, uint8_t* out, uint8_t* next_out) noexcept nogil:
        """rebuild() of key ``key`` at slot ``u`` into ``out`` and at its next slot into ``next_out``.

        Where the next stack is this one shifted by a frame (four uint8 frames, the pixel case),
        both are written in one pass that reads each of the five frames once."""
        cdef Py_ssize_t v = self._nxt[u]
        cdef uint8_t* src[MAX_STACK]
        cdef uint8_t* nsrc[MAX_STACK]
        if self._stack[key] == 4 and self._elem_bytes[key] == 1:
            self._sources(key, u, src)
            self._sources(key, v, nsrc)
            if nsrc[0] == src[1] and nsrc[1] == src[2] and nsrc[2] == src[3]:
                mpr_interleave_pair(src[0], src[1], src[2], src[3], nsrc[3], out, next_out, self._frame_bytes[key])
                return
        self.rebuild(key, u, out)
        self.rebuild(key, v, next_out)

    cdef Py_ssize_t read_set(self, Py_ssize_t u, int64_t* out) noexcept nogil:
        """Slots whose frames the row at ``u`` reads (at most 2 * max_stack); returns the count."""
        cdef Py_ssize_t j, c = 0, d = self._depth[u], nx = self._nxt[u]
        if d > self.max_stack - 1:
            d = self.max_stack - 1
        for j in range(d + 1):
            out[c] = self._back(u, j)
            c += 1
        if nx >= 0:
            d = self._depth[nx]
            if d > self.max_stack - 1:
                d = self.max_stack - 1
            for j in range(d + 1):
                out[c] = self._back(nx, j)
                c += 1
        return c

    cdef bint reads(self, Py_ssize_t r, Py_ssize_t s) noexcept nogil:
        """Whether the row at ``r`` reads the frame at ``s``."""
        cdef int64_t slots[2 * MAX_STACK]
        cdef Py_ssize_t j, c = self.read_set(r, slots)
        for j in range(c):
            if slots[j] == s:
                return True
        return False

    def rebuild_into(self, Py_ssize_t key, const int64_t[::1] slots not None, cnp.ndarray out not None):
        """Rebuild the observations of ``slots`` into ``out`` (one row per slot)."""
        cdef Py_ssize_t j, rb = out.nbytes // max(1, slots.shape[0])
        cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(out)
        if not out.flags.c_contiguous or out.shape[0] != slots.shape[0]:
            raise ValueError("out: expected a C-contiguous array with one row per slot")
        with nogil:
            for j in range(slots.shape[0]):
                self.rebuild(key, slots[j], dst + j * rb)


cdef const uint8_t* array_bytes(object array, Py_ssize_t nbytes, object what, str prefix="") except? NULL:
    """The bytes of ``array``, a C-contiguous ndarray of ``nbytes`` bytes (``prefix + what`` names it)."""
    if not isinstance(array, cnp.ndarray) or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>array) \
            or cnp.PyArray_NBYTES(<cnp.ndarray>array) != nbytes:
        raise ValueError(f"{prefix}{what}: expected a C-contiguous array of {nbytes} bytes")
    return <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>array)


cdef uint8_t* _slot_rows(object array, Py_ssize_t size, Py_ssize_t* pitch) except NULL:
    """The bytes of ``array``, a writable array of ``size`` rows each C-contiguous (alone, or side
    by side with other fields: schema.row_layout), and in ``pitch`` the bytes from a row to the next."""
    if not (isinstance(array, cnp.ndarray) and cnp.PyArray_NDIM(<cnp.ndarray>array) >= 1
            and cnp.PyArray_DIM(<cnp.ndarray>array, 0) == size and array[:1].flags.c_contiguous
            and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>array)):
        raise ValueError(f"stored: expected a writable array of {size} rows, each C-contiguous")
    pitch[0] = cnp.PyArray_STRIDE(<cnp.ndarray>array, 0)
    return <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>array)


cdef class FrameCopier:
    """The write side of one buffer's frame stores, for one writer's planner: the items of its
    plans (:class:`~mpreplay._ext.frame_planner.FramePlan`) written into their slots.

    Parameters
    ----------
    planner : the writer's FramePlanner
    frames : per key, its store ``(size,) + frame`` in the buffer
    nxt, depth : the buffer's per-slot next-frame slots (int64) and depths (uint8)
    """

    def __cinit__(self):
        self.frames = NULL
        self.nxt = NULL
        self.depth = NULL

    def __init__(self, FramePlanner planner not None, list frames not None, object nxt, object depth):
        cdef Py_ssize_t q, nk = planner.nkeys
        if len(frames) != nk:
            raise ValueError("frames: expected one per key")
        self.planner = planner
        self.size = cnp.PyArray_SIZE(depth) if isinstance(depth, cnp.ndarray) else 0
        self.nxt = <int64_t*>array_bytes(nxt, self.size * 8, "nxt")
        self.depth = <uint8_t*>array_bytes(depth, self.size, "depth")
        self.frames = <uint8_t**>calloc(nk + 1, sizeof(uint8_t*))
        if not self.frames:
            raise MemoryError()
        for q in range(nk):
            self.frames[q] = <uint8_t*>array_bytes(frames[q], self.size * (planner.row_bytes[q] // planner.stack[q]),
                                                   planner.names[q], "frames of ")
        self._keep = (frames, nxt, depth)

    def __dealloc__(self):
        free(self.frames)

    def copy(self, FramePlan p not None, object slots, list stored not None, list rows not None):
        """Write the planned items into ``slots`` (int64, one per item): their frames, next-frame
        slots (-1: none yet) and depths, and the rows' values ``rows`` (each ``(k, ...)``,
        C-contiguous) into the plain per-slot arrays ``stored`` (each ``(size, ...)``)."""
        cdef Py_ssize_t j, f, rb, nf = len(stored)
        cdef const int64_t* slot
        if p.planner is not self.planner or len(rows) != nf:
            raise ValueError("copy: expected a plan of this episode's planner and one value per stored array")
        slot = <const int64_t*>array_bytes(slots, p.items * 8, "slots")
        for j in range(p.items):
            if not 0 <= slot[j] < self.size:
                raise ValueError(f"slots: {slot[j]} is outside the {self.size} slots")
        cdef const uint8_t** sources = <const uint8_t**>malloc(nf * sizeof(uint8_t*) + 1)
        cdef uint8_t** targets = <uint8_t**>malloc(nf * sizeof(uint8_t*) + 1)
        cdef Py_ssize_t* pitches = <Py_ssize_t*>malloc(nf * sizeof(Py_ssize_t) + 1)
        try:
            if not (sources and targets and pitches):
                raise MemoryError()
            for f in range(nf):
                targets[f] = _slot_rows(stored[f], self.size, &pitches[f])
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // self.size
                sources[f] = array_bytes(rows[f], p.rows * rb, "rows")
            with nogil:
                self.write_frames(p, slot)
            for f in range(nf):
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // self.size
                with nogil:
                    for j in range(p.items):
                        if p.item_row[j] >= 0:
                            memcpy(targets[f] + slot[j] * pitches[f], sources[f] + p.item_row[j] * rb, rb)
        finally:
            free(sources)
            free(targets)
            free(pitches)

    cdef void write_frames(self, FramePlan p, const int64_t* slot) noexcept nogil:
        # Each item's frame into its slot, with its depth and no next frame yet: a row's newest
        # frame, an episode's last next frame, or a frame a resumed row's stack holds.
        cdef Py_ssize_t q, j, e, n, s, eb, fb, at
        cdef int64_t row
        cdef Observation src
        cdef uint8_t* dst
        for j in range(p.items):
            self.depth[slot[j]] = p.item_depth[j]
            self.nxt[slot[j]] = -1
        for q in range(self.planner.nkeys):
            s, eb = self.planner.stack[q], self.planner.elem_bytes[q]
            fb = self.planner.row_bytes[q] // s
            n = fb // eb
            for j in range(p.items):
                row, at = p.item_row[j], s - 1
                if row >= 0:
                    src = self.planner.row(q, p.obs[q], row)
                else:
                    # A frame item_back steps before an observation's newest (a key of a
                    # shorter stack never reads it: any of its frames will do).
                    at = max(0, s - 1 - p.item_back[j])
                    if p.item_source[j] < 0:
                        src = p.obs[q]
                    elif self.planner.has_next[q]:
                        src = p.next_of(p.item_source[j], q)
                    else:
                        continue
                dst = self.frames[q] + slot[j] * fb
                if s == 1 or src.planar:
                    memcpy(dst, src.data + at * fb, fb)
                elif eb == 1 and s == 4 and at == 3:
                    # The common pixel case: a constant stride the compiler turns into shuffles.
                    for e in range(n):
                        dst[e] = src.data[4 * e + 3]
                elif eb == 1:
                    for e in range(n):
                        dst[e] = src.data[e * s + at]
                else:
                    for e in range(n):
                        memcpy(dst + e * eb, src.data + (e * s + at) * eb, eb)
