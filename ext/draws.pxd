# The draw path of a replay table (ext/draws.pyx): sample, torn-row redraws, priority updates.
# ext/table_handle.pyx hands its calls here.
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.gather cimport Draws
from mpreplay._ext.handle_state cimport HandleState
from mpreplay._ext.table_parts cimport TableParts


cdef dict sample(TableParts t, HandleState h, Py_ssize_t batch_size, bint stratified, double beta, object timeout, dict out,
                 bint leaves, bint float32_weights, bint uint64_indexes)
cdef Py_ssize_t update(TableParts t, HandleState h, object slots, object priorities) except -2
cdef int check_priorities(TableParts t, const double[::1] priorities) except -1
cdef object tags(TableParts t, const int64_t[::1] slots)
