# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The remover interface (see remover.pxd): where a write goes when the table needs room.

A table's slots form lanes, rings its writers fill in order from their cursor.  The remover
decides which slots a write of ``k`` rows takes -- and so which stored items it replaces: the
ring's oldest (``fifo``), the newest (``lifo``), or none at all, the write waiting for free
slots instead (``keep_unread``: what a Queue or a Stack is built with).  The slot table
(ext/slots.pyx) asks it under the lock, then reserves what it chose.  A remover keeps no state
of its own: the lanes' cursors and the slot states are the table's.
"""


cdef class Remover:
    """Abstract: a table is built with a subclass, one per entry of mpreplay.removers."""

    def __init__(self, *args, **kwargs):
        if type(self) is Remover:
            raise TypeError("Remover is an interface: use a subclass such as FifoRemover")

    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3:
        raise NotImplementedError

    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept:
        return start
