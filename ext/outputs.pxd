# The output table of a replay table's samples (ext/outputs.pyx): what sample() allocates, or
# checks in `out=`, per output; and the spare batches a handle hands out again.
from libc.stdint cimport uint8_t

cimport numpy as cnp

from mpreplay._ext.codec cimport MAX_ROW_DIMS


cdef enum:
    # Compressed observations a row may have (obs and next_obs of each compressed key).
    MAX_FRAME_OUTPUTS = 64
    # The dimensions of a sample output: a row's (numpy 1 allows 32) after the lead (rows, steps).
    MAX_OUTPUT_DIMS = MAX_ROW_DIMS + 1
    # Fresh batches kept for reuse once their caller let go of them (see Spares.take): a
    # loop holds the batch it trains on while it draws the next, so the one before is free.
    SPARE_BATCHES = 2
    # The largest batch kept, so a handle holds at most SPARE_BATCHES of them beside what its
    # caller holds.  Large ones matter most: a fresh (84, 84, 4) batch of 256 rows is 14 MB of
    # new pages, each faulted in as the gather first writes it.
    SPARE_MAX_BYTES = 64 << 20


cdef inline bint is_vector(object arr, int typenum):
    # A 1-D C-contiguous aligned array of native `typenum` (read-only allowed).
    return (cnp.PyArray_Check(arr) and cnp.PyArray_NDIM(<cnp.ndarray>arr) == 1
            and cnp.PyArray_TYPE(<cnp.ndarray>arr) == typenum and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>arr)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>arr))


cdef class Outputs:
    # Sample outputs: the fields, the compressed observations, (sequence tables) the mask.
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t nframes            # compressed observations, after the fields
    cdef list names, dtypes
    cdef tuple result_keys             # the keys of a result (plain, with weights, with leaves), as dicts to copy
    cdef tuple weighted_keys           # the keys of a result with weights, in order
    cdef int* nd
    cdef int* typenums
    cdef cnp.npy_intp* dims            # per output, MAX_OUTPUT_DIMS: its dimensions, rows first (set per call)
    cdef Py_ssize_t* step_bytes        # per output: the bytes of one row (of a sequence: of one step)
    cdef Py_ssize_t frame_keys[MAX_FRAME_OUTPUTS]  # per compressed observation: its key
    cdef bint frame_next[MAX_FRAME_OUTPUTS]        # per compressed observation: of the next slot
    # per compressed observation: the next observation of its key, rebuilt with it (-1: none;
    # -2: this is one, rebuilt with the other)
    cdef Py_ssize_t frame_partner[MAX_FRAME_OUTPUTS]
    cdef Py_ssize_t batch_row_bytes    # what one row of a fresh batch holds, indexes and weights too

    cdef int fill(self, Py_ssize_t b, dict out, dict result, bint spare, uint8_t** dst) except -1
    cdef bint fits(self, object arr, Py_ssize_t i, Py_ssize_t nd, const cnp.npy_intp* dims)


cdef class Spares:
    # A handle's fresh batches, SPARE_BATCHES of them, handed out again (see take).
    cdef Outputs _outputs
    cdef list _batches

    cdef dict take(self, Py_ssize_t b, bint weights, int index_type, int weight_type)
    cdef int keep(self, dict batch) except -1
