# The slot table (ext/slots.pyx): what the table kernel calls with the lock held.
cimport cython
from libc.stdint cimport int64_t, uint64_t, uint8_t

from mpreplay._ext.frames cimport Frames
from mpreplay._ext.remover cimport Remover
from mpreplay._ext.schema cimport COMPLETE, LANE_CURSOR, LANE_END, LANE_START, being_written
from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sequences cimport Sequences

cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

# Fault injection sites for the crash tests (arm_fault).
cdef enum:
    F_NONE, F_RESERVE, F_PUBLISH, F_COMPLETE, F_RETIRE, F_UPDATE, F_DRAW, F_OPEN

cdef void fault(int site) noexcept nogil


# Final: the write and draw paths call its methods directly, not through a table of methods.
@cython.final
cdef class Slots:
    cdef int64_t[::1] header
    cdef int64_t[:, ::1] lanes
    cdef uint64_t[::1] gen
    cdef int64_t[::1] owner
    cdef uint8_t[::1] state
    cdef Selector selector
    cdef Remover remover
    cdef Frames frames
    cdef Sequences sequences           # a sequence table's index (items are sequences), or None (items are slots)
    cdef int64_t[:, ::1] writers
    cdef Py_ssize_t writer_row         # this process's row of `writers`; -1: none yet, -2: none left
    cdef int64_t token                 # this process as a writer (see processes.process_token)
    cdef readonly Py_ssize_t size
    cdef int64_t* times_sampled        # per slot: its draws since published (max_times_sampled tables), or NULL
    cdef readonly int64_t max_times    # draws after which an item retires; 0: never
    cdef object _times_keep

    # What the table reads of the slots and lanes, by name (inline: no call where it read an array;
    # the arrays are bound at construction, so no check that they are).
    @cython.initializedcheck(False)
    cdef inline Py_ssize_t nlanes(self) noexcept nogil:
        return self.lanes.shape[0]

    @cython.initializedcheck(False)
    cdef inline Py_ssize_t lane_length(self, Py_ssize_t lane) noexcept nogil:
        return self.lanes[lane, LANE_END] - self.lanes[lane, LANE_START]

    @cython.initializedcheck(False)
    cdef inline Py_ssize_t lane_cursor(self, Py_ssize_t lane) noexcept nogil:
        # The lane's next slot to write: its oldest row.
        return self.lanes[lane, LANE_CURSOR]

    @cython.initializedcheck(False)
    cdef inline uint64_t generation(self, Py_ssize_t s) noexcept nogil:
        return self.gen[s]

    @cython.initializedcheck(False)
    cdef inline uint8_t state_of(self, Py_ssize_t s) noexcept nogil:
        return self.state[s]

    @cython.initializedcheck(False)
    cdef inline bint holds_row(self, Py_ssize_t s) noexcept nogil:
        # A complete transition (or step), published: nobody writes it now.
        return self.state[s] == COMPLETE and not being_written(self.gen[s])

    @cython.initializedcheck(False)
    cdef inline void prefetch(self, Py_ssize_t s) noexcept nogil:
        # Ask for the lines holds_row reads of slot s.
        __builtin_prefetch(&self.gen[s])
        __builtin_prefetch(&self.state[s])

    cdef Py_ssize_t slot(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t j) noexcept nogil
    cdef void fix_run(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k) noexcept nogil
    cdef Py_ssize_t run_at_cursor(self, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip, int64_t* busy) except -3
    cdef bint find_free(self, Py_ssize_t k, Py_ssize_t lane, int64_t* free) except -1
    cdef bint unread(self, Py_ssize_t lane, Py_ssize_t s) noexcept nogil
    cdef Py_ssize_t free_run(self, Py_ssize_t k, Py_ssize_t lane, Py_ssize_t skip) noexcept nogil
    cdef Py_ssize_t find_room(self, Py_ssize_t k, Py_ssize_t lane) except -2
    cdef Py_ssize_t claim_lane(self) except -2
    cdef void release_lane(self, Py_ssize_t lane) noexcept nogil
    cdef void restart_lanes(self) noexcept nogil
    cdef void retire(self, Py_ssize_t s) noexcept nogil
    cdef void count_draw(self, Py_ssize_t s) noexcept nogil
    cdef void retire_readers(self, Py_ssize_t lane, Py_ssize_t s) noexcept nogil
    cdef uint64_t _take(self, Py_ssize_t s) noexcept nogil
    cdef Py_ssize_t reserve(self, Py_ssize_t k, uint64_t* reserved, bint insert, Py_ssize_t lane,
                            Py_ssize_t skip, int64_t* free, int64_t* busy) except -3
    cdef int note_writer(self) except -1
    cdef Py_ssize_t publish(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k, const uint64_t* reserved,
                            const double* priorities, const uint8_t* states, const int64_t* slots) noexcept nogil
    cdef Py_ssize_t complete(self, const int64_t* slots, const uint64_t* generations, const double* priorities,
                             Py_ssize_t n) noexcept nogil
    cdef Py_ssize_t open_sequences(self, const int64_t* slots, const uint64_t* generations, const int64_t* steps,
                                   const double* priorities, Py_ssize_t n) noexcept nogil
    cdef void disown(self, Py_ssize_t lane, Py_ssize_t start, Py_ssize_t k, const uint64_t* reserved,
                     const int64_t* slots, Py_ssize_t back) noexcept nogil
