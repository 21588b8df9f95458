from mpreplay._ext.heap cimport HeapSelector


cdef class LifoSelector(HeapSelector):
    pass
