from mpreplay._ext.remover cimport Remover


cdef class LifoRemover(Remover):
    pass
