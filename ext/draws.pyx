# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The draw path of a replay table: sample, its torn-row redraws, and priority updates.

A reader draws slots and notes their generations under the lock, gathers rows
without it (ext/gather.pyx), and redraws any row whose generation moved
meanwhile (torn).  Priority updates apply only where the generation is still
the one this handle sampled.  See docs/architecture.md, "Data path" and
"Concurrency protocol".
"""
from libc.math cimport NAN
from libc.stdlib cimport free, malloc
from libc.string cimport memset

cimport numpy as cnp

cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

from mpreplay._ext.atomics cimport _mpreplay_acquire_fence
from mpreplay._ext.gate cimport deadline_of
from mpreplay._ext.gather cimport copy_rows
from mpreplay._ext.handle_state cimport NOT_SAMPLED
from mpreplay._ext.outputs cimport SPARE_MAX_BYTES, is_vector
from mpreplay._ext.schema cimport COMPLETE, SAMPLES, STALE, STORED, TORN, being_written
from mpreplay._ext.selector cimport importance_weights
from mpreplay._ext.slots cimport F_DRAW, F_UPDATE, fault

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


cdef double _draw(TableParts t, HandleState h, int64_t* slots, double* values, uint64_t* gens, Py_ssize_t k,
                  Py_ssize_t nstrata) noexcept nogil:
    # Lock held.  Draw j lands in stratum j of nstrata (nstrata == 1:
    # plain draws over the whole mass); `values` gets the drawn weights.
    # Returns the smallest weight, or NaN once nothing is sampleable.
    cdef Py_ssize_t j, i
    if not t.selector.total() > 0.0:
        return NAN
    t.selector.draw(slots, values, k, nstrata, h.bitgen)
    fault(F_DRAW)
    if t.nrow_lines:
        # The drawn slots are known now: ask for everything the checks below and the copies
        # after the lock read of them at once, so their cache misses overlap instead of
        # each stalling in turn -- what the checks read first.  A line is asked for once:
        # the misses in flight are few (a dozen or two a core), and a prefetch waits for a
        # free one even when its line is already on its way (the PER loop at 1e6, against
        # a prefetch per field and a slot's lines together: 2.52 -> 2.48 times the floor).
        for j in range(k):
            t.slots.prefetch(slots[j])
        for j in range(k):
            for i in range(t.nrow_lines):
                __builtin_prefetch(t.rows[t.row_lines[i]] + slots[j] * t.pitch[t.row_lines[i]])
            if h.record != NULL:
                __builtin_prefetch(&h.record[slots[j]])
    for j in range(k):
        while (not t.slots.holds_row(slots[j])
               or (t.sequences is not None and t.sequences.steps(slots[j]) == 0)):
            # A sampleable slot that is being written or holds no complete
            # transition: a writer died inside its reservation.  Nobody can
            # vouch for the row: retire it and draw again.
            t.slots.retire(slots[j])
            t.selector.fix(slots[j])
            if not t.selector.total() > 0.0:
                return NAN
            slots[j] = t.selector.draw_one(h.bitgen)
        values[j] = t.selector.weight(slots[j])
        gens[j] = t.slots.generation(slots[j])
        if t.slots.max_times:
            t.slots.count_draw(slots[j])  # a later draw of the batch that finds it retired draws again
    return t.selector.smallest()


cdef Py_ssize_t _note_reads(TableParts t, Py_ssize_t s, int64_t* slots, uint64_t* gens) noexcept nogil:
    # Lock held: the frames row s reads and their generations now.
    cdef Py_ssize_t j, c = t.frames.read_set(s, slots)
    for j in range(c):
        gens[j] = t.slots.generation(slots[j])
    return c


cdef void _note_row(TableParts t, Draws* d, Py_ssize_t j) noexcept nogil:
    # Lock held: the frames row j reads, with their generations now, and the
    # steps of a sequence.  The frames a sequence's first step reads are the
    # oldest it reads: guarding them guards every step (see ext/sequences.pyx).
    if d.R:
        d.rcp[j] = _note_reads(t, d.sp[j], d.rsp + j * d.R, d.rgp + j * d.R)
    if t.sequences is not None:
        d.stp[j] = t.sequences.steps(d.sp[j])


cdef double _draw_batch(TableParts t, HandleState h, Draws* d, bint stratified, double deadline, bint copy) except? -1.0:
    # Under the lock, once the rate limiter lets the sample through: draw
    # every row, note what each reads, and with `copy` copy the rows too.
    # Returns the smallest weight.
    cdef Py_ssize_t j
    cdef double vmin
    cdef bint wake
    t.gate.acquire(deadline)
    try:
        while not (t.selector.total() > 0.0 and t.gate.can_sample(d.b)
                   and (t.slots.max_times == 0 or t.header[STORED] >= d.b)):
            if not t.gate.limited():
                if t.selector.total() > 0.0 and t.gate.can_sample(d.b):
                    raise ValueError(f"sample: {d.b} rows asked of a buffer whose rows retire after "
                                     f"max_times_sampled draws, {t.header[STORED]} drawable")
                raise ValueError("sample: the buffer holds no transition yet")
            t.gate.block(deadline, "sample: the rate limiter holds samples back until more is inserted")
        with nogil:  # the descent waits on cache misses: let the caller's other threads run
            vmin = _draw(t, h, d.sp, d.vp, d.gp, d.b, d.b if stratified else 1)
            if vmin == vmin and (d.R or t.sequences is not None):
                for j in range(d.b):
                    _note_row(t, d, j)
            if copy and vmin == vmin:
                copy_rows(t, d, d.b, NULL)
        if vmin != vmin:
            raise ValueError("sample: the buffer holds no transition yet")
        t.header[SAMPLES] += d.b
        wake = t.gate.progress()
    finally:
        t.gate.release()
    if wake:
        t.gate.wake()
    return vmin


cdef Py_ssize_t _find_torn(TableParts t, Draws* d) noexcept nogil:
    # After copying: the rows whose slot (or a frame they read) was rewritten
    # meanwhile go to d.tp; returns how many.
    cdef Py_ssize_t j, f, ntorn = 0
    cdef bint bad
    _mpreplay_acquire_fence()  # the generations must be read after the rows were copied
    for j in range(d.b):
        bad = t.slots.generation(d.sp[j]) != d.gp[j]
        for f in range(d.rcp[j] if d.R else 0):
            bad = bad or t.slots.generation(d.rsp[j * d.R + f]) != d.rgp[j * d.R + f]
        if bad:
            d.tp[ntorn] = j
            ntorn += 1
    return ntorn


cdef double _redraw(TableParts t, HandleState h, Draws* d, Py_ssize_t ntorn, double deadline, bint locked) except? -1.0:
    # Draw the torn rows again; with `locked`, also copy them under the lock.
    # Returns the smallest weight now.
    cdef Py_ssize_t j
    cdef int64_t s1
    cdef double v1, vmin
    cdef uint64_t g1
    t.gate.acquire(deadline)
    try:
        t.header[TORN] += ntorn
        for j in range(ntorn):
            vmin = _draw(t, h, &s1, &v1, &g1, 1, 1)
            if vmin != vmin:
                raise ValueError("sample: the buffer holds no transition any more")
            d.sp[d.tp[j]], d.vp[d.tp[j]], d.gp[d.tp[j]] = s1, v1, g1
            _note_row(t, d, d.tp[j])
        if locked:
            copy_rows(t, d, ntorn, d.tp)
    finally:
        t.gate.release()
    return vmin


cdef dict sample(TableParts t, HandleState h, Py_ssize_t batch_size, bint stratified, double beta, object timeout, dict out,
                 bint leaves, bint float32_weights, bint uint64_indexes):
    # TableHandle.sample: the outputs taken (spare, fresh or `out`), the rows drawn, gathered and checked.
    cdef Py_ssize_t b = batch_size, j, ntorn, rounds = 0
    cdef bint locked
    cdef double vmin, deadline = deadline_of(timeout)
    cdef float* w32
    cdef int64_t* tp
    cdef cnp.npy_intp nb = batch_size
    cdef Draws d
    cdef void* block
    cdef uint64_t local[DRAWS_ON_STACK]
    if b < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size}")
    if t.slots.max_times and b > t.size:
        raise ValueError(f"batch_size: {b} rows could never be stored at once in a buffer of {t.size} whose rows "
                         "retire when drawn (max_times_sampled); sample fewer per call")
    cdef cnp.ndarray indexes, values = None, weights = None
    cdef int index_type = cnp.NPY_UINT64 if uint64_indexes else cnp.NPY_INT64
    cdef int weight_type = cnp.NPY_FLOAT32 if float32_weights else cnp.NPY_FLOAT64
    # Fresh batches of the common kinds (up to SPARE_MAX_BYTES) are reused once their caller let go of them.
    cdef bint reuse = out is None and not leaves and b * t.outputs.batch_row_bytes <= SPARE_MAX_BYTES
    cdef dict result = h.spares.take(b, beta >= 0.0, index_type, weight_type) if reuse else None
    cdef bint spare = result is not None
    if spare:
        indexes = result["indexes"]
        if beta >= 0.0:
            weights = result["weights"]
    else:
        result = (<dict>t.outputs.result_keys[2 if leaves else 1 if beta >= 0.0 else 0]).copy()
        indexes = cnp.PyArray_EMPTY(1, &nb, index_type, 0)
        if leaves:
            values = cnp.PyArray_EMPTY(1, &nb, cnp.NPY_FLOAT64, 0)
        elif beta >= 0.0:
            weights = cnp.PyArray_EMPTY(1, &nb, weight_type, 0)
    if weights is not None and not float32_weights:
        values = weights  # drawn leaf weights become importance weights in place
    block = _draws_block(&d, b, 2 * t.frames.max_stack if t.frames is not None else 0, t.length,
                         t.outputs.n, <int64_t*>cnp.PyArray_DATA(indexes),
                         NULL if values is None else <double*>cnp.PyArray_DATA(values), local)
    try:
        t.outputs.fill(b, out, result, spare, d.dst)  # a bad `out` raises before anything is drawn
        t.gate.check_sample(b)
        # A draw that may retire its rows (max_times_sampled) copies them under the lock: a
        # retired slot is free for the next writer at once, and a row torn there would be lost,
        # not drawn again.
        locked = t.slots.max_times != 0
        vmin = _draw_batch(t, h, &d, stratified, deadline, locked)
        ntorn = 0
        if not locked:
            with nogil:
                copy_rows(t, &d, b, NULL)
                ntorn = _find_torn(t, &d)
        while ntorn:
            rounds += 1
            # After a few unlucky rounds (a small ring lapped while this process
            # was descheduled), copy the redrawn rows under the lock: nobody can
            # reserve a published slot meanwhile, so they cannot tear.
            vmin = _redraw(t, h, &d, ntorn, deadline, rounds > LOCKED_REDRAW_AFTER)
            if rounds > LOCKED_REDRAW_AFTER:
                break
            with nogil:
                copy_rows(t, &d, ntorn, d.tp)
                ntorn = _find_torn(t, &d)
        h.note_sampled(d.sp, d.gp, b)
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
        h.spares.keep(result)
    return result


cdef Py_ssize_t _bad_priority(TableParts t, const double* priorities, Py_ssize_t n) noexcept nogil:
    # The first position whose priority is not finite, >= 0 and at most max_priority, or -1.
    cdef Py_ssize_t j
    for j in range(n):
        if not (priorities[j] >= 0.0 and priorities[j] <= t.selector.max_priority):
            return j
    return -1


cdef int _raise_bad_priority(TableParts t, const double* priorities, Py_ssize_t bad) except -1:
    raise ValueError(f"priorities: expected finite values in [0, {t.selector.max_priority:.3g}], "
                     f"got {priorities[bad]!r} at position {bad}")


cdef int check_priorities(TableParts t, const double[::1] priorities) except -1:
    # ValueError unless every priority is finite, >= 0 and small enough that no sum of
    # leaf weights can overflow.
    cdef Py_ssize_t bad = -1
    if priorities.shape[0]:
        with nogil:
            bad = _bad_priority(t, &priorities[0], priorities.shape[0])
    if bad >= 0:
        _raise_bad_priority(t, &priorities[0], bad)
    return 0


cdef object tags(TableParts t, const int64_t[::1] slots):
    # TableHandle.tags: each slot's publication count now, -1 where a writer holds the slot.
    cdef Py_ssize_t j, n = slots.shape[0]
    cdef cnp.ndarray out = np.empty(n, dtype=np.int64)
    cdef int64_t* op = <int64_t*>cnp.PyArray_DATA(out)
    cdef uint64_t g
    for j in range(n):
        if not 0 <= slots[j] < t.size:
            raise ValueError(f"indexes: expected slots in [0, {t.size}), got {slots[j]} at position {j}")
        g = t.slots.generation(slots[j])
        op[j] = -1 if being_written(g) else <int64_t>(g >> 1)
    return out


cdef Py_ssize_t update(TableParts t, HandleState h, object slots, object priorities) except -2:
    # TableHandle.update: what sample handed out, checked and applied in one critical section, or -1.
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
    t.gate.acquire()
    try:
        with nogil:
            # Checked under the lock, in the one pass before the first change (a uint64
            # slot of 2**63 or more reads as negative here, and is refused).
            for j in range(k):
                if not (0 <= sp[j] < t.size and t.slots.generation(sp[j]) != 0):
                    bad_slot = j
                    break
            bad_priority = _bad_priority(t, pp, k)
            if bad_slot < 0 and bad_priority < 0:
                t.selector.prefetch(sp, k)
                # The live updates go to the selector in chunks, which it weighs as a batch.
                for j in range(k):
                    s = sp[j]
                    g = t.slots.generation(s)
                    rec = h.record[s] if h.record != NULL else NOT_SAMPLED
                    if (t.slots.state_of(s) == COMPLETE and (rec == NOT_SAMPLED or rec == g)
                            and (t.sequences is None or t.sequences.steps(s) > 0)):
                        live_slots[m], live_priorities[m] = s, pp[j]
                        m += 1
                    else:
                        stale += 1
                    if m == UPDATE_CHUNK or (j == k - 1 and m):
                        t.selector.update_items(live_slots, live_priorities, m)
                        m = 0
                        fault(F_UPDATE)
                if k:
                    t.selector.fix_each(sp, k)
                t.header[STALE] += stale
    finally:
        t.gate.release()
    if bad_slot >= 0:
        raise ValueError(f"indexes: expected slots that hold transitions (0 <= slot < {t.size}, "
                         f"written at least once), got {slots[bad_slot]} at position {bad_slot}")
    if bad_priority >= 0:
        _raise_bad_priority(t, pp, bad_priority)
    return stale
