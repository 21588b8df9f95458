# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""What a replay table's sample hands out: its output table, and a handle's spare batches.

:class:`Outputs` is built once per table from its fields, compressed observations and (a
sequence table) mask: each output's dtype and dimensions, the keys of a result.  A sample
allocates its arrays straight into the result dict from it, or takes the caller's from
``out=`` once checked.  :class:`Spares` keeps a handle's small fresh batches, two at a
time, and hands one out again once nobody else holds it.  See docs/architecture.md, "Data path".
"""
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_Size
from cpython.list cimport PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.ref cimport Py_REFCNT, PyObject

import numpy as np

cnp.import_array()


cdef object _checked_out(object arr, str name, tuple shape, object dtype):
    if not (isinstance(arr, np.ndarray) and arr.shape == shape and arr.dtype == dtype
            and arr.flags.c_contiguous and arr.flags.writeable):
        raise ValueError(f"out[{name!r}]: expected a writable C-contiguous {dtype} array of shape {shape}")
    return arr


cdef class Outputs:
    """The outputs of a sample: ``fields`` (``(name, shape, dtype)`` of a row's values), then
    ``frame_outputs`` (``(name, key, next, shape, dtype)``: key ``key``'s observation, of the
    next slot when ``next``), then a sequence table's mask; ``length``: steps per sampled
    item (1, or a sequence's length: every output gets a second axis of that many steps)."""

    def __cinit__(self):
        self.nd = NULL
        self.typenums = NULL
        self.dims = NULL
        self.step_bytes = NULL

    def __init__(self, list fields not None, list frame_outputs not None, Py_ssize_t length, bint sequences):
        cdef Py_ssize_t i, d, o, lead = 2 if sequences else 1
        if len(frame_outputs) > MAX_FRAME_OUTPUTS:
            raise ValueError(f"next_of/stack_compress: at most {MAX_FRAME_OUTPUTS} compressed observations "
                             f"per row, got {len(frame_outputs)}")
        outputs = fields + [(name, shape, dtype) for name, _, _, shape, dtype in frame_outputs]
        if sequences:
            outputs.append(("mask", (), np.dtype(np.bool_)))
        n = len(outputs)
        self.n = n
        self.nframes = len(frame_outputs)
        self.names = [name for name, _, _ in outputs]
        self.dtypes = [np.dtype(dtype) for _, _, dtype in outputs]
        self.nd = <int*>malloc(n * sizeof(int) + 1)
        self.typenums = <int*>malloc(n * sizeof(int) + 1)
        self.dims = <cnp.npy_intp*>malloc(n * MAX_OUTPUT_DIMS * sizeof(cnp.npy_intp) + 1)
        self.step_bytes = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t) + 1)
        if not (self.nd and self.typenums and self.dims and self.step_bytes):
            raise MemoryError()
        for i, (name, shape, dtype) in enumerate(outputs):
            if len(shape) + lead > MAX_OUTPUT_DIMS:
                raise ValueError(f"{name}: expected at most {MAX_OUTPUT_DIMS - lead} dimensions, got shape {shape}")
            self.nd[i] = len(shape) + lead
            self.typenums[i] = self.dtypes[i].num
            self.dims[i * MAX_OUTPUT_DIMS + 1] = length
            for d in range(len(shape)):
                self.dims[i * MAX_OUTPUT_DIMS + lead + d] = shape[d]
            self.step_bytes[i] = int(np.prod(shape, dtype=np.int64)) * self.dtypes[i].itemsize
        for o, (_, key, nxt, _, _) in enumerate(frame_outputs):
            self.frame_keys[o], self.frame_next[o], self.frame_partner[o] = key, nxt, -1
        for o in range(self.nframes):
            for i in range(self.nframes):
                if (not self.frame_next[o] and self.frame_next[i] and self.frame_keys[i] == self.frame_keys[o]
                        and self.frame_partner[i] == -1):
                    self.frame_partner[o], self.frame_partner[i] = i, -2
        self.batch_row_bytes = 2 * sizeof(double)
        for i in range(n):
            self.batch_row_bytes += self.step_bytes[i] * length
        # Copying a dict that has every key already is cheaper than growing a new one key by key.
        self.result_keys = tuple(dict.fromkeys(self.names + ["indexes"] + extra)
                                 for extra in ([], ["weights"], ["leaf", "tags"]))
        self.weighted_keys = tuple(self.result_keys[1])

    def __dealloc__(self):
        free(self.nd)
        free(self.typenums)
        free(self.dims)
        free(self.step_bytes)

    cdef int fill(self, Py_ssize_t b, dict out, dict result, bint spare, uint8_t** dst) except -1:
        # Put the arrays a batch of b rows is copied into in `result` (fresh ones, or the caller's
        # from `out`, checked) and where each one's rows go in `dst`; a `spare` result has them.
        cdef Py_ssize_t i, nd, pos = 0
        cdef cnp.npy_intp dims[MAX_OUTPUT_DIMS]
        cdef PyObject* given
        cdef PyObject* key
        for i in range(self.n):
            if spare:
                PyDict_Next(result, &pos, &key, &given)
                dst[i] = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>given)
                continue
            name = self.names[i]
            nd = self.nd[i]
            memcpy(dims, self.dims + i * MAX_OUTPUT_DIMS, nd * sizeof(cnp.npy_intp))
            dims[0] = b
            given = NULL if out is None else PyDict_GetItem(out, name)
            if given == NULL:
                arr = cnp.PyArray_EMPTY(nd, dims, self.typenums[i], 0)
            elif self.fits(<object>given, i, nd, dims):
                arr = <object>given
            else:
                arr = _checked_out(<object>given, name, tuple([dims[j] for j in range(nd)]), self.dtypes[i])
            result[name] = arr
            dst[i] = <uint8_t*>cnp.PyArray_DATA(arr)
        return 0

    cdef bint fits(self, object arr, Py_ssize_t i, Py_ssize_t nd, const cnp.npy_intp* dims):
        # Whether `arr` can take output i as it is: the quick yes of _checked_out.
        cdef Py_ssize_t j
        cdef cnp.ndarray a
        if not cnp.PyArray_Check(arr):
            return False
        a = <cnp.ndarray>arr
        if not (cnp.PyArray_NDIM(a) == nd and cnp.PyArray_ISCARRAY(a)
                and (a.descr is self.dtypes[i] or cnp.PyArray_EquivTypes(a.descr, self.dtypes[i]))):
            return False
        for j in range(nd):
            if cnp.PyArray_DIM(a, j) != dims[j]:
                return False
        return True


cdef class Spares:
    """A handle's spare batches of ``outputs``: fresh batches it handed out, kept to be filled again."""

    def __init__(self, Outputs outputs not None):
        self._outputs = outputs
        self._batches = [None] * SPARE_BATCHES

    cdef dict take(self, Py_ssize_t b, bint weights, int index_type, int weight_type):
        # An earlier fresh batch of b rows (with `weights`, weights too; of those numpy types)
        # that nobody but this handle holds any more -- neither the dict nor any array in it --
        # and that still maps each key to the array it was handed out with: filling it
        # again is invisible to everyone and spares every allocation and dict insert.
        # Taken out of the list with the GIL held throughout, so two threads never take the same.
        cdef Outputs o = self._outputs
        cdef Py_ssize_t k, i, pos, n = o.n + 1 + weights
        cdef cnp.npy_intp dims[MAX_OUTPUT_DIMS]
        cdef PyObject* batch
        cdef PyObject* key
        cdef PyObject* arr
        for k in range(SPARE_BATCHES):
            batch = PyList_GET_ITEM(self._batches, k)
            if <object>batch is None or Py_REFCNT(<object>batch) != 1 or PyDict_Size(<object>batch) != n:
                continue
            pos = 0
            for i in range(n):
                PyDict_Next(<object>batch, &pos, &key, &arr)
                if (key != PyTuple_GET_ITEM(o.weighted_keys, i) or Py_REFCNT(<object>arr) != 1
                        or not cnp.PyArray_Check(<object>arr)):
                    break
                if cnp.PyArray_BASE(<cnp.ndarray>arr) != NULL:
                    break  # a view the caller put in: its memory may be seen elsewhere
                if i < o.n:
                    memcpy(dims, o.dims + i * MAX_OUTPUT_DIMS, o.nd[i] * sizeof(cnp.npy_intp))
                    dims[0] = b
                    if not o.fits(<object>arr, i, o.nd[i], dims):
                        break
                elif not (is_vector(<object>arr, index_type if i == o.n else weight_type)
                          and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>arr) and cnp.PyArray_DIM(<cnp.ndarray>arr, 0) == b):
                    break
            else:
                result = <dict>batch
                self._batches[k] = None
                return result
        return None

    cdef int keep(self, dict batch) except -1:
        # Keep a fresh batch for take: in a free place, else instead of the oldest.
        cdef Py_ssize_t k
        for k in range(SPARE_BATCHES):
            if self._batches[k] is None:
                self._batches[k] = batch
                return 0
        self._batches.pop(0)
        self._batches.append(batch)
        return 0
