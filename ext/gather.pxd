# Gathering what a sample drew (ext/gather.pyx): rows, rebuilt frames and sequences copied into
# its outputs without the lock.  ext/draws.pyx fills the Draws and calls copy_rows.
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.table_parts cimport TableParts


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


cdef void copy_rows(TableParts t, const Draws* d, Py_ssize_t k, const Py_ssize_t* rows) noexcept nogil
