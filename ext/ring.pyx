# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A replay table: a gate, a slot table and a selector, with the rows they govern.

A writer reserves slots under the lock (generation made odd, weight cleared
so the slot cannot be drawn), copies its rows without the lock, and
publishes under the lock (generation made even, weight set).  A reader draws
slots and notes their generations under the lock, gathers rows without it,
and redraws any row whose generation moved meanwhile (torn).  Priority
updates apply only where the generation is still the one that was sampled.
See docs/architecture.md, "Concurrency protocol".

The same code serves the local buffers (no lock) and the shared ones; every
array it touches belongs to the caller's memory (heap or segment).
"""
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.dict cimport PyDict_GetItem, PyDict_Size
from cpython.ref cimport PyObject

cimport numpy as cnp
from numpy.random cimport bitgen_t

from mpreplay._ext.atomics cimport _atomic_cas, _mpreplay_acquire_fence
from mpreplay._ext.frame_plan cimport Episode, FramePlan
from mpreplay._ext.frames cimport MAX_STACK, Frames
from mpreplay._ext.gate cimport Gate, deadline_of
from mpreplay._ext.schema cimport (COMPLETE, LANE_CURSOR, LANE_END, LANE_OWNER, LANE_START, SAMPLES, STALE, TORN,
                                   WAITING, being_written)
from mpreplay._ext.selector cimport Selector, importance_weight
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.slots cimport F_DRAW, F_UPDATE, Slots, fault

import os

import numpy as np

from mpreplay._ext.processes import describe_process, token_alive, token_pid

cnp.import_array()

cdef uint64_t NOT_SAMPLED = 0xFFFFFFFFFFFFFFFFULL
cdef int LOCKED_REDRAW_AFTER = 4  # rounds of torn rows before redrawn rows are copied under the lock

cdef bint _narrow_to_float(const double* src, float* dst, Py_ssize_t n) noexcept nogil:
    # False when a finite value would overflow float32: the general path then says so.
    cdef Py_ssize_t j
    cdef double x
    for j in range(n):
        x = src[j]
        if not (-FLT_MAX <= x <= FLT_MAX or x != x or x == INFINITY or x == -INFINITY):
            return False
        dst[j] = <float>x
    return True


# Compressed observations a row may have (obs and next_obs of each compressed key).
cdef enum:
    MAX_FRAME_OUTPUTS = 64


# Element kinds the single-transition fast path converts without numpy.
cdef enum Kind:
    K_OTHER, K_F32, K_F64, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_BOOL


cdef Kind _kind_of(object dtype):
    cdef dict kinds = {
        "f4": K_F32, "f8": K_F64, "i1": K_I8, "i2": K_I16, "i4": K_I32, "i8": K_I64,
        "u1": K_U8, "u2": K_U16, "u4": K_U32, "u8": K_U64, "b1": K_BOOL,
    }
    return kinds.get(f"{dtype.kind}{dtype.itemsize}", K_OTHER)


cdef bint _store_int(Kind kind, long long x, uint8_t* dst) noexcept nogil:
    """Write integer ``x`` as ``kind``; False if it does not fit."""
    if kind == K_F32:
        (<float*>dst)[0] = <float>x
    elif kind == K_F64:
        (<double*>dst)[0] = <double>x
    elif kind == K_I64:
        (<int64_t*>dst)[0] = x
    elif kind == K_I32 and -2147483648LL <= x <= 2147483647LL:
        (<int*>dst)[0] = <int>x
    elif kind == K_I16 and -32768 <= x <= 32767:
        (<short*>dst)[0] = <short>x
    elif kind == K_I8 and -128 <= x <= 127:
        (<signed char*>dst)[0] = <signed char>x
    elif kind == K_U8 and 0 <= x <= 255:
        dst[0] = <uint8_t>x
    elif kind == K_U16 and 0 <= x <= 65535:
        (<unsigned short*>dst)[0] = <unsigned short>x
    elif kind == K_U32 and 0 <= x <= 4294967295LL:
        (<unsigned int*>dst)[0] = <unsigned int>x
    elif kind == K_U64 and x >= 0:
        (<uint64_t*>dst)[0] = <uint64_t>x
    elif kind == K_BOOL and (x == 0 or x == 1):
        dst[0] = <uint8_t>x
    else:
        return False
    return True


cdef object _checked_out(dict out, str name, tuple shape, object dtype):
    arr = out[name]
    if not (isinstance(arr, np.ndarray) and arr.shape == shape and arr.dtype == dtype
            and arr.flags.c_contiguous and arr.flags.writeable):
        raise ValueError(f"out[{name!r}]: expected a writable C-contiguous {dtype} array of shape {shape}")
    return arr


cdef class _Draws:
    """The scratch of one sample() call: the slots drawn with their weights and
    generations, the rows found torn, (compressed buffers) the R frames at
    most that each row reads, with their generations, and (sequence tables) the
    real steps of each sequence drawn."""
    cdef Py_ssize_t b, R
    cdef cnp.ndarray slots, values, gens, torn, read_slots, read_gens, read_counts, steps
    cdef int64_t* sp
    cdef int64_t* stp
    cdef double* vp
    cdef uint64_t* gp
    cdef Py_ssize_t* tp
    cdef int64_t* rsp
    cdef uint64_t* rgp
    cdef Py_ssize_t* rcp

    def __cinit__(self, Py_ssize_t b, Py_ssize_t R):
        cdef cnp.npy_intp n = b, nr = b * R
        self.b, self.R = b, R
        self.slots = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        self.values = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT64, 0)
        self.gens = cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT64, 0)
        self.torn = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INTP, 0)
        self.sp = <int64_t*>cnp.PyArray_DATA(self.slots)
        self.vp = <double*>cnp.PyArray_DATA(self.values)
        self.gp = <uint64_t*>cnp.PyArray_DATA(self.gens)
        self.tp = <Py_ssize_t*>cnp.PyArray_DATA(self.torn)
        self.steps = cnp.PyArray_ZEROS(1, &n, cnp.NPY_INT64, 0)
        self.stp = <int64_t*>cnp.PyArray_DATA(self.steps)
        self.rsp, self.rgp, self.rcp = NULL, NULL, NULL
        if R:
            self.read_slots = cnp.PyArray_EMPTY(1, &nr, cnp.NPY_INT64, 0)
            self.read_gens = cnp.PyArray_EMPTY(1, &nr, cnp.NPY_UINT64, 0)
            self.read_counts = cnp.PyArray_ZEROS(1, &n, cnp.NPY_INTP, 0)
            self.rsp = <int64_t*>cnp.PyArray_DATA(self.read_slots)
            self.rgp = <uint64_t*>cnp.PyArray_DATA(self.read_gens)
            self.rcp = <Py_ssize_t*>cnp.PyArray_DATA(self.read_counts)


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
    cdef int64_t[::1] _header
    cdef Frames _frames
    cdef Sequences _sequences
    cdef Py_ssize_t _length      # steps per sampled item: 1, or a sequence's length
    cdef list _frame_outputs
    cdef Gate _gate
    cdef Slots _slots
    cdef Selector _selector
    cdef readonly Py_ssize_t size
    cdef list _names, _shapes, _dtypes, _stages
    cdef Py_ssize_t _nfields
    cdef uint8_t** _dst
    cdef uint8_t** _stage
    cdef const uint8_t** _src    # per field, during add_one: the row to copy (a caller's array or the stage)
    cdef Py_ssize_t* _rowbytes
    cdef Kind* _kinds
    cdef bint* _one              # per field: shape (1,), which a number or a 0-d array fills
    cdef int* _typenums
    cdef object _bitgen_owner
    cdef bitgen_t* _bitgen
    cdef object _sampled
    cdef object _fields_keepalive

    def __cinit__(self):
        self._dst = NULL
        self._stage = NULL
        self._src = NULL
        self._rowbytes = NULL
        self._kinds = NULL
        self._one = NULL
        self._typenums = NULL

    def __init__(self, int64_t[::1] header not None, Gate gate not None, Slots slots not None,
                 Selector selector not None, list fields not None, object rng,
                 Frames frames=None, list frame_outputs=None, Sequences sequences=None):
        cdef Py_ssize_t i, n = len(fields)
        self._header = header
        self._frames = frames
        self._sequences = sequences
        self._length = 1 if sequences is None else sequences.length
        self._frame_outputs = frame_outputs or []
        if len(self._frame_outputs) > MAX_FRAME_OUTPUTS:
            raise ValueError(f"next_of/stack_compress: at most {MAX_FRAME_OUTPUTS} compressed observations "
                             f"per row, got {len(self._frame_outputs)}")
        self._gate = gate
        self._slots = slots
        self._selector = selector
        self.size = slots.size
        self._nfields = n
        self._names, self._shapes, self._dtypes, self._stages = [], [], [], []
        self._dst = <uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self._stage = <uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self._src = <const uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self._rowbytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._kinds = <Kind*>malloc(n * sizeof(Kind) + 1)
        self._typenums = <int*>malloc(n * sizeof(int) + 1)
        self._one = <bint*>malloc(n * sizeof(bint) + 1)
        if not (self._dst and self._stage and self._src and self._rowbytes and self._kinds and self._typenums
                and self._one):
            raise MemoryError()
        for i, (name, arr) in enumerate(fields):
            if not (isinstance(arr, np.ndarray) and arr.flags.c_contiguous and arr.shape[0] == self.size):
                raise ValueError(f"field {name!r}: expected a C-contiguous array of {self.size} rows")
            stage = np.zeros(arr.shape[1:], dtype=arr.dtype)
            self._names.append(name)
            self._shapes.append(arr.shape[1:])
            self._dtypes.append(arr.dtype)
            self._stages.append(stage)
            self._dst[i] = <uint8_t*>cnp.PyArray_DATA(arr)
            self._stage[i] = <uint8_t*>cnp.PyArray_DATA(stage)
            self._rowbytes[i] = stage.nbytes
            self._kinds[i] = _kind_of(arr.dtype)
            self._one[i] = arr.shape[1:] == (1,)
            self._typenums[i] = arr.dtype.num
        self._fields_keepalive = [arr for _, arr in fields]
        self.set_rng(rng)
        self._sampled = None

    def __dealloc__(self):
        free(self._dst)
        free(self._stage)
        free(self._src)
        free(self._rowbytes)
        free(self._kinds)
        free(self._typenums)
        free(self._one)

    def set_rng(self, object rng):
        """Draw from ``rng`` (a numpy Generator) from now on."""
        bitgen = rng.bit_generator
        self._bitgen = <bitgen_t*>PyCapsule_GetPointer(bitgen.capsule, "BitGenerator")
        self._bitgen_owner = bitgen

    def after_fork(self, object rng):
        """Become the forked child's handle: its own token, random stream and record of samples."""
        self._slots.after_fork()
        self._gate.forget_lock()
        self.set_rng(rng)
        self._sampled = None

    def close(self):
        """Mark the buffer closed for every process and wake all blocked callers (see Gate.close)."""
        self._gate.close()

    # -- writers ----------------------------------------------------------------
    cdef Py_ssize_t _reserve_waiting(self, Py_ssize_t k, uint64_t* reserved, bint insert,
                                     double deadline, Py_ssize_t lane) except -1:
        # Reserve k slots once no live process still writes one of them and
        # (for inserts) the rate limiter allows it.
        cdef int64_t blocker
        cdef Py_ssize_t s
        if insert:
            self._gate.check_insert(k)
        self._gate.acquire(deadline)
        try:
            while True:
                blocker = self._slots.busy_owner(k, lane)
                if blocker != 0 and not token_alive(blocker):
                    for s in range(self.size):
                        if self._slots.owner[s] == blocker:
                            self._slots.owner[s] = 0
                    continue
                if blocker == 0 and (not insert or self._gate.can_insert(k)):
                    return self._slots.reserve(k, reserved, insert, lane)
                self._gate.block(deadline, f"add: {describe_process(token_pid(blocker))} is still writing the next slots"
                            if blocker else "add: the rate limiter holds inserts back until more is sampled")
        finally:
            self._gate.release()

    def reserve(self, Py_ssize_t k, double deadline=INFINITY, bint insert=True, Py_ssize_t lane=0):
        """Reserve the next ``k`` slots of ``lane`` for writing; returns ``(start, reserved_generations)``.

        Waits while another live process is still writing one of them, and
        (``insert``) while the rate limiter holds inserts back -- until
        ``deadline`` (``time.monotonic()`` seconds, see :func:`mpreplay._ext.gate.deadline`), then
        raises TimeoutError.
        """
        cdef cnp.ndarray reserved = np.empty(k, dtype=np.uint64)
        cdef Py_ssize_t n = self._slots.lanes[lane, LANE_END] - self._slots.lanes[lane, LANE_START]
        if not 0 <= k <= n:
            raise ValueError(f"k: expected 0 <= k <= {n} (the lane's length), got {k}")
        start = self._reserve_waiting(k, <uint64_t*>cnp.PyArray_DATA(reserved), insert, deadline, lane)
        return start, reserved

    def publish(self, Py_ssize_t start, const uint64_t[::1] reserved not None, const double[::1] priorities=None,
                const uint8_t[::1] states=None, Py_ssize_t lane=0, double deadline=INFINITY,
                const int64_t[::1] complete=None, const uint64_t[::1] complete_generations=None,
                const double[::1] complete_priorities=None):
        """Make slots reserved by :meth:`reserve` readable: ``states`` (default all COMPLETE)
        says which hold complete transitions; those become sampleable with ``priorities``
        (default: the stored maximum).  Returns how many slots were lost to a writer that
        took them over.

        ``complete`` names WAITING transitions (with the generations they were published
        with) whose next frame these slots store: they become COMPLETE in the same
        critical section, with ``complete_priorities`` (NaN: the stored maximum).  When
        the lock cannot be had by ``deadline`` the reservation is given up -- nothing is
        stored -- and TimeoutError raised.
        """
        cdef Py_ssize_t k = reserved.shape[0], nc = 0 if complete is None else complete.shape[0], lost
        cdef const double* prio = NULL
        cdef const uint8_t* st = NULL
        cdef const double* cprio = NULL
        cdef bint wake
        if priorities is not None:
            if priorities.shape[0] != k:
                raise ValueError("priorities: expected one per reserved slot")
            prio = &priorities[0] if k else NULL
        if states is not None:
            if states.shape[0] != k:
                raise ValueError("states: expected one per reserved slot")
            st = &states[0] if k else NULL
        if nc:
            if complete_generations is None or complete_generations.shape[0] != nc:
                raise ValueError("complete_generations: expected one per slot to complete")
            if complete_priorities is not None:
                if complete_priorities.shape[0] != nc:
                    raise ValueError("complete_priorities: expected one per slot to complete")
                cprio = &complete_priorities[0]
        if k == 0 and nc == 0:
            return 0
        try:
            self._gate.acquire(deadline)
        except TimeoutError:
            if k:
                self._slots.disown(lane, start, k, &reserved[0])
            raise
        try:
            self._slots.note_writer()
            lost = self._slots.publish(lane, start, k, &reserved[0], prio, st) if k else 0
            if nc:
                self._slots.complete(&complete[0], &complete_generations[0], cprio, nc)
            wake = self._gate.progress()
        finally:
            self._gate.release()
        if wake:
            self._gate.wake()
        return lost

    def abandon(self, Py_ssize_t start, const uint64_t[::1] reserved not None, Py_ssize_t lane=0):
        """Give up slots reserved by :meth:`reserve`: they stay unsampleable, free for the next writer."""
        if reserved.shape[0]:
            self._slots.disown(lane, start, reserved.shape[0], &reserved[0])

    def claim_lane(self, double deadline=INFINITY):
        """Take a lane for one writer: a free one, or one whose writer process died.

        A lane never written comes first, so the rows of a writer that finished stay
        until every lane has been used.  A lane this process already holds is not
        free: each writer object of a process (one per stream of episodes) fills a
        lane of its own."""
        cdef Py_ssize_t l, free = -1
        cdef int64_t token
        self._gate.acquire(deadline)
        try:
            for l in range(self._slots.lanes.shape[0]):
                token = self._slots.lanes[l, LANE_OWNER]
                if token == 0 or not token_alive(token):
                    if self._slots.gen[self._slots.lanes[l, LANE_START]] == 0:
                        free = l
                        break
                    if free < 0:
                        free = l
            if free >= 0:
                self._slots.lanes[free, LANE_OWNER] = self._slots.token
                return free
        finally:
            self._gate.release()
        raise ValueError(f"every one of the buffer's {self._slots.lanes.shape[0]} lanes has a live writer: "
                         "create the buffer with lanes= at least the number of writers (processes, "
                         "and streams of episodes written from one process)")

    def release_lane(self, Py_ssize_t lane):
        """Give this process's lane back (its rows stay).  Without the lock, so that
        close() never waits: only the owner clears its own claim."""
        cdef int64_t mine = self._slots.token
        if not 0 <= lane < self._slots.lanes.shape[0]:
            raise ValueError(f"lane: expected 0 <= lane < {self._slots.lanes.shape[0]}, got {lane}")
        _atomic_cas(&self._slots.lanes[lane, LANE_OWNER], &mine, 0)

    def clear(self):
        """Make every slot unsampleable and restart every lane at its start.

        Every slot gets a new generation, so priority updates sampled before
        the clear are stale; slots other processes are writing are waited for.
        """
        cdef cnp.ndarray reserved = np.empty(self.size, dtype=np.uint64)
        cdef Py_ssize_t s, l
        for l in range(self._slots.lanes.shape[0]):
            self._reserve_waiting(self._slots.lanes[l, LANE_END] - self._slots.lanes[l, LANE_START],
                                  <uint64_t*>cnp.PyArray_DATA(reserved), False, INFINITY, l)
        self._gate.acquire()
        try:
            for s in range(self.size):
                self._slots.owner[s] = 0
            for l in range(self._slots.lanes.shape[0]):
                self._slots.lanes[l, LANE_CURSOR] = self._slots.lanes[l, LANE_START]
        finally:
            self._gate.release()

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
        cdef bint compressed = self._frames is not None
        self._gate.acquire()
        try:
            with nogil:
                for l in range(self._slots.lanes.shape[0]):
                    lo = self._slots.lanes[l, LANE_START]
                    n = self._slots.lanes[l, LANE_END] - lo
                    cursor = self._slots.lanes[l, LANE_CURSOR]
                    for j in range(n):
                        s = lo + (cursor - lo + j) % n
                        if self._slots.state[s] != COMPLETE or being_written(self._slots.gen[s]):
                            continue
                        # A lane is overwritten from its cursor on, oldest first: a
                        # row stays whole while the oldest slot it reads does.
                        o = s
                        if compressed:
                            c = self._frames.read_set(s, reads)
                            best = n
                            for t in range(c):
                                age = ((reads[t] - cursor) % n + n) % n
                                if age < best:
                                    best, o = age, reads[t]
                        sp[count], op[count] = s, o
                        gp[2 * count], gp[2 * count + 1] = self._slots.gen[s], self._slots.gen[o]
                        count += 1
            raw = None
            if priorities:
                raw = np.empty(count)
                for j in range(count):
                    raw[j] = self._selector.priority(sp[j])
        finally:
            self._gate.release()
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
                kp[j] = self._slots.gen[slots[j]] == gens[j, 0] and self._slots.gen[oldest[j]] == gens[j, 1]
        return keep

    cdef bint _stage_value(self, Py_ssize_t i, object value) except -1:
        """Convert ``value`` into field i's staging row; False = not a fast-path case."""
        cdef cnp.ndarray arr
        cdef Py_ssize_t d
        cdef int overflow = 0
        cdef long long x
        cdef double x64
        cdef Kind kind = self._kinds[i]
        cdef tuple shape
        if cnp.PyArray_CheckExact(value):
            arr = <cnp.ndarray>value
            shape = self._shapes[i]
            if not cnp.PyArray_ISCARRAY_RO(arr) or not cnp.PyArray_ISNOTSWAPPED(arr):
                return False
            if not (cnp.PyArray_NDIM(arr) == 0 and self._one[i]):  # a 0-d array fills a (1,) field
                if cnp.PyArray_NDIM(arr) != len(shape):
                    return False
                for d in range(len(shape)):
                    if cnp.PyArray_DIM(arr, d) != <Py_ssize_t>shape[d]:
                        return False
            if cnp.PyArray_TYPE(arr) == self._typenums[i]:
                # Copied straight from the caller's array once the slot is reserved.
                self._src[i] = <const uint8_t*>cnp.PyArray_DATA(arr)
                return True
            if kind == K_F32 and cnp.PyArray_TYPE(arr) == cnp.NPY_DOUBLE:
                # float64 observations into a float32 field: numpy's default dtype
                # meeting the buffer's, the most common conversion of all.
                self._src[i] = self._stage[i]
                return _narrow_to_float(<const double*>cnp.PyArray_DATA(arr), <float*>self._stage[i],
                                        cnp.PyArray_SIZE(arr))
            return False
        if not (self._one[i] or len(<tuple>self._shapes[i]) == 0):  # a number fills a field of one element
            return False
        self._src[i] = self._stage[i]
        if PyFloat_CheckExact(value):
            if kind == K_F32:
                x64 = PyFloat_AS_DOUBLE(value)
                return _narrow_to_float(&x64, <float*>self._stage[i], 1)
            if kind == K_F64:
                (<double*>self._stage[i])[0] = PyFloat_AS_DOUBLE(value)
            else:
                return False
            return True
        if value is True or value is False:
            return _store_int(kind, 1 if value is True else 0, self._stage[i])
        if PyLong_CheckExact(value):
            x = PyLong_AsLongLongAndOverflow(value, &overflow)
            return overflow == 0 and _store_int(kind, x, self._stage[i])
        return False

    def add_one(self, dict values not None, double priority=-1.0, timeout=None):
        """Store one transition given as Python scalars and exact-dtype arrays.

        Returns the slot written, or -1 when some value needs the general
        (numpy) conversion path -- then nothing was changed.  A negative
        ``priority`` means "the stored maximum".
        """
        cdef Py_ssize_t i, slot
        cdef PyObject* item
        cdef uint64_t reserved
        cdef bint wake
        cdef double deadline
        if PyDict_Size(values) != self._nfields:
            return -1
        for i in range(self._nfields):
            item = PyDict_GetItem(values, self._names[i])
            if item == NULL or not self._stage_value(i, <object>item):
                return -1
        if self._frames is not None or self._sequences is not None:
            return -1
        deadline = deadline_of(timeout)
        slot = self._reserve_waiting(1, &reserved, True, deadline, 0)
        for i in range(self._nfields):
            memcpy(self._dst[i] + slot * self._rowbytes[i], self._src[i], self._rowbytes[i])
        try:
            self._gate.acquire(deadline)
        except TimeoutError:
            self._slots.disown(0, slot, 1, &reserved)
            raise
        try:
            self._slots.note_writer()
            self._slots.publish(0, slot, 1, &reserved, &priority if priority >= 0.0 else NULL, NULL)
            wake = self._gate.progress()
        finally:
            self._gate.release()
        if wake:
            self._gate.wake()
        return slot

    cdef int _flag_set(self, Py_ssize_t i) except -2:
        # Whether field i's staged value is nonzero (it ends an episode); -1: a kind not judged here.
        cdef Kind kind = self._kinds[i]
        cdef const uint8_t* v = self._src[i]
        cdef Py_ssize_t b
        if kind == K_F32:
            return (<const float*>v)[0] != 0.0
        if kind == K_F64:
            return (<const double*>v)[0] != 0.0
        if kind == K_OTHER:
            return -1
        for b in range(self._rowbytes[i]):
            if v[b]:
                return 1
        return 0

    def add_step(self, dict values not None, double priority, timeout, Episode episode not None):
        """Store one step of a compressed writer's episode, given as Python scalars and
        exact-dtype arrays: checked, laid out, copied and published in the kernel.

        Returns the step's slot, or -1 when it needs the writer's general path (a value
        that needs numpy's conversion, a writer without a lane yet, a sequence table)
        -- then nothing was changed.  Raises ValueError, changing nothing, when a stack
        or next observation cannot be rebuilt bit for bit (see ext/frame_plan.pyx).
        A negative ``priority`` means "the stored maximum".
        """
        cdef Py_ssize_t i, j, lane = episode.lane, lo, hi, start, row_slot, done
        cdef int flag
        cdef uint8_t flagged = 0
        cdef uint64_t reserved[2]
        cdef int64_t slots[2]
        cdef uint8_t states[2]
        cdef double item_priority[2]
        cdef const double* row_priority = &priority if priority >= 0.0 else NULL
        cdef PyObject* item
        cdef FramePlan plan
        cdef bint wake
        cdef double deadline
        if self._sequences is not None or lane < 0 or PyDict_Size(values) != self._nfields + episode.observations:
            return -1
        for i in range(self._nfields):
            item = PyDict_GetItem(values, self._names[i])
            if item == NULL or not self._stage_value(i, <object>item):
                return -1
        if not episode.take_step(values):
            return -1
        for name in episode.flags:
            flag = self._flag_set(self._names.index(name))
            if flag < 0:
                return -1
            flagged |= flag
        # Every check runs here, before anything is written.
        plan = episode.plan_step(&flagged, values)
        deadline = deadline_of(timeout)
        lo, hi = self._slots.lanes[lane, LANE_START], self._slots.lanes[lane, LANE_END]
        start = self._reserve_waiting(plan.items, reserved, True, deadline, lane)
        for j in range(plan.items):
            slots[j] = lo + (start - lo + j) % (hi - lo)
        row_slot = slots[plan.item_of(0)]
        with nogil:
            episode.copy_frames(plan, slots)
            for i in range(self._nfields):
                memcpy(self._dst[i] + row_slot * self._rowbytes[i], self._src[i], self._rowbytes[i])
            done = episode.settle(plan, slots, row_priority, states, item_priority)
        try:
            self._gate.acquire(deadline)
        except TimeoutError:
            self._slots.disown(lane, start, plan.items, reserved)
            raise
        try:
            self._slots.note_writer()
            # A slot lost to a writer that took it over stays unsampleable, as in publish().
            self._slots.publish(lane, start, plan.items, reserved, item_priority if row_priority != NULL else NULL,
                                states)
            if done:
                # Rows published WAITING by earlier calls complete with this publication.
                self._slots.complete(episode.done_slots, episode.done_generations, episode.done_priorities, done)
            wake = self._gate.progress()
        finally:
            self._gate.release()
        if wake:
            self._gate.wake()
        episode.advance_past(plan, slots, reserved, row_priority)
        return row_slot

    # -- readers ----------------------------------------------------------------
    cdef double _draw(self, int64_t* slots, double* values, uint64_t* gens, Py_ssize_t k,
                      Py_ssize_t nstrata) noexcept nogil:
        # Lock held.  Draw j lands in stratum j of nstrata (nstrata == 1:
        # plain draws over the whole mass); `values` gets the drawn weights.
        # Returns the smallest weight, or NaN once nothing is sampleable.
        cdef Py_ssize_t j
        if not self._selector.total() > 0.0:
            return NAN
        self._selector.draw(slots, values, k, nstrata, self._bitgen)
        fault(F_DRAW)
        for j in range(k):
            while (being_written(self._slots.gen[slots[j]]) or self._slots.state[slots[j]] != COMPLETE
                   or (self._sequences is not None and self._sequences.steps(slots[j]) == 0)):
                # A sampleable slot that is being written or holds no complete
                # transition: a writer died inside its reservation.  Nobody can
                # vouch for the row: retire it and draw again.
                self._slots.retire(slots[j])
                self._selector.fix(slots[j])
                if not self._selector.total() > 0.0:
                    return NAN
                slots[j] = self._selector.draw_one(self._bitgen)
            values[j] = self._selector.weight(slots[j])
            gens[j] = self._slots.gen[slots[j]]
        return self._selector.smallest()

    cdef void _gather(self, const int64_t* slots, Py_ssize_t k, list outs, const Py_ssize_t* rows) except *:
        # Copy rows (all k, or only rows[0..k) of the batch) without the lock.
        cdef Py_ssize_t i, j, r, rb
        cdef uint8_t* src
        cdef uint8_t* dst
        for i in range(self._nfields):
            rb = self._rowbytes[i]
            src = self._dst[i]
            dst = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>outs[i])
            with nogil:
                for j in range(k):
                    r = rows[j] if rows != NULL else j
                    memcpy(dst + r * rb, src + slots[r] * rb, rb)

    cdef cnp.ndarray _empty(self, Py_ssize_t i, Py_ssize_t b):
        cdef cnp.npy_intp dims[34]
        cdef tuple shape = self._shapes[i]
        cdef Py_ssize_t d, nd = len(shape), lead = 1 if self._sequences is None else 2
        dims[0], dims[1] = b, self._length
        for d in range(nd):
            dims[d + lead] = shape[d]
        return cnp.PyArray_EMPTY(nd + lead, dims, self._typenums[i], 0)

    cdef tuple _lead(self, Py_ssize_t b):
        # The leading axes of a batch's outputs: rows, or sequences and their steps.
        if self._sequences is None:
            return (b,)
        return (b, self._length)

    cdef Py_ssize_t _note_reads(self, Py_ssize_t s, int64_t* slots, uint64_t* gens) noexcept nogil:
        # Lock held: the frames row s reads and their generations now.
        cdef Py_ssize_t j, c = self._frames.read_set(s, slots)
        for j in range(c):
            gens[j] = self._slots.gen[slots[j]]
        return c

    cdef void _gather_frames(self, const int64_t* slots, Py_ssize_t k, list outs, const Py_ssize_t* rows) except *:
        # Rebuild the compressed observations of rows (all k, or rows[0..k)) without the lock.
        # Row by row, every output of the row together: obs and next_obs share all frames but
        # one, so the second rebuild reads them from cache instead of memory.
        cdef Py_ssize_t o, j, r, u, n = len(self._frame_outputs)
        cdef Py_ssize_t keys[MAX_FRAME_OUTPUTS]
        cdef Py_ssize_t rbs[MAX_FRAME_OUTPUTS]
        cdef bint nxts[MAX_FRAME_OUTPUTS]
        cdef uint8_t* dsts[MAX_FRAME_OUTPUTS]
        for o in range(n):
            keys[o], nxts[o] = self._frame_outputs[o][1], self._frame_outputs[o][2]
            out = <cnp.ndarray>outs[self._nfields + o]
            rbs[o] = out.nbytes // out.shape[0]
            dsts[o] = <uint8_t*>cnp.PyArray_DATA(out)
        with nogil:
            for j in range(k):
                r = rows[j] if rows != NULL else j
                for o in range(n):
                    u = self._frames._nxt[slots[r]] if nxts[o] else slots[r]
                    self._frames.rebuild(keys[o], u, dsts[o] + r * rbs[o])

    cdef list _outputs(self, Py_ssize_t b, dict out):
        # Arrays to copy a batch of b rows into: fresh ones, or the caller's; a
        # sequence table's last one is the mask.
        cdef Py_ssize_t i
        cdef tuple lead = self._lead(b)
        cdef list outs = [self._empty(i, b) if out is None or self._names[i] not in out
                          else _checked_out(out, self._names[i], lead + self._shapes[i], self._dtypes[i])
                          for i in range(self._nfields)]
        for name, _, _, shape, dtype in self._frame_outputs:
            outs.append(np.empty(lead + shape, dtype=dtype) if out is None or name not in out
                        else _checked_out(out, name, lead + shape, dtype))
        if self._sequences is not None:
            outs.append(np.empty(lead, dtype=np.bool_) if out is None or "mask" not in out
                        else _checked_out(out, "mask", lead, np.dtype(np.bool_)))
        return outs

    cdef double _draw_batch(self, _Draws d, bint stratified, double deadline) except? -1.0:
        # Under the lock, once the rate limiter lets the sample through: draw
        # every row, note what each reads.  Returns the smallest weight.
        cdef Py_ssize_t j
        cdef double vmin
        cdef bint wake
        self._gate.acquire(deadline)
        try:
            while not (self._selector.total() > 0.0 and self._gate.can_sample(d.b)):
                if not self._gate.limited():
                    raise ValueError("sample: the buffer holds no transition yet")
                self._gate.block(deadline, "sample: the rate limiter holds samples back until more is inserted")
            with nogil:  # the descent waits on cache misses: let the caller's other threads run
                vmin = self._draw(d.sp, d.vp, d.gp, d.b, d.b if stratified else 1)
                if vmin == vmin:
                    for j in range(d.b):
                        self._note_row(d, j)
            if vmin != vmin:
                raise ValueError("sample: the buffer holds no transition yet")
            self._header[SAMPLES] += d.b
            wake = self._gate.progress()
        finally:
            self._gate.release()
        if wake:
            self._gate.wake()
        return vmin

    cdef inline void _note_row(self, _Draws d, Py_ssize_t j) noexcept nogil:
        # Lock held: the frames row j reads, with their generations now, and the
        # steps of a sequence.  The frames a sequence's first step reads are the
        # oldest it reads: guarding them guards every step (see ext/sequences.pyx).
        if d.R:
            d.rcp[j] = self._note_reads(d.sp[j], d.rsp + j * d.R, d.rgp + j * d.R)
        if self._sequences is not None:
            d.stp[j] = self._sequences.steps(d.sp[j])

    cdef Py_ssize_t _find_torn(self, _Draws d) noexcept nogil:
        # After copying: the rows whose slot (or a frame they read) was rewritten
        # meanwhile go to d.tp; returns how many.
        cdef Py_ssize_t j, t, ntorn = 0
        cdef bint bad
        _mpreplay_acquire_fence()  # the generations must be read after the rows were copied
        for j in range(d.b):
            bad = self._slots.gen[d.sp[j]] != d.gp[j]
            for t in range(d.rcp[j] if d.R else 0):
                bad = bad or self._slots.gen[d.rsp[j * d.R + t]] != d.rgp[j * d.R + t]
            if bad:
                d.tp[ntorn] = j
                ntorn += 1
        return ntorn

    cdef double _redraw(self, _Draws d, Py_ssize_t ntorn, list outs, double deadline, bint locked) except? -1.0:
        # Draw the torn rows again; with `locked`, also copy them under the lock.
        # Returns the smallest weight now.
        cdef Py_ssize_t j
        cdef int64_t s1
        cdef double v1, vmin
        cdef uint64_t g1
        self._gate.acquire(deadline)
        try:
            self._header[TORN] += ntorn
            for j in range(ntorn):
                vmin = self._draw(&s1, &v1, &g1, 1, 1)
                if vmin != vmin:
                    raise ValueError("sample: the buffer holds no transition any more")
                d.sp[d.tp[j]], d.vp[d.tp[j]], d.gp[d.tp[j]] = s1, v1, g1
                self._note_row(d, d.tp[j])
            if locked:
                self._copy_rows(d, ntorn, outs, d.tp)
        finally:
            self._gate.release()
        return vmin

    cdef int _copy_rows(self, _Draws d, Py_ssize_t k, list outs, const Py_ssize_t* rows) except -1:
        if self._sequences is not None:
            self._gather_sequences(d, k, outs, rows)
            return 0
        self._gather(d.sp, k, outs, rows)
        if self._frames is not None:
            self._gather_frames(d.sp, k, outs, rows)
        return 0

    cdef int _gather_sequences(self, _Draws d, Py_ssize_t k, list outs, const Py_ssize_t* rows) except -1:
        # Copy the steps of sequences (all k, or rows[0..k)) without the lock, step
        # by step every output together; padding steps become zeros, the mask says so.
        cdef Py_ssize_t L = self._length, nf = self._nfields, no = len(self._frame_outputs)
        cdef Py_ssize_t i, o, j, r, t, n, u, at
        cdef Py_ssize_t n_out = nf + no
        cdef uint8_t** dsts = <uint8_t**>malloc(n_out * sizeof(uint8_t*) + 1)
        cdef Py_ssize_t* rbs = <Py_ssize_t*>malloc(n_out * sizeof(Py_ssize_t) + 1)
        cdef Py_ssize_t* keys = <Py_ssize_t*>malloc(no * sizeof(Py_ssize_t) + 1)
        cdef bint* nxts = <bint*>malloc(no * sizeof(bint) + 1)
        cdef int64_t* window = <int64_t*>malloc(L * sizeof(int64_t))
        cdef uint8_t* mask = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>outs[n_out])
        try:
            if not (dsts and rbs and keys and nxts and window):
                raise MemoryError()
            for i in range(n_out):
                out = <cnp.ndarray>outs[i]
                dsts[i] = <uint8_t*>cnp.PyArray_DATA(out)
                rbs[i] = out.nbytes // (out.shape[0] * L)
            for o in range(no):
                keys[o], nxts[o] = self._frame_outputs[o][1], self._frame_outputs[o][2]
            with nogil:
                for j in range(k):
                    r = rows[j] if rows != NULL else j
                    n = d.stp[r]
                    self._sequences.window(d.sp[r], n, window)
                    for t in range(L):
                        at = r * L + t
                        mask[at] = t < n
                        if t >= n:
                            for i in range(n_out):
                                memset(dsts[i] + at * rbs[i], 0, rbs[i])
                            continue
                        u = window[t]
                        for i in range(nf):
                            memcpy(dsts[i] + at * rbs[i], self._dst[i] + u * rbs[i], rbs[i])
                        for o in range(no):
                            self._frames.rebuild(keys[o], self._frames._nxt[u] if nxts[o] else u,
                                                 dsts[nf + o] + at * rbs[nf + o])
        finally:
            free(dsts)
            free(rbs)
            free(keys)
            free(nxts)
            free(window)
        return 0

    def sample(self, Py_ssize_t batch_size, bint stratified, double beta=-1.0, timeout=None, dict out=None,
               bint leaves=False, bint float32_weights=False):
        """Draw ``batch_size`` rows.

        Returns a dict of field arrays plus ``indexes`` and, when
        ``beta >= 0``, importance ``weights`` (v_i / v_min) ** -beta; with
        ``leaves``, instead, each row's ``leaf`` weight v_i and slot ``tags``
        (how many times the slot was published: a rewrite changes it).  Field
        arrays are fresh, or the ones ``out`` holds under the field's name
        (reusing memory spares the page faults of fresh allocations);
        ``float32_weights`` hands the weights out as float32.  Waits at most ``timeout`` seconds (None: no limit) while the rate
        limiter holds samples back, then raises TimeoutError.
        """
        cdef Py_ssize_t b = batch_size, j, ntorn, rounds = 0
        cdef double vmin, deadline = deadline_of(timeout)
        cdef uint64_t* record
        cdef float* w32
        cdef cnp.npy_intp nb = batch_size
        if b < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size}")
        cdef _Draws d = _Draws(b, 2 * self._frames.max_stack if self._frames is not None else 0)
        cdef list outs = self._outputs(b, out)
        self._gate.check_sample(b)
        vmin = self._draw_batch(d, stratified, deadline)
        self._copy_rows(d, b, outs, NULL)
        while True:
            ntorn = self._find_torn(d)
            if ntorn == 0:
                break
            rounds += 1
            # After a few unlucky rounds (a small ring lapped while this process
            # was descheduled), copy the redrawn rows under the lock: nobody can
            # reserve a published slot meanwhile, so they cannot tear.
            vmin = self._redraw(d, ntorn, outs, deadline, rounds > LOCKED_REDRAW_AFTER)
            if rounds > LOCKED_REDRAW_AFTER:
                break
            self._copy_rows(d, ntorn, outs, d.tp)
        if self._sampled is None:
            self._sampled = np.full(self.size, NOT_SAMPLED, dtype=np.uint64)
        record = <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>self._sampled)
        for j in range(b):
            record[d.sp[j]] = d.gp[j]
        result = dict(zip(self._names, outs))
        for o in range(len(self._frame_outputs)):
            result[self._frame_outputs[o][0]] = outs[self._nfields + o]
        if self._sequences is not None:
            result["mask"] = outs[len(outs) - 1]
        result["indexes"] = d.slots
        if leaves:
            result["leaf"] = d.values
            result["tags"] = (d.gens >> np.uint64(1)).astype(np.int64)
        elif beta >= 0.0:
            if float32_weights:
                weights = cnp.PyArray_EMPTY(1, &nb, cnp.NPY_FLOAT32, 0)
                w32 = <float*>cnp.PyArray_DATA(<cnp.ndarray>weights)
                for j in range(b):
                    w32[j] = <float>importance_weight(vmin, d.vp[j], beta)
                result["weights"] = weights
            else:
                for j in range(b):
                    d.vp[j] = importance_weight(vmin, d.vp[j], beta)
                result["weights"] = d.values
        return result

    @property
    def max_priority(self):
        """The largest priority :meth:`check_priorities` and :meth:`update` accept."""
        return self._selector.max_priority

    def check_priorities(self, const double[::1] priorities not None):
        """Raise ValueError unless every priority is finite, >= 0 and small
        enough that no sum of leaf weights can overflow."""
        cdef Py_ssize_t j, bad = -1
        cdef double p
        with nogil:
            for j in range(priorities.shape[0]):
                p = priorities[j]
                if not (p >= 0.0 and p <= self._selector.max_priority):
                    bad = j
                    break
        if bad >= 0:
            raise ValueError(f"priorities: expected finite values in [0, {self._selector.max_priority:.3g}], "
                             f"got {priorities[bad]!r} at position {bad}")

    def tags(self, const int64_t[::1] slots not None):
        """The slot tags of ``slots`` now (see :meth:`sample`), -1 where a writer holds the slot."""
        cdef Py_ssize_t j, n = slots.shape[0]
        cdef cnp.ndarray out = np.empty(n, dtype=np.int64)
        cdef int64_t* op = <int64_t*>cnp.PyArray_DATA(out)
        cdef uint64_t g
        for j in range(n):
            if not 0 <= slots[j] < self.size:
                raise ValueError(f"indexes: expected slots in [0, {self.size}), got {slots[j]} at position {j}")
            g = self._slots.gen[slots[j]]
            op[j] = -1 if being_written(g) else <int64_t>(g >> 1)
        return out

    def update(self, const int64_t[::1] slots not None, const double[::1] priorities not None):
        """Set priorities of sampled slots; returns how many updates were dropped as stale.

        Raises ValueError (changing nothing) for a slot outside the stored
        range or a bad priority.  An update whose slot was overwritten since
        this process sampled it, or is being written now, is dropped.
        """
        cdef Py_ssize_t k = slots.shape[0], j, s, stale = 0, bad = -1
        cdef uint64_t g, rec
        cdef uint64_t* record = NULL
        if priorities.shape[0] != k:
            raise ValueError(f"priorities: expected {k} values (one per index), got {priorities.shape[0]}")
        with nogil:
            for j in range(k):
                if not (0 <= slots[j] < self.size and self._slots.gen[slots[j]] != 0):
                    bad = j
                    break
        if bad >= 0:
            raise ValueError(f"indexes: expected slots that hold transitions (0 <= slot < {self.size}, "
                             f"written at least once), got {slots[bad]} at position {bad}")
        self.check_priorities(priorities)
        if self._sampled is not None:
            record = <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>self._sampled)
        self._gate.acquire()
        try:
            with nogil:
                for j in range(k):
                    s = slots[j]
                    g = self._slots.gen[s]
                    rec = record[s] if record != NULL else NOT_SAMPLED
                    if (self._slots.state[s] == COMPLETE and (rec == NOT_SAMPLED or rec == g)
                            and (self._sequences is None or self._sequences.steps(s) > 0)):
                        self._selector.set(s, priorities[j])
                        fault(F_UPDATE)
                    else:
                        stale += 1
                if k:
                    self._selector.fix_each(&slots[0], k)
                self._header[STALE] += stale
        finally:
            self._gate.release()
        return stale

    def open_sequences(self, const int64_t[::1] slots not None, const uint64_t[::1] generations not None,
                       const int64_t[::1] steps not None, const double[::1] priorities=None,
                       double deadline=INFINITY):
        """Make sequences sampleable (a sequence table's writer, once their last step is stored):
        the one starting at ``slots[j]``, whose first step was published with ``generations[j]``,
        has ``steps[j]`` real steps, every one stored COMPLETE and consecutive in its lane.
        ``priorities`` (NaN or None: the largest stored).  Returns how many were opened; one
        whose first slot was rewritten meanwhile is skipped."""
        cdef Py_ssize_t n = slots.shape[0], j, opened
        cdef const double* prio = NULL
        cdef bint wake
        if self._sequences is None:
            raise ValueError("open_sequences: this table stores transitions, not sequences")
        if generations.shape[0] != n or steps.shape[0] != n or (priorities is not None and priorities.shape[0] != n):
            raise ValueError("generations, steps, priorities: expected one per slot")
        for j in range(n):
            if not (0 <= slots[j] < self.size and 1 <= steps[j] <= self._length):
                raise ValueError(f"slots, steps: expected a slot in [0, {self.size}) and 1 to {self._length} "
                                 f"steps, got {slots[j]} and {steps[j]} at position {j}")
        if n == 0:
            return 0
        if priorities is not None:
            prio = &priorities[0]
        self._gate.acquire(deadline)
        try:
            opened = self._slots.open_sequences(&slots[0], &generations[0], &steps[0], prio, n)
            wake = self._gate.progress()
        finally:
            self._gate.release()
        if wake:
            self._gate.wake()
        return opened
