# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Planning a compressed batch: every stack and next observation checked byte for byte.

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
pending rows (an :class:`~mpreplay._ext.episode_state.EpisodeState` keeps
them, copied, with the episode's newest stacks), ordinal ``earlier + i`` row
``i`` of this batch.  A :class:`FramePlan` is what the planner decided; the
writer's episode (episode.pyx) writes and publishes it, then moves past it.

A batch may *resume* an episode at step t > 0 none of whose steps the writer
stored (a saved buffer's oldest kept step): its first row's stacks hold every
older frame they read, so those frames take items of their own before it
(never sampled, as a lone next frame), and its depth is t, as when it was first
stored.  Symmetrically, a batch may end an episode *open* (a saved one, which
may have gone on when it was saved): rows folded n steps ahead then look past
its last row, and the steps their next observations reach take items of their
own after it, each checked to be the one before shifted by one frame.
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

from mpreplay._ext.episode_state cimport EpisodeState

cimport numpy as cnp

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
        self.row_bytes = self.elem_bytes = self.stack = self._nmasks = NULL
        self.has_next = NULL
        self._masks = NULL
        self.nkeys = 0

    def __init__(self, list keys not None, Py_ssize_t max_next):
        cdef Py_ssize_t q, p, n = len(keys), period, nmasks
        cdef uint8_t* mask_bytes
        self.row_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self.elem_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self.stack = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._nmasks = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self.has_next = <bint*>malloc(n * sizeof(bint) + 1)
        self._masks = <uint64_t**>malloc(n * sizeof(uint64_t*) + 1)
        if not (self.row_bytes and self.elem_bytes and self.stack and self._nmasks and self.has_next
                and self._masks):
            raise MemoryError()
        self.max_next = max_next
        self.names = tuple(name for name, *_ in keys)
        self.any_next = False
        self._first_next = -1
        for q in range(n):
            self._masks[q] = NULL
        self.nkeys = n
        for q, (name, row_bytes, elem_bytes, stack, has_next) in enumerate(keys):
            if not (stack >= 1 and elem_bytes >= 1 and row_bytes >= 0 and row_bytes % (stack * elem_bytes) == 0):
                raise ValueError(f"keys: {name!r} needs row_bytes a multiple of stack * elem_bytes")
            self.row_bytes[q], self.elem_bytes[q], self.stack[q] = row_bytes, elem_bytes, stack
            self.has_next[q] = has_next
            if has_next:
                self.any_next = True
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
            for q in range(self.nkeys):
                free(self._masks[q])
        free(self._masks)
        free(self.row_bytes)
        free(self.elem_bytes)
        free(self.stack)
        free(self._nmasks)
        free(self.has_next)

    cdef bint _stack_ok(self, Py_ssize_t q, Observation obs, Observation before, Py_ssize_t t) noexcept nogil:
        # Positions 0 .. s-2 hold positions 1 .. s-1 of the step before; at t = 0 every frame
        # is the newest, so each position equals the next one of the same observation.
        cdef Py_ssize_t s = self.stack[q], eb = self.elem_bytes[q]
        if t == 0:
            before = obs
        if not obs.planar and not before.planar:
            return _shifted_equal(obs.data, before.data, self.row_bytes[q], eb, self._masks[q], self._nmasks[q])
        return _positions_equal(obs, 0, before, 1, s - 1, self.row_bytes[q] // (s * eb), s, eb)

    cdef bint _same(self, Py_ssize_t q, Observation a, Observation b) noexcept nogil:
        # Whether two observations of key q are equal, byte for byte.
        cdef Py_ssize_t s = self.stack[q], eb = self.elem_bytes[q]
        return _positions_equal(a, 0, b, 0, s, self.row_bytes[q] // (s * eb), s, eb)

    cdef Observation row(self, Py_ssize_t q, Observation rows, Py_ssize_t i) noexcept nogil:
        rows.data += i * self.row_bytes[q]
        return rows

    cdef FramePlan plan(self, Py_ssize_t k, const Observation* obs, const Observation* nexts, const uint8_t* flag,
                        EpisodeState episode, bint end_episode, object keep, Py_ssize_t resume, bint open_end):
        # Plan k rows (obs, nexts: per key, row 0 of the rows; flag: per row) after the episode
        # (one made for this planner); `keep` holds the memory they point into for as long as the
        # plan lives.  Raises ValueError naming the field; changes nothing.  resume > 0: the first
        # row is step `resume` of an episode whose older steps are not stored (the episode must be
        # between episodes): the older frames its stacks read are planned as items of their own
        # before it, and its stacks are not checked against a step before it -- only that the
        # positions older than the episode repeat its first frame.  open_end: end_episode ends
        # the episode where the rows stop, which may be before it did (see _trail).
        cdef Py_ssize_t q, i, m, nk = self.nkeys, earlier = episode.waiting, t = episode.t
        cdef Py_ssize_t head = 0, tail = earlier, ending = -1, items = 0, last_row = -1, seeds = 0
        # The pending ordinal of the episode's first row, -1 where it began in an earlier call.
        cdef Py_ssize_t opened = earlier if t == 0 else -1
        cdef int64_t base = episode.written
        cdef bint flagged, tail_ok
        if resume < 0 or (resume > 0 and (t != 0 or earlier != 0)):
            raise ValueError(f"resume: expected 0, or a step > 0 for a writer between episodes, got {resume}")
        if k == 0:
            resume = 0
        for q in range(nk):
            if resume > 0 and self.stack[q] > 1:
                seeds = max(seeds, self._resumed_stack(q, obs[q], resume))
        cdef FramePlan p = FramePlan.__new__(FramePlan)
        p._init(self, k, earlier, seeds + (self.max_next if open_end else 0))
        for q in range(nk):
            p.obs[q] = obs[q]
            if self.has_next[q]:
                p.nexts[q] = nexts[q]
                for i in range(earlier):
                    p._pending[i * nk + q].data = episode.waiting_next[i * nk + q]
                    p._pending[i * nk + q].planar = episode.waiting_planar[i * nk + q]
        for i in range(earlier):
            p._positions[i] = episode.waiting_position[i]
        cdef Observation* before = <Observation*>malloc(nk * sizeof(Observation) + 1)
        if not before:
            raise MemoryError()
        p._keep = keep
        cdef int64_t* item_row = p.item_row
        cdef int64_t* item_source = p.item_source
        cdef int64_t* row_item = p.row_item
        cdef int64_t* resolved_item = p.resolved_item
        cdef uint8_t* item_depth = p.item_depth
        try:
            for q in range(nk):
                before[q].data, before[q].planar = NULL, False
                if self.stack[q] > 1 and t > 0:
                    before[q].data, before[q].planar = episode.last[q], episode.last_planar[q]
            for m in range(seeds):
                # The frame `seeds - m` steps before the resumed row's.
                item_row[m], item_source[m], p.item_back[m] = -1, -1, seeds - m
                item_depth[m] = min(resume - (seeds - m), 255)
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
                        if self.has_next[q] and not self._same(q, self.row(q, p.nexts[q], i), p.next_of(ending, q)):
                            tail_ok = False
                        elif self.stack[q] > 1 and not self._stack_ok(q, self.row(q, p.obs[q], i), before[q], t):
                            tail_ok = False
                    if not tail_ok:
                        items, head, t = self._finish(p, ending, items, head, tail, t, before)
                        ending, opened = -1, earlier + i
                for q in range(nk):
                    if self.stack[q] > 1 and (i > 0 or resume == 0) \
                            and not self._stack_ok(q, self.row(q, p.obs[q], i), before[q], t):
                        raise ValueError(
                            f"field {self.names[q]!r}: row {i} is not the previous observation shifted by one frame, "
                            "nor the first frame of an episode repeated (stack_compress); end episodes with done "
                            "flags or on_episode_end()")
                m = items
                item_row[m], item_depth[m], item_source[m] = i, min(t, 255), -1
                items += 1
                row_item[i] = m
                # The oldest pending rows whose next observation this is.
                while self.any_next and head < tail and self._equals_next(p, head, i):
                    resolved_item[head] = m
                    head += 1
                if head < tail and base + m - p._position(head, base) >= self.max_next:
                    raise ValueError(f"field 'next_{self.names[self._first_next]}': no observation within "
                                     f"{self.max_next} steps equals this next observation "
                                     "(next_of needs next_obs[t] == obs[t + n])")
                for q in range(nk):
                    if self.stack[q] > 1:
                        before[q] = self.row(q, p.obs[q], i)
                last_row = i
                t += 1
                if self.any_next:
                    tail += 1
                if flagged:
                    ending = earlier + i
            if end_episode and ending < 0 and head < tail:
                if open_end:
                    items, head, t = self._trail(p, items, head, tail, t, before, head == opened, base)
                else:
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
        cdef Py_ssize_t s = self.stack[q], eb = self.elem_bytes[q], older = min(resume, s - 1)
        if not _positions_equal(first, 0, first, 1, s - 1 - older, self.row_bytes[q] // (s * eb), s, eb):
            raise ValueError(f"field {self.names[q]!r}: row 0 is step {resume} of its episode, but the "
                             f"{s - 1 - older} oldest frames of its stack do not repeat the episode's first "
                             "frame (stack_compress)")
        return older

    cdef tuple _finish(self, FramePlan p, Py_ssize_t ending, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail,
                       Py_ssize_t t, Observation* before):
        """End the episode: its last next observation (pending ordinal ``ending``) gets an item of
        its own, and every row still pending must be rebuilt from it.  Returns (items, head, t)."""
        cdef Py_ssize_t q, m, nk = self.nkeys
        if not self.any_next:
            return items, head, 0
        for q in range(nk):
            if self.has_next[q] and self.stack[q] > 1 and not self._stack_ok(q, p.next_of(ending, q), before[q], t):
                raise ValueError(f"field 'next_{self.names[q]}': the episode's last next observation is not its "
                                 "last observation shifted by one frame (stack_compress)")
        m = items
        p.item_row[m], p.item_depth[m], p.item_source[m], p.item_back[m] = -1, min(t, 255), ending, 0
        while head < tail:
            for q in range(nk):
                if self.has_next[q] and not self._same(q, p.next_of(head, q), p.next_of(ending, q)):
                    raise ValueError(f"field 'next_{self.names[self._first_next]}': a next observation of this "
                                     "episode is neither a later observation nor its last one (next_of)")
            p.resolved_item[head] = m
            head += 1
        return items + 1, head, 0

    cdef tuple _trail(self, FramePlan p, Py_ssize_t items, Py_ssize_t head, Py_ssize_t tail, Py_ssize_t t,
                      Observation* before, bint unresolved, int64_t base):
        """End an episode where its rows stop, which may be before it did (a saved episode, open
        when saved).  Rows folded n steps ahead then look up to n steps past its last row: each
        pending row's next observation, oldest first, takes an item of its own after the one
        before (or shares it, when equal), and must be that one shifted by one frame.  Only where
        ``unresolved`` (no row of the episode found its next observation: fewer rows than their
        look-ahead) may the first lie further on: the fewest steps its stacks agree with, the
        frames between taking items of their own, as those stacks hold them.  Returns (items,
        head, t)."""
        cdef Py_ssize_t q, b, d, m = -1, shared = -1, nk = self.nkeys
        while head < tail:
            if shared < 0 or not self._same_nexts(p, head, shared):
                d = self._steps_past(p, head, before, unresolved and shared < 0)
                if base + items + d - 1 - p._position(head, base) > self.max_next:
                    raise ValueError(f"field 'next_{self.names[self._first_next]}': no observation within "
                                     f"{self.max_next} steps equals this next observation "
                                     "(next_of needs next_obs[t] == obs[t + n])")
                for b in range(d):
                    m = items
                    p.item_row[m], p.item_source[m], p.item_back[m] = -1, head, d - 1 - b
                    p.item_depth[m] = min(t, 255)
                    items += 1
                    t += 1
                for q in range(nk):
                    if self.has_next[q] and self.stack[q] > 1:
                        before[q] = p.next_of(head, q)
                shared = head
            p.resolved_item[head] = m
            head += 1
        return items, head, 0

    cdef Py_ssize_t _steps_past(self, FramePlan p, Py_ssize_t o, Observation* before, bint further) except -1:
        """The steps from ``before`` (per stacked key, the episode's newest observation) to the next
        observation of pending ordinal ``o``: 1 where it is ``before`` shifted by one frame; with
        ``further``, the fewest whose shift its stacks agree with (any, past a key's stack).
        ValueError otherwise."""
        cdef Py_ssize_t q, d, s, eb, most = 1
        cdef bint agree
        if further:
            for q in range(self.nkeys):
                if self.has_next[q]:
                    most = max(most, self.stack[q])
        for d in range(1, most + 1):
            agree = True
            for q in range(self.nkeys):
                s, eb = self.stack[q], self.elem_bytes[q]
                if self.has_next[q] and d < s and not _positions_equal(
                        p.next_of(o, q), 0, before[q], d, s - d, self.row_bytes[q] // (s * eb), s, eb):
                    agree = False
                    break
            if agree:
                return d
        raise ValueError(f"field 'next_{self.names[q]}': a next observation no row of the episode holds is not the "
                         "observation before it shifted by one frame (stack_compress)")

    cdef bint _same_nexts(self, FramePlan p, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
        # Whether pending ordinals a and b have the same next observation, for every next_of key.
        cdef Py_ssize_t q
        for q in range(self.nkeys):
            if self.has_next[q] and not self._same(q, p.next_of(a, q), p.next_of(b, q)):
                return False
        return True

    cdef bint _equals_next(self, FramePlan p, Py_ssize_t o, Py_ssize_t i) noexcept nogil:
        # Whether row i's observation is the next observation of pending ordinal o, for every next_of key.
        cdef Py_ssize_t q
        for q in range(self.nkeys):
            if self.has_next[q] and not self._same(q, p.next_of(o, q), self.row(q, p.obs[q], i)):
                return False
        return True


cdef class FramePlan:
    """What :meth:`FramePlanner.plan` decided for one batch; valid while its rows are unchanged."""

    def __cinit__(self):
        self.obs = self.nexts = self._pending = NULL
        self.item_row = self.item_source = self.item_back = self.row_item = self.resolved_item = self._positions = NULL
        self.item_depth = NULL

    cdef _init(self, FramePlanner planner, Py_ssize_t rows, Py_ssize_t earlier, Py_ssize_t extra):
        # An episode ends before each row and after the last; `extra` items more: a resumed
        # episode's older frames, an open end's next frames.
        cdef Py_ssize_t nk = planner.nkeys, most = 2 * rows + 1 + extra
        self.planner = planner
        self.rows, self.earlier = rows, earlier
        self.item_row = <int64_t*>malloc(most * sizeof(int64_t))
        self.item_source = <int64_t*>malloc(most * sizeof(int64_t))
        self.item_back = <int64_t*>malloc(most * sizeof(int64_t))
        self.item_depth = <uint8_t*>malloc(most)
        self.row_item = <int64_t*>malloc(rows * sizeof(int64_t) + 1)
        self.resolved_item = <int64_t*>malloc((earlier + rows) * sizeof(int64_t) + 1)
        self._positions = <int64_t*>malloc(earlier * sizeof(int64_t) + 1)
        self.obs = <Observation*>malloc(nk * sizeof(Observation) + 1)
        self.nexts = <Observation*>malloc(nk * sizeof(Observation) + 1)
        self._pending = <Observation*>malloc(earlier * nk * sizeof(Observation) + 1)
        if not (self.item_row and self.item_source and self.item_back and self.item_depth and self.row_item
                and self.resolved_item and self._positions and self.obs and self.nexts and self._pending):
            raise MemoryError()
        memset(self.nexts, 0, nk * sizeof(Observation))

    def __dealloc__(self):
        free(self.item_row)
        free(self.item_source)
        free(self.item_back)
        free(self.item_depth)
        free(self.row_item)
        free(self.resolved_item)
        free(self._positions)
        free(self.obs)
        free(self.nexts)
        free(self._pending)

    @property
    def row_items(self):
        """Per row, its item (int64 array)."""
        cdef cnp.npy_intp n = self.rows
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        if n:
            memcpy(cnp.PyArray_DATA(out), self.row_item, n * sizeof(int64_t))
        return out

    cdef int64_t item_of(self, Py_ssize_t row) noexcept nogil:
        # The item of a row.
        return self.row_item[row]

    cdef Observation next_of(self, Py_ssize_t o, Py_ssize_t q) noexcept nogil:
        # The next observation of key q of pending ordinal o.
        if o < self.earlier:
            return self._pending[o * self.planner.nkeys + q]
        return self.planner.row(q, self.nexts[q], o - self.earlier)

    cdef int64_t _position(self, Py_ssize_t o, int64_t base) noexcept nogil:
        # Items the writer had written before pending ordinal o.
        if o < self.earlier:
            return self._positions[o]
        return base + self.row_item[o - self.earlier]

