"""A process killed inside each critical section of the shared buffer, on purpose.

``arm_fault(site)`` makes a child SIGKILL itself at a chosen instruction while
it holds the lock.  The next process to take the lock must find the buffer
consistent: the stored count equal to the transitions stored, the priority
tree equal to the sum of its leaves, the rate limiter counting right.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from helpers import EACH_START_METHOD, assert_child_dies_at, crash_at, rows_of, run_in_child

from mpreplay import MinSize, MPPrioritizedReplayBuffer, MPPrioritizedSequenceReplayBuffer, MPReplayBuffer
from mpreplay.inspect import FAULT_SITES

ENV = {"obs": {"shape": (4,), "dtype": np.int64}, "id": {"dtype": np.int64}}
CAPACITY = 64
ALPHA, EPS = 0.6, 1e-4


# What the child does once armed: each reaches its site with the lock held.
def _add(buffer) -> None:
    buffer.add(**rows_of(ENV, np.arange(1000, 1008)), priorities=np.full(8, 2.0))


def _update(buffer) -> None:
    batch = buffer.sample(8)
    buffer.update_priorities(batch["indexes"], np.full(8, 5.0))


def _sample(buffer) -> None:
    buffer.sample(8)


ACTIONS = {"reserve": _add, "publish": _add, "retire": _add, "update": _update, "draw": _sample}


def _kill_child_at(method: str, buffer, site: str, target) -> None:
    """Run ``target(buffer, site)``, which crashes at ``site`` after steps of its own, in a child, and
    check that the site killed it."""
    exitcode = run_in_child(method, target, buffer, site, timeout=60)
    assert exitcode == -signal.SIGKILL, f"the child did not die at {site!r}: exit code {exitcode}"


def _assert_consistent(buffer) -> None:
    rows = buffer.get_all_transitions(indexes=True)
    assert buffer.get_stored_size() == len(rows["id"])
    assert (rows["obs"] == rows["id"][:, None]).all()
    view = buffer.inspection()
    expected_total = float(np.sum((view.priorities(rows["indexes"])[1] + EPS) ** ALPHA))
    assert view.total_weight == pytest.approx(expected_total, rel=1e-12)
    buffer.verify()


def test_every_fault_site_is_exercised():
    assert set(ACTIONS) | {"complete", "open"} == set(FAULT_SITES)


@EACH_START_METHOD
@pytest.mark.parametrize("site", sorted(ACTIONS))
@pytest.mark.timeout(120)
def test_a_holder_killed_at_each_site_leaves_counts_and_tree_consistent(method, site):
    with MPPrioritizedReplayBuffer(CAPACITY, ENV, alpha=ALPHA, eps=EPS, rate_limiter=MinSize(CAPACITY)) as buffer:
        buffer.add(**rows_of(ENV, np.arange(CAPACITY)))
        assert_child_dies_at(method, site, ACTIONS[site], buffer, timeout=60)
        _assert_consistent(buffer)  # its lock acquisition recovers
        assert buffer.stats()["lock_recoveries"] == 1
        # A full lap later the buffer is full again, and the limiter knows it.
        buffer.add(**rows_of(ENV, np.arange(2000, 2000 + CAPACITY)))
        assert buffer.get_stored_size() == CAPACITY
        batch = buffer.sample(16, timeout=10)
        assert set(batch["id"].tolist()) <= set(range(2000, 2000 + CAPACITY))
        _assert_consistent(buffer)


def _add_three(buffer) -> None:
    buffer.add(id=np.array([100, 101, 102]))


@EACH_START_METHOD
@pytest.mark.parametrize("selector", ["fifo", "uniform"])
@pytest.mark.timeout(120)
def test_a_writer_killed_reserving_rows_of_a_full_ring_leaves_it_oldest_first(method, selector):
    # The ring holds 2..9 and the write was to go over 2, 3 and 4: the repair ends the
    # reservation, so the ring keeps 5..9 oldest first and the next write replaces the oldest.
    with MPReplayBuffer(8, {"id": {"dtype": np.int64}}, selector=selector) as buffer:
        buffer.add(id=np.arange(10))
        assert_child_dies_at(method, "reserve", _add_three, buffer, timeout=60)
        assert buffer.get_all_transitions()["id"].tolist() == [5, 6, 7, 8, 9]
        if selector == "fifo":
            assert buffer.sample(5)["id"].tolist() == [5, 6, 7, 8, 9]
        buffer.verify()
        buffer.add(id=50)
        assert buffer.get_all_transitions()["id"].tolist() == [6, 7, 8, 9, 50]


def _complete_then_die(buffer, site: str) -> None:
    buffer.add(obs=np.arange(4), id=1, next_obs=np.arange(4) + 1)  # waits for its next frame
    crash_at(site, buffer.add, obs=np.arange(4) + 1, id=2, next_obs=np.arange(4) + 2)  # stores it: the first completes


@EACH_START_METHOD
@pytest.mark.parametrize("site", ["reserve", "complete"])  # a waiting row publishes without a leaf: no "publish" site
@pytest.mark.timeout(120)
def test_a_writer_killed_storing_a_compressed_step_that_completes_another_leaves_counts_consistent(method, site):
    with MPPrioritizedReplayBuffer(CAPACITY, ENV, alpha=ALPHA, eps=EPS, next_of="obs", lanes=2) as buffer:
        _kill_child_at(method, buffer, site, _complete_then_die)
        stored = buffer.get_all_transitions()
        assert buffer.get_stored_size() == len(stored["id"])
        assert buffer.stats()["lock_recoveries"] == 1
        buffer.verify()
        buffer.add(obs=np.full(4, 7), id=7, next_obs=np.full(4, 8))
        buffer.on_episode_end()
        assert buffer.get_stored_size() == len(buffer.get_all_transitions()["id"])


def _open_then_die(buffer, site: str) -> None:
    buffer.add(obs=np.zeros((3, 4), np.int64), id=np.arange(3), done=np.zeros(3))
    crash_at(site, buffer.add, obs=np.zeros(4, np.int64), id=3, done=0.0)  # the sequence's last step: it opens


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_a_writer_killed_opening_a_sequence_leaves_counts_and_tree_consistent(method):
    env = {**ENV, "done": {}}
    with MPPrioritizedSequenceReplayBuffer(CAPACITY, env, length=4, alpha=ALPHA, eps=EPS, lanes=2) as buffer:
        _kill_child_at(method, buffer, "open", _open_then_die)
        assert buffer.get_stored_size() == 4
        assert buffer.stats()["lock_recoveries"] == 0  # nothing yet: the next acquisition recovers
        buffer.add(obs=np.ones((4, 4), np.int64), id=np.arange(10, 14), done=np.array([0, 0, 0, 1.0]))
        assert buffer.stats()["lock_recoveries"] == 1
        buffer.verify()
        batch = buffer.sample(32)
        assert set(batch["id"][:, 0].tolist()) == {10}
        total = float(np.sum((buffer.get_max_priority() + EPS) ** ALPHA))
        assert buffer.inspection().total_weight == pytest.approx(total, rel=1e-12)
