# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Planning compressed writes: every stack and next observation checked byte for byte.

A batch of rows of a compressed buffer becomes a list of *items*, one slot
each: a row's own frame, or the lone frame of an episode's last next
observation.  Before anything is written, each row is checked against what
the sampler will rebuild (see frames.pyx), over the raw bytes:

* a stacked observation (last axis = stack) at step t >= 1 of its episode
  must hold, in stack positions 0 .. s-2, positions 1 .. s-1 of the step
  before -- which was itself checked, so this is exactly "the frames it will
  be rebuilt from" -- and at t = 0 its newest frame in every position;
* a next observation (``next_of``) must equal, byte for byte, a later
  observation of the same episode within ``max_next`` items, or the
  episode's last next observation, whose frame then takes an item of its own.

An observation of a stacked key comes in one of two layouts, each read
without a copy: *interleaved* (C order, the stack axis last, as declared) or
*planar* (each frame contiguous, the frames one after another -- what
``np.moveaxis`` makes of a channels-first stack).  Planar stacks compare
frame against frame with memcmp; interleaved ones 8 bytes at a time under a
mask of the older frames' bytes.

The pending rows (waiting for the frame of their next observation) form one
queue across calls: ordinals ``0 .. earlier-1`` are the earlier calls'
pending rows, ordinal ``earlier + i`` row ``i`` of this batch.  The writer's
:class:`Episode` keeps, copied, what outlives a call: those pending rows and
the episode's newest stacks.  One step of exact arrays is planned by the same
code as a batch (``Episode.plan_step``, for ``Ring.add_step``).

A batch may *resume* an episode at step t > 0 none of whose steps the writer
stored (a saved buffer's oldest kept step): its first row's stacks hold every
older frame they read, so those frames take items of their own before it
(never sampled, as a lone next frame), and its depth is t, as when it was first
stored.
"""
from libc.math cimport NAN
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memmove, memset
from cpython.dict cimport PyDict_GetItem
from cpython.ref cimport PyObject

from mpreplay._ext.schema cimport COMPLETE, EMPTY, WAITING

cimport numpy as cnp

import numpy as np

cnp.import_array()


cdef bint _shifted_equal(const uint8_t* a, const uint8_t* b, Py_ssize_t nbytes, Py_ssize_t shift,
                         const uint64_t* masks, Py_ssize_t nmasks) noexcept nogil:
    """Whether a[p] == b[p + shift] for every byte p of ``a`` the masks keep.

    ``masks`` repeat every ``8 * nmasks`` bytes; bytes past ``nbytes - shift`` belong to the
    newest frame of the last element, which the masks never keep.
    """
    cdef Py_ssize_t c = 0, m = 0, end = nbytes - shift, period = 8 * nmasks
    cdef uint64_t x, y, diff = 0, mask = masks[0]
    cdef const uint8_t* mask_bytes = <const uint8_t*>masks
    if nmasks == 1:
        # The usual case (uint8 frames, stack 2, 4 or 8): one mask, a loop the compiler vectorizes.
        while c + 8 <= end:
            memcpy(&x, a + c, 8)
            memcpy(&y, b + c + shift, 8)
            diff |= (x ^ y) & mask
            c += 8
    else:
        while c + 8 <= end:
            memcpy(&x, a + c, 8)
            memcpy(&y, b + c + shift, 8)
            diff |= (x ^ y) & masks[m]
            m += 1
            if m == nmasks:
                m = 0
            c += 8
    while c < end:
        if mask_bytes[c % period] and a[c] != b[c + shift]:
            return False
        c += 1
    return diff == 0


cdef bint _positions_equal(Observation a, Py_ssize_t ja, Observation b, Py_ssize_t jb, Py_ssize_t count,
                           Py_ssize_t frames, Py_ssize_t stack, Py_ssize_t elem_bytes) noexcept nogil:
    """Whether stack positions ja .. ja+count-1 of ``a`` equal positions jb .. of ``b``, byte for byte
    (``frames`` elements of ``elem_bytes`` per frame, ``stack`` frames per observation)."""
    cdef Py_ssize_t e, j, fb = frames * elem_bytes
    if a.planar and b.planar:
        return memcmp(a.data + ja * fb, b.data + jb * fb, count * fb) == 0
    if not a.planar and not b.planar and ja == jb and count == stack:
        return memcmp(a.data, b.data, stack * fb) == 0
    # Layouts that differ (a writer that switched layouts, or obs and next_obs held differently):
    # element by element.
    for j in range(count):
        for e in range(frames):
            if memcmp(a.data + (e * stack + ja + j if not a.planar else (ja + j) * frames + e) * elem_bytes,
                      b.data + (e * stack + jb + j if not b.planar else (jb + j) * frames + e) * elem_bytes,
                      elem_bytes) != 0:
                return False
    return True


cdef Py_ssize_t _gcd(Py_ssize_t a, Py_ssize_t b) noexcept:
    while b:
        a, b = b, a % b
    return a


cdef const uint8_t* _data(object array, Py_ssize_t nbytes, object what, str prefix="") except? NULL:
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


cdef Observation _observation(object pair, Py_ssize_t nbytes, object what, str prefix="") except *:
    """An ``(array, planar)`` pair as an Observation; the array C-contiguous, ``nbytes`` long."""
    cdef Observation o
    if not isinstance(pair, tuple) or len(<tuple>pair) != 2:
        raise ValueError(f"{prefix}{what}: expected an (array, planar) pair")
    o.data = _data((<tuple>pair)[0], nbytes, what, prefix)
    o.planar = (<tuple>pair)[1]
    return o


cdef class FramePlanner:
    """Plans batches of one writer's rows of a compressed buffer.

    Parameters
    ----------
    keys : list of ``(name, row_bytes, elem_bytes, stack, has_next)`` per compressed key:
        ``row_bytes`` the bytes of one observation, ``stack`` its frames (last axis; 1: not
        stacked), ``has_next`` whether its next observation is stored by reference (``next_of``)
    max_next : largest item distance from a row to the observation equal to its next one
    """

    def __cinit__(self):
        self._row_bytes = self._elem_bytes = self._stack = self._nmasks = NULL
        self._has_next = NULL
        self._masks = NULL
        self._nkeys = 0

    def __init__(self, list keys not None, Py_ssize_t max_next):
        cdef Py_ssize_t q, p, n = len(keys), period, nmasks
        cdef uint8_t* mask_bytes
        self._row_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._elem_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._stack = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._nmasks = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._has_next = <bint*>malloc(n * sizeof(bint) + 1)
        self._masks = <uint64_t**>malloc(n * sizeof(uint64_t*) + 1)
        if not (self._row_bytes and self._elem_bytes and self._stack and self._nmasks and self._has_next
                and self._masks):
            raise MemoryError()
        self._max_next = max_next
        self._names = tuple(name for name, *_ in keys)
        self._any_next = False
        self._first_next = -1
        for q in range(n):
            self._masks[q] = NULL
        self._nkeys = n
        for q, (name, row_bytes, elem_bytes, stack, has_next) in enumerate(keys):
            if not (stack >= 1 and elem_bytes >= 1 and row_bytes >= 0 and row_bytes % (stack * elem_bytes) == 0):
                raise ValueError(f"keys: {name!r} needs row_bytes a multiple of stack * elem_bytes")
            self._row_bytes[q], self._elem_bytes[q], self._stack[q] = row_bytes, elem_bytes, stack
            self._has_next[q] = has_next
            if has_next:
                self._any_next = True
                if self._first_next < 0:
                    self._first_next = q
            if stack > 1:
                # A byte of an element of `stack` frames belongs to an older frame unless it is in
                # the newest's `elem_bytes`; the pattern repeats every lcm(stack * elem_bytes, 8) bytes.
                period = stack * elem_bytes
                nmasks = period // _gcd(period, 8)
                self._nmasks[q] = nmasks
                self._masks[q] = <uint64_t*>malloc(nmasks * sizeof(uint64_t))
                if not self._masks[q]:
                    raise MemoryError()
                mask_bytes = <uint8_t*>self._masks[q]
                for p in range(8 * nmasks):
                    mask_bytes[p] = 0 if (p % period) // elem_bytes == stack - 1 else 0xFF

    def __dealloc__(self):
        cdef Py_ssize_t q
        if self._masks:
            for q in range(self._nkeys):
                free(self._masks[q])
        free(self._masks)
        free(self._row_bytes)
        free(self._elem_bytes)
        free(self._stack)
        free(self._nmasks)
        free(self._has_next)

    cdef bint _stack_ok(self, Py_ssize_t q, Observation obs, Observation before, Py_ssize_t t) noexcept nogil:
        # Positions 0 .. s-2 hold positions 1 .. s-1 of the step before; at t = 0 every frame
        # is the newest, so each position equals the next one of the same observation.
        cdef Py_ssize_t s = self._stack[q], eb = self._elem_bytes[q]
        if t == 0:
            before = obs
        if not obs.planar and not before.planar:
            return _shifted_equal(obs.data, before.data, self._row_bytes[q], eb, self._masks[q], self._nmasks[q])
        return _positions_equal(obs, 0, before, 1, s - 1, self._row_bytes[q] // (s * eb), s, eb)

    cdef bint _same(self, Py_ssize_t q, Observation a, Observation b) noexcept nogil:
        # Whether two observations of key q are equal, byte for byte.
        cdef Py_ssize_t s = self._stack[q], eb = self._elem_bytes[q]
        return _positions_equal(a, 0, b, 0, s, self._row_bytes[q] // (s * eb), s, eb)

    cdef Observation _row(self, Py_ssize_t q, Observation rows, Py_ssize_t i) noexcept nogil:
        rows.data += i * self._row_bytes[q]
        return rows

    def plan(self, Py_ssize_t k, list obs not None, list nexts not None, object flags, Episode episode not None,
             bint end_episode, Py_ssize_t resume=0):
        """Plan ``k`` rows after ``episode`` (which must be this planner's); returns a
        :class:`FramePlan`, or raises ValueError naming the field.  Changes nothing.

        obs, nexts : per key, the rows' observations and next observations as ``(array, planar)``:
            the array C-contiguous, interleaved ``(k, ..., stack)`` or planar ``(k, stack, ...)``
            (``nexts[q]`` None without next_of)
        flags : bool or uint8 array, per row nonzero if the row ends its episode (done or truncated)
        end_episode : the episode ends after the rows, as with a flagged last row
        resume : > 0, the first row is step ``resume`` of an episode whose older steps are not
            stored (``episode`` must be between episodes): the older frames its stacks read are
            planned as items of their own before it, and its stacks are not checked against a
            step before it -- only that the positions older than the episode repeat its first frame
        """
        cdef Py_ssize_t q, nk = self._nkeys
        if len(obs) != nk or len(nexts) != nk:
            raise ValueError("plan: expected one entry per key")
        cdef const uint8_t* flag = _data(flags, k, "flags")
        cdef Observation* o = <Observation*>malloc(2 * nk * sizeof(Observation) + 1)
        if not o:
            raise MemoryError()
        try:
            memset(o, 0, 2 * nk * sizeof(Observation))
            for q in range(nk):
                o[q] = _observation(obs[q], k * self._row_bytes[q], self._names[q])
                if self._has_next[q]:
                    o[nk + q] = _observation(nexts[q], k * self._row_bytes[q], self._names[q], "next_")
            return self._plan(k, o, o + nk, flag, episode, end_episode, (obs, nexts), resume)
        finally:
            free(o)

    cdef FramePlan _plan(self, Py_ssize_t k, const Observation* obs, const Observation* nexts, const uint8_t* flag,
                         Episode episode, bint end_episode, object keep, Py_ssize_t resume):
        # Plan k rows (obs, nexts: per key, row 0 of the rows; flag: per row) after the episode;
        # `keep` holds the memory they point into for as long as the plan lives.
        cdef Py_ssize_t q, i, m, nk = self._nkeys, earlier = episode.waiting, t = episode.t
        cdef Py_ssize_t head = 0, tail = earlier, ending = -1, items = 0, last_row = -1, seeds = 0
        cdef int64_t base = episode.written
        cdef bint flagged, tail_ok
        if episode.planner is not self:
            raise ValueError("plan: expected an episode of this planner")
        if resume < 0 or (resume > 0 and (t != 0 or earlier != 0)):
            raise ValueError(f"resume: expected 0, or a step > 0 for a writer between episodes, got {resume}")
        if k == 0:
            resume = 0
        for q in range(nk):
            if resume > 0 and self._stack[q] > 1:
                seeds = max(seeds, self._resumed_stack(q, obs[q], resume))
        cdef FramePlan p = FramePlan.__new__(FramePlan)
        p._init(self, k, earlier, seeds)
        for q in range(nk):
            p._obs[q] = obs[q]
            if self._has_next[q]:
                p._next[q] = nexts[q]
                for i in range(earlier):
                    p._pending[i * nk + q].data = episode._next[i * nk + q]
                    p._pending[i * nk + q].planar = episode._next_planar[i * nk + q]
        for i in range(earlier):
            p._positions[i] = episode._position[i]
        cdef Observation* before = <Observation*>malloc(nk * sizeof(Observation) + 1)
        if not before:
            raise MemoryError()
        p._keep = keep
        cdef int64_t* item_row = p._item_row
        cdef int64_t* item_source = p._item_source
        cdef int64_t* row_item = p._row_item
        cdef int64_t* resolved_item = p._resolved_item
        cdef uint8_t* item_depth = p._item_depth
        try:
            for q in range(nk):
                before[q].data, before[q].planar = NULL, False
                if self._stack[q] > 1 and t > 0:
                    before[q].data, before[q].planar = episode._last[q], episode._last_planar[q]
            for m in range(seeds):
                # The frame `seeds - m` steps before the resumed row: its source says how far back.
                item_row[m], item_source[m], item_depth[m] = -1, -1 - (seeds - m), min(resume - (seeds - m), 255)
            items = seeds
            if resume > 0:
                t = resume
            for i in range(k):
                flagged = flag[i] != 0
                if ending >= 0:
                    # After a flagged row, flagged rows of the same call with the same last next
                    # observation are the tail of the same episode (what an n-step folder flushes).
                    tail_ok = flagged
                    for q in range(nk):
                        if not tail_ok:
                            break
                        if self._has_next[q] and not self._same(q, self._row(q, p._next[q], i), p._next_of(ending, q)):
                            tail_ok = False
                        elif self._stack[q] > 1 and not self._stack_ok(q, self._row(q, p._obs[q], i), before[q], t):
                            tail_ok = False
                    if not tail_ok:
                        items, head, t = self._finish(p, ending, items, head, tail, t, before)
                        ending = -1
                for q in range(nk):
                    if self._stack[q] > 1 and (i > 0 or resume == 0) \
                            and not self._stack_ok(q, self._row(q, p._obs[q], i), before[q], t):
                        raise ValueError(
                            f"field {self._names[q]!r}: row {i} is not the previous observation shifted by one frame, "
                            "nor the first frame of an episode repeated (stack_compress); end episodes with done "
                            "flags or on_episode_end()")
                m = items
                item_row[m], item_depth[m], item_source[m] = i, min(t, 255), -1
                items += 1
                row_item[i] = m
                # The oldest pending rows whose next observation this is.
                while self._any_next and head < tail and self._equals_next(p, head, i):
                    resolved_item[head] = m
                    head += 1
                if head < tail and base + m - p._position(head, base) >= self._max_next:
                    raise ValueError(f"field 'next_{self._names[self._first_next]}': no observation within "
                                     f"{self._max_next} steps equals this next observation "
                                     "(next_of needs next_obs[t] == obs[t + n])")
                for q in range(nk):
                    if self._stack[q] > 1:
                        before[q] = self._row(q, p._obs[q], i)
                last_row = i
                t += 1
                if self._any_next:
                    tail += 1
                if flagged:
                    ending = earlier + i
            if end_episode and ending < 0 and head < tail:
                ending = tail - 1
            if ending >= 0:
                items, head, t = self._finish(p, ending, items, head, tail, t, before)
            elif end_episode:
                t = 0
        finally:
            free(before)
        p.items, p.head, p.t, p.last_row = items, head, t, last_row if t > 0 else -1
        p.waiting = tail - head
        return p

    cdef Py_ssize_t _resumed_stack(self, Py_ssize_t q, Observation first, Py_ssize_t resume) except -1:
        """The older frames the stack of key q of step ``resume`` reads (ValueError unless its
        positions older than the episode repeat the episode's first frame, as a rebuild would)."""
        cdef Py_ssize_t s = self._stack[q], eb = self._elem_bytes[q], older = min(resume, s - 1)
        if not _positions_equal(first, 0, first, 1, s - 1 - older, self._row_bytes[q] // (s * eb), s, eb):
            raise ValueError(f"field {self._names[q]!r}: row 0 is step {resume} of its episode, but the "
                             f"{s - 1 - older} oldest frames of its stack do not repeat the episode's first "
                             "frame (stack_compress)")
        return older

    cdef tuple _finish(self, FramePlan p, Py_ssize_t ending, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail,
                       Py_ssize_t t, Observation* before):
        """End the episode: its last next observation (pending ordinal ``ending``) gets an item of
        its own, and every row still pending must be rebuilt from it.  Returns (items, head, t)."""
        cdef Py_ssize_t q, m, nk = self._nkeys
        if not self._any_next:
            return items, head, 0
        for q in range(nk):
            if self._has_next[q] and self._stack[q] > 1 and not self._stack_ok(q, p._next_of(ending, q), before[q], t):
                raise ValueError(f"field 'next_{self._names[q]}': the episode's last next observation is not its "
                                 "last observation shifted by one frame (stack_compress)")
        m = items
        p._item_row[m], p._item_depth[m], p._item_source[m] = -1, min(t, 255), ending
        while head < tail:
            for q in range(nk):
                if self._has_next[q] and not self._same(q, p._next_of(head, q), p._next_of(ending, q)):
                    raise ValueError(f"field 'next_{self._names[self._first_next]}': a next observation of this "
                                     "episode is neither a later observation nor its last one (next_of)")
            p._resolved_item[head] = m
            head += 1
        return items + 1, head, 0

    cdef bint _equals_next(self, FramePlan p, Py_ssize_t o, Py_ssize_t i) noexcept nogil:
        # Whether row i's observation is the next observation of pending ordinal o, for every next_of key.
        cdef Py_ssize_t q
        for q in range(self._nkeys):
            if self._has_next[q] and not self._same(q, p._next_of(o, q), self._row(q, p._obs[q], i)):
                return False
        return True


cdef class FramePlan:
    """What :meth:`FramePlanner.plan` decided for one batch; valid while its rows are unchanged."""

    def __cinit__(self):
        self._obs = self._next = self._pending = NULL
        self._item_row = self._item_source = self._row_item = self._resolved_item = self._positions = NULL
        self._item_depth = NULL

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier, Py_ssize_t seeds):
        # An episode ends before each row and after the last; a resumed one has `seeds` older frames.
        cdef Py_ssize_t nk = planner._nkeys, most = 2 * rows + 1 + seeds
        self._planner = planner
        self.rows, self._earlier = rows, earlier
        self._item_row = <int64_t*>malloc(most * sizeof(int64_t))
        self._item_source = <int64_t*>malloc(most * sizeof(int64_t))
        self._item_depth = <uint8_t*>malloc(most)
        self._row_item = <int64_t*>malloc(rows * sizeof(int64_t) + 1)
        self._resolved_item = <int64_t*>malloc((earlier + rows) * sizeof(int64_t) + 1)
        self._positions = <int64_t*>malloc(earlier * sizeof(int64_t) + 1)
        self._obs = <Observation*>malloc(nk * sizeof(Observation) + 1)
        self._next = <Observation*>malloc(nk * sizeof(Observation) + 1)
        self._pending = <Observation*>malloc(earlier * nk * sizeof(Observation) + 1)
        if not (self._item_row and self._item_source and self._item_depth and self._row_item and self._resolved_item
                and self._positions and self._obs and self._next and self._pending):
            raise MemoryError()
        memset(self._next, 0, nk * sizeof(Observation))

    def __dealloc__(self):
        free(self._item_row)
        free(self._item_source)
        free(self._item_depth)
        free(self._row_item)
        free(self._resolved_item)
        free(self._positions)
        free(self._obs)
        free(self._next)
        free(self._pending)

    @property
    def row_items(self):
        """Per row, its item (int64 array)."""
        cdef cnp.npy_intp n = self.rows
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        if n:
            memcpy(cnp.PyArray_DATA(out), self._row_item, n * sizeof(int64_t))
        return out

    cdef int64_t item_of(self, Py_ssize_t row) noexcept nogil:
        # The item of a row.
        return self._row_item[row]

    cdef Observation _next_of(self, Py_ssize_t o, Py_ssize_t q) noexcept nogil:
        # The next observation of key q of pending ordinal o.
        if o < self._earlier:
            return self._pending[o * self._planner._nkeys + q]
        return self._planner._row(q, self._next[q], o - self._earlier)

    cdef int64_t _position(self, Py_ssize_t o, int64_t base) noexcept nogil:
        # Items the writer had written before pending ordinal o.
        if o < self._earlier:
            return self._positions[o]
        return base + self._row_item[o - self._earlier]


cdef class Episode:
    """One compressed writer's episode in progress, and where its frames go.

    It holds, copied, what later rows are checked against: the episode's newest
    stack per stacked key, and the rows waiting for the frame of their next
    observation (their slots, generations and next observations).  A batch is
    planned after it (:meth:`FramePlanner.plan`), copied (:meth:`copy`), its
    publication prepared (:meth:`publication`) and, once published, the episode
    moves past it (:meth:`advance`).

    Parameters
    ----------
    planner : the writer's FramePlanner
    frames : per key, its store ``(size,) + frame`` in the buffer
    nxt, depth : the buffer's per-slot next-frame slots (int64) and depths (uint8)
    key_shapes, key_dtypes : per key, the observation's shape and dtype (what a single step must hold)
    flags : names of the fields whose nonzero value ends an episode
    """

    def __cinit__(self):
        self._last = self._next = self._frames = NULL
        self._last_planar = self._next_planar = NULL
        self._slot = self._position = self.done_slots = self._nxt = NULL
        self._gen = self.done_generations = NULL
        self._priority = self.done_priorities = NULL
        self._depth = NULL
        self._key_types = NULL
        self._step_obs = self._step_next = NULL
        self._capacity = self._nkeys = 0

    def __init__(self, FramePlanner planner not None, list frames not None, object nxt, object depth,
                 tuple key_shapes not None, tuple key_dtypes not None, tuple flags not None):
        cdef Py_ssize_t q, nk = planner._nkeys, cap = planner._max_next + 1
        if len(frames) != nk or len(key_shapes) != nk or len(key_dtypes) != nk:
            raise ValueError("frames, key_shapes, key_dtypes: expected one per key")
        self.planner = planner
        self._nkeys = nk
        self.lane = -1
        self.flags = flags
        self._capacity = cap
        self._size = cnp.PyArray_SIZE(depth) if isinstance(depth, cnp.ndarray) else 0
        self._nxt = <int64_t*>_data(nxt, self._size * 8, "nxt")
        self._depth = <uint8_t*>_data(depth, self._size, "depth")
        self._last = <uint8_t**>calloc(nk + 1, sizeof(uint8_t*))
        self._last_planar = <bint*>calloc(nk + 1, sizeof(bint))
        self._frames = <uint8_t**>calloc(nk + 1, sizeof(uint8_t*))
        self._key_types = <int*>calloc(nk + 1, sizeof(int))
        self._step_obs = <Observation*>calloc(nk + 1, sizeof(Observation))
        self._step_next = <Observation*>calloc(nk + 1, sizeof(Observation))
        self._next = <uint8_t**>calloc(cap * nk + 1, sizeof(uint8_t*))
        self._next_planar = <bint*>calloc(cap * nk + 1, sizeof(bint))
        self._slot = <int64_t*>calloc(cap, sizeof(int64_t))
        self._position = <int64_t*>calloc(cap, sizeof(int64_t))
        self._gen = <uint64_t*>calloc(cap, sizeof(uint64_t))
        self._priority = <double*>calloc(cap, sizeof(double))
        self.done_slots = <int64_t*>calloc(cap, sizeof(int64_t))
        self.done_generations = <uint64_t*>calloc(cap, sizeof(uint64_t))
        self.done_priorities = <double*>calloc(cap, sizeof(double))
        if not (self._last and self._last_planar and self._frames and self._key_types and self._step_obs
                and self._step_next and self._next and self._next_planar and self._slot and self._position
                and self._gen and self._priority and self.done_slots and self.done_generations and self.done_priorities):
            raise MemoryError()
        for q in range(nk):
            self._frames[q] = <uint8_t*>_data(frames[q], self._size * (planner._row_bytes[q] // planner._stack[q]),
                                              planner._names[q], "frames of ")
            if planner._stack[q] > 1:
                self._last[q] = <uint8_t*>malloc(planner._row_bytes[q] + 1)
                if not self._last[q]:
                    raise MemoryError()
            self._key_types[q] = np.dtype(key_dtypes[q]).num
        self._key_shapes = tuple(tuple(shape) for shape in key_shapes)
        self._next_names = tuple(f"next_{name}" if planner._has_next[q] else None
                                 for q, name in enumerate(planner._names))
        self.observations = nk + sum(1 for name in self._next_names if name is not None)
        self._keep = (frames, nxt, depth)

    def __dealloc__(self):
        cdef Py_ssize_t j, nk = self._nkeys
        if self._last:
            for j in range(nk):
                free(self._last[j])
        if self._next:
            for j in range(self._capacity * nk):
                free(self._next[j])
        free(self._last)
        free(self._last_planar)
        free(self._frames)
        free(self._key_types)
        free(self._step_obs)
        free(self._step_next)
        free(self._next)
        free(self._next_planar)
        free(self._slot)
        free(self._position)
        free(self._gen)
        free(self._priority)
        free(self.done_slots)
        free(self.done_generations)
        free(self.done_priorities)

    # -- one step -----------------------------------------------------------------
    cdef bint take_step(self, dict values) except -1:
        """Find one step's observations in ``values`` for :meth:`plan_step`: each an exact ndarray of
        its key's dtype and shape, C-contiguous or (stacked) planar.  False: not such a step."""
        cdef Py_ssize_t q, nk = self.planner._nkeys
        cdef PyObject* item
        for q in range(nk):
            item = PyDict_GetItem(values, self.planner._names[q])
            if item == NULL or not self._view(q, <object>item, &self._step_obs[q]):
                return False
            if self._next_names[q] is not None:
                item = PyDict_GetItem(values, self._next_names[q])
                if item == NULL or not self._view(q, <object>item, &self._step_next[q]):
                    return False
        return True

    cdef bint _view(self, Py_ssize_t q, object value, Observation* out) except -1:
        # One observation of key q read in place: interleaved (C order) or planar (the stack
        # axis, last, with the largest stride: what np.moveaxis makes of a channels-first stack).
        cdef cnp.ndarray arr
        cdef tuple shape = self._key_shapes[q]
        cdef Py_ssize_t d, nd = len(shape), itemsize, stride
        if not cnp.PyArray_CheckExact(value):
            return False
        arr = <cnp.ndarray>value
        if (cnp.PyArray_TYPE(arr) != self._key_types[q] or not cnp.PyArray_ISNOTSWAPPED(arr)
                or cnp.PyArray_NDIM(arr) != nd):
            return False
        for d in range(nd):
            if cnp.PyArray_DIM(arr, d) != <Py_ssize_t>shape[d]:
                return False
        out.data = <const uint8_t*>cnp.PyArray_DATA(arr)
        out.planar = False
        if cnp.PyArray_IS_C_CONTIGUOUS(arr):
            return True
        if self.planner._stack[q] < 2:
            return False
        itemsize = cnp.PyArray_ITEMSIZE(arr)
        stride = itemsize
        for d in range(nd - 2, -1, -1):
            if cnp.PyArray_DIM(arr, d) > 1 and cnp.PyArray_STRIDE(arr, d) != stride:
                return False
            stride *= cnp.PyArray_DIM(arr, d)
        if cnp.PyArray_STRIDE(arr, nd - 1) != stride:
            return False
        out.planar = True
        return True

    cdef FramePlan plan_step(self, const uint8_t* flag, object keep):
        """Plan the step :meth:`take_step` found (``flag``: it ends its episode), as
        :meth:`FramePlanner.plan` plans a batch of one; ``keep`` holds its arrays."""
        return self.planner._plan(1, self._step_obs, self._step_next, flag, self, False, keep, 0)

    # -- any batch ----------------------------------------------------------------
    def copy(self, FramePlan p not None, object slots, list stored not None, list rows not None):
        """Write the planned items into ``slots`` (int64, one per item): their frames, next-frame
        slots (-1: none yet) and depths, and the rows' values ``rows`` (each ``(k, ...)``,
        C-contiguous) into the plain per-slot arrays ``stored`` (each ``(size, ...)``)."""
        cdef Py_ssize_t j, f, rb, nf = len(stored)
        cdef const int64_t* slot
        if p._planner is not self.planner or len(rows) != nf:
            raise ValueError("copy: expected a plan of this episode's planner and one value per stored array")
        slot = <const int64_t*>_data(slots, p.items * 8, "slots")
        for j in range(p.items):
            if not 0 <= slot[j] < self._size:
                raise ValueError(f"slots: {slot[j]} is outside the {self._size} slots")
        cdef const uint8_t** sources = <const uint8_t**>malloc(nf * sizeof(uint8_t*) + 1)
        cdef uint8_t** targets = <uint8_t**>malloc(nf * sizeof(uint8_t*) + 1)
        cdef Py_ssize_t* pitches = <Py_ssize_t*>malloc(nf * sizeof(Py_ssize_t) + 1)
        try:
            if not (sources and targets and pitches):
                raise MemoryError()
            for f in range(nf):
                targets[f] = _slot_rows(stored[f], self._size, &pitches[f])
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // self._size
                sources[f] = _data(rows[f], p.rows * rb, "rows")
            with nogil:
                self.copy_frames(p, slot)
            for f in range(nf):
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // self._size
                with nogil:
                    for j in range(p.items):
                        if p._item_row[j] >= 0:
                            memcpy(targets[f] + slot[j] * pitches[f], sources[f] + p._item_row[j] * rb, rb)
        finally:
            free(sources)
            free(targets)
            free(pitches)

    cdef void copy_frames(self, FramePlan p, const int64_t* slot) noexcept nogil:
        # Each item's frame into its slot, with its depth and no next frame yet: a row's newest
        # frame, an episode's last next frame, or a frame a resumed row's stack holds.
        cdef Py_ssize_t q, j, e, n, s, eb, fb, at
        cdef int64_t row
        cdef Observation src
        cdef uint8_t* dst
        for j in range(p.items):
            self._depth[slot[j]] = p._item_depth[j]
            self._nxt[slot[j]] = -1
        for q in range(self.planner._nkeys):
            s, eb = self.planner._stack[q], self.planner._elem_bytes[q]
            fb = self.planner._row_bytes[q] // s
            n = fb // eb
            for j in range(p.items):
                row, at = p._item_row[j], s - 1
                if row >= 0:
                    src = self.planner._row(q, p._obs[q], row)
                elif p._item_source[j] < 0:
                    # A frame -1 - source steps before the resumed first row (a key of a
                    # shorter stack never reads it: any of its frames will do).
                    src = p._obs[q]
                    at = max(0, s - 1 - (-1 - p._item_source[j]))
                elif self.planner._has_next[q]:
                    src = p._next_of(p._item_source[j], q)
                else:
                    continue
                dst = self._frames[q] + slot[j] * fb
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

    def publication(self, FramePlan p not None, object slots, object priorities):
        """Link the waiting rows ``p`` resolves to their next frames (the buffer's ``nxt``) and
        say how to publish the items in ``slots``: returns ``(states, priorities, complete,
        complete_generations, complete_priorities)`` for :meth:`Ring.publish` (``priorities``:
        per row, float64, or None for the largest stored)."""
        cdef cnp.npy_intp n = p.items
        cdef const double* row_priority = NULL
        cdef const int64_t* slot = <const int64_t*>_data(slots, p.items * 8, "slots")
        if priorities is not None:
            row_priority = <const double*>_data(priorities, p.rows * 8, "priorities")
        states = cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT8, 0)
        item_priority = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT64, 0)
        cdef Py_ssize_t done = self.settle(p, slot, row_priority, <uint8_t*>cnp.PyArray_DATA(states),
                                           <double*>cnp.PyArray_DATA(item_priority))
        n = done
        complete = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        generations = cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT64, 0)
        complete_priority = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT64, 0)
        if done:
            memcpy(cnp.PyArray_DATA(complete), self.done_slots, done * sizeof(int64_t))
            memcpy(cnp.PyArray_DATA(generations), self.done_generations, done * sizeof(uint64_t))
            memcpy(cnp.PyArray_DATA(complete_priority), self.done_priorities, done * sizeof(double))
        return states, (item_priority if priorities is not None else None), complete, generations, complete_priority

    cdef Py_ssize_t settle(self, FramePlan p, const int64_t* slot, const double* row_priority, uint8_t* states,
                           double* item_priority) noexcept nogil:
        # Point every waiting row p resolves at the slot of its next frame; per item its state
        # and priority (row_priority: per row, NULL: the largest stored).  The earlier calls'
        # rows it completes go to done_slots, done_generations and done_priorities; returns how many.
        cdef Py_ssize_t j, o, done = 0
        cdef int64_t row
        for j in range(p.items):
            row = p._item_row[j]
            if row < 0:
                states[j] = EMPTY
            elif self.planner._any_next and p._earlier + row >= p.head:
                states[j] = WAITING
            else:
                states[j] = COMPLETE
            item_priority[j] = row_priority[row] if row_priority != NULL and row >= 0 else 0.0
        for o in range(p.head):
            # WAITING rows are published, but nobody reads their nxt before they complete.
            if o < p._earlier:
                self._nxt[self._slot[o]] = slot[p._resolved_item[o]]
                self.done_slots[done], self.done_generations[done] = self._slot[o], self._gen[o]
                self.done_priorities[done] = self._priority[o]
                done += 1
            else:
                self._nxt[slot[p._row_item[o - p._earlier]]] = slot[p._resolved_item[o]]
        return done

    def advance(self, FramePlan p not None, object slots, object reserved, object priorities):
        """Move past ``p`` once its items were published into ``slots`` with the generations
        ``reserved`` + 1 (both None when ``p`` has no item); ``priorities`` as for :meth:`publication`."""
        cdef const int64_t* slot = NULL
        cdef const uint64_t* gen = NULL
        cdef const double* row_priority = NULL
        if p.items:
            slot = <const int64_t*>_data(slots, p.items * 8, "slots")
            gen = <const uint64_t*>_data(reserved, p.items * 8, "reserved")
        if priorities is not None:
            row_priority = <const double*>_data(priorities, p.rows * 8, "priorities")
        self.advance_past(p, slot, gen, row_priority)

    cdef int advance_past(self, FramePlan p, const int64_t* slot, const uint64_t* reserved,
                     const double* row_priority) except -1:
        cdef FramePlanner planner = self.planner
        cdef Py_ssize_t q, o, r, m, e, nk = planner._nkeys
        if p._planner is not planner or p._earlier != self.waiting:
            raise ValueError("advance: expected the plan of this episode's latest batch")
        self._drop(min(p.head, p._earlier))
        if planner._any_next:
            for o in range(max(p.head, p._earlier), p._earlier + p.rows):
                r = o - p._earlier
                m = p._row_item[r]
                e = self.waiting
                if e == self._capacity:
                    raise RuntimeError("advance: more rows wait for their next observation than the planner allows")
                for q in range(nk):
                    if planner._has_next[q]:
                        if self._next[e * nk + q] == NULL:
                            self._next[e * nk + q] = <uint8_t*>malloc(planner._row_bytes[q] + 1)
                            if self._next[e * nk + q] == NULL:
                                raise MemoryError()
                        memcpy(self._next[e * nk + q], planner._row(q, p._next[q], r).data, planner._row_bytes[q])
                        self._next_planar[e * nk + q] = p._next[q].planar
                self._slot[e], self._gen[e], self._position[e] = slot[m], reserved[m] + 1, self.written + m
                self._priority[e] = row_priority[r] if row_priority != NULL else NAN
                self.waiting += 1
        if p.t > 0 and p.last_row >= 0:
            for q in range(nk):
                if planner._stack[q] > 1:
                    memcpy(self._last[q], planner._row(q, p._obs[q], p.last_row).data, planner._row_bytes[q])
                    self._last_planar[q] = p._obs[q].planar
        self.t = p.t
        self.written += p.items
        return 0

    cdef void _drop(self, Py_ssize_t n) noexcept nogil:
        # Forget the n oldest waiting rows; their next-observation buffers go to the free end.
        cdef Py_ssize_t nk = self.planner._nkeys, rest = self.waiting - n
        if n <= 0:
            return
        # Rotate the (capacity, keys) table of buffers left by n entries.
        _rotate(<void**>self._next, self._capacity * nk, n * nk)
        memmove(self._next_planar, self._next_planar + n * nk, rest * nk * sizeof(bint))
        memmove(self._slot, self._slot + n, rest * sizeof(int64_t))
        memmove(self._gen, self._gen + n, rest * sizeof(uint64_t))
        memmove(self._position, self._position + n, rest * sizeof(int64_t))
        memmove(self._priority, self._priority + n, rest * sizeof(double))
        self.waiting = rest


cdef void _reverse(void** items, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    # items[lo .. hi) in reverse order.
    cdef void* x
    hi -= 1
    while lo < hi:
        x = items[lo]
        items[lo] = items[hi]
        items[hi] = x
        lo += 1
        hi -= 1


cdef void _rotate(void** items, Py_ssize_t n, Py_ssize_t by) noexcept nogil:
    # items[0 .. n) rotated left by `by`: items[by] comes first, items[0 .. by) go last.
    _reverse(items, 0, by)
    _reverse(items, by, n)
    _reverse(items, 0, n)
