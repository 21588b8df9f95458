# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The sequence index of a sequence table: which slots start a sequence, and of how many steps.

A sequence table stores steps, one per slot, an episode's steps consecutive in
its writer's lane.  A sequence is named by the slot of its first step; ``steps``
of that slot counts its real steps (the rest of its ``length`` is padding), 0
where no sampleable sequence starts.  The slot table opens a sequence once its
last step is stored and closes it when the slot is retired; the selector's item
for the slot is the sequence (see docs/architecture.md, "Sequences").

A lane is overwritten oldest slot first and a sequence's steps follow its first
step, so the first step (with the frames before it that its stacks read) is
always the first to go: a sequence whose first slot still holds the generation
it was drawn with holds every step it was drawn with.
"""
from libc.stdint cimport int32_t, int64_t

cimport numpy as cnp

from mpreplay._ext.schema cimport LANE_END, LANE_LEN, LANE_START

import numpy as np

cnp.import_array()


cdef class Sequences:
    """The sequence index over caller-owned arrays.

    Parameters
    ----------
    steps : int32 per slot, the ``sequence_steps`` array of the segment schema
    lanes : int64 (nlanes, LANE_LEN), the lanes of the table
    length : steps per sequence, padding included
    """

    def __init__(self, int32_t[::1] steps not None, int64_t[:, ::1] lanes not None, Py_ssize_t length):
        if length < 1:
            raise ValueError(f"length: expected an integer >= 1, got {length}")
        self._steps = &steps[0]
        self._lanes = &lanes[0, 0]
        self._nlanes = lanes.shape[0]
        self.size = steps.shape[0]
        self.length = length
        self._keep = (steps, lanes)

    cdef Py_ssize_t steps(self, Py_ssize_t s) noexcept nogil:
        return self._steps[s]

    cdef void open(self, Py_ssize_t s, Py_ssize_t steps) noexcept nogil:
        # Lock held.
        self._steps[s] = <int32_t>steps

    cdef void close(self, Py_ssize_t s) noexcept nogil:
        # Lock held.
        self._steps[s] = 0

    cdef Py_ssize_t window(self, Py_ssize_t s, Py_ssize_t steps, int64_t* out) noexcept nogil:
        # The slots of the first `steps` steps of the sequence at s, in its lane (a ring).
        cdef Py_ssize_t l, lo = 0, hi = self.size, j, u = s
        for l in range(self._nlanes):
            if self._lanes[LANE_LEN * l + LANE_START] <= s < self._lanes[LANE_LEN * l + LANE_END]:
                lo = self._lanes[LANE_LEN * l + LANE_START]
                hi = self._lanes[LANE_LEN * l + LANE_END]
                break
        for j in range(steps):
            out[j] = u
            u += 1
            if u == hi:
                u = lo
        return steps

    def slots(self, Py_ssize_t s, Py_ssize_t steps):
        """The slots of the first ``steps`` steps of a sequence starting at slot ``s`` (its
        window in its lane, wrapping at the lane's end): :meth:`window` for Python."""
        cdef cnp.ndarray out
        if not (0 <= s < self.size and 0 <= steps <= self.length):
            raise ValueError(f"s, steps: expected a slot in [0, {self.size}) and 0 to {self.length} steps, "
                             f"got {s} and {steps}")
        out = np.empty(steps, dtype=np.int64)
        self.window(s, steps, <int64_t*>cnp.PyArray_DATA(out))
        return out
