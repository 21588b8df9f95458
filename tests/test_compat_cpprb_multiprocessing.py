"""cpprb's shared arrays and values (``cpprb.multiprocessing``) in the compat layer."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os

import numpy as np
import pytest
from helpers import EACH_START_METHOD, run_in_child

from mpreplay.compat.cpprb import multiprocessing as cmp

CTYPES = pytest.mark.parametrize(
    "ctype, dtype",
    [
        (ctypes.c_float, np.float32),
        (ctypes.c_double, np.float64),
        (ctypes.c_uint8, np.uint8),
        (ctypes.c_uint16, np.uint16),
        (ctypes.c_uint32, np.uint32),
        (ctypes.c_int64, np.int64),
    ],
)
BACKENDS = pytest.mark.parametrize("backend", ["SharedMemory", "sharedctypes"])


def _segment_path(array: cmp.SharedMemoryArray | cmp.SharedMemoryValue) -> str:
    return "/dev/shm/" + array.name.lstrip("/")


@CTYPES
@BACKENDS
def test_a_raw_array_is_indexed_sliced_and_assigned_as_numpy_is(backend, ctype, dtype):
    array = cmp.RawArray(mp.get_context(), ctype, 3, backend)
    array[0:3] = 2
    array[1] = 1
    assert len(array) == 3
    np.testing.assert_array_equal(array[0:3], np.array([2, 1, 2], dtype))
    assert array[0:3].dtype == dtype


@BACKENDS
def test_a_raw_value_starts_at_its_initial_value_and_can_be_set(backend):
    value = cmp.RawValue(mp.get_context(), ctypes.c_double, 1.5, backend)
    assert value.value == 1.5
    value.value = 2.5
    assert value.value == 2.5


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="backend"):
        cmp.RawArray(None, ctypes.c_double, 3, "mmap")


def test_a_context_that_is_none_of_cpprbs_kinds_is_refused():
    with pytest.raises(TypeError, match="ctx"):
        cmp.ctypesArray("spawn", ctypes.c_double, 3)


def test_a_negative_length_is_refused_by_name():
    with pytest.raises(ValueError, match="len_"):
        cmp.SharedMemoryArray(ctypes.c_double, -1)


def _fill(array, value) -> None:
    array[:] = value


@EACH_START_METHOD
@BACKENDS
@pytest.mark.timeout(60, method="thread")
def test_a_child_process_writes_the_parents_array(method, backend):
    array = cmp.RawArray(mp.get_context(method), ctypes.c_int64, 4, backend)
    assert run_in_child(method, _fill, array, 7) == 0
    np.testing.assert_array_equal(array[:], [7, 7, 7, 7])


def test_closing_a_shared_memory_array_unlinks_its_segment():
    array = cmp.SharedMemoryArray(ctypes.c_double, 8)
    path = _segment_path(array)
    assert os.path.exists(path)
    array.close()
    assert not os.path.exists(path)


def test_a_collected_shared_memory_value_leaves_no_segment():
    value = cmp.SharedMemoryValue(ctypes.c_double, 1.0)
    path = _segment_path(value)
    del value
    assert not os.path.exists(path)
