from mpreplay._ext.ring cimport Ring


cdef class BufferCalls:
    cdef Ring _kernel            # None: the buffer is closed (or not bound yet)
    cdef bint _plain             # one transition goes to the kernel as it is

    cdef Ring _open(self)


cdef class PrioritizedCalls(BufferCalls):
    cdef bint _weights_f32       # the buffer's weights_dtype is float32
    cdef bint _indexes_u64       # the buffer's indexes_dtype is uint64
