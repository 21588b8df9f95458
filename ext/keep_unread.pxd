from mpreplay._ext.remover cimport Remover


cdef class KeepUnreadRemover(Remover):
    pass
