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
WRITERS_ARRAY = "writers"

# The selector's one array: a sum tree (prioritized selection) or the packed members (uniform).
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
    prioritized selection, MEMBERS_ARRAY for uniform); ``fields``: ``(name, shape, dtype)`` of
    the uncompressed fields; ``frames``:
    ``(key, frame_shape, dtype)`` of the compressed observations, or None for an
    uncompressed buffer; ``lock_nbytes``: 0 for a buffer without a lock; ``sequences``:
    whether the table samples sequences of steps; ``rows``: the fields side by side in one
    ROWS_ARRAY (see row_layout) instead of an array each; ``times_sampled``: a count of draws
    per slot (TIMES_SAMPLED_ARRAY, a buffer with ``max_times_sampled``).
    """
    out = [(MANIFEST_ARRAY, (MANIFEST_NBYTES,), np.uint8),
           ("header", (HEADER_LEN,), np.int64),
           ("limits", (LIMITS_LEN,), np.float64),
           ("lanes", (lanes, LANE_LEN), np.int64),
           (WRITERS_ARRAY, (MAX_WRITERS, WRITER_LEN), np.int64),
           ("generation", (size,), np.uint64),
           ("owner", (size,), np.int64),
           ("state", (size,), np.uint8),
           (selector[0], (selector[1],), selector[2])]
    if times_sampled:
        out.append((TIMES_SAMPLED_ARRAY, (size,), np.int64))
    if rows and fields:
        out.append((ROWS_ARRAY, (size, row_layout(fields)[0]), np.uint8))
    else:
        out += [(field_array(name), (size,) + tuple(shape), dtype) for name, shape, dtype in fields]
    if frames is not None:
        out += [("nxt", (size,), np.int64), ("depth", (size,), np.uint8)]
        out += [(frames_array(key), (size,) + tuple(shape), dtype) for key, shape, dtype in frames]
    if sequences:
        out += [(SEQUENCE_STEPS_ARRAY, (size,), np.int32), (EPISODE_STEP_ARRAY, (size,), np.int64),
                (EPISODE_START_ARRAY, (size,), np.uint8)]
    if lock_nbytes:
        out.append(("lock", (lock_nbytes,), np.uint8))
    return out

