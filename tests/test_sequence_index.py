"""The sequence index (ext/sequences.pyx): a sequence's slots in its lane."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay._ext.schema import LANE_END, LANE_LEN, LANE_START
from mpreplay._ext.sequences import Sequences


def _index(length: int = 4) -> Sequences:
    lanes = np.zeros((2, LANE_LEN), dtype=np.int64)
    lanes[0, [LANE_START, LANE_END]] = 0, 10
    lanes[1, [LANE_START, LANE_END]] = 10, 20
    return Sequences(np.zeros(20, dtype=np.int32), lanes, length)


def test_a_sequence_holds_consecutive_slots_of_its_lane():
    assert _index().slots(12, 4).tolist() == [12, 13, 14, 15]


def test_a_sequence_wraps_at_its_lanes_end_not_at_the_buffers():
    assert _index().slots(8, 4).tolist() == [8, 9, 0, 1]
    assert _index().slots(18, 4).tolist() == [18, 19, 10, 11]


def test_a_padded_sequence_lists_only_its_real_steps():
    assert _index().slots(5, 2).tolist() == [5, 6]


@pytest.mark.parametrize("s, steps", [(-1, 1), (20, 1), (3, 5)])
def test_a_slot_or_a_step_count_out_of_range_is_refused(s, steps):
    with pytest.raises(ValueError, match="s, steps: expected a slot in"):
        _index().slots(s, steps)


def test_a_sequence_length_below_one_is_refused():
    with pytest.raises(ValueError, match="length: expected an integer >= 1"):
        _index(0)
