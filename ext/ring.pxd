# The replay table's declarations: ext/calls.pyx calls its per-step methods without Python.
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.frames cimport Frames
from mpreplay._ext.gate cimport Gate
from mpreplay._ext.handle cimport Handle
from mpreplay._ext.outputs cimport Outputs
from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.slots cimport Slots


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
    cdef int64_t[::1] _header
    cdef Frames _frames
    cdef Sequences _sequences
    cdef Py_ssize_t _length      # steps per sampled item: 1, or a sequence's length
    cdef Gate _gate
    cdef Slots _slots
    cdef Selector _selector
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t _nfields
    cdef Outputs _out               # what sample() hands out (see ext/outputs.pyx)
    cdef Handle _handle             # this handle's own state: its draws' stream, its record of samples, its scratch
    cdef uint8_t** _dst
    cdef Py_ssize_t* _rowbytes   # per field: the bytes of one slot's value
    cdef Py_ssize_t* _pitch      # per field: from one slot's value to the next (the rowbytes, or a row of fields)
    cdef Py_ssize_t* _row_lines  # the fields whose line of a row no earlier field's shares
    cdef Py_ssize_t _nrow_lines  # how many; 0 while the fields fit a core's cache (no prefetch)
    cdef object _fields_keepalive

    cpdef Py_ssize_t add_one(self, dict values, double priority=*, object timeout=*) except -2
    cpdef dict sample(self, Py_ssize_t batch_size, bint stratified, double beta=*, object timeout=*, dict out=*,
                      bint leaves=*, bint float32_weights=*, bint uint64_indexes=*)
    cpdef Py_ssize_t update(self, object slots, object priorities) except -2
    cdef Py_ssize_t _check_sequences(self, const int64_t[::1] slots, const uint64_t[::1] generations,
                                     const int64_t[::1] steps, const double[::1] priorities) except -1
    cdef Py_ssize_t _reserve_waiting(self, Py_ssize_t k, uint64_t* reserved, bint insert,
                                     double deadline, Py_ssize_t lane, Py_ssize_t skip=*) except -1
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
