# The scalar codec of the one-row adds (ext/codec.pyx): Python numbers and exact-dtype arrays
# staged as one slot's field values without numpy.  The table's write path calls it.
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY
from libc.stdint cimport int64_t, uint64_t, uint8_t

cimport numpy as cnp


# Element kinds the single-transition fast path converts without numpy.
cdef enum Kind:
    K_OTHER, K_F32, K_F64, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_BOOL


cdef enum:
    # The dimensions of a row: numpy 2 allows 64, a sample output at most 34 with its lead (rows).
    MAX_ROW_DIMS = 33


cdef Kind kind_of(object dtype)


cdef inline bint narrow_to_float(const double* src, float* dst, Py_ssize_t n) noexcept nogil:
    # False when a finite value would overflow float32: the general path then says so.
    cdef Py_ssize_t j
    cdef double x
    for j in range(n):
        x = src[j]
        if not (-FLT_MAX <= x <= FLT_MAX or x != x or x == INFINITY or x == -INFINITY):
            return False
        dst[j] = <float>x
    return True


cdef inline bint store_int(Kind kind, long long x, uint8_t* dst) noexcept nogil:
    # Write integer `x` as `kind`; False if it does not fit.
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


cdef class Staging:
    # One row of every field, as a handle's one-row add stages it: per field, where its value
    # is copied from (the caller's array, or the field's staging row).
    cdef Py_ssize_t n
    cdef list names
    cdef list _rows                  # per field: its staging row (a numpy array this object owns)
    cdef uint8_t** _row              # their memory
    cdef const uint8_t** src         # per field, once staged: the value to copy (a batch's first row)
    cdef Py_ssize_t* rowbytes        # per field: the bytes of one value
    cdef Kind* _kinds
    cdef bint* _one                  # per field: shape (1,), which a number or a 0-d array fills
    cdef int* _typenums
    cdef int* _nd                    # per field: the dimensions of a value, and their lengths
    cdef cnp.npy_intp* _dims         # (n, MAX_ROW_DIMS)

    cdef bint stage(self, Py_ssize_t i, object value) except -1
    cdef bint stage_all(self, dict values) except -1
    cdef Py_ssize_t stage_rows(self, dict values) except -1
    cdef Py_ssize_t _rows_of(self, Py_ssize_t i, object value) except -1
    cdef int flag_set(self, Py_ssize_t i, Py_ssize_t row) except -2
