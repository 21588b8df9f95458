# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The scalar codec of the one-row adds: Python numbers and exact-dtype arrays -> a slot's values.

``TableHandle.add_one`` and ``TableHandle.add_step`` take one transition as an actor passes it: Python
floats, ints and bools, and arrays of the field's own dtype and shape.  :class:`Staging`
stages each value without numpy (an array of the field's dtype is copied from where it
lies), or says that a value needs numpy's conversion -- then the general path takes the
call and nothing was changed.  A staging is a handle's own scratch: two handles of one
table never share one.
"""
from libc.stdlib cimport free, malloc
from cpython.dict cimport PyDict_GetItem
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.ref cimport PyObject

import numpy as np

cnp.import_array()


cdef Kind kind_of(object dtype):
    cdef dict kinds = {
        "f4": K_F32, "f8": K_F64, "i1": K_I8, "i2": K_I16, "i4": K_I32, "i8": K_I64,
        "u1": K_U8, "u2": K_U16, "u4": K_U32, "u8": K_U64, "b1": K_BOOL,
    }
    return kinds.get(f"{dtype.kind}{dtype.itemsize}", K_OTHER)


cdef class Staging:
    """A staging row per field: ``fields`` is a list of ``(name, shape, dtype)`` of one slot's values."""

    def __cinit__(self):
        self._row = NULL
        self.src = NULL
        self.rowbytes = NULL
        self._kinds = NULL
        self._one = NULL
        self._typenums = NULL
        self._nd = NULL
        self._dims = NULL

    def __init__(self, list fields not None):
        cdef Py_ssize_t i, d, n = len(fields)
        self.n = n
        self.names, self._rows = [], []
        self._row = <uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self.src = <const uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self.rowbytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self._kinds = <Kind*>malloc(n * sizeof(Kind) + 1)
        self._one = <bint*>malloc(n * sizeof(bint) + 1)
        self._typenums = <int*>malloc(n * sizeof(int) + 1)
        self._nd = <int*>malloc(n * sizeof(int) + 1)
        self._dims = <cnp.npy_intp*>malloc(n * MAX_ROW_DIMS * sizeof(cnp.npy_intp) + 1)
        if not (self._row and self.src and self.rowbytes and self._kinds and self._one and self._typenums
                and self._nd and self._dims):
            raise MemoryError()
        for i, (name, shape, dtype) in enumerate(fields):
            if len(shape) > MAX_ROW_DIMS:
                raise ValueError(f"{name}: expected at most {MAX_ROW_DIMS} dimensions, got shape {shape}")
            row = np.zeros(shape, dtype=dtype)
            self.names.append(name)
            self._rows.append(row)
            self._row[i] = <uint8_t*>cnp.PyArray_DATA(row)
            self.src[i] = self._row[i]
            self.rowbytes[i] = row.nbytes
            self._kinds[i] = kind_of(row.dtype)
            self._one[i] = row.shape == (1,)
            self._typenums[i] = row.dtype.num
            self._nd[i] = row.ndim
            for d in range(row.ndim):
                self._dims[i * MAX_ROW_DIMS + d] = row.shape[d]

    def __dealloc__(self):
        free(self._row)
        free(self.src)
        free(self.rowbytes)
        free(self._kinds)
        free(self._one)
        free(self._typenums)
        free(self._nd)
        free(self._dims)

    cdef bint stage_all(self, dict values) except -1:
        # Stage every field's value of `values`; False (a field missing, or a value that is not
        # a fast-path case) sends the call to the general path.
        cdef Py_ssize_t i
        cdef PyObject* item
        for i in range(self.n):
            item = PyDict_GetItem(values, self.names[i])
            if item == NULL or not self.stage(i, <object>item):
                return False
        return True

    cdef Py_ssize_t stage_rows(self, dict values) except -1:
        # Stage every field's rows of `values` -- one transition, or a batch with a leading
        # dimension -- each row `row` of field i then at src[i] + row * rowbytes[i]; returns how
        # many rows, or 0 (a field missing, a value that is not a fast-path case, lengths that
        # disagree) to send the call to the general path.
        cdef Py_ssize_t i, k = 0, rows
        cdef PyObject* item
        for i in range(self.n):
            item = PyDict_GetItem(values, self.names[i])
            if item == NULL:
                return 0
            rows = self._rows_of(i, <object>item)
            if rows == 0 or (k and rows != k):
                return 0
            k = rows
        return k

    cdef Py_ssize_t _rows_of(self, Py_ssize_t i, object value) except -1:
        # Field i's rows in `value`, staged: a batch (an aligned C array of the field's exact dtype
        # and, after its leading dimension, shape; or, for a field of shape (1,), one number per
        # row) read in place; anything else one row, as stage() takes it.  0: not a fast-path case.
        cdef cnp.ndarray arr
        cdef Py_ssize_t d, nd = self._nd[i]
        cdef const cnp.npy_intp* dims = self._dims + i * MAX_ROW_DIMS
        if not cnp.PyArray_CheckExact(value):
            return 1 if self.stage(i, value) else 0
        arr = <cnp.ndarray>value
        if cnp.PyArray_NDIM(arr) == nd + 1:
            for d in range(nd):
                if cnp.PyArray_DIM(arr, d + 1) != dims[d]:
                    return 0
        elif not (self._one[i] and cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_DIM(arr, 0) != 1):
            return 1 if self.stage(i, value) else 0
        if (cnp.PyArray_TYPE(arr) != self._typenums[i] or not cnp.PyArray_ISCARRAY_RO(arr)
                or not cnp.PyArray_ISNOTSWAPPED(arr)):
            return 0
        self.src[i] = <const uint8_t*>cnp.PyArray_DATA(arr)
        return cnp.PyArray_DIM(arr, 0)

    cdef bint stage(self, Py_ssize_t i, object value) except -1:
        """Convert ``value`` into field i's staging row; False = not a fast-path case."""
        cdef cnp.ndarray arr
        cdef Py_ssize_t d
        cdef int overflow = 0
        cdef long long x
        cdef double x64
        cdef Kind kind = self._kinds[i]
        cdef Py_ssize_t nd = self._nd[i]
        cdef const cnp.npy_intp* dims = self._dims + i * MAX_ROW_DIMS
        if cnp.PyArray_CheckExact(value):
            arr = <cnp.ndarray>value
            if not cnp.PyArray_ISCARRAY_RO(arr) or not cnp.PyArray_ISNOTSWAPPED(arr):
                return False
            if not (cnp.PyArray_NDIM(arr) == 0 and self._one[i]):  # a 0-d array fills a (1,) field
                if cnp.PyArray_NDIM(arr) != nd:
                    return False
                for d in range(nd):
                    if cnp.PyArray_DIM(arr, d) != dims[d]:
                        return False
            if cnp.PyArray_TYPE(arr) == self._typenums[i]:
                # Copied straight from the caller's array once the slot is reserved.
                self.src[i] = <const uint8_t*>cnp.PyArray_DATA(arr)
                return True
            if kind == K_F32 and cnp.PyArray_TYPE(arr) == cnp.NPY_DOUBLE:
                # float64 observations into a float32 field: numpy's default dtype
                # meeting the buffer's, the most common conversion of all.
                self.src[i] = self._row[i]
                return narrow_to_float(<const double*>cnp.PyArray_DATA(arr), <float*>self._row[i],
                                       cnp.PyArray_SIZE(arr))
            return False
        if not (self._one[i] or nd == 0):  # a number fills a field of one element
            return False
        self.src[i] = self._row[i]
        if PyFloat_CheckExact(value):
            if kind == K_F32:
                x64 = PyFloat_AS_DOUBLE(value)
                return narrow_to_float(&x64, <float*>self._row[i], 1)
            if kind == K_F64:
                (<double*>self._row[i])[0] = PyFloat_AS_DOUBLE(value)
            else:
                return False
            return True
        if value is True or value is False:
            return store_int(kind, 1 if value is True else 0, self._row[i])
        if PyLong_CheckExact(value):
            x = PyLong_AsLongLongAndOverflow(value, &overflow)
            return overflow == 0 and store_int(kind, x, self._row[i])
        return False

    cdef int flag_set(self, Py_ssize_t i, Py_ssize_t row) except -2:
        # Whether field i's staged value of `row` is nonzero (it ends an episode); -1: a kind not
        # judged here.
        cdef Kind kind = self._kinds[i]
        cdef const uint8_t* v = self.src[i] + row * self.rowbytes[i]
        cdef Py_ssize_t b
        if kind == K_F32:
            return (<const float*>v)[0] != 0.0
        if kind == K_F64:
            return (<const double*>v)[0] != 0.0
        if kind == K_OTHER:
            return -1
        for b in range(self.rowbytes[i]):
            if v[b]:
                return 1
        return 0
