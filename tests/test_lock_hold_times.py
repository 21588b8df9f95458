"""``inspection().time_lock_holds()`` / ``lock_holds()``: how long a handle's calls hold a shared buffer's lock."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer

FIELDS = {"obs": {"shape": (4,)}, "rew": {}}


@pytest.fixture
def shared():
    with MPPrioritizedReplayBuffer(1_000, FIELDS) as buffer:
        yield buffer


def add(buffer, k: int) -> None:
    for _ in range(k):
        buffer.add(obs=np.zeros(4), rew=1.0, priorities=1.0)


def test_holds_are_not_timed_until_asked(shared):
    add(shared, 5)
    assert shared.inspection().lock_holds() == (0.0, 0)


def test_every_acquisition_of_a_timed_handle_is_counted(shared):
    inspection = shared.inspection()
    inspection.time_lock_holds()
    before = shared.stats()["lock_acquisitions"]
    add(shared, 10)
    shared.update_priorities(shared.sample(8)["indexes"], np.ones(8))
    seconds, holds = inspection.lock_holds()
    assert holds == shared.stats()["lock_acquisitions"] - before > 0
    assert 0.0 < seconds < 1.0


def test_starting_again_sets_the_totals_back_to_zero(shared):
    inspection = shared.inspection()
    inspection.time_lock_holds()
    add(shared, 3)
    inspection.time_lock_holds()
    assert inspection.lock_holds() == (0.0, 0)


def test_stopped_timing_keeps_its_totals(shared):
    inspection = shared.inspection()
    inspection.time_lock_holds()
    add(shared, 3)
    inspection.time_lock_holds(on=False)
    totals = inspection.lock_holds()
    add(shared, 3)
    assert inspection.lock_holds() == totals


def test_a_local_buffer_has_no_shared_lock_to_time():
    with pytest.raises(TypeError, match="time_lock_holds: a local buffer"):
        PrioritizedReplayBuffer(10, FIELDS).inspection().time_lock_holds()
