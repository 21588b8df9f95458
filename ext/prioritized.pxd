from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sumtree cimport PriorityTree


cdef class PrioritizedSelector(Selector):
    cdef PriorityTree _tree
    cdef bint _max_ever        # new items get the largest priority ever set (cpprb's rule), not the largest stored
    cdef double _last_priority  # the priority of the last lone weight computed (NaN: none yet), and the weight
    cdef double _last_weight
