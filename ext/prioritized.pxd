from libc.stdint cimport int64_t

from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sumtree cimport PriorityTree


cdef class PrioritizedSelector(Selector):
    cdef readonly PriorityTree tree
    cdef readonly double alpha, eps
    cdef bint _max_ever        # new items get the largest priority ever set (cpprb's rule), not the largest stored
    cdef double _last_priority  # the priority of the last lone weight computed (NaN: none yet), and the weight
    cdef double _last_weight

    cdef void weigh_each(self, const int64_t* items, const double* priorities, Py_ssize_t k) noexcept nogil
