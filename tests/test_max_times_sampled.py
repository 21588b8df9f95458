"""max_times_sampled: a transition retires once it has been sampled that many times (Reverb's option)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from helpers import EACH_START_METHOD, ID_FIELD, assert_child_dies_at, put_sampled_ids

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer

ENV = ID_FIELD


def test_a_transition_sampled_max_times_is_never_drawn_again():
    buffer = ReplayBuffer(8, ENV, selector="fifo", max_times_sampled=2)
    buffer.add(id=np.arange(4))
    assert [buffer.sample(2)["id"].tolist() for _ in range(3)] == [[0, 1], [0, 1], [2, 3]]
    assert buffer.sample(2)["id"].tolist() == [2, 3]
    assert buffer.get_stored_size() == 0


def test_each_transition_is_delivered_exactly_max_times_then_none_is_left():
    buffer = ReplayBuffer(16, ENV, max_times_sampled=1, seed=0)
    buffer.add(id=np.arange(10))
    drawn = [int(buffer.sample(1)["id"][0]) for _ in range(10)]
    assert sorted(drawn) == list(range(10))
    with pytest.raises(ValueError, match="holds no transition"):
        buffer.sample(1)


def test_a_batch_never_draws_a_transition_more_than_max_times():
    buffer = ReplayBuffer(8, ENV, max_times_sampled=1, seed=1)
    buffer.add(id=np.arange(5))
    assert sorted(buffer.sample(5)["id"].tolist()) == [0, 1, 2, 3, 4]


def test_a_sample_larger_than_what_is_drawable_raises_and_changes_nothing(unchanged):
    buffer = ReplayBuffer(8, ENV, max_times_sampled=3)
    buffer.add(id=np.arange(3))
    with unchanged(buffer), pytest.raises(ValueError, match="max_times_sampled draws, 3 drawable"):
        buffer.sample(4)


def test_a_retired_transition_is_no_longer_stored_or_listed():
    buffer = ReplayBuffer(8, ENV, selector="lifo", max_times_sampled=1)
    buffer.add(id=np.arange(3))
    assert buffer.sample(1)["id"].tolist() == [2]
    assert buffer.get_all_transitions()["id"].tolist() == [0, 1]


def test_an_update_of_a_retired_transition_is_dropped_as_stale():
    buffer = PrioritizedReplayBuffer(8, ENV, max_times_sampled=1, seed=2)
    buffer.add(id=np.arange(2))
    batch = buffer.sample(1)
    buffer.update_priorities(batch["indexes"], [5.0])
    assert buffer.stats()["stale_updates_dropped"] == 1
    assert buffer.sample(1)["id"].tolist() == [1 - int(batch["id"][0])]


def test_an_overwritten_slot_counts_its_new_transition_from_zero():
    buffer = ReplayBuffer(2, ENV, selector="fifo", max_times_sampled=2)
    buffer.add(id=np.arange(2))
    buffer.sample(1)  # id 0 drawn once
    buffer.add(id=np.array([2, 3]))  # both slots rewritten
    assert [buffer.sample(1)["id"].tolist() for _ in range(3)] == [[2], [2], [3]]


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"])
def test_a_bad_max_times_sampled_is_refused_by_name(value):
    with pytest.raises((TypeError, ValueError), match="max_times_sampled"):
        ReplayBuffer(8, ENV, max_times_sampled=value)


def test_a_sequence_buffer_refuses_max_times_sampled():
    with pytest.raises(ValueError, match="max_times_sampled"):
        SequenceReplayBuffer(16, ENV, length=2, max_times_sampled=1)


@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_draws_are_counted_across_processes(method):
    ctx = mp.get_context(method)
    with MPReplayBuffer(32, ENV, max_times_sampled=1, seed=3) as buffer:
        buffer.add(id=np.arange(12))
        queue = ctx.Queue()
        child = ctx.Process(target=put_sampled_ids, args=(buffer, 7, queue))
        child.start()
        theirs = queue.get(timeout=30)
        child.join(30)
        ours = buffer.sample(5)["id"].tolist()
        assert sorted(theirs + ours) == list(range(12))
        assert buffer.get_stored_size() == 0


@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_a_sampler_killed_while_retiring_leaves_the_row_retired(method):
    with MPReplayBuffer(8, ENV, selector="fifo", max_times_sampled=1) as buffer:
        buffer.add(id=np.arange(3))
        # The first retirement is the sampled row's, inside the draw.
        assert_child_dies_at(method, "retire", buffer.sample, 1, timeout=30)
        assert buffer.sample(1)["id"].tolist() == [1]  # the lock's next owner recovered: 0 is gone
        assert buffer.get_stored_size() == 1
        assert buffer.get_all_transitions()["id"].tolist() == [2]
