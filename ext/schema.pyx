# cython: language_level=3
"""The shared segment's schema for Python: the names of schema.pxd and the list of arrays.

A buffer's memory (heap or shared segment) is these arrays, in this order,
each at a 64-byte aligned offset (mpreplay.memory.Layout places them).
See docs/architecture.md, "Segment schema".
"""
from libc.stdint cimport uint64_t

import numpy as np


# The first array of every segment: its manifest (mpreplay.monitor), a JSON document that lets
# another process read the segment without the buffer's configuration.
MANIFEST_ARRAY = "manifest"
MANIFEST_NBYTES = 16384
# The arrays of schema.pxd's enums (the header's counters, the rate limiter's settings, the lane
# and writer rows), then per slot its generation, reserving writer and state.
HEADER_ARRAY = "header"
LIMITS_ARRAY = "limits"
LANES_ARRAY = "lanes"
WRITERS_ARRAY = "writers"
GENERATION_ARRAY = "generation"
OWNER_ARRAY = "owner"
STATE_ARRAY = "state"

# The selector's one array: a sum tree (prioritized selection), the packed members (uniform), or
# selector_array(name) for the others (mpreplay.selectors).
TREE_ARRAY = "tree"
MEMBERS_ARRAY = "members"

# Sequence tables: per slot, the real steps of the sequence starting there (ext/sequences.pyx), the
# step's index in its episode, and 1 where a writer stored the first step of an episode (its step 0,
# or a loaded episode's oldest kept step): what a saved buffer needs to give back the same episodes.
SEQUENCE_STEPS_ARRAY = "sequence_steps"
# Buffers with max_times_sampled: per slot, the draws since it was published.
TIMES_SAMPLED_ARRAY = "times_sampled"
EPISODE_STEP_ARRAY = "episode_step"
EPISODE_START_ARRAY = "episode_start"


def field_array(str name):
    """The array holding uncompressed field ``name``."""
    return f"field:{name}"


def frames_array(str key):
    """The array holding the frames of compressed observation ``key``."""
    return f"frames:{key}"


def selector_array(str name):
    """The array of registered selector ``name`` when its entry names none of its own."""
    return f"selector:{name}"


# Compressed buffers, per slot: the slot of its next observation, and how many frames of its
# episode come before it (ext/frames.pyx).
NEXT_ARRAY = "nxt"
DEPTH_ARRAY = "depth"
# The SharedLock of a shared segment (ext/lock.pyx); a local buffer has none.
LOCK_ARRAY = "lock"


# The uncompressed fields of a slot side by side in one row of this array (see row_layout).
ROWS_ARRAY = "rows"


def row_layout(list fields):
    """``(pitch, offsets)`` of uncompressed fields ``(name, shape, dtype)`` stored side by side,
    one row per slot: each field at an offset aligned for its dtype, in the order given.

    A row of up to 64 bytes is padded to a power of two, so no row straddles a cache line; a
    longer one to whole cache lines.  A draw then reads one line (or the fewest) for all the
    fields of its row, where an array per field costs a line per field.
    """
    cdef Py_ssize_t end = 0, pitch, a
    offsets = []
    for name, shape, dtype in fields:
        dt = np.dtype(dtype)
        a = dt.alignment
        end = (end + a - 1) // a * a
        offsets.append(end)
        end += dt.itemsize * int(np.prod(shape, dtype=np.int64))
    pitch = max(end, 1)
    pitch = 1 << (pitch - 1).bit_length() if pitch <= 64 else (pitch + 63) // 64 * 64
    return pitch, offsets


def segment_arrays(Py_ssize_t size, Py_ssize_t lanes, tuple selector, list fields, list frames,
                   Py_ssize_t lock_nbytes, bint sequences=False, bint rows=False, bint times_sampled=False):
    """``(name, shape, dtype)`` of every array of a buffer, in layout order.

    ``selector``: ``(name, length, dtype)`` of the selector's one array (TREE_ARRAY for
    prioritized selection, MEMBERS_ARRAY for uniform, else selector_array(name)); ``fields``: ``(name, shape, dtype)`` of
    the uncompressed fields; ``frames``:
    ``(key, frame_shape, dtype)`` of the compressed observations, or None for an
    uncompressed buffer; ``lock_nbytes``: 0 for a buffer without a lock; ``sequences``:
    whether the table samples sequences of steps; ``rows``: the fields side by side in one
    ROWS_ARRAY (see row_layout) instead of an array each; ``times_sampled``: a count of draws
    per slot (TIMES_SAMPLED_ARRAY, a buffer with ``max_times_sampled``).
    """
    out = [(MANIFEST_ARRAY, (MANIFEST_NBYTES,), np.uint8),
           (HEADER_ARRAY, (HEADER_LEN,), np.int64),
           (LIMITS_ARRAY, (LIMITS_LEN,), np.float64),
           (LANES_ARRAY, (lanes, LANE_LEN), np.int64),
           (WRITERS_ARRAY, (MAX_WRITERS, WRITER_LEN), np.int64),
           (GENERATION_ARRAY, (size,), np.uint64),
           (OWNER_ARRAY, (size,), np.int64),
           (STATE_ARRAY, (size,), np.uint8),
           (selector[0], (selector[1],), selector[2])]
    if times_sampled:
        out.append((TIMES_SAMPLED_ARRAY, (size,), np.int64))
    if rows and fields:
        out.append((ROWS_ARRAY, (size, row_layout(fields)[0]), np.uint8))
    else:
        out += [(field_array(name), (size,) + tuple(shape), dtype) for name, shape, dtype in fields]
    if frames is not None:
        out += [(NEXT_ARRAY, (size,), np.int64), (DEPTH_ARRAY, (size,), np.uint8)]
        out += [(frames_array(key), (size,) + tuple(shape), dtype) for key, shape, dtype in frames]
    if sequences:
        out += [(SEQUENCE_STEPS_ARRAY, (size,), np.int32), (EPISODE_STEP_ARRAY, (size,), np.int64),
                (EPISODE_START_ARRAY, (size,), np.uint8)]
    if lock_nbytes:
        out.append((LOCK_ARRAY, (lock_nbytes,), np.uint8))
    return out

