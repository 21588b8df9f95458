# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A compressed writer's episode: each batch planned after it, written, published, moved past.

:class:`Episode` is what a writer of a compressed buffer (``next_of``,
``stack_compress``) keeps between calls: the episode in progress
(:class:`~mpreplay._ext.episode_state.EpisodeState`, its base), its
:class:`~mpreplay._ext.frame_planner.FramePlanner`, and the write side of the
buffer's frame stores (:class:`~mpreplay._ext.frames.FrameCopier`).  A write is
four steps, each changing nothing until the one before succeeded:

1. *plan* (:meth:`Episode.plan`; rows of exact arrays, found in place by
   ``take_rows``, through ``plan_rows``, for ``TableHandle.add_rows``): every stack
   and next observation checked, the items laid out (frame_planner.pyx);
2. *copy* into the reserved slots (``Episode.store``'s ``copy``);
3. *publication* (:meth:`Episode.publication`): the waiting rows the batch
   resolves linked to their next frames, and each item's state and priority;
4. once published, *advance* (:meth:`Episode.advance`): the episode moves past
   the batch, keeping copies of what later rows are checked against.
"""
from libc.math cimport NAN
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from cpython.dict cimport PyDict_GetItem
from cpython.ref cimport PyObject

from mpreplay._ext.frames cimport array_bytes
from mpreplay._ext.schema cimport COMPLETE, EMPTY, WAITING

cimport numpy as cnp

import numpy as np

cnp.import_array()


cdef Observation _observation(object pair, Py_ssize_t nbytes, object what, str prefix="") except *:
    """An ``(array, planar)`` pair as an Observation; the array C-contiguous, ``nbytes`` long."""
    cdef Observation o
    if not isinstance(pair, tuple) or len(<tuple>pair) != 2:
        raise ValueError(f"{prefix}{what}: expected an (array, planar) pair")
    o.data = array_bytes((<tuple>pair)[0], nbytes, what, prefix)
    o.planar = (<tuple>pair)[1]
    return o


cdef class Episode(EpisodeState):
    """One compressed writer's episode in progress, and where its frames go.

    It holds, copied, what later rows are checked against: the episode's newest
    stack per stacked key, and the rows waiting for the frame of their next
    observation (their slots, generations and next observations).  A batch is
    planned after it (:meth:`plan`), copied (``store.copy``), its publication
    prepared (:meth:`publication`) and, once published, the episode moves past
    it (:meth:`advance`).

    Parameters
    ----------
    planner : the writer's FramePlanner
    frames : per key, its store ``(size,) + frame`` in the buffer
    nxt, depth : the buffer's per-slot next-frame slots (int64) and depths (uint8)
    key_shapes, key_dtypes : per key, the observation's shape and dtype (what exact rows must hold)
    flags : names of the fields whose nonzero value ends an episode
    """

    def __cinit__(self):
        self.done_slots = NULL
        self.done_generations = NULL
        self.done_priorities = NULL
        self._key_types = NULL
        self._step_obs = self._step_next = NULL

    def __init__(self, FramePlanner planner not None, list frames not None, object nxt, object depth,
                 tuple key_shapes not None, tuple key_dtypes not None, tuple flags not None):
        cdef Py_ssize_t q, nk = planner.nkeys, cap = planner.max_next + 1
        if len(frames) != nk or len(key_shapes) != nk or len(key_dtypes) != nk:
            raise ValueError("frames, key_shapes, key_dtypes: expected one per key")
        self.planner = planner
        self.lane = -1
        self.flags = flags
        self.store = FrameCopier(planner, frames, nxt, depth)
        cdef Py_ssize_t* last_bytes = <Py_ssize_t*>malloc(nk * sizeof(Py_ssize_t) + 1)
        if not last_bytes:
            raise MemoryError()
        try:
            for q in range(nk):
                last_bytes[q] = planner.row_bytes[q] if planner.stack[q] > 1 else 0
            self.allocate(nk, cap, last_bytes)
        finally:
            free(last_bytes)
        self._key_types = <int*>calloc(nk + 1, sizeof(int))
        self._step_obs = <Observation*>calloc(nk + 1, sizeof(Observation))
        self._step_next = <Observation*>calloc(nk + 1, sizeof(Observation))
        self.done_slots = <int64_t*>calloc(cap, sizeof(int64_t))
        self.done_generations = <uint64_t*>calloc(cap, sizeof(uint64_t))
        self.done_priorities = <double*>calloc(cap, sizeof(double))
        if not (self._key_types and self._step_obs and self._step_next and self.done_slots and self.done_generations
                and self.done_priorities):
            raise MemoryError()
        for q in range(nk):
            self._key_types[q] = np.dtype(key_dtypes[q]).num
        self._key_shapes = tuple(tuple(shape) for shape in key_shapes)
        self._next_names = tuple(f"next_{name}" if planner.has_next[q] else None
                                 for q, name in enumerate(planner.names))
        self.observations = nk + sum(1 for name in self._next_names if name is not None)

    def __dealloc__(self):
        free(self._key_types)
        free(self._step_obs)
        free(self._step_next)
        free(self.done_slots)
        free(self.done_generations)
        free(self.done_priorities)

    # -- planning -----------------------------------------------------------------
    def plan(self, Py_ssize_t k, list obs not None, list nexts not None, object flags, bint end_episode,
             Py_ssize_t resume=0, bint open_end=False):
        """Plan ``k`` rows after this episode; returns a :class:`~mpreplay._ext.frame_planner.FramePlan`,
        or raises ValueError naming the field.  Changes nothing.

        obs, nexts : per key, the rows' observations and next observations as ``(array, planar)``:
            the array C-contiguous, interleaved ``(k, ..., stack)`` or planar ``(k, stack, ...)``
            (``nexts[q]`` None without next_of)
        flags : bool or uint8 array, per row nonzero if the row ends its episode (done or truncated)
        end_episode : the episode ends after the rows, as with a flagged last row
        resume : > 0, the first row is step ``resume`` of an episode whose older steps are not
            stored (this episode must be between episodes): the older frames its stacks read are
            planned as items of their own before it, and its stacks are not checked against a
            step before it -- only that the positions older than the episode repeat its first frame
        open_end : ``end_episode`` ends the episode where the rows stop, which may be before it did
            (a saved episode, open when saved): the steps its rows' next observations reach past its
            last row (n with rows folded n steps ahead) take items of their own, each checked to be
            the one before shifted by one frame
        """
        cdef FramePlanner planner = self.planner
        cdef Py_ssize_t q, nk = planner.nkeys
        if len(obs) != nk or len(nexts) != nk:
            raise ValueError("plan: expected one entry per key")
        cdef const uint8_t* flag = array_bytes(flags, k, "flags")
        cdef Observation* o = <Observation*>malloc(2 * nk * sizeof(Observation) + 1)
        if not o:
            raise MemoryError()
        try:
            memset(o, 0, 2 * nk * sizeof(Observation))
            for q in range(nk):
                o[q] = _observation(obs[q], k * planner.row_bytes[q], planner.names[q])
                if planner.has_next[q]:
                    o[nk + q] = _observation(nexts[q], k * planner.row_bytes[q], planner.names[q], "next_")
            return planner.plan(k, o, o + nk, flag, self, end_episode, (obs, nexts), resume, open_end)
        finally:
            free(o)

    # -- rows of exact arrays -------------------------------------------------------
    cdef bint take_rows(self, dict values, Py_ssize_t k) except -1:
        """Find ``k`` rows' observations in ``values`` for :meth:`plan_rows`: each an exact ndarray
        of its key's dtype, of its shape (``k`` = 1) or with a leading dimension of ``k``,
        C-contiguous or (stacked) planar.  False: not such rows."""
        cdef Py_ssize_t q, nk = self.planner.nkeys
        cdef PyObject* item
        for q in range(nk):
            item = PyDict_GetItem(values, self.planner.names[q])
            if item == NULL or not self._view(q, <object>item, k, &self._step_obs[q]):
                return False
            if self._next_names[q] is not None:
                item = PyDict_GetItem(values, self._next_names[q])
                if item == NULL or not self._view(q, <object>item, k, &self._step_next[q]):
                    return False
        return True

    cdef bint _view(self, Py_ssize_t q, object value, Py_ssize_t k, Observation* out) except -1:
        # k observations of key q read in place: interleaved (C order) or planar (the stack
        # axis, last, with the largest stride of a row: what np.moveaxis makes of a
        # channels-first stack), after a leading dimension of k unless one row of the key's shape.
        cdef cnp.ndarray arr
        cdef tuple shape = self._key_shapes[q]
        cdef Py_ssize_t d, nd = len(shape), lead, itemsize, stride
        if not cnp.PyArray_CheckExact(value):
            return False
        arr = <cnp.ndarray>value
        lead = cnp.PyArray_NDIM(arr) - nd  # 1: rows, 0: one row
        if (cnp.PyArray_TYPE(arr) != self._key_types[q] or not cnp.PyArray_ISNOTSWAPPED(arr)
                or not (lead == 1 or (lead == 0 and k == 1))):
            return False
        if lead and cnp.PyArray_DIM(arr, 0) != k:
            return False
        for d in range(nd):
            if cnp.PyArray_DIM(arr, lead + d) != <Py_ssize_t>shape[d]:
                return False
        out.data = <const uint8_t*>cnp.PyArray_DATA(arr)
        out.planar = False
        if cnp.PyArray_IS_C_CONTIGUOUS(arr):
            return True
        if self.planner.stack[q] < 2:
            return False
        itemsize = cnp.PyArray_ITEMSIZE(arr)
        stride = itemsize
        for d in range(lead + nd - 2, lead - 1, -1):
            if cnp.PyArray_DIM(arr, d) > 1 and cnp.PyArray_STRIDE(arr, d) != stride:
                return False
            stride *= cnp.PyArray_DIM(arr, d)
        if cnp.PyArray_STRIDE(arr, lead + nd - 1) != stride:
            return False
        if lead and k > 1 and cnp.PyArray_STRIDE(arr, 0) != stride * cnp.PyArray_DIM(arr, lead + nd - 1):
            return False  # rows that do not follow one another
        out.planar = True
        return True

    cdef FramePlan plan_rows(self, Py_ssize_t k, const uint8_t* flag, object keep):
        """Plan the ``k`` rows :meth:`take_rows` found (``flag``: per row, it ends its episode),
        as :meth:`plan` plans them; ``keep`` holds their arrays."""
        return self.planner.plan(k, self._step_obs, self._step_next, flag, self, False, keep, 0, False)

    # -- any batch ----------------------------------------------------------------
    cdef void copy_frames(self, FramePlan p, const int64_t* slot) noexcept nogil:
        # The items' frames into their slots (the whole copy of a batch: store.copy).
        self.store.write_frames(p, slot)

    def publication(self, FramePlan p not None, object slots, object priorities):
        """Link the waiting rows ``p`` resolves to their next frames (the buffer's ``nxt``) and
        say how to publish the items in ``slots``: returns ``(states, priorities, complete,
        complete_generations, complete_priorities)`` for :meth:`TableHandle.publish` (``priorities``:
        per row, float64, or None for the largest stored)."""
        cdef cnp.npy_intp n = p.items
        cdef const double* row_priority = NULL
        cdef const int64_t* slot = <const int64_t*>array_bytes(slots, p.items * 8, "slots")
        if priorities is not None:
            row_priority = <const double*>array_bytes(priorities, p.rows * 8, "priorities")
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
            row = p.item_row[j]
            if row < 0:
                states[j] = EMPTY
            elif self.planner.any_next and p.earlier + row >= p.head:
                states[j] = WAITING
            else:
                states[j] = COMPLETE
            item_priority[j] = row_priority[row] if row_priority != NULL and row >= 0 else 0.0
        for o in range(p.head):
            # WAITING rows are published, but nobody reads their nxt before they complete.
            if o < p.earlier:
                self.store.nxt[self.waiting_slot[o]] = slot[p.resolved_item[o]]
                self.done_slots[done], self.done_generations[done] = self.waiting_slot[o], self.waiting_gen[o]
                self.done_priorities[done] = self.waiting_priority[o]
                done += 1
            else:
                self.store.nxt[slot[p.row_item[o - p.earlier]]] = slot[p.resolved_item[o]]
        return done

    def advance(self, FramePlan p not None, object slots, object reserved, object priorities):
        """Move past ``p`` once its items were published into ``slots`` with the generations
        ``reserved`` + 1 (both None when ``p`` has no item); ``priorities`` as for :meth:`publication`."""
        cdef const int64_t* slot = NULL
        cdef const uint64_t* gen = NULL
        cdef const double* row_priority = NULL
        if p.items:
            slot = <const int64_t*>array_bytes(slots, p.items * 8, "slots")
            gen = <const uint64_t*>array_bytes(reserved, p.items * 8, "reserved")
        if priorities is not None:
            row_priority = <const double*>array_bytes(priorities, p.rows * 8, "priorities")
        self.advance_past(p, slot, gen, row_priority)

    cdef int advance_past(self, FramePlan p, const int64_t* slot, const uint64_t* reserved,
                          const double* row_priority) except -1:
        cdef FramePlanner planner = self.planner
        cdef Py_ssize_t q, o, r, m, e, nk = planner.nkeys
        if p.planner is not planner or p.earlier != self.waiting:
            raise ValueError("advance: expected the plan of this episode's latest batch")
        self.drop(min(p.head, p.earlier))
        if planner.any_next:
            for o in range(max(p.head, p.earlier), p.earlier + p.rows):
                r = o - p.earlier
                m = p.row_item[r]
                e = self.waiting
                if e == self.capacity:
                    raise RuntimeError("advance: more rows wait for their next observation than the planner allows")
                for q in range(nk):
                    if planner.has_next[q]:
                        if self.waiting_next[e * nk + q] == NULL:
                            self.waiting_next[e * nk + q] = <uint8_t*>malloc(planner.row_bytes[q] + 1)
                            if self.waiting_next[e * nk + q] == NULL:
                                raise MemoryError()
                        memcpy(self.waiting_next[e * nk + q], planner.row(q, p.nexts[q], r).data, planner.row_bytes[q])
                        self.waiting_planar[e * nk + q] = p.nexts[q].planar
                self.waiting_slot[e], self.waiting_gen[e] = slot[m], reserved[m] + 1
                self.waiting_position[e] = self.written + m
                self.waiting_priority[e] = row_priority[r] if row_priority != NULL else NAN
                self.waiting += 1
        if p.t > 0 and p.last_row >= 0:
            for q in range(nk):
                if planner.stack[q] > 1:
                    memcpy(self.last[q], planner.row(q, p.obs[q], p.last_row).data, planner.row_bytes[q])
                    self.last_planar[q] = p.obs[q].planar
        self.t = p.t
        self.written += p.items
        return 0
