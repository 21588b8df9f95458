# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A handle's own state: what one buffer object keeps apart from the table it shares.

A table (its slots, selector, gate and rows) is shared by every handle of its memory: the
threads of a process, other processes.  A handle keeps to itself the random stream its
draws come from, the record of the generations it sampled (a priority update applies only
where the slot still holds one, see docs/architecture.md, "Concurrency protocol"), the
staging rows of its one-row adds and its spare batches.  A forked child gets a stream and
a record of its own.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer

cimport numpy as cnp

import numpy as np

cnp.import_array()


cdef class HandleState:
    """The state of one handle of a table of ``size`` slots: draws from ``rng`` (a numpy
    Generator), stages through ``staging``, hands batches out again through ``spares``."""

    def __init__(self, Py_ssize_t size, object rng, Staging staging not None, Spares spares not None):
        self.size = size
        self.staging = staging
        self.spares = spares
        self.set_rng(rng)
        self._sampled = None
        self.record = NULL

    def set_rng(self, object rng):
        """Draw from ``rng`` (a numpy Generator) from now on."""
        bitgen = rng.bit_generator
        self.bitgen = <bitgen_t*>PyCapsule_GetPointer(bitgen.capsule, "BitGenerator")
        self._bitgen_owner = bitgen

    def forget_samples(self):
        """Judge no update by what was sampled before (a forked child's parent sampled it)."""
        self._sampled = None
        self.record = NULL

    cdef int note_sampled(self, const int64_t* slots, const uint64_t* generations, Py_ssize_t b) except -1:
        # Record the generations of the b slots drawn, for the updates that follow.
        cdef Py_ssize_t j
        if self.record == NULL:
            self._sampled = np.full(self.size, NOT_SAMPLED, dtype=np.uint64)
            self.record = <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>self._sampled)
        for j in range(b):
            self.record[slots[j]] = generations[j]
        return 0
