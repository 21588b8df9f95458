from mpreplay._ext.heap cimport HeapSelector


cdef class MaxHeapSelector(HeapSelector):
    pass
