# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The selector interface (see selector.pxd): what each way of selecting implements."""


cdef class Selector:
    """Abstract: a table is built with a subclass (PrioritizedSelector)."""

    def __init__(self, *args, **kwargs):
        if type(self) is Selector:
            raise TypeError("Selector is an interface: use a subclass such as PrioritizedSelector")

    cdef void set(self, Py_ssize_t item, double priority) noexcept nogil:
        pass

    cdef void clear(self, Py_ssize_t item) noexcept nogil:
        pass

    cdef void fix(self, Py_ssize_t item) noexcept nogil:
        pass

    cdef void rebuild(self) noexcept nogil:
        pass

    cdef double default_priority(self) noexcept nogil:
        return 1.0

    cdef double total(self) noexcept nogil:
        return 0.0

    cdef double smallest(self) noexcept nogil:
        return 0.0

    cdef double weight(self, Py_ssize_t item) noexcept nogil:
        return 0.0

    cdef double priority(self, Py_ssize_t item) noexcept nogil:
        return 0.0

    cdef void draw(self, int64_t* items, double* scratch, Py_ssize_t k, Py_ssize_t nstrata,
                   bitgen_t* rng) noexcept nogil:
        pass

    cdef Py_ssize_t draw_one(self, bitgen_t* rng) noexcept nogil:
        return -1
