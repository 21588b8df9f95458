# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The shared part of a replay table: a gate, a slot table and a selector, with the rows they govern.

Every handle of a table's memory -- the threads of a process, other processes -- reads and
writes this part alike; what a handle keeps to itself is its :class:`~mpreplay._ext.handle_state.HandleState`.
The write path (ext/writes.pyx) and the draw path (ext/draws.pyx, ext/gather.pyx) take both.
"""
from libc.stdlib cimport free, malloc

cimport numpy as cnp

import numpy as np

cnp.import_array()

# Fields larger than a core's L2 cache (1 MiB on the development machine) miss on most draws:
# from there sample prefetches the rows it drew; below, the prefetches cost more than they save.
cdef Py_ssize_t PREFETCH_ROWS_ABOVE = 1 << 20


cdef bint _same_line(const uint8_t* a, const uint8_t* b, Py_ssize_t pitch, Py_ssize_t pitch_b) noexcept:
    # Whether the values of two fields in any one slot start on the same cache line: fields
    # side by side in rows (schema.row_layout) whose rows are whole lines, or pack a line.
    cdef Py_ssize_t x = <Py_ssize_t>a, y = <Py_ssize_t>b
    if pitch != pitch_b or pitch <= 0:
        return False
    if pitch % 64 == 0:
        return x // 64 == y // 64
    return 64 % pitch == 0 and x // pitch == y // pitch


cdef class TableParts:
    """The shared part of a table (see :class:`mpreplay._ext.table_handle.TableHandle` for the parameters)."""

    def __cinit__(self):
        self.rows = NULL
        self.rowbytes = NULL
        self.pitch = NULL
        self.row_lines = NULL

    def __init__(self, int64_t[::1] header not None, Gate gate not None, Slots slots not None,
                 Selector selector not None, list fields not None, Frames frames=None, list frame_outputs=None,
                 Sequences sequences=None):
        cdef Py_ssize_t i, n = len(fields)
        self.header = header
        self.frames = frames
        self.sequences = sequences
        self.length = 1 if sequences is None else sequences.length
        self.gate = gate
        self.slots = slots
        self.selector = selector
        self.size = slots.size
        self.nfields = n
        self.names = [name for name, _ in fields]
        self.rows = <uint8_t**>malloc(n * sizeof(uint8_t*) + 1)
        self.rowbytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self.pitch = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        self.row_lines = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        if not (self.rows and self.rowbytes and self.pitch and self.row_lines):
            raise MemoryError()
        for i, (name, arr) in enumerate(fields):
            # A field's values may sit in rows of several fields (schema.row_layout): each contiguous.
            if not (isinstance(arr, np.ndarray) and arr.shape[0] == self.size and arr[:1].flags.c_contiguous):
                raise ValueError(f"field {name!r}: expected an array of {self.size} rows, each C-contiguous")
            self.rows[i] = <uint8_t*>cnp.PyArray_DATA(arr)
            self.rowbytes[i] = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
            self.pitch[i] = arr.strides[0]
        self._keep = [arr for _, arr in fields]
        self.nrow_lines = 0
        if sum(arr.nbytes for _, arr in fields) > PREFETCH_ROWS_ABOVE:
            for i in range(n):
                if not any(_same_line(self.rows[i], self.rows[j], self.pitch[i], self.pitch[j])
                           for j in self.row_lines[:self.nrow_lines]):
                    self.row_lines[self.nrow_lines] = i
                    self.nrow_lines += 1
        self.outputs = Outputs([(name, arr.shape[1:], arr.dtype) for name, arr in fields], frame_outputs or [],
                               self.length, sequences is not None)

    def __dealloc__(self):
        free(self.rows)
        free(self.rowbytes)
        free(self.pitch)
        free(self.row_lines)
