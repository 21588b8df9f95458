from mpreplay._ext.heap cimport HeapSelector


cdef class FifoSelector(HeapSelector):
    pass
