from mpreplay._ext.table_handle cimport TableHandle


cdef class TableCalls:
    cdef TableHandle _kernel            # None: the table is closed (or not bound yet)
    cdef bint _plain             # rows go to the kernel as they are
    cdef object _frames          # a compressed table's writer whose rows go to the kernel as they are, or None
    cdef bint _by_priority       # the selector draws by priority: priorities given and updated, weights handed out
    cdef bint _weights_f32       # the table's weights_dtype is float32
    cdef bint _indexes_u64       # the table's indexes_dtype is uint64
    cdef bint _readonly          # a read-only handle: add, add_row and update_priorities refuse

    cdef TableHandle _open(self)
