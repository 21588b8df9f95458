from libc.stdint cimport int64_t

from mpreplay._ext.selector cimport Selector


cdef class UniformSelector(Selector):
    cdef int64_t[::1] _state
    cdef int64_t* _count      # how many items may be drawn
    cdef int64_t* _members    # those items, densely packed
    cdef int64_t* _position   # where each item sits in _members, -1 when it may not be drawn
