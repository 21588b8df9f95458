"""A prioritized local buffer's priorities: what new rows get, what updates set, updates made stale
by a rewrite, the largest priority it takes, and what a sharded client reads (leaves, tags, mass)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import NUMBERED_FIELDS, numbered_row, numbered_transitions, slot_priorities, wrapped_buffer

from mpreplay import PrioritizedReplayBuffer

ENV = NUMBERED_FIELDS


def test_empty_buffer_reports_max_priority_one_and_first_insert_gets_it():
    buffer = PrioritizedReplayBuffer(4, ENV)
    assert buffer.get_max_priority() == 1.0
    buffer.add(**numbered_row(0))
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0])


def test_given_priorities_are_stored():
    buffer = PrioritizedReplayBuffer(4, ENV)
    buffer.add(**numbered_transitions(range(3)), priorities=[0.5, 0.0, 2.0])
    buffer.add(**numbered_row(3), priorities=4.0)
    np.testing.assert_array_equal(slot_priorities(buffer), [0.5, 0.0, 2.0, 4.0])
    assert buffer.get_max_priority() == 4.0


def test_a_single_float_priority_takes_the_fast_path_and_is_stored():
    buffer = PrioritizedReplayBuffer(8, ENV)
    buffer.add(obs=np.zeros(3, np.float32), act=1, rew=0.5, done=0, priorities=2.5)
    assert buffer.get_max_priority() == 2.5


def test_new_transitions_get_the_largest_priority_stored():
    buffer = PrioritizedReplayBuffer(6, ENV)
    buffer.add(**numbered_transitions(range(3)), priorities=[0.5, 3.0, 2.0])
    buffer.add(**numbered_transitions(range(3, 5)))
    np.testing.assert_array_equal(slot_priorities(buffer), [0.5, 3.0, 2.0, 3.0, 3.0])


def test_new_transition_gets_the_new_max_after_the_max_was_overwritten():
    buffer = PrioritizedReplayBuffer(3, ENV)
    buffer.add(**numbered_transitions(range(3)), priorities=[5.0, 1.0, 2.0])
    buffer.add(**numbered_row(3))  # overwrites the 5.0
    np.testing.assert_array_equal(slot_priorities(buffer), [2.0, 1.0, 2.0])
    assert buffer.get_max_priority() == 2.0


def test_new_transition_gets_the_new_max_after_the_max_was_lowered():
    buffer = PrioritizedReplayBuffer(5, ENV)
    buffer.add(**numbered_transitions(range(3)), priorities=[5.0, 1.0, 2.0])
    buffer.update_priorities([0], [0.5])
    assert buffer.get_max_priority() == 2.0
    buffer.add(**numbered_row(3))
    np.testing.assert_array_equal(slot_priorities(buffer), [0.5, 1.0, 2.0, 2.0])


def test_with_max_ever_new_rows_get_the_largest_priority_ever_set_even_once_it_is_gone():
    rb = PrioritizedReplayBuffer(2, {"x": {}}, alpha=1.0, eps=0.0, new_priority="max_ever")
    rb.add(x=1.0, priorities=5.0)
    rb.add(x=2.0, priorities=0.5)
    rb.add(x=3.0, priorities=0.5)  # overwrites the row of priority 5
    rb.add(x=4.0)
    assert rb.get_max_priority() == 5.0 and rb.default_priority() == 5.0


def test_with_max_ever_the_default_starts_at_one_and_clear_forgets_the_past():
    rb = PrioritizedReplayBuffer(4, {"x": {}}, new_priority="max_ever")
    rb.add(x=1.0, priorities=0.25)
    assert rb.default_priority() == 1.0
    rb.update_priorities(rb.sample(1)["indexes"], [9.0])
    assert rb.default_priority() == 9.0
    rb.clear()
    assert rb.default_priority() == 1.0


def test_by_default_new_rows_get_the_largest_priority_stored_now():
    rb = PrioritizedReplayBuffer(1, {"x": {}}, alpha=1.0, eps=0.0)
    rb.add(x=1.0, priorities=5.0)
    rb.add(x=2.0, priorities=0.5)
    assert rb.default_priority() == 0.5


def test_clear_resets_the_max_priority_to_one():
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    buffer.clear()
    assert buffer.get_max_priority() == 1.0
    buffer.add(**numbered_row(0))
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0])


def test_update_priorities_sets_the_priorities_of_sampled_transitions():
    buffer = PrioritizedReplayBuffer(8, ENV, seed=0)
    buffer.add(**numbered_transitions(range(8)))
    indexes = np.unique(buffer.sample(16)["indexes"])
    new = np.linspace(0.1, 9.0, len(indexes))
    buffer.update_priorities(indexes, new)
    np.testing.assert_array_equal(slot_priorities(buffer)[indexes], new)
    assert buffer.get_max_priority() == 9.0


def test_updates_of_a_buffer_whose_tree_outgrows_a_cache_keep_every_sum_min_and_max():
    # From about 40,000 slots the tree's lowest levels are prefetched ahead of an update.
    buffer = PrioritizedReplayBuffer(100_000, ENV, seed=0)
    buffer.add(**numbered_transitions(range(100_000)))
    rng = np.random.default_rng(0)
    for _ in range(50):
        indexes = buffer.sample(32)["indexes"]
        buffer.update_priorities(indexes, rng.uniform(0.01, 5.0, 32))
    raw = slot_priorities(buffer)
    weights = (raw + buffer.eps) ** buffer.alpha
    assert buffer.leaf_mass() == (pytest.approx(math.fsum(weights), rel=1e-12), pytest.approx(weights.min(), rel=1e-15))
    assert buffer.get_max_priority() == raw.max()


def test_update_priorities_with_repeated_indexes_keeps_the_last():
    buffer = PrioritizedReplayBuffer(4, ENV)
    buffer.add(**numbered_transitions(range(4)))
    buffer.update_priorities([2, 1, 2], [7.0, 3.0, 0.25])
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0, 3.0, 0.25, 1.0])


def test_update_priorities_takes_read_only_arrays():
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    indexes, priorities = np.array([2, 5]), np.array([7.0, 9.0])
    indexes.flags.writeable = priorities.flags.writeable = False
    buffer.update_priorities(indexes, priorities)
    np.testing.assert_array_equal(slot_priorities(buffer)[indexes], priorities)


@pytest.mark.parametrize(
    "indexes, priorities",
    [
        pytest.param(np.array([3, 6], np.int32), np.array([7.0, 9.0]), id="int32-indexes"),
        pytest.param(np.array([3, 6]), np.array([7.0, 9.0], np.float32), id="float32-priorities"),
        pytest.param(np.array([3, 9, 6])[::2], np.array([7.0, 0.0, 9.0])[::2], id="strided-arrays"),
        pytest.param(np.array([3, 6]).astype(">i8"), np.array([7.0, 9.0]).astype(">f8"), id="big-endian-arrays"),
        pytest.param([3, 6], [7.0, 9.0], id="lists"),
    ],
)
def test_update_priorities_converts_other_integers_and_numbers(indexes, priorities):
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    buffer.update_priorities(indexes, priorities)
    np.testing.assert_array_equal(slot_priorities(buffer)[[3, 6]], [7.0, 9.0])


def test_update_priorities_takes_unaligned_arrays(unaligned):
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    buffer.update_priorities(unaligned(np.array([3, 6])), unaligned(np.array([7.0, 9.0])))
    np.testing.assert_array_equal(slot_priorities(buffer)[[3, 6]], [7.0, 9.0])


def test_update_for_a_slot_overwritten_since_sampling_is_dropped_and_counted():
    buffer = PrioritizedReplayBuffer(4, ENV, seed=0)
    buffer.add(**numbered_transitions(range(4)), priorities=[1.0, 2.0, 3.0, 4.0])
    sampled = buffer.sample(3)["indexes"]
    buffer.add(**numbered_transitions(range(4, 8)), priorities=[5.0, 6.0, 7.0, 8.0])
    buffer.update_priorities(sampled, [100.0, 100.0, 100.0])
    np.testing.assert_array_equal(slot_priorities(buffer), [5.0, 6.0, 7.0, 8.0])
    assert buffer.stats()["stale_updates_dropped"] == 3


def test_only_the_stale_part_of_an_update_is_dropped():
    buffer = PrioritizedReplayBuffer(4, ENV, seed=0)
    buffer.add(**numbered_transitions(range(4)))
    buffer.sample(8)
    buffer.add(**numbered_row(4))  # overwrites slot 0 only
    buffer.update_priorities([0, 1, 2, 3], [9.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0, 2.0, 3.0, 4.0])
    assert buffer.stats()["stale_updates_dropped"] == 1


def test_update_after_sampling_the_new_occupant_again_is_applied():
    buffer = PrioritizedReplayBuffer(2, ENV, seed=0)
    buffer.add(**numbered_transitions(range(2)))
    buffer.sample(8)
    buffer.add(**numbered_transitions(range(2, 4)))
    indexes = buffer.sample(8)["indexes"]
    buffer.update_priorities(indexes, np.full(8, 6.0))
    assert set(slot_priorities(buffer)[indexes]) == {6.0}
    assert buffer.stats()["stale_updates_dropped"] == 0


def test_update_sampled_before_a_clear_is_dropped_once_the_slot_is_refilled():
    buffer = PrioritizedReplayBuffer(4, ENV, seed=0)
    buffer.add(**numbered_transitions(range(4)))
    sampled = buffer.sample(4)["indexes"]
    buffer.clear()
    buffer.add(**numbered_transitions(range(4, 8)), priorities=[5.0, 6.0, 7.0, 8.0])
    buffer.update_priorities(sampled, np.full(4, 100.0))
    np.testing.assert_array_equal(slot_priorities(buffer), [5.0, 6.0, 7.0, 8.0])
    assert buffer.stats()["stale_updates_dropped"] == 4


def test_max_priority_is_the_largest_priority_the_buffer_accepts(unchanged):
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    assert 1e200 < buffer.max_priority <= 1e300
    buffer.update_priorities([0], [buffer.max_priority])
    assert buffer.get_max_priority() == buffer.max_priority
    with unchanged(buffer), pytest.raises(ValueError, match="priorities: expected finite values in"):
        buffer.update_priorities([0], [np.nextafter(buffer.max_priority, math.inf)])


def test_max_priority_falls_with_the_capacity_when_alpha_is_large():
    small, large = (PrioritizedReplayBuffer(size, ENV, alpha=2.0) for size in (8, 8192))
    assert large.max_priority < small.max_priority < 1e300


def test_sample_leaves_gives_each_rows_leaf_weight():
    buffer = PrioritizedReplayBuffer(8, {"obs": {}}, alpha=0.5, eps=0.25)
    buffer.add(obs=np.arange(8.0), priorities=np.arange(8.0))
    batch = buffer.sample_leaves(32)
    np.testing.assert_allclose(batch["leaf"], (batch["obs"] + 0.25) ** 0.5)
    assert "weights" not in batch


def test_a_slot_tag_changes_when_the_slot_is_rewritten():
    buffer = PrioritizedReplayBuffer(4, {"obs": {}})
    buffer.add(obs=np.arange(4.0))
    batch = buffer.sample_leaves(16)
    np.testing.assert_array_equal(buffer.slot_tags(batch["indexes"]), batch["tags"])
    buffer.add(obs=np.arange(4.0))
    assert (buffer.slot_tags(batch["indexes"]) != batch["tags"]).all()


def test_a_slot_held_by_a_writer_has_no_tag():
    buffer = PrioritizedReplayBuffer(4, {"obs": {}})
    buffer.add(obs=np.arange(4.0))
    reservation = buffer.inspection().reserve(1)
    assert buffer.slot_tags(reservation.slots).tolist() == [-1]


def test_leaf_mass_is_the_total_and_the_smallest_leaf():
    buffer = PrioritizedReplayBuffer(4, {"obs": {}}, alpha=1.0, eps=0.0)
    buffer.add(obs=np.arange(3.0), priorities=np.array([1.0, 2.0, 4.0]))
    assert buffer.leaf_mass() == (7.0, 1.0)
