"""The uncompressed fields of a slot side by side in one row: a draw reads one cache line for
all of them (schema.row_layout), except in a buffer of files (one file per field, as cpprb)."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from mpreplay._ext.schema import ROWS_ARRAY, field_array, row_layout

_PER_FIELDS = [
    ("obs", (4,), np.float32),
    ("act", (), np.int64),
    ("rew", (), np.float32),
    ("next_obs", (4,), np.float32),
    ("done", (), np.float32),
]


def test_a_row_of_up_to_64_bytes_is_padded_to_a_power_of_two():
    assert row_layout(_PER_FIELDS) == (64, [0, 16, 24, 28, 44])  # 48 bytes of values
    assert row_layout([("x", (3,), np.float32)])[0] == 16
    assert row_layout([("x", (), np.uint8)])[0] == 1


def test_a_longer_row_fills_whole_cache_lines():
    assert row_layout([("x", (25,), np.float32)])[0] == 128
    assert row_layout([("obs", (84, 84, 4), np.uint8)])[0] == 84 * 84 * 4  # already whole lines


def test_each_field_starts_at_an_offset_aligned_for_its_dtype():
    pitch, offsets = row_layout([("flag", (), np.uint8), ("value", (), np.float64), ("pair", (2,), np.int16)])
    assert offsets == [0, 8, 16]
    assert pitch == 32


def _env():
    return {name: {"shape": shape, "dtype": dtype} for name, shape, dtype in _PER_FIELDS}


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer, MPPrioritizedReplayBuffer])
def test_the_fields_of_a_buffer_are_views_of_one_array_of_rows(cls):
    buffer = cls(100, _env())
    try:
        arrays = buffer.inspection().arrays
        rows = arrays[ROWS_ARRAY]
        assert rows.shape == (100, 64)
        for name in ("obs", "act", "rew", "next_obs", "done"):
            field = arrays[field_array(name)]
            assert np.shares_memory(field, rows)
            assert field.strides[0] == 64
    finally:
        buffer.close()


def test_no_row_straddles_a_cache_line():
    buffer = PrioritizedReplayBuffer(1000, _env())
    start = buffer.inspection().arrays[ROWS_ARRAY].ctypes.data
    assert start % 64 == 0  # with a pitch of 64, every row is one line


def test_every_field_of_a_row_reads_back_what_was_added():
    buffer = PrioritizedReplayBuffer(8, _env())
    n = 8
    buffer.add(
        obs=np.arange(4 * n, dtype=np.float32).reshape(n, 4),
        act=np.arange(n),
        rew=np.full(n, 0.5),
        next_obs=-np.arange(4 * n, dtype=np.float32).reshape(n, 4),
        done=np.zeros(n),
    )
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["obs"], np.arange(4 * n, dtype=np.float32).reshape(n, 4))
    np.testing.assert_array_equal(stored["act"], np.arange(n))
    np.testing.assert_array_equal(stored["rew"], np.full(n, 0.5, dtype=np.float32))
    np.testing.assert_array_equal(stored["next_obs"], -np.arange(4 * n, dtype=np.float32).reshape(n, 4))
    np.testing.assert_array_equal(stored["done"], np.zeros(n, dtype=np.float32))


def test_a_buffer_of_files_keeps_a_file_per_field(tmp_path):
    prefix = str(tmp_path / "replay")
    buffer = ReplayBuffer(16, _env(), mmap_prefix=prefix)
    try:
        assert ROWS_ARRAY not in buffer.inspection().arrays
        for name in ("obs", "act", "rew", "next_obs", "done"):
            assert (tmp_path / f"replay_{name}.dat").exists()
    finally:
        buffer.close()
