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
pending rows, ordinal ``earlier + i`` row ``i`` of this batch.
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

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

    def plan(self, Py_ssize_t k, list obs not None, list nexts not None, object flags, Py_ssize_t t,
             list last not None, list pending not None, list pending_positions not None, int64_t base,
             bint end_episode):
        """Plan ``k`` rows; returns a :class:`FramePlan`, or raises ValueError naming the field.

        obs, nexts : per key, the rows' observations and next observations as ``(array, planar)``:
            the array C-contiguous, interleaved ``(k, ..., stack)`` or planar ``(k, stack, ...)``
            (``nexts[q]`` None without next_of)
        flags : bool or uint8 array, per row nonzero if the row ends its episode (done or truncated)
        t : steps of the episode in progress stored so far
        last : per key, the newest observation of that episode as ``(array, planar)`` (None if t == 0
            or not stacked)
        pending : per earlier pending row (oldest first), a dict of its next observations by field,
            each ``(array, planar)``
        pending_positions : per earlier pending row, the items this writer had written before it
        base : the items this writer has written
        end_episode : the episode ends after the rows, as with a flagged last row
        """
        cdef Py_ssize_t q, i, m, nk = self._nkeys, earlier = len(pending)
        cdef Py_ssize_t head = 0, tail = earlier, ending = -1, items = 0, last_row = -1
        cdef bint flagged, tail_ok
        if len(obs) != nk or len(nexts) != nk or len(last) != nk or len(pending_positions) != earlier:
            raise ValueError("plan: expected one entry per key and one position per pending row")
        cdef const uint8_t* flag = _data(flags, k, "flags")
        cdef FramePlan p = FramePlan.__new__(FramePlan)
        p._init(self, k, earlier)
        for q in range(nk):
            p._obs[q] = _observation(obs[q], k * self._row_bytes[q], self._names[q])
            if self._has_next[q]:
                p._next[q] = _observation(nexts[q], k * self._row_bytes[q], self._names[q], "next_")
                for i in range(earlier):
                    p._pending[i * nk + q] = _observation(pending[i][self._names[q]], self._row_bytes[q],
                                                          self._names[q], "next_")
        for i in range(earlier):
            p._positions[i] = pending_positions[i]
        cdef Observation* before = <Observation*>malloc(nk * sizeof(Observation) + 1)
        if not before:
            raise MemoryError()
        p._keep = (obs, nexts, pending, last)
        cdef int64_t* item_row = p._item_row
        cdef int64_t* item_source = p._item_source
        cdef int64_t* row_item = p._row_item
        cdef int64_t* resolved_item = p._resolved_item
        cdef uint8_t* item_depth = p._item_depth
        try:
            for q in range(nk):
                before[q].data, before[q].planar = NULL, False
                if self._stack[q] > 1 and t > 0:
                    before[q] = _observation(last[q], self._row_bytes[q], self._names[q])
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
                    if self._stack[q] > 1 and not self._stack_ok(q, self._row(q, p._obs[q], i), before[q], t):
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
        return p

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

    def copy(self, FramePlan p not None, object slots, list frames not None, list stored not None,
             list rows not None, object nxt, object depth):
        """Write the planned items into ``slots`` (one per item) of the buffer's arrays.

        frames : per key, its store ``(size,) + frame``: each row's newest frame, and an episode's
            last next frame for the next_of keys
        stored, rows : the plain per-slot arrays ``(size, ...)`` and the rows' values for them ``(k, ...)``
        nxt, depth : per slot: set to -1 (no next frame yet) and to the item's depth (int64, uint8)
        Every array C-contiguous; ``slots`` int64.
        """
        cdef Py_ssize_t q, j, e, n, s, eb, fb, rb, f, nk = self._nkeys, nf = len(stored)
        cdef Py_ssize_t size = cnp.PyArray_SIZE(depth) if isinstance(depth, cnp.ndarray) else 0
        cdef int64_t row
        cdef Observation src
        cdef uint8_t* dst
        cdef const int64_t* item_row = p._item_row
        cdef const int64_t* item_source = p._item_source
        cdef const uint8_t* item_depth = p._item_depth
        if p._planner is not self or len(frames) != nk or len(rows) != nf:
            raise ValueError("copy: expected this planner's plan, one store per key and one value per stored array")
        cdef const int64_t* slot = <const int64_t*>_data(slots, p.items * 8, "slots")
        cdef int64_t* next_slot = <int64_t*>_data(nxt, size * 8, "nxt")
        cdef uint8_t* slot_depth = <uint8_t*>_data(depth, size, "depth")
        for j in range(p.items):
            if not 0 <= slot[j] < size:
                raise ValueError(f"slots: {slot[j]} is outside the {size} slots")
        cdef const uint8_t** sources = <const uint8_t**>malloc((nk + nf) * sizeof(uint8_t*) + 1)
        cdef uint8_t** targets = <uint8_t**>malloc((nk + nf) * sizeof(uint8_t*) + 1)
        try:
            if not (sources and targets):
                raise MemoryError()
            for q in range(nk):
                targets[q] = <uint8_t*>_data(frames[q], size * (self._row_bytes[q] // self._stack[q]),
                                             self._names[q], "frames of ")
            for f in range(nf):
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // size if isinstance(stored[f], cnp.ndarray) else 0
                targets[nk + f] = <uint8_t*>_data(stored[f], size * rb, "stored")
                sources[nk + f] = _data(rows[f], p.rows * rb, "rows")
            with nogil:
                for j in range(p.items):
                    slot_depth[slot[j]] = item_depth[j]
                    next_slot[slot[j]] = -1
                for q in range(nk):
                    s, eb = self._stack[q], self._elem_bytes[q]
                    fb = self._row_bytes[q] // s
                    n = fb // eb
                    for j in range(p.items):
                        row = item_row[j]
                        if row >= 0:
                            src = self._row(q, p._obs[q], row)
                        elif self._has_next[q]:
                            src = p._next_of(item_source[j], q)
                        else:
                            continue
                        dst = targets[q] + slot[j] * fb
                        if s == 1 or src.planar:
                            memcpy(dst, src.data + (s - 1) * fb, fb)
                        elif eb == 1 and s == 4:
                            # The common pixel case: a constant stride the compiler turns into shuffles.
                            for e in range(n):
                                dst[e] = src.data[4 * e + 3]
                        elif eb == 1:
                            for e in range(n):
                                dst[e] = src.data[e * s + s - 1]
                        else:
                            for e in range(n):
                                memcpy(dst + e * eb, src.data + (e * s + s - 1) * eb, eb)
            for f in range(nf):
                rb = cnp.PyArray_NBYTES(<cnp.ndarray>stored[f]) // size
                with nogil:
                    for j in range(p.items):
                        if item_row[j] >= 0:
                            memcpy(targets[nk + f] + slot[j] * rb, sources[nk + f] + item_row[j] * rb, rb)
        finally:
            free(sources)
            free(targets)


cdef class FramePlan:
    """What :meth:`FramePlanner.plan` decided for one batch; valid while its rows are unchanged."""

    def __cinit__(self):
        self._obs = self._next = self._pending = NULL
        self._item_row = self._item_source = self._row_item = self._resolved_item = self._positions = NULL
        self._item_depth = NULL

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier):
        cdef Py_ssize_t nk = planner._nkeys, most = 2 * rows + 1  # an episode ends before each row and after the last
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
    def item_rows(self) -> list:
        """Per item, its row; -1 for an episode's last next frame."""
        return [self._item_row[j] for j in range(self.items)]

    @property
    def row_items(self) -> list:
        """Per row, its item."""
        return [self._row_item[i] for i in range(self.rows)]

    @property
    def resolved_items(self) -> list:
        """Per pending ordinal < head, the item holding the frame of its next observation."""
        return [self._resolved_item[o] for o in range(self.head)]

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
