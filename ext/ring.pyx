# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A replay table: a gate, a slot table and a selector, with the rows they govern.

A writer reserves slots under the lock (generation made odd, weight cleared
so the slot cannot be drawn), copies its rows without the lock, and
publishes under the lock (generation made even, weight set).  A reader draws
slots and notes their generations under the lock, gathers rows without it,
and redraws any row whose generation moved meanwhile (torn).  Priority
updates apply only where the generation is still the one that was sampled.
See docs/architecture.md, "Concurrency protocol".

The same code serves the local buffers (a lock of their process) and the shared ones; every
array it touches belongs to the caller's memory (heap or segment).
"""
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

cimport numpy as cnp

cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

from mpreplay._ext.atomics cimport _mpreplay_acquire_fence
from mpreplay._ext.codec cimport Staging
from mpreplay._ext.frame_plan cimport Episode
from mpreplay._ext.frames cimport MAX_STACK, Frames
from mpreplay._ext.gate cimport Gate, deadline_of
from mpreplay._ext.handle cimport NOT_SAMPLED, Handle
from mpreplay._ext.outputs cimport SPARE_MAX_BYTES, Spares, is_vector
from mpreplay._ext.schema cimport COMPLETE, LANE_CURSOR, LANE_END, LANE_START, SAMPLES, STALE, TORN, being_written
from mpreplay._ext.selector cimport Selector, importance_weights
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.slots cimport F_DRAW, F_UPDATE, Slots, fault
from mpreplay._ext.table cimport Table
cimport mpreplay._ext.writes as writes

import numpy as np

cnp.import_array()

cdef int LOCKED_REDRAW_AFTER = 4  # rounds of torn rows before redrawn rows are copied under the lock

cdef enum:
    UPDATE_CHUNK = 64        # update() hands the selector this many live updates at a time
    # A sample's scratch of up to this many words (a batch of ~100 uncompressed rows) lives on
    # the stack: a block just past the allocator's per-thread cache costs 50 ns to malloc.
    DRAWS_ON_STACK = 512


cdef void* _draws_block(Draws* d, Py_ssize_t b, Py_ssize_t R, Py_ssize_t L, Py_ssize_t nout,
                        int64_t* slots, double* values, uint64_t* local) except NULL:
    # Lay d out in one block (every part is 8-byte words): `local` (DRAWS_ON_STACK words) where
    # it fits, else a fresh one.  `values` NULL: the weights go in the block too.  The caller
    # frees the block unless it is `local`.
    cdef Py_ssize_t words = 4 * b + L + 2 * b * R + nout + (b if values == NULL else 0)
    cdef uint64_t* block = local if words <= DRAWS_ON_STACK else <uint64_t*>malloc(words * sizeof(uint64_t) + 1)
    if block == NULL:
        raise MemoryError()
    d.b, d.R, d.sp = b, R, slots
    d.gp = block
    d.tp = <Py_ssize_t*>(d.gp + b)
    d.stp = <int64_t*>(d.tp + b)
    d.rcp = <Py_ssize_t*>(d.stp + b)
    d.window = <int64_t*>(d.rcp + b)
    d.rsp = <int64_t*>(d.window + L)
    d.rgp = <uint64_t*>(d.rsp + b * R)
    d.dst = <uint8_t**>(d.rgp + b * R)
    d.vp = values if values != NULL else <double*>(d.dst + nout)
    memset(d.stp, 0, 2 * b * sizeof(int64_t))  # steps and frame counts: 0 until noted
    return block


cdef class Ring:
    """A replay table composed of a gate, a slot table and a selector, over caller-owned arrays.

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
        self._table = Table(header, gate, slots, selector, fields, frames, frame_outputs, sequences)
        self.size = self._table.size
        self._handle = Handle(self.size, rng, Staging([(name, arr.shape[1:], arr.dtype) for name, arr in fields]),
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
                Py_ssize_t skip=0):
        """Reserve the next ``k`` slots of ``lane`` for writing; returns ``(start, reserved_generations)``.

        Waits while another live process is still writing one of them, and
        (``insert``) while the rate limiter holds inserts back -- until
        ``deadline`` (``time.monotonic()`` seconds, see :func:`mpreplay._ext.gate.deadline`), then
        raises TimeoutError, having changed nothing.  ``skip``: a reservation of the whole
        lane starts that many slots past the cursor (the newest rows of a batch longer than
        the lane go where they would have gone had all been written).
        """
        return writes.reserve(self._table, k, deadline, insert, lane, skip)

    def publish(self, Py_ssize_t start, const uint64_t[::1] reserved not None, const double[::1] priorities=None,
                const uint8_t[::1] states=None, Py_ssize_t lane=0, double deadline=INFINITY,
                const int64_t[::1] complete=None, const uint64_t[::1] complete_generations=None,
                const double[::1] complete_priorities=None, tuple sequences=None):
        """Make slots reserved by :meth:`reserve` (for inserts) readable: ``states`` (default all
        COMPLETE) says which hold complete transitions; those become sampleable with
        ``priorities`` (default: the stored maximum).  Returns how many slots were lost to a
        writer that took them over.

        ``complete`` names WAITING transitions (with the generations they were published
        with) whose next frame these slots store: they become COMPLETE in the same
        critical section, with ``complete_priorities`` (NaN: the stored maximum).
        ``sequences`` (a sequence table's writer): ``(slots, generations, steps, priorities)``
        of the sequences whose last step is stored once these slots are, opened in the same
        critical section too (see :meth:`Slots.open_sequences`): one call publishes all
        that a write makes readable, or nothing.  When the lock cannot be had by
        ``deadline`` the reservation is given up and undone (``Slots.disown``) -- nothing is
        stored -- and TimeoutError raised.
        """
        return writes.publish(self._table, start, reserved, priorities, states, lane, deadline, complete,
                              complete_generations, complete_priorities, sequences)

    def abandon(self, Py_ssize_t start, const uint64_t[::1] reserved not None, Py_ssize_t lane=0):
        """Give up an insert reserved by :meth:`reserve`, as :meth:`publish` does at a timeout
        (``Slots.disown``): the slots stay unsampleable, free for the next writer."""
        if reserved.shape[0]:
            self._table.slots.disown(lane, start, reserved.shape[0], &reserved[0])

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
        """Every complete transition now, oldest first (lane by lane), taken under the lock.

        Returns ``(slots, guards, raw)``: ``guards`` is what :meth:`unchanged` needs to tell,
        once the rows were copied without the lock, which of them were overwritten
        meanwhile; ``raw`` holds the raw priorities when ``priorities`` (else None).
        """
        cdef Py_ssize_t l, j, n, lo, cursor, s, count = 0, c, t, o, age, best
        cdef int64_t reads[2 * MAX_STACK]
        cdef cnp.ndarray slots = np.empty(self.size, dtype=np.int64)
        cdef cnp.ndarray oldest = np.empty(self.size, dtype=np.int64)
        cdef cnp.ndarray gens = np.empty((self.size, 2), dtype=np.uint64)
        cdef int64_t* sp = <int64_t*>cnp.PyArray_DATA(slots)
        cdef int64_t* op = <int64_t*>cnp.PyArray_DATA(oldest)
        cdef uint64_t* gp = <uint64_t*>cnp.PyArray_DATA(gens)
        cdef bint compressed = self._table.frames is not None
        self._table.gate.acquire()
        try:
            with nogil:
                for l in range(self._table.slots.lanes.shape[0]):
                    lo = self._table.slots.lanes[l, LANE_START]
                    n = self._table.slots.lanes[l, LANE_END] - lo
                    cursor = self._table.slots.lanes[l, LANE_CURSOR]
                    for j in range(n):
                        s = lo + (cursor - lo + j) % n
                        if self._table.slots.state[s] != COMPLETE or being_written(self._table.slots.gen[s]):
                            continue
                        # A lane is overwritten from its cursor on, oldest first: a
                        # row stays whole while the oldest slot it reads does.
                        o = s
                        if compressed:
                            c = self._table.frames.read_set(s, reads)
                            best = n
                            for t in range(c):
                                age = ((reads[t] - cursor) % n + n) % n
                                if age < best:
                                    best, o = age, reads[t]
                        sp[count], op[count] = s, o
                        gp[2 * count], gp[2 * count + 1] = self._table.slots.gen[s], self._table.slots.gen[o]
                        count += 1
            raw = None
            if priorities:
                raw = np.empty(count)
                for j in range(count):
                    raw[j] = self._table.selector.priority(sp[j])
        finally:
            self._table.gate.release()
        return slots[:count], (oldest[:count], gens[:count]), raw

    def unchanged(self, const int64_t[::1] slots not None, tuple guards not None):
        """Which rows of a :meth:`snapshot` were not overwritten since (call after copying them)."""
        cdef const int64_t[::1] oldest = guards[0]
        cdef const uint64_t[:, ::1] gens = guards[1]
        cdef Py_ssize_t j, n = slots.shape[0]
        cdef cnp.ndarray keep = np.empty(n, dtype=np.bool_)
        cdef uint8_t* kp = <uint8_t*>cnp.PyArray_DATA(keep)
        with nogil:
            # The generations must be read after the rows were copied.
            _mpreplay_acquire_fence()
            for j in range(n):
                kp[j] = self._table.slots.gen[slots[j]] == gens[j, 0] and self._table.slots.gen[oldest[j]] == gens[j, 1]
        return keep

    cpdef Py_ssize_t add_one(self, dict values, double priority=-1.0, object timeout=None) except -2:
        """Store one transition given as Python scalars and exact-dtype arrays.

        Returns the slot written, or -1 when some value needs the general
        (numpy) conversion path -- then nothing was changed.  A negative
        ``priority`` means "the stored maximum".
        """
        return writes.add_one(self._table, self._handle, values, priority, timeout)

    def add_step(self, dict values not None, double priority, timeout, Episode episode not None):
        """Store one step of a compressed writer's episode, given as Python scalars and
        exact-dtype arrays: checked, laid out, copied and published in the kernel.

        Returns the step's slot, or -1 when it needs the writer's general path (a value
        that needs numpy's conversion, a writer without a lane yet, a sequence table)
        -- then nothing was changed.  Raises ValueError, changing nothing, when a stack
        or next observation cannot be rebuilt bit for bit (see ext/frame_plan.pyx).
        A negative ``priority`` means "the stored maximum".
        """
        return writes.add_step(self._table, self._handle, values, priority, timeout, episode)

    # -- readers ----------------------------------------------------------------
    cdef double _draw(self, int64_t* slots, double* values, uint64_t* gens, Py_ssize_t k,
                      Py_ssize_t nstrata) noexcept nogil:
        # Lock held.  Draw j lands in stratum j of nstrata (nstrata == 1:
        # plain draws over the whole mass); `values` gets the drawn weights.
        # Returns the smallest weight, or NaN once nothing is sampleable.
        cdef Py_ssize_t j, i
        if not self._table.selector.total() > 0.0:
            return NAN
        self._table.selector.draw(slots, values, k, nstrata, self._handle.bitgen)
        fault(F_DRAW)
        if self._table.nrow_lines:
            # The drawn slots are known now: ask for everything the checks below and the copies
            # after the lock read of them at once, so their cache misses overlap instead of
            # each stalling in turn -- what the checks read first.  A line is asked for once:
            # the misses in flight are few (a dozen or two a core), and a prefetch waits for a
            # free one even when its line is already on its way (the PER loop at 1e6, against
            # a prefetch per field and a slot's lines together: 2.52 -> 2.48 times the floor).
            for j in range(k):
                __builtin_prefetch(&self._table.slots.gen[slots[j]])
                __builtin_prefetch(&self._table.slots.state[slots[j]])
            for j in range(k):
                for i in range(self._table.nrow_lines):
                    __builtin_prefetch(self._table.rows[self._table.row_lines[i]] + slots[j] * self._table.pitch[self._table.row_lines[i]])
                if self._handle.record != NULL:
                    __builtin_prefetch(&self._handle.record[slots[j]])
        for j in range(k):
            while (being_written(self._table.slots.gen[slots[j]]) or self._table.slots.state[slots[j]] != COMPLETE
                   or (self._table.sequences is not None and self._table.sequences.steps(slots[j]) == 0)):
                # A sampleable slot that is being written or holds no complete
                # transition: a writer died inside its reservation.  Nobody can
                # vouch for the row: retire it and draw again.
                self._table.slots.retire(slots[j])
                self._table.selector.fix(slots[j])
                if not self._table.selector.total() > 0.0:
                    return NAN
                slots[j] = self._table.selector.draw_one(self._handle.bitgen)
            values[j] = self._table.selector.weight(slots[j])
            gens[j] = self._table.slots.gen[slots[j]]
        return self._table.selector.smallest()

    cdef void _gather(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
        # Copy rows (all k, or only rows[0..k) of the batch) without the lock.  Values of
        # 4, 8 and 16 bytes (scalars, small vectors: the common fields) are copied
        # with a constant size, which compiles to plain loads and stores.
        cdef Py_ssize_t i, j, r, rb, pitch
        cdef const uint8_t* src
        cdef uint8_t* dst
        for i in range(self._table.nfields):
            rb, pitch, src, dst = self._table.rowbytes[i], self._table.pitch[i], self._table.rows[i], d.dst[i]
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

    cdef Py_ssize_t _note_reads(self, Py_ssize_t s, int64_t* slots, uint64_t* gens) noexcept nogil:
        # Lock held: the frames row s reads and their generations now.
        cdef Py_ssize_t j, c = self._table.frames.read_set(s, slots)
        for j in range(c):
            gens[j] = self._table.slots.gen[slots[j]]
        return c

    cdef void _gather_frames(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
        # Rebuild the compressed observations of rows (all k, or rows[0..k)) without the lock.
        # Row by row, every output of the row together: obs and next_obs share all frames but
        # one, so the second rebuild reads them from cache instead of memory.
        cdef Py_ssize_t o, p, j, r, u, nf = self._table.nfields, n = self._table.outputs.n - self._table.nfields
        for j in range(k):
            r = rows[j] if rows != NULL else j
            for o in range(n):
                p = self._table.outputs.frame_partner[o]
                if p >= 0:  # a stack and the next one, in one pass over their frames
                    self._table.frames.rebuild_pair(self._table.outputs.frame_keys[o], d.sp[r], d.dst[nf + o] + r * self._table.outputs.step_bytes[nf + o],
                                              d.dst[nf + p] + r * self._table.outputs.step_bytes[nf + p])
                elif p == -1:
                    u = self._table.frames._nxt[d.sp[r]] if self._table.outputs.frame_next[o] else d.sp[r]
                    self._table.frames.rebuild(self._table.outputs.frame_keys[o], u, d.dst[nf + o] + r * self._table.outputs.step_bytes[nf + o])

    cdef double _draw_batch(self, Draws* d, bint stratified, double deadline) except? -1.0:
        # Under the lock, once the rate limiter lets the sample through: draw
        # every row, note what each reads.  Returns the smallest weight.
        cdef Py_ssize_t j
        cdef double vmin
        cdef bint wake
        self._table.gate.acquire(deadline)
        try:
            while not (self._table.selector.total() > 0.0 and self._table.gate.can_sample(d.b)):
                if not self._table.gate.limited():
                    raise ValueError("sample: the buffer holds no transition yet")
                self._table.gate.block(deadline, "sample: the rate limiter holds samples back until more is inserted")
            with nogil:  # the descent waits on cache misses: let the caller's other threads run
                vmin = self._draw(d.sp, d.vp, d.gp, d.b, d.b if stratified else 1)
                if vmin == vmin and (d.R or self._table.sequences is not None):
                    for j in range(d.b):
                        self._note_row(d, j)
            if vmin != vmin:
                raise ValueError("sample: the buffer holds no transition yet")
            self._table.header[SAMPLES] += d.b
            wake = self._table.gate.progress()
        finally:
            self._table.gate.release()
        if wake:
            self._table.gate.wake()
        return vmin

    cdef void _note_row(self, Draws* d, Py_ssize_t j) noexcept nogil:
        # Lock held: the frames row j reads, with their generations now, and the
        # steps of a sequence.  The frames a sequence's first step reads are the
        # oldest it reads: guarding them guards every step (see ext/sequences.pyx).
        if d.R:
            d.rcp[j] = self._note_reads(d.sp[j], d.rsp + j * d.R, d.rgp + j * d.R)
        if self._table.sequences is not None:
            d.stp[j] = self._table.sequences.steps(d.sp[j])

    cdef Py_ssize_t _find_torn(self, Draws* d) noexcept nogil:
        # After copying: the rows whose slot (or a frame they read) was rewritten
        # meanwhile go to d.tp; returns how many.
        cdef Py_ssize_t j, t, ntorn = 0
        cdef bint bad
        _mpreplay_acquire_fence()  # the generations must be read after the rows were copied
        for j in range(d.b):
            bad = self._table.slots.gen[d.sp[j]] != d.gp[j]
            for t in range(d.rcp[j] if d.R else 0):
                bad = bad or self._table.slots.gen[d.rsp[j * d.R + t]] != d.rgp[j * d.R + t]
            if bad:
                d.tp[ntorn] = j
                ntorn += 1
        return ntorn

    cdef double _redraw(self, Draws* d, Py_ssize_t ntorn, double deadline, bint locked) except? -1.0:
        # Draw the torn rows again; with `locked`, also copy them under the lock.
        # Returns the smallest weight now.
        cdef Py_ssize_t j
        cdef int64_t s1
        cdef double v1, vmin
        cdef uint64_t g1
        self._table.gate.acquire(deadline)
        try:
            self._table.header[TORN] += ntorn
            for j in range(ntorn):
                vmin = self._draw(&s1, &v1, &g1, 1, 1)
                if vmin != vmin:
                    raise ValueError("sample: the buffer holds no transition any more")
                d.sp[d.tp[j]], d.vp[d.tp[j]], d.gp[d.tp[j]] = s1, v1, g1
                self._note_row(d, d.tp[j])
            if locked:
                self._copy_rows(d, ntorn, d.tp)
        finally:
            self._table.gate.release()
        return vmin

    cdef void _copy_rows(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
        if self._table.sequences is not None:
            self._gather_sequences(d, k, rows)
            return
        self._gather(d, k, rows)
        if self._table.frames is not None:
            self._gather_frames(d, k, rows)

    cdef void _gather_sequences(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil:
        # Copy the steps of sequences (all k, or rows[0..k)) without the lock, step
        # by step every output together; padding steps become zeros, the mask says so.
        cdef Py_ssize_t L = self._table.length, nf = self._table.nfields, no = self._table.outputs.n - self._table.nfields - 1
        cdef Py_ssize_t i, o, j, r, t, n, u, at, rb
        cdef Py_ssize_t n_out = nf + no
        cdef uint8_t* mask = d.dst[n_out]
        for j in range(k):
            r = rows[j] if rows != NULL else j
            n = d.stp[r]
            self._table.sequences.window(d.sp[r], n, d.window)
            for t in range(L):
                at = r * L + t
                mask[at] = t < n
                if t >= n:
                    for i in range(n_out):
                        memset(d.dst[i] + at * self._table.outputs.step_bytes[i], 0, self._table.outputs.step_bytes[i])
                    continue
                u = d.window[t]
                for i in range(nf):
                    rb = self._table.outputs.step_bytes[i]
                    memcpy(d.dst[i] + at * rb, self._table.rows[i] + u * self._table.pitch[i], rb)
                for o in range(no):
                    self._table.frames.rebuild(self._table.outputs.frame_keys[o], self._table.frames._nxt[u] if self._table.outputs.frame_next[o] else u,
                                         d.dst[nf + o] + at * self._table.outputs.step_bytes[nf + o])

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
        cdef Py_ssize_t b = batch_size, j, ntorn, rounds = 0
        cdef double vmin, deadline = deadline_of(timeout)
        cdef float* w32
        cdef int64_t* tp
        cdef cnp.npy_intp nb = batch_size
        cdef Draws d
        cdef void* block
        cdef uint64_t local[DRAWS_ON_STACK]
        if b < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size}")
        cdef cnp.ndarray indexes, values = None, weights = None
        cdef int index_type = cnp.NPY_UINT64 if uint64_indexes else cnp.NPY_INT64
        cdef int weight_type = cnp.NPY_FLOAT32 if float32_weights else cnp.NPY_FLOAT64
        # Small fresh batches of the common kinds are reused once their caller let go of them.
        cdef bint reuse = out is None and not leaves and b * self._table.outputs.batch_row_bytes <= SPARE_MAX_BYTES
        cdef dict result = self._handle.spares.take(b, beta >= 0.0, index_type, weight_type) if reuse else None
        cdef bint spare = result is not None
        if spare:
            indexes = result["indexes"]
            if beta >= 0.0:
                weights = result["weights"]
        else:
            result = (<dict>self._table.outputs.result_keys[2 if leaves else 1 if beta >= 0.0 else 0]).copy()
            indexes = cnp.PyArray_EMPTY(1, &nb, index_type, 0)
            if leaves:
                values = cnp.PyArray_EMPTY(1, &nb, cnp.NPY_FLOAT64, 0)
            elif beta >= 0.0:
                weights = cnp.PyArray_EMPTY(1, &nb, weight_type, 0)
        if weights is not None and not float32_weights:
            values = weights  # drawn leaf weights become importance weights in place
        block = _draws_block(&d, b, 2 * self._table.frames.max_stack if self._table.frames is not None else 0, self._table.length,
                             self._table.outputs.n, <int64_t*>cnp.PyArray_DATA(indexes),
                             NULL if values is None else <double*>cnp.PyArray_DATA(values), local)
        try:
            self._table.outputs.fill(b, out, result, spare, d.dst)  # a bad `out` raises before anything is drawn
            self._table.gate.check_sample(b)
            vmin = self._draw_batch(&d, stratified, deadline)
            with nogil:
                self._copy_rows(&d, b, NULL)
                ntorn = self._find_torn(&d)
            while ntorn:
                rounds += 1
                # After a few unlucky rounds (a small ring lapped while this process
                # was descheduled), copy the redrawn rows under the lock: nobody can
                # reserve a published slot meanwhile, so they cannot tear.
                vmin = self._redraw(&d, ntorn, deadline, rounds > LOCKED_REDRAW_AFTER)
                if rounds > LOCKED_REDRAW_AFTER:
                    break
                with nogil:
                    self._copy_rows(&d, ntorn, d.tp)
                    ntorn = self._find_torn(&d)
            self._handle.note_sampled(d.sp, d.gp, b)
            if not spare:
                result["indexes"] = indexes
            if leaves:
                result["leaf"] = values
                tags = cnp.PyArray_EMPTY(1, &nb, cnp.NPY_INT64, 0)
                tp = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>tags)
                for j in range(b):
                    tp[j] = <int64_t>(d.gp[j] >> 1)
                result["tags"] = tags
            elif beta >= 0.0:
                importance_weights(vmin, d.vp, b, beta)
                if float32_weights:
                    w32 = <float*>cnp.PyArray_DATA(weights)
                    for j in range(b):
                        w32[j] = <float>d.vp[j]
                if not spare:
                    result["weights"] = weights
        finally:
            if block != <void*>local:
                free(block)
        if reuse:
            self._handle.spares.keep(result)
        return result

    @property
    def max_priority(self):
        """The largest priority :meth:`check_priorities` and :meth:`update` accept."""
        return self._table.selector.max_priority

    cdef Py_ssize_t _bad_priority(self, const double* priorities, Py_ssize_t n) noexcept nogil:
        # The first position whose priority is not finite, >= 0 and at most max_priority, or -1.
        cdef Py_ssize_t j
        for j in range(n):
            if not (priorities[j] >= 0.0 and priorities[j] <= self._table.selector.max_priority):
                return j
        return -1

    cdef int _raise_bad_priority(self, const double* priorities, Py_ssize_t bad) except -1:
        raise ValueError(f"priorities: expected finite values in [0, {self._table.selector.max_priority:.3g}], "
                         f"got {priorities[bad]!r} at position {bad}")

    def check_priorities(self, const double[::1] priorities not None):
        """Raise ValueError unless every priority is finite, >= 0 and small
        enough that no sum of leaf weights can overflow."""
        cdef Py_ssize_t bad = -1
        if priorities.shape[0]:
            with nogil:
                bad = self._bad_priority(&priorities[0], priorities.shape[0])
        if bad >= 0:
            self._raise_bad_priority(&priorities[0], bad)

    def tags(self, const int64_t[::1] slots not None):
        """The slot tags of ``slots`` now (see :meth:`sample`), -1 where a writer holds the slot."""
        cdef Py_ssize_t j, n = slots.shape[0]
        cdef cnp.ndarray out = np.empty(n, dtype=np.int64)
        cdef int64_t* op = <int64_t*>cnp.PyArray_DATA(out)
        cdef uint64_t g
        for j in range(n):
            if not 0 <= slots[j] < self.size:
                raise ValueError(f"indexes: expected slots in [0, {self.size}), got {slots[j]} at position {j}")
            g = self._table.slots.gen[slots[j]]
            op[j] = -1 if being_written(g) else <int64_t>(g >> 1)
        return out

    cpdef Py_ssize_t update(self, object slots, object priorities) except -2:
        """Set priorities of sampled slots; returns how many updates were dropped as stale.

        ``slots`` and ``priorities`` are what :meth:`sample` hands out: a 1-D
        C-contiguous int64 (or uint64) array and a float64 one as long.  Anything else
        returns -1 and changes nothing: the caller converts it and calls again.
        Raises ValueError (changing nothing) for a slot outside the stored
        range or a bad priority.  An update whose slot was overwritten since
        this process sampled it, or is being written now, is dropped.
        """
        cdef Py_ssize_t k, j, s, m = 0, stale = 0, bad_slot = -1, bad_priority = -1
        cdef uint64_t g, rec
        cdef int64_t live_slots[UPDATE_CHUNK]
        cdef double live_priorities[UPDATE_CHUNK]
        cdef const int64_t* sp
        cdef const double* pp
        if not ((is_vector(slots, cnp.NPY_INT64) or is_vector(slots, cnp.NPY_UINT64))
                and is_vector(priorities, cnp.NPY_FLOAT64)
                and cnp.PyArray_DIM(<cnp.ndarray>slots, 0) == cnp.PyArray_DIM(<cnp.ndarray>priorities, 0)):
            return -1
        k = cnp.PyArray_DIM(<cnp.ndarray>slots, 0)
        sp = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>slots)
        pp = <const double*>cnp.PyArray_DATA(<cnp.ndarray>priorities)
        self._table.gate.acquire()
        try:
            with nogil:
                # Checked under the lock, in the one pass before the first change (a uint64
                # slot of 2**63 or more reads as negative here, and is refused).
                for j in range(k):
                    if not (0 <= sp[j] < self.size and self._table.slots.gen[sp[j]] != 0):
                        bad_slot = j
                        break
                bad_priority = self._bad_priority(pp, k)
                if bad_slot < 0 and bad_priority < 0:
                    self._table.selector.prefetch(sp, k)
                    # The live updates go to the selector in chunks, which it weighs as a batch.
                    for j in range(k):
                        s = sp[j]
                        g = self._table.slots.gen[s]
                        rec = self._handle.record[s] if self._handle.record != NULL else NOT_SAMPLED
                        if (self._table.slots.state[s] == COMPLETE and (rec == NOT_SAMPLED or rec == g)
                                and (self._table.sequences is None or self._table.sequences.steps(s) > 0)):
                            live_slots[m], live_priorities[m] = s, pp[j]
                            m += 1
                        else:
                            stale += 1
                        if m == UPDATE_CHUNK or (j == k - 1 and m):
                            self._table.selector.set_each(live_slots, live_priorities, m)
                            m = 0
                            fault(F_UPDATE)
                    if k:
                        self._table.selector.fix_each(sp, k)
                    self._table.header[STALE] += stale
        finally:
            self._table.gate.release()
        if bad_slot >= 0:
            raise ValueError(f"indexes: expected slots that hold transitions (0 <= slot < {self.size}, "
                             f"written at least once), got {slots[bad_slot]} at position {bad_slot}")
        if bad_priority >= 0:
            self._raise_bad_priority(pp, bad_priority)
        return stale
