# The replay table's declarations: ext/calls.pyx calls its per-step methods without Python.
cimport cython
cimport numpy as cnp

from mpreplay._ext.episode cimport Episode
from mpreplay._ext.handle_state cimport HandleState
from mpreplay._ext.table_parts cimport TableParts


@cython.final
cdef class TableHandle:
    # A table's handle: the table's shared part, and this handle's own state.
    cdef TableParts _table
    cdef HandleState _handle
    cdef readonly Py_ssize_t size

    cpdef Py_ssize_t add_one(self, dict values, double priority=*, object timeout=*) except -2
    cpdef Py_ssize_t add_rows(self, dict values, object priorities=*, object timeout=*, Episode episode=*) except -2
    cpdef dict sample(self, Py_ssize_t batch_size, bint stratified, double beta=*, object timeout=*, dict out=*,
                      bint leaves=*, bint float32_weights=*, bint uint64_indexes=*)
    cpdef Py_ssize_t update(self, object slots, object priorities) except -2
