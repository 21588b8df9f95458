from mpreplay._ext.remover cimport Remover


cdef class FifoRemover(Remover):
    pass
