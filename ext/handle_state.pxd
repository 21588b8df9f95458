# A handle's own state (ext/handle_state.pyx): what one buffer object keeps apart from the table it
# shares with other handles, threads and processes.
from libc.stdint cimport int64_t, uint64_t
from numpy.random cimport bitgen_t

from mpreplay._ext.codec cimport Staging
from mpreplay._ext.outputs cimport Spares

cdef extern from *:
    """#define MPR_NOT_SAMPLED 0xFFFFFFFFFFFFFFFFULL"""
    # A slot this handle has not sampled, in its record.
    const uint64_t NOT_SAMPLED "MPR_NOT_SAMPLED"


cdef class HandleState:
    cdef object _bitgen_owner
    cdef bitgen_t* bitgen             # the draws' random stream
    cdef object _sampled              # per slot: the generation this handle sampled (None: nothing yet)
    cdef uint64_t* record             # its memory (NULL: nothing sampled yet)
    cdef readonly Py_ssize_t size
    cdef Staging staging              # the one-row adds' values, staged
    cdef Spares spares                # sample's fresh batches, handed out again

    cdef int note_sampled(self, const int64_t* slots, const uint64_t* generations, Py_ssize_t b) except -1
