# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The write path of a replay table: reserve, copy, publish.

A writer reserves slots under the lock (generation made odd, weight cleared so the slot
cannot be drawn), copies its rows without the lock, and publishes under the lock
(generation made even, weight set) -- every publication through :func:`publish_locked`,
which gives the reservation up when the lock cannot be had in time.  The adds of exact
arrays (:func:`add_one`: one transition; :func:`add_rows`: a batch, priorities, a timeout,
a compressed writer's steps) stay in C from the call to the publication.  See
docs/architecture.md, "Data path" and "Concurrency protocol".
"""
from libc.math cimport INFINITY
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy
from cpython.dict cimport PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact

cimport numpy as cnp

from mpreplay._ext.frame_planner cimport FramePlan
from mpreplay._ext.gate cimport deadline_of
from mpreplay._ext.processes cimport describe_process, token_pid
from mpreplay._ext.remover cimport SCATTERED, WAIT
from mpreplay._ext.schema cimport LANE_START

import numpy as np

cnp.import_array()


cdef Py_ssize_t reserve_waiting(TableParts t, Py_ssize_t k, uint64_t* reserved, bint insert, double deadline,
                                Py_ssize_t lane, Py_ssize_t skip=0, int64_t* free=NULL) except -3:
    # Reserve k slots where the table's remover places them (an insert; else the run at the
    # cursor), once no live process still writes one of them and (inserts) the rate limiter
    # allows it: returns the start of the run (`skip` past the cursor: a batch longer than the
    # lane), or SCATTERED with the slots in `free` (given only by a writer that can copy into
    # slots anywhere).  A remover that keeps unread rows makes the write wait for room instead.
    cdef int64_t busy = 0
    cdef Py_ssize_t start
    if insert:
        t.gate.check_insert(k)
    t.gate.acquire(deadline)
    try:
        while True:
            if insert and not t.gate.can_insert(k):
                t.gate.block(deadline, "add: the rate limiter holds inserts back until more is sampled")
                continue
            start = t.slots.reserve(k, reserved, insert, lane, skip, free, &busy)
            if start != WAIT:
                return start
            if busy:
                t.gate.block(deadline, f"add: {describe_process(token_pid(busy))} is still writing the next slots")
            else:
                t.gate.block(deadline, f"add: no room for {k} rows: the slots hold items not yet sampled (or "
                             "frames they read) or being written; the queue waits for a sample")
    finally:
        t.gate.release()


cdef Py_ssize_t publish_locked(TableParts t, double deadline, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k,
                               const uint64_t* reserved, const int64_t* slots, const double* priorities,
                               const uint8_t* states,
                               const int64_t* complete, const uint64_t* complete_generations,
                               const double* complete_priorities, Py_ssize_t nc, const int64_t* open_slots,
                               const uint64_t* open_generations, const int64_t* open_steps,
                               const double* open_priorities, Py_ssize_t ns, Py_ssize_t back) except -1:
    # The one critical section that makes a write readable: the k reserved slots published (the
    # run from `start`, or `slots`; states NULL: all COMPLETE; priorities NULL: the stored
    # maximum), the nc WAITING rows they
    # complete, the ns sequences they end; then whoever waits for it is woken.  When the lock
    # cannot be had by the deadline the reservation is given up (Slots.disown) and the error
    # raised: nothing is stored (the lane's cursor back at `back`).  Returns how many slots were
    # lost to a writer that took them over.
    cdef Py_ssize_t lost = 0
    cdef bint wake
    try:
        t.gate.acquire(deadline)
    except BaseException:
        if k:
            t.slots.disown(lane, start, k, reserved, slots, back)
        raise
    try:
        t.slots.note_writer()
        # Earlier calls' rows first: they were added before this call's, and an ordered selector
        # (fifo, lifo, a heap's ties) orders its items by when they enter it.
        if nc:
            t.slots.complete(complete, complete_generations, complete_priorities, nc)
        if k:
            lost = t.slots.publish(lane, start, k, reserved, priorities, states, slots)
        if ns:
            t.slots.open_sequences(open_slots, open_generations, open_steps, open_priorities, ns)
        wake = t.gate.progress()
    finally:
        t.gate.release()
    if wake:
        t.gate.wake()
    return lost


cdef Reservation reserve(TableParts t, Py_ssize_t k, double deadline, bint insert, Py_ssize_t lane, Py_ssize_t skip,
                         bint scatter):
    # TableHandle.reserve, its arguments checked first.
    cdef Reservation r = Reservation.__new__(Reservation)
    cdef Py_ssize_t n = t.slots.lane_length(lane)
    cdef cnp.ndarray free = None
    if not 0 <= k <= n:
        raise ValueError(f"k: expected 0 <= k <= {n} (the lane's length), got {k}")
    if skip and not t.slots.remover.overwrites:
        raise ValueError(f"add: {k + skip} rows at once exceed the queue's size {n}: its unread rows are never "
                         "overwritten; add fewer per call")
    if skip and k != n:
        raise ValueError(f"skip: only a reservation of the whole lane ({n} slots) skips slots, got k={k}")
    r.table, r.lane, r.k = t, lane, k
    r.reserved = np.empty(k, dtype=np.uint64)
    r.back = -1
    if k == 0:  # a publication of what completes earlier rows only
        return r
    if scatter:
        free = np.empty(k, dtype=np.int64)
    r.start = reserve_waiting(t, k, <uint64_t*>cnp.PyArray_DATA(r.reserved), insert, deadline, lane, skip % n,
                              <int64_t*>cnp.PyArray_DATA(free) if scatter else NULL)
    if r.start == SCATTERED:
        r.free, r.start = free, free[0]
    return r


cdef Reservation reserve_room(TableParts t, Py_ssize_t k, double deadline, Py_ssize_t lane):
    # TableHandle.reserve_room: an insert of k slots in the first run of the lane past its cursor
    # that no unread item needs, the cursor moved past it; None when the lane has no such run now
    # or the rate limiter holds inserts back (nothing changed).
    cdef Reservation r = Reservation.__new__(Reservation)
    cdef Py_ssize_t skip, start
    cdef int64_t busy = 0
    if not 0 < k <= t.slots.lane_length(lane):
        raise ValueError(f"k: expected 0 < k <= {t.slots.lane_length(lane)} (the lane's length), got {k}")
    r.table, r.lane, r.k = t, lane, k
    r.reserved = np.empty(k, dtype=np.uint64)
    t.gate.check_insert(k)
    t.gate.acquire(deadline)
    try:
        if not t.gate.can_insert(k):
            return None
        skip = t.slots.find_room(k, lane)
        if skip < 0:
            return None
        r.back = t.slots.lane_cursor(lane)
        start = t.slots.reserve(k, <uint64_t*>cnp.PyArray_DATA(r.reserved), True, lane, skip, NULL, &busy)
    finally:
        t.gate.release()
    if start == WAIT:
        return None
    r.start = start
    return r


cdef class Reservation:
    """Slots a writer reserved (``TableHandle.reserve``), being written: copy the rows into
    :attr:`slots`, then :meth:`publish` them -- or :meth:`abandon` the write.  The one way a
    write reaches the table, whichever store makes it."""

    @property
    def slots(self):
        """The reserved slots, in the order of the rows written into them (int64)."""
        cdef Py_ssize_t lo, n
        if self.free is not None:
            return self.free
        lo, n = self.table.slots.lanes[self.lane, LANE_START], self.table.slots.lane_length(self.lane)
        return lo + (self.start - lo + np.arange(self.k, dtype=np.int64)) % n

    @property
    def scattered(self):
        """Whether the slots lie anywhere (a queue of rows) rather than in a run of their lane."""
        return self.free is not None

    def publish(self, const double[::1] priorities=None, const uint8_t[::1] states=None, double deadline=INFINITY,
                const int64_t[::1] complete=None, const uint64_t[::1] complete_generations=None,
                const double[::1] complete_priorities=None, tuple sequences=None):
        """Make the reserved slots readable: ``states`` (default all COMPLETE) says which hold
        complete transitions; those become sampleable with ``priorities`` (default: the stored
        maximum).  Returns how many slots were lost to a writer that took them over.

        ``complete`` names WAITING transitions (with the generations they were published
        with) whose next frame these slots store: they become COMPLETE in the same critical
        section, with ``complete_priorities`` (NaN: the stored maximum).  ``sequences`` (a
        sequence table's writer): ``(slots, generations, steps, priorities)`` of the sequences
        whose last step is stored once these slots are, opened in the same critical section
        too: one call publishes all that a write makes readable, or nothing.  When the lock
        cannot be had by ``deadline`` the reservation is given up (as :meth:`abandon`) --
        nothing is stored -- and TimeoutError raised."""
        return publish(self.table, self.start, self.reserved, priorities, states, self.lane, deadline, complete,
                       complete_generations, complete_priorities, sequences, self.free, self.rollback())

    def abandon(self):
        """Give the write up, as :meth:`publish` does at a timeout: the slots stay unsampleable,
        free for the next writer."""
        cdef const uint64_t[::1] reserved = self.reserved
        cdef const int64_t[::1] free = self.free
        if self.k:
            self.table.slots.disown(self.lane, self.start, self.k, &reserved[0],
                                    &free[0] if self.free is not None else NULL, self.rollback())

    cdef Py_ssize_t rollback(self):
        # Where the lane's cursor goes back to if the write is given up: before a run made
        # elsewhere in the lane (reserve_room), where the cursor was; else the run's start.
        return self.start if self.back < 0 else self.back


cdef Py_ssize_t _check_sequences(TableParts t, const int64_t[::1] slots, const uint64_t[::1] generations,
                                 const int64_t[::1] steps, const double[::1] priorities) except -1:
    # How many sequences publish() is asked to open, once their description is checked.
    cdef Py_ssize_t n = slots.shape[0], j
    if t.sequences is None:
        raise ValueError("sequences: this table stores transitions, not sequences")
    if generations.shape[0] != n or steps.shape[0] != n or priorities.shape[0] != n:
        raise ValueError("sequences: expected one generation, step count and priority per slot")
    for j in range(n):
        if not (0 <= slots[j] < t.size and 1 <= steps[j] <= t.length):
            raise ValueError(f"sequences: expected a slot in [0, {t.size}) and 1 to {t.length} "
                             f"steps, got {slots[j]} and {steps[j]} at position {j}")
    return n


cdef Py_ssize_t publish(TableParts t, Py_ssize_t start, const uint64_t[::1] reserved, const double[::1] priorities,
                        const uint8_t[::1] states, Py_ssize_t lane, double deadline, const int64_t[::1] complete,
                        const uint64_t[::1] complete_generations, const double[::1] complete_priorities,
                        tuple sequences, const int64_t[::1] slots, Py_ssize_t back) except -1:
    # TableHandle.publish, its arguments checked first.
    cdef Py_ssize_t k = reserved.shape[0], nc = 0 if complete is None else complete.shape[0]
    cdef Py_ssize_t ns = 0, j
    cdef const double* prio = NULL
    cdef const uint8_t* st = NULL
    cdef const double* cprio = NULL
    cdef const int64_t[::1] open_slots
    cdef const uint64_t[::1] open_generations
    cdef const int64_t[::1] open_steps
    cdef const double[::1] open_priorities
    if priorities is not None:
        if priorities.shape[0] != k:
            raise ValueError("priorities: expected one per reserved slot")
        prio = &priorities[0] if k else NULL
    if states is not None:
        if states.shape[0] != k:
            raise ValueError("states: expected one per reserved slot")
        st = &states[0] if k else NULL
    if slots is not None:
        if slots.shape[0] != k:
            raise ValueError("slots: expected one per reserved slot")
        for j in range(k):
            if not 0 <= slots[j] < t.size:
                raise ValueError(f"slots: expected slots in [0, {t.size}), got {slots[j]} at position {j}")
    if nc:
        if complete_generations is None or complete_generations.shape[0] != nc:
            raise ValueError("complete_generations: expected one per slot to complete")
        if complete_priorities is not None:
            if complete_priorities.shape[0] != nc:
                raise ValueError("complete_priorities: expected one per slot to complete")
            cprio = &complete_priorities[0]
    if sequences is not None:
        open_slots, open_generations, open_steps, open_priorities = sequences
        ns = _check_sequences(t, open_slots, open_generations, open_steps, open_priorities)
    if k == 0 and nc == 0 and ns == 0:
        return 0
    return publish_locked(t, deadline, lane, start, k, &reserved[0] if k else NULL,
                          &slots[0] if slots is not None and k else NULL, prio, st,
                          &complete[0] if nc else NULL, &complete_generations[0] if nc else NULL, cprio, nc,
                          &open_slots[0] if ns else NULL, &open_generations[0] if ns else NULL,
                          &open_steps[0] if ns else NULL, &open_priorities[0] if ns else NULL, ns, back)


cdef inline void _copy_staged(TableParts t, HandleState h, Py_ssize_t slot, Py_ssize_t row) noexcept nogil:
    # The staged values of every field of `row` into the slot's rows.
    cdef Py_ssize_t i
    for i in range(t.nfields):
        memcpy(t.rows[i] + slot * t.pitch[i], h.staging.src[i] + row * h.staging.rowbytes[i], t.rowbytes[i])


cdef Py_ssize_t add_one(TableParts t, HandleState h, dict values, double priority, object timeout) except -2:
    # TableHandle.add_one: one transition of Python scalars and exact-dtype arrays, or -1.
    cdef Py_ssize_t slot
    cdef uint64_t reserved
    cdef int64_t free_slot
    cdef double deadline
    if values is None:
        raise TypeError("values: expected a dict of the fields, got None")
    if t.frames is not None or t.sequences is not None or PyDict_Size(values) != t.nfields:
        return -1
    if not h.staging.stage_all(values):
        return -1
    deadline = deadline_of(timeout)
    # One slot: a run of one and a free slot (a queue's) are the same reservation.
    slot = reserve_waiting(t, 1, &reserved, True, deadline, 0, 0, &free_slot)
    if slot == SCATTERED:
        slot = free_slot
    _copy_staged(t, h, slot, 0)
    publish_locked(t, deadline, 0, slot, 1, &reserved, NULL, &priority if priority >= 0.0 else NULL, NULL,
                   NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, slot)
    return slot


cdef bint _take_deadline(object timeout, double* deadline) except -1:
    # The deadline of a timeout the kernel takes as it is: None, or a Python float or int
    # >= 0 and finite.  False: the general path checks it (and names what it expected).
    if timeout is not None and not ((PyFloat_CheckExact(timeout) and 0.0 <= PyFloat_AS_DOUBLE(timeout) < INFINITY)
                                    or (PyLong_CheckExact(timeout) and timeout >= 0)):
        return False
    deadline[0] = deadline_of(timeout)
    return True


cdef bint _take_priorities(TableParts t, object priorities, Py_ssize_t k, double* one,
                           const double** out) except -1:
    # The priorities of k rows as the kernel takes them, into *out (NULL: the stored maximum):
    # None, one Python float for all (written k times into `one`), or an aligned C array of k
    # float64.  False: the general path converts them, or refuses a value out of range by name.
    cdef cnp.ndarray arr
    cdef const double* p
    cdef double top = t.selector.max_priority
    cdef Py_ssize_t j
    if priorities is None:
        out[0] = NULL
        return True
    if PyFloat_CheckExact(priorities):
        if not 0.0 <= PyFloat_AS_DOUBLE(priorities) <= top:  # False for NaN
            return False
        for j in range(k):
            one[j] = PyFloat_AS_DOUBLE(priorities)
        out[0] = one
        return True
    if not cnp.PyArray_CheckExact(priorities):
        return False
    arr = <cnp.ndarray>priorities
    if (cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_DIM(arr, 0) != k or cnp.PyArray_TYPE(arr) != cnp.NPY_DOUBLE
            or not cnp.PyArray_ISCARRAY_RO(arr) or not cnp.PyArray_ISNOTSWAPPED(arr)):
        return False
    p = <const double*>cnp.PyArray_DATA(arr)
    for j in range(k):
        if not 0.0 <= p[j] <= top:
            return False
    out[0] = p
    return True


cdef Py_ssize_t add_rows(TableParts t, HandleState h, dict values, object priorities, object timeout,
                         Episode episode) except -2:
    # TableHandle.add_rows: one transition or a batch of exact-dtype arrays (a compressed table's:
    # after `episode`, the writer's), or -1 -- then nothing changed.  Every check runs before
    # anything is written; what fails one goes to the general path, which converts or refuses it.
    cdef Py_ssize_t k
    cdef double deadline
    cdef const double* prio
    cdef double* one
    if values is None:
        raise TypeError("values: expected a dict of the fields, got None")
    if t.sequences is not None or (t.frames is None) != (episode is None):
        return -1
    if episode is None:
        if PyDict_Size(values) != t.nfields:
            return -1
    elif (PyDict_Size(values) != t.nfields + episode.observations or episode.lane < 0
          or not t.slots.remover.overwrites):  # the general path moves an episode its lane's unread items block
        return -1
    k = h.staging.stage_rows(values)
    if k == 0 or (episode is None and k > t.slots.lane_length(0)):  # more rows than slots: the newest kept
        return -1
    if episode is not None and not episode.take_rows(values, k):
        return -1
    if not _take_deadline(timeout, &deadline):
        return -1
    one = <double*>malloc(k * sizeof(double))
    if one == NULL:
        raise MemoryError()
    try:
        if not _take_priorities(t, priorities, k, one, &prio):
            return -1
        if episode is None:
            return _write_rows(t, h, k, prio, deadline)
        return _write_steps(t, h, k, prio, deadline, episode, values)
    finally:
        free(one)


cdef Py_ssize_t _write_rows(TableParts t, HandleState h, Py_ssize_t k, const double* prio,
                            double deadline) except -2:
    # The k staged rows into k slots of the one lane where the remover places them (a queue's:
    # whichever are free); returns the slot of the first.
    cdef Py_ssize_t j, start
    cdef bint scattered
    cdef uint64_t* reserved = <uint64_t*>malloc(k * (sizeof(uint64_t) + sizeof(int64_t)))
    cdef int64_t* slot = <int64_t*>(reserved + k)
    if reserved == NULL:
        raise MemoryError()
    try:
        start = reserve_waiting(t, k, reserved, True, deadline, 0, 0, slot)
        scattered = start == SCATTERED
        if scattered:
            start = slot[0]
        else:
            for j in range(k):
                slot[j] = t.slots.slot(0, start, j)
        with nogil:
            for j in range(k):
                _copy_staged(t, h, slot[j], j)
        # A run is published (or given up, its lane's cursor put back) as a run.
        publish_locked(t, deadline, 0, start, k, reserved, slot if scattered else NULL, prio, NULL, NULL, NULL, NULL,
                       0, NULL, NULL, NULL, NULL, 0, start)
        return start
    finally:
        free(reserved)


cdef Py_ssize_t _write_steps(TableParts t, HandleState h, Py_ssize_t k, const double* prio, double deadline,
                             Episode episode, dict values) except -2:
    # The k staged steps of a compressed writer's episode, their observations found by take_rows:
    # planned (every stack and next observation checked), copied, published, the episode moved
    # past them; returns the slot of the first row.
    cdef Py_ssize_t i, j, r, n, lane = episode.lane, start, done
    cdef int flag
    cdef FramePlan plan
    cdef uint8_t* flags = <uint8_t*>calloc(k, 1)
    cdef uint64_t* reserved = NULL
    cdef int64_t* slot
    cdef double* item_priority
    cdef uint8_t* states
    if flags == NULL:
        raise MemoryError()
    try:
        for name in episode.flags:
            i = h.staging.names.index(name)
            for r in range(k):
                flag = h.staging.flag_set(i, r)
                if flag < 0:
                    return -1
                flags[r] |= flag
        plan = episode.plan_rows(k, flags, values)
        n = plan.items
        if n == 0 or n > t.slots.lane_length(lane):  # the general path says so
            return -1
        reserved = <uint64_t*>malloc(n * (sizeof(uint64_t) + sizeof(int64_t) + sizeof(double) + 1))
        if reserved == NULL:
            raise MemoryError()
        slot = <int64_t*>(reserved + n)
        item_priority = <double*>(slot + n)
        states = <uint8_t*>(item_priority + n)
        start = reserve_waiting(t, n, reserved, True, deadline, lane)
        for j in range(n):
            slot[j] = t.slots.slot(lane, start, j)
        with nogil:
            episode.copy_frames(plan, slot)
            for r in range(k):
                _copy_staged(t, h, slot[plan.item_of(r)], r)
            done = episode.settle(plan, slot, prio, states, item_priority)
        # A slot lost to a writer that took it over stays unsampleable, as in publish().  Rows
        # published WAITING by earlier calls complete with this publication.
        publish_locked(t, deadline, lane, start, n, reserved, NULL, item_priority if prio != NULL else NULL, states,
                       episode.done_slots, episode.done_generations, episode.done_priorities, done,
                       NULL, NULL, NULL, NULL, 0, start)
        episode.advance_past(plan, slot, reserved, prio)
        return slot[plan.item_of(0)]
    finally:
        free(flags)
        free(reserved)


cdef Py_ssize_t claim_lane(TableParts t, double deadline) except -1:
    # TableHandle.claim_lane: a lane for one writer, under the lock.
    cdef Py_ssize_t lane
    t.gate.acquire(deadline)
    try:
        lane = t.slots.claim_lane()
    finally:
        t.gate.release()
    if lane < 0:
        raise ValueError(f"every one of the buffer's {t.slots.nlanes()} lanes has a live writer: "
                         "create the buffer with lanes= at least the number of writers (processes, "
                         "and streams of episodes written from one process)")
    return lane


cdef int release_lane(TableParts t, Py_ssize_t lane) except -1:
    if not 0 <= lane < t.slots.nlanes():
        raise ValueError(f"lane: expected 0 <= lane < {t.slots.nlanes()}, got {lane}")
    t.slots.release_lane(lane)
    return 0


cdef int clear(TableParts t) except -1:
    # TableHandle.clear: every lane reserved whole (waiting for the slots other processes write), then
    # every lane restarted at its start.
    cdef cnp.ndarray reserved = np.empty(t.size, dtype=np.uint64)
    cdef Py_ssize_t l
    for l in range(t.slots.nlanes()):
        reserve_waiting(t, t.slots.lane_length(l), <uint64_t*>cnp.PyArray_DATA(reserved), False, INFINITY, l)
    t.gate.acquire()
    try:
        t.slots.restart_lanes()
    finally:
        t.gate.release()
    return 0
