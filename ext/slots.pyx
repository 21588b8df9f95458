# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The slot table of a replay table: the lock-held steps of the slot protocol.

Every slot has a generation (even: published, odd: being written), an owner
(the token of the writer holding its reservation) and a state (EMPTY,
COMPLETE, WAITING); slots form lanes, rings a writer fills in order.  The
table (ext/writes.pyx, ext/draws.pyx) takes the lock through its gate and calls these steps;
they keep the stored count and the selector's weights in step with the slot
states, and :func:`recover` makes them agree again after a holder died.  See
docs/architecture.md, "Concurrency protocol" and "Crash handling".
"""
from mpreplay._ext.atomics cimport _atomic_add, _atomic_cas, _atomic_store, _mpreplay_compiler_fence
from mpreplay._ext.processes cimport process_token, token_alive
from mpreplay._ext.remover cimport SCATTERED, WAIT
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.schema cimport (COMPLETE, EMPTY, INSERTS, LANE_CURSOR, LANE_END, LANE_OWNER, LANE_START, MAX_WRITERS,
                                   PENDING_COUNT, PENDING_CURSOR, PENDING_LANE, PENDING_START, RESERVED,
                                   STORED, WAITING,
                                   WRITER_INSERTS, WRITER_TOKEN, being_written, next_reservation)

import os


cdef extern from "<signal.h>" nogil:
    enum: SIGKILL
    int raise_signal "raise"(int sig)

# Fault injection for the crash tests: arm_fault(site, n) makes this process
# SIGKILL itself the n-th time it passes `site` -- inside a critical section,
# with the lock held.  Disarmed, a site costs one load and a predictable branch.
FAULT_SITES = ("reserve", "publish", "complete", "retire", "update", "draw", "open")
cdef int _fault_site = F_NONE
cdef int _fault_countdown = 0


def arm_fault(str site, int after=1):
    """Test hook: SIGKILL this process the ``after``-th time it reaches ``site`` (one of FAULT_SITES)."""
    global _fault_site, _fault_countdown
    if site not in FAULT_SITES or after < 1:
        raise ValueError(f"site: expected one of {FAULT_SITES} and after >= 1, got {site!r}, {after}")
    _fault_countdown = after
    _fault_site = FAULT_SITES.index(site) + 1


cdef void fault(int site) noexcept nogil:
    global _fault_countdown
    if _fault_site == site:
        _fault_countdown -= 1
        if _fault_countdown == 0:
            raise_signal(SIGKILL)


cdef class Slots:
    """The slots of a table over caller-owned arrays (see the segment schema).

    Parameters
    ----------
    header : int64 counters; lanes : (nlanes, LANE_LEN) int64; generation : uint64 per slot;
    owner : int64 per slot (writer token, 0: none); state : uint8 per slot;
    writers : (MAX_WRITERS, WRITER_LEN) int64, the inserts of each writer process
    selector : the table's Selector (its weights follow the slot states)
    remover : the table's Remover (where a write goes: what it replaces, or whether it waits)
    frames : the Frames of a compressed table, or None
    sequences : the Sequences of a sequence table (the selector's items are sequences,
        weighed by :meth:`open_sequences`), or None (its items are the slots, weighed on publication)
    times_sampled, max_times : an int64 per slot counting its draws since it was published, and the
        draws after which it retires (Reverb's max_times_sampled); None and 0: items never retire so
    """

    def __init__(self, int64_t[::1] header not None, int64_t[:, ::1] lanes not None,
                 uint64_t[::1] generation not None, int64_t[::1] owner not None, uint8_t[::1] state not None,
                 int64_t[:, ::1] writers not None, Selector selector not None, Remover remover not None,
                 Frames frames=None, Sequences sequences=None, int64_t[::1] times_sampled=None,
                 int64_t max_times=0):
        self.header = header
        self.remover = remover
        if max_times and (times_sampled is None or times_sampled.shape[0] != generation.shape[0]):
            raise ValueError("times_sampled: expected an int64 count per slot with max_times")
        self._times_keep = times_sampled
        self.times_sampled = &times_sampled[0] if max_times else NULL
        self.max_times = max_times
        self.writers = writers
        self.writer_row = -1
        self.lanes = lanes
        self.gen = generation
        self.owner = owner
        self.state = state
        self.selector = selector
        self.frames = frames
        self.sequences = sequences
        self.size = generation.shape[0]
        self.token = process_token(os.getpid())

    def after_fork(self):
        """In a forked child: write as this process."""
        self.token = process_token(os.getpid())
        self.writer_row = -1

    def recover(self):
        """With the lock held, after its previous holder died: make everything derived agree
        with the slots again (the lock's ``on_recover``).

        A holder killed inside a critical section may have left a reservation half made, a
        slot half published, the stored count a step behind the slot states, and the
        selector's sums stale.  A reservation in progress (the header's pending run) is
        finished as far as the slots go: every slot of its run retires and the lane's cursor
        moves where the reservation would have left it -- otherwise rows it had not
        reached yet would sit behind the cursor, newest in the ring's order though oldest in
        fact.  Rows whose generation is odd were being written: they become unsampleable, and so
        do the rows that read a frame of theirs.
        Then every item that may not be drawn is cleared from the selector, which rebuilds
        what it derives, and the stored count -- which the rate limiter reads -- is
        recounted.  The cumulative counters (inserts, samples, reservations) change by single
        stores and cannot be torn.  In a sequence table an item is a sequence: only slots
        where one starts may keep their weight.  With ``max_times_sampled``, an item drawn
        that many times retires, as the draw that reached the count would have retired it.
        See docs/architecture.md, "Crash handling".
        """
        cdef Py_ssize_t s, j, lane, start, k, stored = 0
        with nogil:
            k = self.header[PENDING_COUNT]
            if k > 0:
                lane, start = self.header[PENDING_LANE], self.header[PENDING_START]
                for j in range(k):
                    self.state[self.slot(lane, start, j)] = EMPTY
                self.lanes[lane, LANE_CURSOR] = self.header[PENDING_CURSOR]
                self.header[PENDING_COUNT] = 0
            for s in range(self.size):
                if being_written(self.gen[s]):
                    self.state[s] = EMPTY
                if self.max_times and self.times_sampled[s] >= self.max_times:
                    self.state[s] = EMPTY
            if self.frames is not None:
                # A write completes the rows its frames end before it publishes those frames (in
                # one critical section): a holder killed between the two leaves them reading a
                # frame never published.
                for lane in range(self.nlanes()):
                    for s in range(self.lanes[lane, LANE_START], self.lanes[lane, LANE_END]):
                        if being_written(self.gen[s]):
                            self.retire_readers(lane, s)
            for s in range(self.size):
                if self.state[s] == COMPLETE:
                    stored += 1
                if self.state[s] != COMPLETE or (self.sequences is not None and self.sequences.steps(s) == 0):
                    self.selector.remove_item(s)
                    if self.sequences is not None:
                        self.sequences.close(s)
            self.header[STORED] = stored
            self.selector.rebuild()

    cdef int note_writer(self) except -1:
        # Lock held, before a publish: find this process's row of `writers`, or take a free
        # one (never used, or whose writer is gone).  Once per writer process: the
        # liveness checks read /proc.
        cdef Py_ssize_t r, free = -1
        cdef int64_t t
        if self.writer_row == -2 or (self.writer_row >= 0
                                     and self.writers[self.writer_row, WRITER_TOKEN] == self.token):
            return 0
        for r in range(MAX_WRITERS):
            t = self.writers[r, WRITER_TOKEN]
            if t == self.token:
                self.writer_row = r
                return 0
            if free < 0 and (t == 0 or not token_alive(t)):
                free = r
        if free >= 0:
            self.writers[free, WRITER_INSERTS] = 0
            self.writers[free, WRITER_TOKEN] = self.token
        self.writer_row = free if free >= 0 else -2
        return 0

    cdef Py_ssize_t slot(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t j) noexcept nogil:
        # The slot j places after `start` in `lane`.
        cdef Py_ssize_t lo = self.lanes[lane, LANE_START], n = self.lanes[lane, LANE_END] - lo
        return lo + ((start - lo + j) % n + n) % n

    cdef void fix_run(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept nogil:
        # selector.fix of the k slots after `start` in `lane`: one run, or two where the lane wraps.
        cdef Py_ssize_t lo = self.lanes[lane, LANE_START], end = self.lanes[lane, LANE_END], head
        if k <= 0:
            return
        if k >= end - lo:
            self.selector.fix_range(lo, end - 1)
            return
        head = min(k, end - start)
        self.selector.fix_range(start, start + head - 1)
        if k > head:
            self.selector.fix_range(lo, lo + k - head - 1)

    cdef Py_ssize_t run_at_cursor(self, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* busy) except -3:
        # Lock held: the start of the run of k slots `skip` past the lane's cursor, or WAIT with
        # `busy` the token of another process still writing one of them (it was lapped: its copy
        # cannot be stopped, so the slots are not handed out again until it publishes -- or
        # dies).  A dead writer's reservations there are taken over.
        cdef Py_ssize_t start = self.lanes[lane, LANE_CURSOR], j, s
        cdef int64_t owner
        if skip:
            start = self.slot(lane, start, skip)
        busy[0] = 0
        for j in range(k):
            s = self.slot(lane, start, j)
            owner = self.owner[s]
            if being_written(self.gen[s]) and owner != 0 and owner != self.token:
                if token_alive(owner):
                    busy[0] = owner
                    return WAIT
                self.owner[s] = 0
        return start

    cdef bint find_free(self, Py_ssize_t k, Py_ssize_t lane, int64_t* free) except -1:
        # Lock held: the first k slots of the lane, from its cursor on, that hold no row and
        # that no live writer holds, wherever they lie, into `free`, taking over a dead
        # writer's reservations on the way; False: fewer than k are free now.  The slot states
        # are the only count this reads, so a writer killed after reserving holds its slots
        # only until the next writer looks.
        cdef Py_ssize_t n = self.lane_length(lane), cursor = self.lanes[lane, LANE_CURSOR], j, s, found = 0
        if k == 0:
            return True
        for j in range(n):
            s = self.slot(lane, cursor, j)
            if being_written(self.gen[s]) and self.owner[s] != 0 and not token_alive(self.owner[s]):
                self.owner[s] = 0
            if self.state[s] == EMPTY and (not being_written(self.gen[s]) or self.owner[s] == 0):
                free[found] = s
                found += 1
                if found == k:
                    return True
        return False

    cdef bint unread(self, Py_ssize_t lane, Py_ssize_t s) noexcept nogil:
        # Lock held: whether slot s of the lane holds an item -- a complete row -- or a frame one
        # reads.  A WAITING row is no item: its episode was given up (a writer that died, started
        # over or moved on), or it is this lane's writer's own, whose next frame is still to come.
        cdef Py_ssize_t i, r
        if self.state[s] == COMPLETE:
            return True
        if self.frames is not None:
            for i in range(-self.frames.max_next - self.frames.max_stack, self.frames.max_stack):
                r = self.slot(lane, s, i)
                if r != s and self.state[r] == COMPLETE and self.frames.reads(r, s):
                    return True
        return False

    cdef Py_ssize_t free_run(self, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip) noexcept nogil:
        # Lock held: how many of the k slots from `skip` past the lane's cursor come before the
        # first that is unread (k: none is).
        cdef Py_ssize_t start = self.slot(lane, self.lanes[lane, LANE_CURSOR], skip), j
        for j in range(k):
            if self.unread(lane, self.slot(lane, start, j)):
                return j
        return k

    cdef Py_ssize_t find_room(self, Py_ssize_t k, Py_ssize_t lane) except -2:
        # Lock held: the fewest slots past the lane's cursor after which k slots in a row are
        # neither unread nor held by a live writer of another process; -1: there are none.  One
        # pass over the lane, counting the free slots in a row.
        cdef Py_ssize_t n = self.lane_length(lane), cursor = self.lanes[lane, LANE_CURSOR], j, s, run = 0
        cdef int64_t owner
        if k > n:
            return -1
        for j in range(n + k - 1):
            s = self.slot(lane, cursor, j)
            owner = self.owner[s]
            if self.unread(lane, s) or (being_written(self.gen[s]) and owner != 0 and owner != self.token
                                        and token_alive(owner)):
                run = 0
            else:
                run += 1
                if run == k:
                    return (j - k + 1) % n
        return -1

    cdef Py_ssize_t claim_lane(self) except -2:
        # Lock held: take a lane for a writer of this process, a free one or one whose writer
        # died; -1: every lane has a live writer.  A lane never written comes first, so the
        # rows of a writer that finished stay until every lane has been used.
        cdef Py_ssize_t l, free = -1
        cdef int64_t token
        for l in range(self.lanes.shape[0]):
            token = self.lanes[l, LANE_OWNER]
            if token == 0 or not token_alive(token):
                if self.gen[self.lanes[l, LANE_START]] == 0:
                    free = l
                    break
                if free < 0:
                    free = l
        if free >= 0:
            self.lanes[free, LANE_OWNER] = self.token
        return free

    cdef void release_lane(self, Py_ssize_t lane) noexcept nogil:
        # Without the lock, so that close() never waits: only the owner clears its own claim.
        cdef int64_t mine = self.token
        _atomic_cas(&self.lanes[lane, LANE_OWNER], &mine, 0)

    cdef void restart_lanes(self) noexcept nogil:
        # Lock held, every slot reserved by this process (clear): no slot has an owner, every
        # lane starts again at its start.
        cdef Py_ssize_t s, l
        for s in range(self.size):
            self.owner[s] = 0
        for l in range(self.lanes.shape[0]):
            self.lanes[l, LANE_CURSOR] = self.lanes[l, LANE_START]

    cdef void retire(self, Py_ssize_t s) noexcept nogil:
        # Lock held.  The transition at s (or the sequence starting there) stops
        # being sampleable (no fix_up).
        if self.state[s] == COMPLETE:
            self.header[STORED] -= 1
            fault(F_RETIRE)
        self.state[s] = EMPTY
        self.selector.remove_item(s)
        if self.sequences is not None:
            self.sequences.close(s)

    cdef void count_draw(self, Py_ssize_t s) noexcept nogil:
        # Lock held, max_times set: one more draw of s, which retires it at the count.  The count
        # is stored first: a holder killed between the two leaves recover() to retire it.
        self.times_sampled[s] += 1
        if self.times_sampled[s] >= self.max_times:
            self.retire(s)
            self.selector.fix(s)

    cdef void retire_readers(self, Py_ssize_t lane, Py_ssize_t s) noexcept nogil:
        # Lock held, slot s about to be overwritten: retire every row whose
        # rebuilt observations read its frame.  They lie within the next
        # offsets before s and the stack after it in the lane.
        cdef Py_ssize_t j, r
        for j in range(-self.frames.max_next - self.frames.max_stack, self.frames.max_stack):
            r = self.slot(lane, s, j)
            if r != s and self.state[r] != EMPTY and self.frames.reads(r, s):
                self.retire(r)
                self.selector.fix(r)

    cdef uint64_t _take(self, Py_ssize_t s) noexcept nogil:
        # Lock held: slot s reserved by this process; returns its odd generation.  Odd
        # generation + no weight: nobody samples the slot now.
        cdef uint64_t g = next_reservation(self.gen[s])
        self.gen[s] = g
        fault(F_RESERVE)
        self.owner[s] = self.token
        if self.times_sampled != NULL:
            self.times_sampled[s] = 0
        self.retire(s)
        return g

    cdef Py_ssize_t reserve(self, Py_ssize_t k, uint64_t* reserved, bint insert, Py_ssize_t lane,
                            Py_ssize_t skip, int64_t* free, int64_t* busy) except -3:
        # Lock held: reserve the k slots the remover places the write in (an insert; else the
        # run at the cursor, as clear() takes whole lanes): returns the start of the run, or
        # SCATTERED (the slots are in `free`), or WAIT (nothing changed but dead writers'
        # reservations taken over; `busy`: a live writer still copying, 0: unread items).
        # A run is written into the header before its first slot changes, so a holder killed
        # midway leaves recover() enough to finish it (see Slots.recover).
        cdef Py_ssize_t start, j, s, cursor
        start = self.remover.place(self, k, lane, skip, free, busy) if insert else self.run_at_cursor(k, lane, skip, busy)
        if start == WAIT:
            return WAIT
        if start == SCATTERED:
            for j in range(k):
                reserved[j] = self._take(free[j])
                self.selector.fix(free[j])
            if k:
                self.lanes[lane, LANE_CURSOR] = self.slot(lane, free[k - 1], 1)
        else:
            cursor = self.remover.cursor_after(self, lane, start, k) if insert else self.slot(lane, start, k)
            self.header[PENDING_LANE] = lane
            self.header[PENDING_START] = start
            self.header[PENDING_CURSOR] = cursor
            self.header[PENDING_COUNT] = k
            _mpreplay_compiler_fence()  # the run is written before any slot changes
            self.lanes[lane, LANE_CURSOR] = cursor
            for j in range(k):
                s = self.slot(lane, start, j)
                if self.frames is not None:
                    self.retire_readers(lane, s)
                reserved[j] = self._take(s)
            self.fix_run(lane, start, k)
            _mpreplay_compiler_fence()  # and cleared once every slot has
            self.header[PENDING_COUNT] = 0
        if insert:
            # Atomic: disown() gives an insert back without the lock.
            _atomic_add(&self.header[RESERVED], k)
        return start

    cdef Py_ssize_t publish(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k, const uint64_t* reserved,
                             const double* priorities, const uint8_t* states, const int64_t* slots) noexcept nogil:
        # Lock held.  Slot j of the reservation (the run from `start`, or slots[j] when given:
        # reserve_free's) becomes states[j] (all COMPLETE when NULL); only complete ones get a
        # leaf.  Returns how many slots were lost to a writer that took them over meanwhile
        # (only after judging this one dead): their rows may be mixed, so they stay unsampleable.
        cdef Py_ssize_t j, s, lost = 0, inserted = 0
        cdef uint64_t g
        cdef uint8_t st
        cdef double p, default = self.selector.default_priority()
        for j in range(k):
            s = self.slot(lane, start, j) if slots == NULL else slots[j]
            g = self.gen[s]
            st = COMPLETE if states == NULL else states[j]
            if g == reserved[j]:
                self.gen[s] = g + 1
                self.owner[s] = 0
                self.state[s] = st
                # NaN: none given (a moved episode's rows again, see mpreplay/waiting_rows.py).
                p = priorities[j] if priorities != NULL and priorities[j] == priorities[j] else default
                if st == COMPLETE:
                    if self.sequences is None:
                        self.selector.insert_item(s, p)
                    fault(F_PUBLISH)
                    self.header[STORED] += 1
                    self.header[INSERTS] += 1
                    inserted += 1
                elif st == WAITING:
                    self.header[INSERTS] += 1
                    inserted += 1
            else:
                self.gen[s] = next_reservation(g)
                self.retire(s)
                lost += 1
        if slots == NULL:
            self.fix_run(lane, start, k)
        else:
            self.selector.fix_each(slots, k)
        if self.writer_row >= 0:
            self.writers[self.writer_row, WRITER_INSERTS] += inserted
        return lost

    cdef Py_ssize_t complete(self, const int64_t* slots, const uint64_t* generations, const double* priorities,
                              Py_ssize_t n) noexcept nogil:
        # Lock held.  WAITING transitions whose next frame is stored now become
        # COMPLETE; a slot rewritten or retired meanwhile is skipped.
        cdef Py_ssize_t j, s, done = 0
        cdef double p, default = self.selector.default_priority()
        for j in range(n):
            s = slots[j]
            if self.gen[s] == generations[j] and self.state[s] == WAITING:
                p = priorities[j] if priorities != NULL and priorities[j] == priorities[j] else default
                self.state[s] = COMPLETE
                fault(F_COMPLETE)
                self.header[STORED] += 1
                if self.sequences is None:
                    self.selector.insert_item(s, p)
                    self.selector.fix(s)
                done += 1
        return done

    cdef Py_ssize_t open_sequences(self, const int64_t* slots, const uint64_t* generations, const int64_t* steps,
                                   const double* priorities, Py_ssize_t n) noexcept nogil:
        # Lock held.  Sequences whose last step is stored become sampleable: the one
        # starting at slots[j] has steps[j] real steps, all COMPLETE (its writer, the only
        # one of its lane, checked that).  One whose first slot was rewritten or retired
        # meanwhile is skipped.  NaN priority: the largest stored.
        cdef Py_ssize_t j, s, opened = 0
        cdef double p, default = self.selector.default_priority()
        for j in range(n):
            s = slots[j]
            if self.gen[s] == generations[j] and self.state[s] == COMPLETE:
                p = priorities[j] if priorities != NULL and priorities[j] == priorities[j] else default
                self.sequences.open(s, steps[j])
                fault(F_OPEN)
                self.selector.insert_item(s, p)
                self.selector.fix(s)
                opened += 1
        return opened

    cdef void disown(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k, const uint64_t* reserved,
                     const int64_t* slots, Py_ssize_t back) noexcept nogil:
        # Without the lock: give up this process's reservation of an insert that is not
        # made after all (the run from `start`, or `slots`).  The slots stay unsampleable
        # (odd generation, EMPTY) and free for the next writer (no other process writes the
        # owner of a slot a live writer holds); the rate limiter stops counting the insert; a
        # run's lane cursor goes back to `back` (where it was before the reservation: the run's
        # start, unless the run was made elsewhere in the lane) unless a writer reserved after it
        # (so a compressed lane keeps no gap for its stacks to read across).  The rows the slots
        # held before stay retired.
        cdef Py_ssize_t j, s
        cdef int64_t end = self.slot(lane, start, k)
        for j in range(k):
            s = self.slot(lane, start, j) if slots == NULL else slots[j]
            if self.gen[s] == reserved[j] and self.owner[s] == self.token:
                _atomic_store(&self.owner[s], 0)
        if k:
            _atomic_add(&self.header[RESERVED], -k)
            if slots == NULL:
                _atomic_cas(&self.lanes[lane, LANE_CURSOR], &end, back)
