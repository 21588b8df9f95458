# The kernel's types and loops (ext/discount.pyx): the element types it runs on, the
# discount links it specialises on, and the blocking of rows and chunks.

cdef extern from *:
    """
    #define _prefetch(address) __builtin_prefetch(address)
    """
    void _prefetch(const void* address) noexcept nogil

ctypedef fused real:
    float
    double

cdef enum:
    _CHAINS = 8        # chunks of one row recurred together
    _CHUNK = 128       # most steps per chunk; _CHAINS * _CHUNK * 16 bytes of scratch stay in L1
    _MIN_CHUNK = 16    # shorter chunks cost more in stitching than they save
    _ROW_BLOCK = 4     # rows swept together; wider blocks run out of registers for row addresses


cdef struct _Constant:
    double gamma

cdef struct _Stepwise:
    # Byte strides; a missing part points at one constant with zero strides.
    const char* g
    Py_ssize_t g_row, g_step
    const char* d
    Py_ssize_t d_row, d_step

# Specialising on the kind of links keeps the common constant-discount loops free of branches.
ctypedef fused links_t:
    _Constant
    _Stepwise


cdef void _sweep_block(const real[:, :] x, real[:, :] out, const links_t* links, Py_ssize_t r0,
                       bint right) noexcept nogil
cdef void _chunked_row(const real[:, :] x, real[:, :] out, Py_ssize_t r, const links_t* links,
                       double* loc, double* prod, bint right) noexcept nogil
cdef int _run(const real[:, :] x, real[:, :] out, const links_t* links, bint right) except -1
