# The end of a process that owns segments; see ext/termination.pyx.

# The C handler guard() puts in front of Python's (it calls only what a signal handler may).
cdef void ending_signal_handler(int sig) noexcept nogil
