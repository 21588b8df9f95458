# The replay table's declarations: ext/calls.pyx calls its per-step methods without Python.
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.handle cimport Handle
from mpreplay._ext.table cimport Table


cdef struct Draws:
    # The scratch of one sample() call: the slots drawn with their weights and
    # generations, the rows found torn, (compressed buffers) the R frames at
    # most that each row reads, with their generations, (sequence tables) the
    # real steps of each sequence drawn and the slots of one, and where each
    # output's rows go.  It lives in one block per call (on the caller's stack,
    # or malloc'd when large), so two threads sampling one table never share it.
    Py_ssize_t b, R
    int64_t* sp            # the slots: the memory of the `indexes` output
    double* vp             # their weights, then importance weights: an output's memory, or scratch
    uint64_t* gp
    Py_ssize_t* tp
    int64_t* stp
    int64_t* window
    int64_t* rsp
    uint64_t* rgp
    Py_ssize_t* rcp
    uint8_t** dst          # per output (fields, compressed observations, mask): its first row


@cython.final
cdef class Ring:
    # A table's handle: the table's shared part, and this handle's own state.
    cdef Table _table
    cdef Handle _handle
    cdef readonly Py_ssize_t size

    cpdef Py_ssize_t add_one(self, dict values, double priority=*, object timeout=*) except -2
    cpdef dict sample(self, Py_ssize_t batch_size, bint stratified, double beta=*, object timeout=*, dict out=*,
                      bint leaves=*, bint float32_weights=*, bint uint64_indexes=*)
    cpdef Py_ssize_t update(self, object slots, object priorities) except -2
    cdef double _draw(self, int64_t* slots, double* values, uint64_t* gens, Py_ssize_t k,
                      Py_ssize_t nstrata) noexcept nogil
    cdef void _gather(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil
    cdef Py_ssize_t _note_reads(self, Py_ssize_t s, int64_t* slots, uint64_t* gens) noexcept nogil
    cdef void _gather_frames(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil
    cdef double _draw_batch(self, Draws* d, bint stratified, double deadline) except? -1.0
    cdef void _note_row(self, Draws* d, Py_ssize_t j) noexcept nogil
    cdef Py_ssize_t _find_torn(self, Draws* d) noexcept nogil
    cdef double _redraw(self, Draws* d, Py_ssize_t ntorn, double deadline, bint locked) except? -1.0
    cdef void _copy_rows(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil
    cdef void _gather_sequences(self, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil
    cdef Py_ssize_t _bad_priority(self, const double* priorities, Py_ssize_t n) noexcept nogil
    cdef int _raise_bad_priority(self, const double* priorities, Py_ssize_t bad) except -1
