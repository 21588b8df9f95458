from mpreplay._ext.heap cimport HeapSelector


cdef class MinHeapSelector(HeapSelector):
    pass
