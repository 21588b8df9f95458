# The n-step fold of a vector of environments (ext/nstep_fold.pyx): what an output field is
# taken from, and the kernel that writes, folds and emits a step in one call.
from libc.stdint cimport int64_t

cimport numpy as cnp


cpdef enum Source:
    FIRST_STEP = 0  # the field of the row's first step: its ring at the row's column
    LAST_STEP = 1   # the field of the step that ends the fold: its ring at the newest column
    FOLDED = 2      # a folded reward: its accumulator at the row's column, cast to the field's dtype
    DISCOUNT = 3    # gamma ** m
    FLAG = 4        # the truncated flag: the last step's, or 1 in the rows an episode end flushes


cdef struct Field:
    Source source
    Py_ssize_t nbytes   # bytes of one row (FIRST_STEP, LAST_STEP, FLAG) or doubles of one (FOLDED)
    char kind           # the output dtype's kind and item size (FOLDED, DISCOUNT, FLAG)
    int itemsize


cdef enum:
    _ARENA_MIN = 16384        # bytes: smaller arrays are numpy's (its allocator keeps small blocks)
    _ARENA_BLOCKS = 64
    _ARENA_BYTES = 1 << 26    # 64 MiB kept at most


cdef class RowArena:
    cdef list blocks
    cdef Py_ssize_t kept

    cpdef object empty(self, tuple shape, object dtype)


cdef class FoldKernel:
    cdef readonly Py_ssize_t n, num_envs
    cdef double* powers          # gamma ** k for k in 0..n
    cdef Field* fields           # per output field, in output order
    cdef list names, shapes, dtypes
    cdef Py_ssize_t nfields
    cdef object done, truncated  # the names of the flags (truncated: None without one)
    cdef Field done_field, truncated_field
    cdef list rews, rings        # the names of the accumulated fields and of the ring fields
    cdef RowArena arena          # where the rows handed out are made

    cdef bint _flag(self, Field f, cnp.ndarray ring, Py_ssize_t e, Py_ssize_t c)
    cdef dict _flush(self, dict rings, dict accs, Py_ssize_t cur, const int64_t* emit, const int64_t* count,
                     int64_t counted, Py_ssize_t total, bint truncate)
    cdef dict _gather(self, dict rings, dict accs, Py_ssize_t cur, const int64_t* envs,
                      const int64_t* cols, const int64_t* m, Py_ssize_t total, bint truncate)
