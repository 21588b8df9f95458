from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sumtree cimport PriorityTree


cdef class PrioritizedSelector(Selector):
    cdef PriorityTree _tree
