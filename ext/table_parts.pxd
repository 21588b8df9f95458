# The shared part of a replay table (ext/table_parts.pyx): what every handle of its memory reads
# and writes alike.  The write path (ext/writes.pyx) and the draw path (ext/draws.pyx) take it.
from libc.stdint cimport int64_t, uint8_t

from mpreplay._ext.frames cimport Frames
from mpreplay._ext.gate cimport Gate
from mpreplay._ext.outputs cimport Outputs
from mpreplay._ext.selector cimport Selector
from mpreplay._ext.sequences cimport Sequences
from mpreplay._ext.slots cimport Slots


cdef class TableParts:
    cdef int64_t[::1] header
    cdef Gate gate
    cdef Slots slots
    cdef Selector selector
    cdef Frames frames                # a compressed table's (else None)
    cdef Sequences sequences          # a sequence table's (else None)
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t length            # steps per sampled item: 1, or a sequence's length
    cdef Py_ssize_t nfields
    cdef uint8_t** rows               # per field: its value of slot 0
    cdef Py_ssize_t* rowbytes         # per field: the bytes of one slot's value
    cdef Py_ssize_t* pitch            # per field: from one slot's value to the next (the rowbytes, or a row of fields)
    cdef Py_ssize_t* row_lines        # the fields whose line of a row no earlier field's shares
    cdef Py_ssize_t nrow_lines        # how many; 0 while the fields fit a core's cache (no prefetch)
    cdef Outputs outputs              # what a sample hands out
    cdef list names                   # the fields, in order
    cdef object _keep
