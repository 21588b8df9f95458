# Writer tokens, declared for the kernels that judge writers (ext/slots.pyx, ext/writes.pyx,
# ext/gate.pyx): they call these as C functions.
from libc.stdint cimport int64_t

cpdef int64_t process_token(int pid) except? -1
cpdef int64_t token_pid(int64_t token) noexcept
cpdef bint token_alive(int64_t token) except -1
cpdef str describe_process(int pid)
