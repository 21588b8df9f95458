# The write path of a replay table (ext/writes.pyx): reservations, publications, the one-row
# adds, lanes and clearing.  ext/table_handle.pyx hands its calls here.
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.episode cimport Episode
from mpreplay._ext.handle_state cimport HandleState
from mpreplay._ext.table_parts cimport TableParts


cdef Py_ssize_t reserve_waiting(TableParts t, Py_ssize_t k, uint64_t* reserved, bint insert, double deadline,
                                Py_ssize_t lane, Py_ssize_t skip=*, int64_t* free=*) except -3
cdef Py_ssize_t publish_locked(TableParts t, double deadline, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k,
                               const uint64_t* reserved, const int64_t* slots, const double* priorities,
                               const uint8_t* states,
                               const int64_t* complete, const uint64_t* complete_generations,
                               const double* complete_priorities, Py_ssize_t nc, const int64_t* open_slots,
                               const uint64_t* open_generations, const int64_t* open_steps,
                               const double* open_priorities, Py_ssize_t ns, Py_ssize_t back) except -1
cdef class Reservation:
    cdef TableParts table
    cdef readonly Py_ssize_t lane, start, k
    cdef readonly object reserved    # per slot, the odd generation it was reserved with (uint64)
    cdef object free                 # a scattered reservation's slots (int64), else None
    cdef Py_ssize_t back             # the lane's cursor before a run made elsewhere (reserve_room), else -1

    cdef Py_ssize_t rollback(self)


cdef Reservation reserve(TableParts t, Py_ssize_t k, double deadline, bint insert, Py_ssize_t lane, Py_ssize_t skip,
                         bint scatter)
cdef Reservation reserve_room(TableParts t, Py_ssize_t k, double deadline, Py_ssize_t lane)
cdef Py_ssize_t publish(TableParts t, Py_ssize_t start, const uint64_t[::1] reserved, const double[::1] priorities,
                        const uint8_t[::1] states, Py_ssize_t lane, double deadline, const int64_t[::1] complete,
                        const uint64_t[::1] complete_generations, const double[::1] complete_priorities,
                        tuple sequences, const int64_t[::1] slots, Py_ssize_t back) except -1
cdef Py_ssize_t add_one(TableParts t, HandleState h, dict values, double priority, object timeout) except -2
cdef Py_ssize_t add_rows(TableParts t, HandleState h, dict values, object priorities, object timeout,
                         Episode episode) except -2
cdef Py_ssize_t claim_lane(TableParts t, double deadline) except -1
cdef int release_lane(TableParts t, Py_ssize_t lane) except -1
cdef int clear(TableParts t) except -1
