# The shared segment's schema, the one place that says where everything lives.
# Kernels cimport it; Python imports the same names from mpreplay._ext.schema,
# which also lists the segment's arrays.  See docs/architecture.md, "Segment schema".
from libc.stdint cimport uint64_t

# "header": int64 counters.
cpdef enum:
    STORED           # complete transitions stored now
    INSERTS          # transitions published, ever
    SAMPLES          # rows drawn, ever (what a rate limiter counts)
    STALE            # priority updates dropped as stale
    TORN             # rows redrawn because they were overwritten while copied
    LOCK_WAIT_NS     # nanoseconds spent waiting for the lock
    LOCK_HOLDS       # lock acquisitions
    CLOSED           # nonzero once the table ended for every handle: why, one of ENDED_* below
    RESERVED         # rows reserved by writers, ever (the inserts a rate limiter counts)
    EPOCH            # bumped (low 32 bits) whenever a blocked caller may proceed: the futex word
    WAITERS          # callers blocked on EPOCH
    # The run of slots a writer is reserving, written before the first slot changes and cleared
    # once the last has: recovery ends a reservation its holder died inside (Slots.recover).
    PENDING_LANE
    PENDING_START
    PENDING_CURSOR   # where the lane's cursor goes once the run is reserved
    PENDING_COUNT    # 0: no reservation in progress
    HEADER_LEN = 16

# Why the header's CLOSED word is set: every handle's next call raises the error it names
# (ext/gate.pyx).  A word, written once: never by the hot paths, which only read it.
cpdef enum:
    ENDED_CLOSED = 1     # its owner closed it (BufferClosed)
    ENDED_CREATOR = 2    # its creator died, and it was not persistent (TableGone)
    ENDED_REMOVED = 3    # removed: mpreplay rm, or close(unlink=True) (TableGone)

# "limits": float64 rate limiter settings (see mpreplay.limiter).
cpdef enum:
    LIMIT_ON         # 0: no rate limiter
    LIMIT_SPI        # samples per insert
    LIMIT_MIN_SIZE   # stored transitions before sampling may start
    LIMIT_MIN_DIFF   # the cursor inserts * spi - samples stays within [min_diff, max_diff]
    LIMIT_MAX_DIFF
    LIMITS_LEN

# "lanes": int64 rows, one per lane (a ring of slots one writer fills in order).
cpdef enum:
    LANE_START
    LANE_END
    LANE_CURSOR      # the next slot to reserve: the oldest one
    LANE_OWNER       # token of the writer process that claimed the lane, 0: none
    LANE_LEN

# "writers": int64 rows, one per writer process that has published (what `mpreplay top` shows).
cpdef enum:
    WRITER_TOKEN     # the writer's process token (see processes.process_token), 0: a free row
    WRITER_INSERTS   # transitions it published, ever
    WRITER_LEN
    MAX_WRITERS = 64  # writers beyond these store as usual and are not counted apart

# "state": uint8, one per slot.
cpdef enum:
    EMPTY            # nothing sampleable: never written, being written, a lone frame, or broken
    COMPLETE         # a transition every frame of which is stored
    WAITING          # a transition whose next observation is not stored yet


# "generation": uint64, one per slot; odd while a writer holds the slot.
cdef inline bint being_written(uint64_t generation) noexcept nogil:
    return generation & 1


cdef inline uint64_t next_reservation(uint64_t generation) noexcept nogil:
    # The odd generation a new reservation gives the slot.
    return generation + 1 + (generation & 1)
