# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A replay table's handle: the calls of a table, composed of its parts.

A table is a shared part (ext/table_parts.pyx: a gate, a slot table, a selector and the rows
they govern), which every handle of its memory -- threads, processes -- reads and writes
alike, and a handle's own state (ext/handle_state.pyx: its draws' random stream, its record of
sampled generations, its scratch).  :class:`TableHandle` holds one of each and hands its calls to
the write path (ext/writes.pyx: reserve, copy, publish) and the draw path (ext/draws.pyx:
draw, gather, check for torn rows, update); snapshots are listed here.  See
docs/architecture.md, "Data path" and "Concurrency protocol".

The same code serves the local buffers (a lock of their process) and the shared ones; every
array it touches belongs to the caller's memory (heap or segment).
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t, uint64_t, uint8_t

cimport numpy as cnp

from mpreplay._ext.atomics cimport _mpreplay_acquire_fence
from mpreplay._ext.codec cimport Staging
from mpreplay._ext.episode cimport Episode
from mpreplay._ext.frames cimport MAX_STACK, Frames
from mpreplay._ext.gate cimport Gate
from mpreplay._ext.schema cimport being_written
from mpreplay._ext.outputs cimport Spares
from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.slots cimport Slots
cimport mpreplay._ext.draws as draws
cimport mpreplay._ext.writes as writes

import numpy as np

cnp.import_array()


cdef class TableHandle:
    """A handle of a replay table composed of a gate, a slot table and a selector, over caller-owned arrays.

    Parameters
    ----------
    header : the int64 counters of schema.pxd
    gate : the Gate of the table: its lock and rate limiter
    slots : the Slots of the table: generations, owners, states and lanes
    selector : the Selector that draws slots (PrioritizedSelector; alpha = 0 for uniform replay)
    fields : list of ``(name, array)``; each array is ``(size,) + shape``, C-contiguous
    rng : numpy Generator the draws come from
    frames : Frames of the compressed keys, or None
    frame_outputs : list of ``(name, key, next, shape, dtype)``: sample output ``name`` is key
        ``key``'s observation (``next``: of the next slot) with per-row ``shape``
    sequences : the Sequences of a sequence table, or None.  A sequence table stores
        steps and samples sequences of them: every output gets a second axis of
        ``sequences.length`` steps, and a ``mask`` says which are real (padding is zeros).
    """
    def __init__(self, int64_t[::1] header not None, Gate gate not None, Slots slots not None,
                 Selector selector not None, list fields not None, object rng,
                 Frames frames=None, list frame_outputs=None, Sequences sequences=None):
        self._table = TableParts(header, gate, slots, selector, fields, frames, frame_outputs, sequences)
        self.size = self._table.size
        self._handle = HandleState(self.size, rng, Staging([(name, arr.shape[1:], arr.dtype) for name, arr in fields]),
                              Spares(self._table.outputs))

    def set_rng(self, object rng):
        """Draw from ``rng`` (a numpy Generator) from now on."""
        self._handle.set_rng(rng)

    def after_fork(self, object rng):
        """Become the forked child's handle: its own token, random stream and record of samples."""
        self._table.slots.after_fork()
        self._table.gate.forget_lock()
        self._handle.set_rng(rng)
        self._handle.forget_samples()

    def close(self):
        """Mark the buffer closed for every process and wake all blocked callers (see Gate.close)."""
        self._table.gate.close()

    # -- writers (ext/writes.pyx) ---------------------------------------------
    def reserve(self, Py_ssize_t k, double deadline=INFINITY, bint insert=True, Py_ssize_t lane=0,
                Py_ssize_t skip=0, bint scatter=False):
        """Reserve ``k`` slots of ``lane`` for writing where the table's remover places them;
        returns the :class:`~mpreplay._ext.writes.Reservation` to copy the rows into, then
        publish (or abandon).

        The slots are the run at the lane's cursor (the ring: what a fifo remover replaces),
        or -- ``scatter``, a writer that can copy into slots anywhere -- any free slots a
        remover that keeps unread rows finds.  Waits while another live process is still
        writing one of them, while the remover finds no room, and (``insert``) while the rate
        limiter holds inserts back -- until ``deadline`` (``time.monotonic()`` seconds, see
        :func:`mpreplay._ext.gate.deadline`), then raises TimeoutError, having changed
        nothing.  ``skip``: a reservation of the whole lane starts that many slots past the
        cursor (the newest rows of a batch longer than the lane go where they would have gone
        had all been written).  ``k`` = 0 reserves nothing: its publication completes earlier
        rows only.
        """
        return writes.reserve(self._table, k, deadline, insert, lane, skip, scatter)

    def reserve_room(self, Py_ssize_t k, double deadline=INFINITY, Py_ssize_t lane=0):
        """Reserve ``k`` slots of ``lane`` for an insert in the first run past the lane's cursor
        that holds no unread item nor a frame one reads -- in a table whose remover keeps unread
        items (a compressed Queue or Stack), where a writer whose run at the cursor such items
        hold moves its episode; returns the :class:`~mpreplay._ext.writes.Reservation`, or None
        when there is no such run now or the rate limiter holds inserts back (nothing changed).
        Given up, the reservation puts the cursor back where it was."""
        return writes.reserve_room(self._table, k, deadline, lane)

    @property
    def keeps_unread(self):
        """Whether the table's remover never replaces an unread item (a write waits for room)."""
        return not self._table.slots.remover.overwrites

    def claim_lane(self, double deadline=INFINITY):
        """Take a lane for one writer: a free one, or one whose writer process died.

        A lane never written comes first, so the rows of a writer that finished stay
        until every lane has been used.  A lane this process already holds is not
        free: each writer object of a process (one per stream of episodes) fills a
        lane of its own."""
        return writes.claim_lane(self._table, deadline)

    def release_lane(self, Py_ssize_t lane):
        """Give this process's lane back (its rows stay).  Without the lock, so that
        close() never waits: only the owner clears its own claim."""
        writes.release_lane(self._table, lane)

    def clear(self):
        """Make every slot unsampleable and restart every lane at its start.

        Every slot gets a new generation, so priority updates sampled before
        the clear are stale; slots other processes are writing are waited for.
        """
        writes.clear(self._table)

    def snapshot(self, bint priorities=False):
        """Every complete transition now, oldest first, taken under the lock: lane by lane from
        each cursor, or -- an ordered selector over rows, whose order is the rows' insertion
        order, not their places -- in the order the selector was given them.

        Returns ``(slots, guards, raw, arrivals)``: ``guards`` is what :meth:`unchanged` needs
        to tell, once the rows were copied without the lock, which of them were overwritten
        meanwhile; ``raw`` holds the raw priorities when ``priorities`` (else None);
        ``arrivals`` each row's place in the order the selector was given them (-1 where it
        keeps none, see ``Selector.item_arrival``).
        """
        cdef TableParts t = self._table
        cdef Slots slot_table = t.slots
        cdef Py_ssize_t l, j, n, cursor, s, count = 0, c, f, o, age, best
        cdef int64_t reads[2 * MAX_STACK]
        cdef cnp.ndarray slots = np.empty(self.size, dtype=np.int64)
        cdef cnp.ndarray oldest = np.empty(self.size, dtype=np.int64)
        cdef cnp.ndarray gens = np.empty((self.size, 2), dtype=np.uint64)
        cdef cnp.ndarray arrivals = np.empty(self.size, dtype=np.int64)
        cdef int64_t* ap = <int64_t*>cnp.PyArray_DATA(arrivals)
        cdef int64_t* sp = <int64_t*>cnp.PyArray_DATA(slots)
        cdef int64_t* op = <int64_t*>cnp.PyArray_DATA(oldest)
        cdef uint64_t* gp = <uint64_t*>cnp.PyArray_DATA(gens)
        cdef bint compressed = t.frames is not None
        t.gate.acquire()
        try:
            with nogil:
                for l in range(slot_table.nlanes()):
                    n = slot_table.lane_length(l)
                    cursor = slot_table.lane_cursor(l)
                    for j in range(n):
                        s = slot_table.slot(l, cursor, j)
                        if not slot_table.holds_row(s):
                            continue
                        # A lane is overwritten from its cursor on, oldest first: a
                        # row stays whole while the oldest slot it reads does.
                        o = s
                        if compressed:
                            c = t.frames.read_set(s, reads)
                            best = n
                            for f in range(c):
                                age = ((reads[f] - cursor) % n + n) % n
                                if age < best:
                                    best, o = age, reads[f]
                        sp[count], op[count] = s, o
                        gp[2 * count], gp[2 * count + 1] = slot_table.generation(s), slot_table.generation(o)
                        ap[count] = t.selector.arrival(s)
                        count += 1
            raw = None
            if priorities:
                raw = np.empty(count)
                for j in range(count):
                    raw[j] = t.selector.priority(sp[j])
        finally:
            t.gate.release()
        slots, oldest, gens, arrivals = slots[:count], oldest[:count], gens[:count], arrivals[:count]
        if count and not compressed and t.sequences is None and arrivals[0] >= 0:
            # A compressed lane's rows are its episodes' steps in order; rows stand alone.
            order = np.argsort(arrivals, kind="stable")
            slots, oldest, gens, arrivals = slots[order], oldest[order], gens[order], arrivals[order]
            raw = None if raw is None else raw[order]
        return slots, (oldest, gens), raw, arrivals

    def reorder_last(self, const int64_t[::1] ranks not None):
        """Give the last ``len(ranks)`` items inserted into an ordered selector the places
        ``ranks`` among them (a permutation of ``0..len(ranks) - 1``, in the order they were
        inserted) -- a file's rows, loaded lane by lane, back in the order the saving table was
        given them.  Returns False, and changes nothing, where the selector keeps no order."""
        cdef TableParts t = self._table
        cdef Py_ssize_t m = ranks.shape[0]
        cdef bint done
        if m == 0:
            return True
        t.gate.acquire()
        try:
            with nogil:
                done = t.selector.reorder_last(&ranks[0], m)
        finally:
            t.gate.release()
        return done

    def unchanged(self, const int64_t[::1] slots not None, tuple guards not None):
        """Which rows of a :meth:`snapshot` were not overwritten since (call after copying them)."""
        cdef const int64_t[::1] oldest = guards[0]
        cdef const uint64_t[:, ::1] gens = guards[1]
        cdef Slots slot_table = self._table.slots
        cdef Py_ssize_t j, n = slots.shape[0]
        cdef cnp.ndarray keep = np.empty(n, dtype=np.bool_)
        cdef uint8_t* kp = <uint8_t*>cnp.PyArray_DATA(keep)
        with nogil:
            # The generations must be read after the rows were copied.
            _mpreplay_acquire_fence()
            for j in range(n):
                kp[j] = slot_table.generation(slots[j]) == gens[j, 0] and slot_table.generation(oldest[j]) == gens[j, 1]
        return keep

    def changed_since(self, const uint64_t[::1] generations not None, Py_ssize_t start, Py_ssize_t stop):
        """Which of slots ``start``..``stop - 1`` changed since ``generations`` (every slot's,
        read under the lock: a checkpoint's cut) were read: being written then, or rewritten
        since.  Call once their rows were copied without the lock: a slot not listed held,
        throughout the copy, the row it held at the cut."""
        cdef Slots slot_table = self._table.slots
        cdef Py_ssize_t s
        if generations.shape[0] != self.size or not 0 <= start <= stop <= self.size:
            raise ValueError(f"generations, start, stop: expected one per slot ({self.size}) and a range of slots")
        cdef cnp.ndarray changed = np.empty(stop - start, dtype=np.bool_)
        cdef uint8_t* cp = <uint8_t*>cnp.PyArray_DATA(changed)
        with nogil:
            # The generations must be read after the rows were copied.
            _mpreplay_acquire_fence()
            for s in range(start, stop):
                cp[s - start] = being_written(generations[s]) or slot_table.generation(s) != generations[s]
        return changed

    def repair(self, double deadline=INFINITY):
        """Under the lock, make everything derived agree with the slot states, as the next
        holder does after one died (see Slots.recover): for arrays written from outside the
        table's calls (a restored checkpoint whose cut left rows out)."""
        self._table.gate.acquire(deadline)
        try:
            self._table.slots.recover()
        finally:
            self._table.gate.release()

    def rng_state(self):
        """The state of this handle's random stream (its numpy bit generator's ``state``)."""
        return self._handle._bitgen_owner.state

    cpdef Py_ssize_t add_one(self, dict values, double priority=-1.0, object timeout=None) except -2:
        """Store one transition given as Python scalars and exact-dtype arrays.

        Returns the slot written, or -1 when some value needs the general
        (numpy) conversion path -- then nothing was changed.  A negative
        ``priority`` means "the stored maximum".
        """
        return writes.add_one(self._table, self._handle, values, priority, timeout)

    cpdef Py_ssize_t add_rows(self, dict values, object priorities=None, object timeout=None,
                              Episode episode=None) except -2:
        """Store one transition, or a batch with a leading dimension, of exact-dtype arrays
        (Python scalars for one transition) -- a compressed table's as the steps of the writer
        ``episode``, which must hold a lane -- with ``priorities`` (None: the stored maximum; one
        Python float for all; a C-contiguous float64 array of one per row) within ``timeout``
        seconds (None: no limit): checked, laid out, copied and published in the kernel.

        Returns the slot of the first row, or -1 when the rows need the writer's general path
        (a value that needs numpy's conversion or is refused there, more rows than the lane
        holds, a writer without a lane yet, a sequence table) -- then nothing was changed.
        Raises ValueError, changing nothing, when a stack or next observation cannot be
        rebuilt bit for bit (see ext/episode.pyx); TimeoutError as ``add`` does.
        """
        return writes.add_rows(self._table, self._handle, values, priorities, timeout, episode)

    # -- readers (ext/draws.pyx) -------------------------------------------------
    cpdef dict sample(self, Py_ssize_t batch_size, bint stratified, double beta=-1.0, object timeout=None, dict out=None,
                      bint leaves=False, bint float32_weights=False, bint uint64_indexes=False):
        """Draw ``batch_size`` rows.

        Returns a dict of field arrays plus ``indexes`` and, when
        ``beta >= 0``, importance ``weights`` (v_i / v_min) ** -beta; with
        ``leaves``, instead, each row's ``leaf`` weight v_i and slot ``tags``
        (how many times the slot was published: a rewrite changes it).  Field
        arrays are fresh, or the ones ``out`` holds under the field's name
        (reusing memory spares the page faults of fresh allocations);
        ``float32_weights`` hands the weights out as float32 and ``uint64_indexes``
        the indexes as uint64 (cpprb's types).  Waits at most ``timeout`` seconds
        (None: no limit) while the rate limiter holds samples back, then raises TimeoutError.
        """
        return draws.sample(self._table, self._handle, batch_size, stratified, beta, timeout, out, leaves,
                            float32_weights, uint64_indexes)

    @property
    def max_priority(self):
        """The largest priority :meth:`check_priorities` and :meth:`update` accept."""
        return self._table.selector.max_priority

    def check_priorities(self, const double[::1] priorities not None):
        """Raise ValueError unless every priority is finite, >= 0 and small
        enough that no sum of leaf weights can overflow."""
        draws.check_priorities(self._table, priorities)

    def tags(self, const int64_t[::1] slots not None):
        """The slot tags of ``slots`` now (see :meth:`sample`), -1 where a writer holds the slot."""
        return draws.tags(self._table, slots)

    cpdef Py_ssize_t update(self, object slots, object priorities) except -2:
        """Set priorities of sampled slots; returns how many updates were dropped as stale.

        ``slots`` and ``priorities`` are what :meth:`sample` hands out: a 1-D
        C-contiguous int64 (or uint64) array and a float64 one as long.  Anything else
        returns -1 and changes nothing: the caller converts it and calls again.
        Raises ValueError (changing nothing) for a slot outside the stored
        range or a bad priority.  An update whose slot was overwritten since
        this process sampled it, or is being written now, is dropped.
        """
        return draws.update(self._table, self._handle, slots, priorities)
