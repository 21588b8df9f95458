# What a write replaces when it needs room: a table's remover (Reverb's item remover), owned by
# its slot table.  A new remover is a subclass in a kernel file of its own and one entry of
# mpreplay/removers.py (the registry); see ext/remover.pyx and docs/architecture.md, "Removers".
from libc.stdint cimport int64_t

cdef enum:
    SCATTERED = -1   # the write's slots lie anywhere: they are in `free`
    WAIT = -2        # no room now: the write waits (for a sample, or for a writer still copying)


cdef class Remover:
    cdef readonly bint overwrites   # a write may replace an item not yet sampled (else it waits)

    # Lock held, `slots` the table's Slots.  Where a write of k slots goes in `lane`: the start of
    # a run of k consecutive slots (`skip` past the cursor: a batch longer than the lane), SCATTERED
    # (`free` filled; only where `free` is not NULL and the table stores rows), or WAIT, `busy` set
    # to the token of a live writer still copying into the slots it needs (0: items hold them).
    # Changes nothing but a dead writer's reservations, taken over on the way.
    cdef Py_ssize_t place(self, object slots, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* free,
                          int64_t* busy) except -3
    # The lane's cursor once the run of k slots from `start` that place() chose is reserved.
    cdef Py_ssize_t cursor_after(self, object slots, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept
