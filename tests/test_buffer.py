"""Specification of the local buffers: ReplayBuffer and PrioritizedReplayBuffer (cpprb's API)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from helpers import (
    EACH_BUFFER_CLASS,
    NUMBERED_FIELDS,
    assert_numbered,
    numbered_row,
    numbered_transitions,
    slot_priorities,
    wrapped_buffer,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from mpreplay._ext.schema import MEMBERS_ARRAY, TREE_ARRAY, field_array
from mpreplay._ext.sumtree import TREE_HEAD_LEN

ENV = NUMBERED_FIELDS


# -- construction ------------------------------------------------------------------


def test_missing_shape_means_scalar_and_missing_dtype_means_float32():
    buffer = ReplayBuffer(4, {"rew": {}, "obs": {"shape": 2}, "act": {"shape": (2, 3), "dtype": np.int16}})
    assert buffer.get_env_dict() == {
        "rew": {"shape": (), "dtype": np.float32},
        "obs": {"shape": (2,), "dtype": np.float32},
        "act": {"shape": (2, 3), "dtype": np.int16},
    }


def test_default_dtype_applies_to_fields_without_a_dtype():
    buffer = PrioritizedReplayBuffer(4, {"rew": {}, "act": {"dtype": np.int32}}, default_dtype=np.float64)
    assert buffer.get_env_dict()["rew"]["dtype"] == np.float64
    assert buffer.get_env_dict()["act"]["dtype"] == np.int32


@EACH_BUFFER_CLASS
def test_new_buffer_is_empty(cls):
    buffer = cls(6, ENV)
    assert (buffer.get_buffer_size(), buffer.get_stored_size(), buffer.get_next_index()) == (6, 0, 0)
    assert buffer.get_all_transitions()["obs"].shape == (0, 3)


# -- add --------------------------------------------------------------------------


@EACH_BUFFER_CLASS
def test_add_one_transition_returns_its_slot(cls):
    buffer = cls(4, ENV)
    assert buffer.add(**numbered_row(0)) == 0
    assert buffer.add(**numbered_row(1)) == 1
    assert (buffer.get_stored_size(), buffer.get_next_index()) == (2, 2)
    assert_numbered(buffer.get_all_transitions(), [0, 1])


def _exact_row(i: int) -> dict[str, object]:
    """Transition number ``i`` as the kernel's one-row add takes it: numbers and exact arrays."""
    return {"obs": np.array([i, 10.0 * i, 100.0 * i], dtype=np.float32), "act": i, "rew": i / 2, "done": i % 2}


@EACH_BUFFER_CLASS
def test_add_row_stores_one_transition_of_exact_values_and_returns_its_slot(cls):
    buffer = cls(4, ENV)
    assert buffer.add_row(_exact_row(0)) == 0
    assert buffer.add_row(_exact_row(1)) == 1
    assert_numbered(buffer.get_all_transitions(), [0, 1])


@EACH_BUFFER_CLASS
@pytest.mark.parametrize(
    "values",
    [
        pytest.param({**_exact_row(0), "obs": [0.0, 0.0, 0.0]}, id="a list"),
        pytest.param({**_exact_row(0), "unknown": 1}, id="a key of no field"),
        pytest.param({k: v for k, v in _exact_row(0).items() if k != "rew"}, id="a missing field"),
        pytest.param({**_exact_row(0), "obs": np.zeros((2, 3), np.float32)}, id="a batch"),
    ],
)
def test_add_row_leaves_values_it_does_not_take_to_add(cls, values):
    buffer = cls(4, ENV)
    before = buffer.get_all_transitions()
    assert buffer.add_row(values) == -1
    assert buffer.get_stored_size() == 0
    for name, array in buffer.get_all_transitions().items():
        np.testing.assert_array_equal(array, before[name])


def test_add_row_leaves_a_transition_to_fold_to_add():
    buffer = ReplayBuffer(8, ENV, nstep={"size": 3, "gamma": 0.9})
    assert buffer.add_row(_exact_row(0)) == -1
    assert buffer.get_stored_size() == 0


@EACH_BUFFER_CLASS
def test_add_batch_returns_the_slot_of_its_first_transition(cls):
    buffer = cls(8, ENV)
    buffer.add(**numbered_transitions(range(3)))
    assert buffer.add(**numbered_transitions(range(3, 7))) == 3
    assert (buffer.get_stored_size(), buffer.get_next_index()) == (7, 7)
    assert_numbered(buffer.get_all_transitions(), range(7))


@EACH_BUFFER_CLASS
def test_fields_are_stored_in_their_dtypes(cls):
    buffer = cls(4, ENV)
    buffer.add(**numbered_row(1))
    stored = buffer.get_all_transitions()
    assert {name: stored[name].dtype for name in ENV} == {
        "obs": np.float32,
        "act": np.int64,
        "rew": np.float32,
        "done": np.uint8,
    }
    assert {name: stored[name].shape for name in ENV} == {"obs": (1, 3), "act": (1,), "rew": (1,), "done": (1,)}


@EACH_BUFFER_CLASS
def test_full_buffer_overwrites_the_oldest_transitions_first(cls):
    buffer = cls(5, ENV)
    slots = [buffer.add(**numbered_row(i)) for i in range(12)]
    assert slots == [i % 5 for i in range(12)]
    assert (buffer.get_stored_size(), buffer.get_next_index()) == (5, 2)
    assert_numbered(buffer.get_all_transitions(), range(7, 12))


@EACH_BUFFER_CLASS
def test_batch_that_reaches_the_end_wraps_to_the_start(cls):
    buffer = cls(5, ENV)
    buffer.add(**numbered_transitions(range(3)))
    assert buffer.add(**numbered_transitions(range(3, 7))) == 3
    assert buffer.get_next_index() == 2
    assert_numbered(buffer.get_all_transitions(), range(2, 7))
    np.testing.assert_array_equal(buffer.inspection().arrays[field_array("act")], [5, 6, 2, 3, 4])


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("k", [7, 13], ids=["less-than-twice-the-capacity", "more-than-twice-the-capacity"])
def test_batch_larger_than_the_capacity_keeps_its_newest_rows(cls, k):
    buffer = cls(5, ENV)
    buffer.add(**numbered_transitions(range(2)))
    assert buffer.add(**numbered_transitions(range(2, 2 + k))) == 2  # where its first row would have gone
    assert (buffer.get_stored_size(), buffer.get_next_index()) == (5, (2 + k) % 5)
    assert_numbered(buffer.get_all_transitions(), range(k - 3, k + 2))


_BATCHINGS = {
    "fill": [3, 2],
    "wrap": [3, 4, 1, 2],
    "exactly-capacity": [2, 5, 3],
    "larger-than-capacity": [2, 7, 1],
    "more-than-twice-the-capacity": [2, 12, 1],
    "more-than-twice-the-capacity-twice": [11, 13, 4],
}


def _given(cls, priorities) -> dict:
    """``priorities=`` for a prioritized buffer; nothing for a uniform one."""
    return {"priorities": priorities} if cls is PrioritizedReplayBuffer else {}


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("lengths", list(_BATCHINGS.values()), ids=list(_BATCHINGS))
def test_batched_and_one_by_one_adds_give_identical_contents(cls, lengths):
    batched, single = cls(5, ENV), cls(5, ENV)
    start = 0
    for k in lengths:
        p = np.arange(start, start + k) % 7 + 0.5
        first = batched.add(**numbered_transitions(range(start, start + k)), **_given(cls, p))
        firsts = [single.add(**numbered_row(start + j), **_given(cls, p[j])) for j in range(k)]
        assert first == firsts[0]
        start += k
    assert (batched.get_stored_size(), batched.get_next_index()) == (single.get_stored_size(), single.get_next_index())
    batched_arrays, single_arrays = batched.inspection().arrays, single.inspection().arrays
    for name in ENV:
        assert batched_arrays[field_array(name)].tobytes() == single_arrays[field_array(name)].tobytes(), name
    assert _selectable(batched) == _selectable(single)


@given(capacity=st.integers(1, 40), lengths=st.lists(st.integers(1, 90), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_a_batch_fixes_the_tree_exactly_as_its_rows_one_by_one(capacity, lengths):
    # A batch recomputes each ancestor of its run of leaves once (two runs where the ring wraps).
    batched, single = PrioritizedReplayBuffer(capacity, ENV), PrioritizedReplayBuffer(capacity, ENV)
    start = 0
    for k in lengths:
        p = (np.arange(start, start + k) * 0.37) % 5 + 0.1
        batched.add(**numbered_transitions(range(start, start + k)), priorities=p)
        for j in range(k):
            single.add(**numbered_row(start + j), priorities=p[j])
        start += k
    assert _selectable(batched) == _selectable(single)


def _selectable(buffer) -> bytes | set:
    """What the selector draws from: the whole tree (but its header, the largest priority ever
    set, which rows skipped by a batch never reach), or the set of uniform members (whose
    order depends on the order of removals)."""
    if isinstance(buffer, PrioritizedReplayBuffer):
        return buffer.inspection().arrays[TREE_ARRAY][TREE_HEAD_LEN:].tobytes()
    state = buffer.inspection().arrays[MEMBERS_ARRAY]
    return set(state[1 : 1 + state[0]].tolist())


@EACH_BUFFER_CLASS
def test_on_episode_end_is_accepted_and_changes_nothing(cls, unchanged):
    buffer = wrapped_buffer(cls)
    with unchanged(buffer):
        buffer.on_episode_end()


# -- sample -----------------------------------------------------------------------


@EACH_BUFFER_CLASS
def test_sample_returns_whole_stored_rows_with_their_indexes(cls):
    buffer = cls(8, ENV, seed=3)
    buffer.add(**numbered_transitions(range(11)))
    batch = buffer.sample(32)
    assert batch["indexes"].shape == (32,)
    assert {name: batch[name].shape for name in ENV} == {"obs": (32, 3), "act": (32,), "rew": (32,), "done": (32,)}
    numbers = batch["act"]
    assert ((numbers >= 3) & (numbers < 11)).all()
    np.testing.assert_array_equal(numbers % 8, batch["indexes"])
    assert_numbered(batch, numbers)


@EACH_BUFFER_CLASS
def test_same_seed_gives_the_same_samples(cls):
    a, b = cls(8, ENV, seed=42), cls(8, ENV, seed=42)
    for buffer in (a, b):
        buffer.add(**numbered_transitions(range(8)))
    np.testing.assert_array_equal(a.sample(64)["indexes"], b.sample(64)["indexes"])


def _draw_counts(buffer, draws: int, batch_size: int = 1000) -> np.ndarray:
    counts = np.zeros(buffer.get_buffer_size(), dtype=np.int64)
    for _ in range(draws // batch_size):
        counts += np.bincount(buffer.sample(batch_size)["indexes"], minlength=len(counts))
    return counts


def test_uniform_sampling_draws_every_stored_slot_equally_and_never_an_empty_one(assert_frequencies):
    buffer = ReplayBuffer(16, ENV, seed=7)
    buffer.add(**numbered_transitions(range(10)))
    counts = _draw_counts(buffer, 100_000)
    assert_frequencies(counts, np.r_[np.ones(10), np.zeros(6)])


def test_prioritized_sampling_frequencies_follow_p_plus_eps_to_the_alpha(assert_frequencies):
    alpha, eps = 0.7, 0.01
    buffer = PrioritizedReplayBuffer(20, ENV, alpha=alpha, eps=eps, seed=11)
    p = np.geomspace(0.05, 20.0, 16)
    buffer.add(**numbered_transitions(range(16)), priorities=p)
    counts = _draw_counts(buffer, 100_000)
    assert_frequencies(counts, np.r_[(p + eps) ** alpha, np.zeros(4)])


def test_sampling_frequencies_follow_updated_priorities(assert_frequencies):
    buffer = PrioritizedReplayBuffer(12, ENV, alpha=1.0, eps=0.0, seed=5)
    buffer.add(**numbered_transitions(range(12)))
    p = np.arange(12) % 4 + 1.0
    buffer.update_priorities(np.arange(12), p)
    assert_frequencies(_draw_counts(buffer, 100_000), p)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0, None], ids=["beta=0", "beta=0.4", "beta=1", "default-beta"])
def test_importance_weights_match_the_definition(beta):
    alpha, eps = 0.6, 1e-4
    buffer = PrioritizedReplayBuffer(10, ENV, alpha=alpha, eps=eps, seed=2)
    p = np.array([0.0, 3.0, 0.2, 1.0, 7.5, 0.01, 2.0])
    buffer.add(**numbered_transitions(range(7)), priorities=p)
    batch = buffer.sample(64) if beta is None else buffer.sample(64, beta=beta)
    beta = 0.4 if beta is None else beta
    n = len(p)
    probability = (p + eps) ** alpha / ((p + eps) ** alpha).sum()
    expected = (n * probability[batch["indexes"]]) ** -beta / ((n * probability) ** -beta).max()
    np.testing.assert_allclose(batch["weights"], expected, rtol=1e-12)
    assert batch["weights"].shape == (64,)


_HUGE_AND_TINY = [1e300, 1e-300, 0.0, 5e-324, 1e300]


def test_huge_and_tiny_priorities_side_by_side_sample_only_stored_rows():
    buffer = PrioritizedReplayBuffer(8, ENV, alpha=1.0, eps=0.0, seed=1)
    buffer.add(**numbered_transitions(range(5)), priorities=_HUGE_AND_TINY)
    batch = buffer.sample(1000)
    assert set(batch["indexes"]) <= {0, 1, 3, 4}
    assert_numbered(batch, batch["act"])


def test_importance_weights_never_exceed_one_and_the_rarest_row_weighs_exactly_one():
    buffer = PrioritizedReplayBuffer(64, ENV, seed=3)
    buffer.add(**numbered_transitions(range(64)), priorities=np.geomspace(0.1, 10.0, 64))
    weights, indexes = (batch := buffer.sample(4096))["weights"], batch["indexes"]
    assert weights.max() <= 1.0
    np.testing.assert_array_equal(weights[indexes == 0], 1.0)
    assert (indexes == 0).any()


def test_importance_weights_stay_exact_for_extreme_priority_ratios():
    beta = 0.4
    buffer = PrioritizedReplayBuffer(8, ENV, alpha=1.0, eps=0.0, seed=1)
    buffer.add(**numbered_transitions(range(5)), priorities=_HUGE_AND_TINY)
    batch = buffer.sample(1000, beta=beta)
    # In logs: the ratio 1e300 / 5e-324 overflows a float, its weight (~1e-249) does not.
    log_p = np.log(np.array(_HUGE_AND_TINY)[batch["indexes"]])
    expected = np.exp(-beta * (log_p - np.log(5e-324)))
    np.testing.assert_allclose(batch["weights"], expected, rtol=1e-9)


@EACH_BUFFER_CLASS
def test_sample_from_an_empty_buffer_raises_and_changes_nothing(cls, unchanged):
    buffer = cls(4, ENV, seed=0)
    with unchanged(buffer), pytest.raises(ValueError, match="no transition"):
        buffer.sample(1)


# -- priorities -------------------------------------------------------------------


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


@pytest.mark.parametrize("where", ["rows", "files"])
def test_a_buffer_whose_rows_outgrow_a_cache_samples_every_field_of_the_drawn_row(where, tmp_path):
    # From about 1 MiB of fields a sample prefetches the lines of the rows it drew: one a row
    # for fields side by side, one a field for fields in files of their own.
    prefix = str(tmp_path / "rb") if where == "files" else None
    buffer = PrioritizedReplayBuffer(40_000, ENV, seed=0, mmap_prefix=prefix)
    buffer.add(**numbered_transitions(range(40_000)))
    for _ in range(20):
        batch = buffer.sample(64)
        expected = numbered_transitions(batch["indexes"])
        for name, value in expected.items():
            np.testing.assert_array_equal(batch[name].reshape(value.shape), value)


def test_update_priorities_with_repeated_indexes_keeps_the_last():
    buffer = PrioritizedReplayBuffer(4, ENV)
    buffer.add(**numbered_transitions(range(4)))
    buffer.update_priorities([2, 1, 2], [7.0, 3.0, 0.25])
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0, 3.0, 0.25, 1.0])


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


# -- clear -----------------------------------------------------------------------


@EACH_BUFFER_CLASS
def test_clear_empties_the_buffer(cls):
    buffer = wrapped_buffer(cls)
    buffer.clear()
    assert (buffer.get_stored_size(), buffer.get_next_index(), buffer.get_buffer_size()) == (0, 0, 8)
    assert len(buffer.get_all_transitions()["act"]) == 0
    with pytest.raises(ValueError, match="no transition"):
        buffer.sample(1)


@EACH_BUFFER_CLASS
def test_add_after_clear_starts_afresh(cls):
    buffer = wrapped_buffer(cls)
    buffer.clear()
    assert buffer.add(**numbered_transitions(range(100, 103))) == 0
    assert_numbered(buffer.get_all_transitions(), range(100, 103))
    assert set(buffer.sample(50)["act"]) <= {100, 101, 102}


def test_clear_resets_the_max_priority_to_one():
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    buffer.clear()
    assert buffer.get_max_priority() == 1.0
    buffer.add(**numbered_row(0))
    np.testing.assert_array_equal(slot_priorities(buffer), [1.0])


# -- bad input ------------------------------------------------------------------------


def _without(row: dict, name: str) -> dict:
    return {k: v for k, v in row.items() if k != name}


def _with(rows: dict, **changes) -> dict:
    return {**rows, **changes}


def _bad_last_row(k: int, name: str, value) -> dict:
    """A batch of k good rows but for field ``name`` of the last one (the whole batch must be refused)."""
    rows = numbered_transitions(range(k))
    column = rows[name].astype(np.result_type(rows[name], np.asarray(value)))
    column[-1] = value
    return {**rows, name: column}


_BAD_FOR_ANY_BUFFER = [
    pytest.param(lambda b: b.add(**numbered_row(0), extra=1.0), ValueError, "'extra'", id="add-unknown-field"),
    pytest.param(lambda b: b.add(**_without(numbered_row(0), "act")), ValueError, "'act'", id="add-missing-field"),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), obs=np.zeros(2))), ValueError, "'obs'", id="add-wrong-shape"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), obs=np.zeros((2, 4)))),
        ValueError,
        "'obs'",
        id="add-batch-wrong-row-shape",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=[1.0, 2.0])), ValueError, "'obs'", id="add-list-of-wrong-length"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=[[1.0, 2.0, 3.0], [1.0, 2.0]])),
        ValueError,
        "'obs'",
        id="add-ragged-list",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), act=1.5)), TypeError, "'act'", id="add-float-into-int-field"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), act=np.array([1.0, 2.0]))),
        TypeError,
        "'act'",
        id="add-float-array-into-int-field",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), done=256)), ValueError, "'done'", id="add-int-above-uint8"),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), done=-1)), ValueError, "'done'", id="add-negative-into-uint8"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), done=np.int8(-1))),
        ValueError,
        "'done'",
        id="add-negative-int8-into-uint8",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), act=np.uint64(2**63))),
        ValueError,
        "'act'",
        id="add-uint64-above-int64-range",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), rew=1e300)), ValueError, "'rew'", id="add-float-overflowing-float32"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=np.array([0.0, 1e300, 2.0]))),
        ValueError,
        "'obs'",
        id="add-float64-row-overflowing-float32",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), rew="high")), TypeError, "'rew'", id="add-string-value"),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), rew=None)), TypeError, "'rew'", id="add-none-value"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), act=np.arange(3))),
        ValueError,
        "'act'",
        id="add-batch-lengths-disagree",
    ),
    pytest.param(
        lambda b: b.add(**_bad_last_row(6, "done", 300)), ValueError, "'done'", id="add-wrapping-batch-bad-last-row"
    ),
    pytest.param(
        lambda b: b.add(**_bad_last_row(20, "act", 0.5)), TypeError, "'act'", id="add-oversized-batch-bad-last-row"
    ),
    pytest.param(lambda b: b.sample(0), ValueError, "batch_size", id="sample-batch-size-zero"),
    pytest.param(lambda b: b.sample(-3), ValueError, "batch_size", id="sample-batch-size-negative"),
    pytest.param(lambda b: b.sample(2.5), ValueError, "batch_size", id="sample-batch-size-float"),
    pytest.param(lambda b: b.sample(True), ValueError, "batch_size", id="sample-batch-size-bool"),
    pytest.param(lambda b: b.sample(None), ValueError, "batch_size", id="sample-batch-size-none"),
    pytest.param(lambda b: b.sample(2, timeout=-1.0), ValueError, "timeout", id="sample-timeout-negative"),
    pytest.param(lambda b: b.sample(2, timeout=math.inf), ValueError, "timeout", id="sample-timeout-inf"),
    pytest.param(lambda b: b.add(**numbered_row(0), timeout=math.nan), ValueError, "timeout", id="add-timeout-nan"),
    pytest.param(lambda b: b.add(**numbered_row(0), timeout="1"), TypeError, "timeout", id="add-timeout-string"),
]


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("call, error, field", _BAD_FOR_ANY_BUFFER)
def test_bad_input_raises_naming_the_field_and_changes_nothing(cls, call, error, field, unchanged):
    buffer = wrapped_buffer(cls)
    with unchanged(buffer), pytest.raises(error, match=field):
        call(buffer)


@EACH_BUFFER_CLASS
def test_a_float64_row_into_a_float32_field_is_stored_rounded_to_float32(cls):
    buffer = cls(4, ENV)
    obs = np.array([0.1, -np.inf, np.nan])
    buffer.add(**_with(numbered_row(0), obs=obs))
    assert buffer.get_all_transitions()["obs"][0].tobytes() == obs.astype(np.float32).tobytes()


def test_uniform_buffer_refuses_priorities(unchanged):
    buffer = wrapped_buffer(ReplayBuffer)
    with unchanged(buffer), pytest.raises(TypeError, match="priorities"):
        buffer.add(**numbered_row(0), priorities=1.0)


_BAD_FOR_PRIORITIZED_BUFFER = [
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=math.nan), ValueError, "priorities", id="add-nan-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=math.inf), ValueError, "priorities", id="add-inf-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=-0.5), ValueError, "priorities", id="add-negative-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(3)), priorities=[1.0, 2.0]),
        ValueError,
        "priorities",
        id="add-too-few-priorities",
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(2)), priorities=[[1.0, 2.0], [3.0, 4.0]]),
        ValueError,
        "priorities",
        id="add-priorities-2d-too-many",
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities="high"), TypeError, "priorities", id="add-priority-string"
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(6)), priorities=[1.0] * 5 + [math.nan]),
        ValueError,
        "priorities",
        id="add-wrapping-batch-bad-last-priority",
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(20)), priorities=[1.0] * 19 + [-1.0]),
        ValueError,
        "priorities",
        id="add-oversized-batch-bad-last-priority",
    ),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0, math.nan]), ValueError, "priorities", id="update-nan"),
    pytest.param(lambda b: b.update_priorities([0, 1], [math.inf, 1.0]), ValueError, "priorities", id="update-inf"),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0, -1.0]), ValueError, "priorities", id="update-negative"),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0]), ValueError, "priorities", id="update-too-few"),
    pytest.param(
        lambda b: b.update_priorities([0, 1], [1.0, 2.0, 3.0]), ValueError, "priorities", id="update-too-many"
    ),
    pytest.param(lambda b: b.update_priorities([0, 8], [1.0, 2.0]), ValueError, "indexes", id="update-index-capacity"),
    pytest.param(lambda b: b.update_priorities([-1], [1.0]), ValueError, "indexes", id="update-index-negative"),
    pytest.param(lambda b: b.update_priorities([2**40], [1.0]), ValueError, "indexes", id="update-index-huge"),
    pytest.param(
        lambda b: b.update_priorities([0.0, 1.5], [1.0, 2.0]), ValueError, "indexes", id="update-fractional-index"
    ),
    pytest.param(lambda b: b.update_priorities([[0, 1]], [1.0, 2.0]), ValueError, "indexes", id="update-index-2d"),
    # The int64 and float64 arrays sample() hands out take a path of their own: the same refusals.
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0, math.nan])),
        ValueError,
        "priorities",
        id="update-arrays-nan",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0, -1.0])),
        ValueError,
        "priorities",
        id="update-arrays-negative",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0])),
        ValueError,
        "priorities",
        id="update-arrays-too-few",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 8]), np.array([1.0, 2.0])),
        ValueError,
        "indexes",
        id="update-arrays-index-capacity",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([-1, 0]), np.array([1.0, math.nan])),
        ValueError,
        "indexes",
        id="update-arrays-bad-index-before-bad-priority",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([[0, 1]]), np.array([1.0, 2.0])),
        ValueError,
        "indexes",
        id="update-arrays-index-2d",
    ),
    pytest.param(lambda b: b.sample(2, beta=-0.1), ValueError, "beta", id="sample-beta-negative"),
    pytest.param(lambda b: b.sample(2, beta=math.nan), ValueError, "beta", id="sample-beta-nan"),
    pytest.param(lambda b: b.sample(2, beta=math.inf), ValueError, "beta", id="sample-beta-inf"),
    pytest.param(lambda b: b.sample(2, beta=None), (TypeError, ValueError), "beta", id="sample-beta-none"),
    pytest.param(lambda b: b.sample(2, beta="high"), (TypeError, ValueError), "beta", id="sample-beta-string"),
]


@pytest.mark.parametrize("call, error, field", _BAD_FOR_PRIORITIZED_BUFFER)
def test_bad_input_to_a_prioritized_buffer_raises_naming_the_argument_and_changes_nothing(
    call, error, field, unchanged
):
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    with unchanged(buffer), pytest.raises(error, match=field):
        call(buffer)


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


@EACH_BUFFER_CLASS
def test_timeout_0_means_do_not_wait(cls):
    buffer = wrapped_buffer(cls)
    assert buffer.add(**numbered_row(0), timeout=0) >= 0
    assert len(buffer.sample(2, timeout=0)["indexes"]) == 2


def test_update_of_a_slot_not_stored_yet_raises_and_changes_nothing(unchanged):
    buffer = PrioritizedReplayBuffer(8, ENV)
    buffer.add(**numbered_transitions(range(3)))
    with unchanged(buffer), pytest.raises(ValueError, match="indexes"):
        buffer.update_priorities([3], [1.0])


_BAD_CONSTRUCTION = [
    pytest.param(dict(size=0), "size", id="size-zero"),
    pytest.param(dict(size=-4), "size", id="size-negative"),
    pytest.param(dict(size=4.5), "size", id="size-fraction"),
    pytest.param(dict(size=math.inf), "size", id="size-infinite"),
    pytest.param(dict(size="4"), "size", id="size-string"),
    pytest.param(dict(size=True), "size", id="size-bool"),
    pytest.param(dict(env_dict=None), "env_dict", id="env-dict-none"),
    pytest.param(dict(env_dict={}), "env_dict", id="env-dict-empty"),
    pytest.param(dict(env_dict=[("obs", {})]), "env_dict", id="env-dict-not-a-mapping"),
    pytest.param(dict(env_dict={"obs": 3}), "obs", id="env-dict-options-not-a-mapping"),
    pytest.param(dict(env_dict={"2obs": {}}), "2obs", id="env-dict-name-not-identifier"),
    pytest.param(dict(env_dict={"weights": {}}), "weights", id="env-dict-reserved-name"),
    pytest.param(dict(env_dict={"obs": {"shap": 3}}), "shap", id="env-dict-unknown-option"),
    pytest.param(dict(env_dict={"obs": {"shape": 0}}), "shape", id="env-dict-zero-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": (3, -1)}}), "shape", id="env-dict-negative-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": 2.5}}), "shape", id="env-dict-float-shape"),
    pytest.param(dict(env_dict={"obs": {"shape": (2.5,)}}), "shape", id="env-dict-float-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": "x"}}), "shape", id="env-dict-string-shape"),
    pytest.param(dict(env_dict={"obs": {"dtype": "nonsense"}}), "dtype", id="env-dict-unknown-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": "U3"}}), "dtype", id="env-dict-string-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": "M8[s]"}}), "dtype", id="env-dict-datetime-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": object}}), "dtype", id="env-dict-object-dtype"),
    pytest.param(dict(default_dtype="nonsense"), "dtype", id="default-dtype-unknown"),
    pytest.param(dict(alpha=-0.5), "alpha", id="alpha-negative"),
    pytest.param(dict(alpha=math.nan), "alpha", id="alpha-nan"),
    pytest.param(dict(alpha=math.inf), "alpha", id="alpha-inf"),
    pytest.param(dict(alpha=None), "alpha", id="alpha-none"),
    pytest.param(dict(alpha="high"), "alpha", id="alpha-string"),
    pytest.param(dict(eps=-1e-3), "eps", id="eps-negative"),
    pytest.param(dict(eps=math.nan), "eps", id="eps-nan"),
    pytest.param(dict(eps=None), "eps", id="eps-none"),
]


@pytest.mark.parametrize("options, name", _BAD_CONSTRUCTION)
def test_bad_construction_raises_naming_the_argument(options, name):
    arguments = {"size": 8, "env_dict": ENV, **options}
    cls = PrioritizedReplayBuffer if {"alpha", "eps"} & set(options) else ReplayBuffer
    with pytest.raises((TypeError, ValueError), match=name):
        cls(arguments.pop("size"), arguments.pop("env_dict"), **arguments)


@EACH_BUFFER_CLASS
def test_sample_fills_the_arrays_given_in_out(cls):
    buffer = wrapped_buffer(cls)
    first = buffer.sample(4)
    again = buffer.sample(4, out=first)
    for name in ENV:
        assert again[name] is first[name]
    np.testing.assert_array_equal(again["obs"], buffer.inspection().arrays[field_array("obs")][again["indexes"]])


@EACH_BUFFER_CLASS
def test_sample_rejects_an_out_array_of_the_wrong_shape(cls):
    buffer = wrapped_buffer(cls)
    with pytest.raises(ValueError, match=r"out\['obs'\]"):
        buffer.sample(4, out={"obs": np.zeros((3, 3), np.float32)})


_BAD_OUT = [
    pytest.param(np.zeros((4, 3), np.float64), id="wrong-dtype"),
    pytest.param(np.zeros((3, 4), np.float32).T, id="not-c-contiguous"),
    pytest.param(np.zeros((4, 3), np.float32)[::-1], id="negative-strides"),
    pytest.param(np.broadcast_to(np.zeros(3, np.float32), (4, 3)), id="read-only"),
    pytest.param([[0.0] * 3] * 4, id="a-list"),
]


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("array", _BAD_OUT)
def test_sample_rejects_an_out_array_it_cannot_fill_and_changes_nothing(cls, array, unchanged):
    buffer = wrapped_buffer(cls)
    with unchanged(buffer), pytest.raises(ValueError, match=r"out\['obs'\]: expected a writable C-contiguous"):
        buffer.sample(4, out={"obs": array})


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


@EACH_BUFFER_CLASS
def test_a_batch_the_caller_still_holds_is_never_refilled(cls):
    buffer = wrapped_buffer(cls)
    held = [buffer.sample(4) for _ in range(6)]
    copies = [{name: array.copy() for name, array in batch.items()} for batch in held]
    for _ in range(10):
        buffer.sample(4)
    for batch, copy in zip(held, copies, strict=True):
        for name in copy:
            np.testing.assert_array_equal(batch[name], copy[name])


@EACH_BUFFER_CLASS
def test_a_view_of_a_dropped_batch_keeps_its_rows(cls):
    buffer = wrapped_buffer(cls)
    view = buffer.sample(4)["obs"][1:]
    kept = view.copy()
    for _ in range(10):
        buffer.sample(4)
    np.testing.assert_array_equal(view, kept)


@EACH_BUFFER_CLASS
def test_a_dropped_batch_reshaped_in_place_does_not_change_later_batches(cls):
    buffer = wrapped_buffer(cls)
    for _ in range(3):
        batch = buffer.sample(4)
        batch["obs"].shape = (2, 6)
        batch["act"].dtype = np.uint64
        del batch
    batch = buffer.sample(4)
    assert batch["obs"].shape == (4, 3) and batch["act"].dtype == np.int64
    assert_numbered(batch, batch["act"])  # act holds each row's number


@EACH_BUFFER_CLASS
def test_a_dropped_batch_whose_arrays_changed_keys_does_not_mislabel_later_batches(cls):
    buffer = wrapped_buffer(cls)  # slot s holds transition s + 8 for s < 3, s otherwise
    for _ in range(3):
        batch = buffer.sample(4)
        batch["act"], batch["indexes"] = batch["indexes"], batch["act"]  # same dtype and shape
        del batch
    for _ in range(3):
        batch = buffer.sample(4)
        assert_numbered(batch, batch["act"])
        np.testing.assert_array_equal(batch["indexes"], batch["act"] % 8)


@EACH_BUFFER_CLASS
def test_an_array_put_into_a_dropped_batch_is_never_filled(cls):
    buffer = wrapped_buffer(cls)
    mine = np.zeros((8, 3), dtype=buffer.sample(4)["obs"].dtype)
    for _ in range(3):
        batch = buffer.sample(4)
        batch["obs"] = mine[:4]  # a view: its memory is still the caller's
        del batch
    for _ in range(3):
        buffer.sample(4)
    assert not mine.any()


def test_reused_batches_keep_cpprbs_dtypes_and_a_held_one_is_never_refilled():
    buffer = PrioritizedReplayBuffer(8, ENV, seed=0, weights_dtype=np.float32, indexes_dtype=np.uint64)
    buffer.add(**numbered_transitions(range(8)))
    held = buffer.sample(4)
    kept = {name: array.copy() for name, array in held.items()}
    for _ in range(6):
        batch = buffer.sample(4)
        assert batch["indexes"].dtype == np.uint64 and batch["weights"].dtype == np.float32
        assert_numbered(batch, batch["act"])
        del batch
    for name in kept:
        np.testing.assert_array_equal(held[name], kept[name])


def test_a_uint64_index_of_2_to_the_63_or_more_is_refused_as_given():
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    before = slot_priorities(buffer)
    with pytest.raises(ValueError, match=f"indexes: expected slots .* got {2**63 + 1} at position 1"):
        buffer.update_priorities(np.array([0, 2**63 + 1], dtype=np.uint64), np.array([5.0, 5.0]))
    np.testing.assert_array_equal(slot_priorities(buffer), before)


# -- what a sharded client reads ------------------------------------------------------------------


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


# -- cpprb's conventions the native API accepts -------------------------------------------
@pytest.mark.parametrize("size", [1e3, 1000.0, np.float64(1000)], ids=["1e3", "float", "numpy-float"])
def test_an_integral_float_size_is_a_capacity(size):
    assert ReplayBuffer(size, ENV).get_buffer_size() == 1000


def test_the_env_dict_given_is_not_changed():
    env_dict = {"obs": {"shape": 3}, "rew": {}}
    copy = {name: dict(options) for name, options in env_dict.items()}
    ReplayBuffer(8, env_dict).add(obs=np.zeros(3), rew=1.0)
    assert env_dict == copy


def test_an_env_dict_cpprb_has_annotated_with_add_shape_is_accepted():
    env_dict = {"obs": {"shape": 3, "add_shape": np.array([-1, 3])}, "rew": {"add_shape": np.array([-1, 1])}}
    buffer = ReplayBuffer(8, env_dict)
    assert buffer.get_env_dict() == {
        "obs": {"shape": (3,), "dtype": np.float32},
        "rew": {"shape": (), "dtype": np.float32},
    }


def test_an_add_shape_that_disagrees_with_the_shape_is_refused():
    with pytest.raises(ValueError, match="add_shape"):
        ReplayBuffer(8, {"obs": {"shape": 3, "add_shape": [-1, 4]}})


def test_a_field_of_shape_one_takes_a_scalar_for_one_transition():
    buffer = ReplayBuffer(8, {"rew": {"shape": 1}})
    buffer.add(rew=0.5)
    np.testing.assert_array_equal(buffer.get_all_transitions()["rew"], [[0.5]])


@pytest.mark.parametrize(
    "value, error", [(256, ValueError), (-1, ValueError), (1.5, TypeError)], ids=["too-large", "negative", "fractional"]
)
def test_a_number_that_does_not_fit_a_field_of_shape_one_is_refused_and_changes_nothing(value, error, unchanged):
    buffer = ReplayBuffer(8, {"act": {"shape": 1, "dtype": np.uint8}})
    buffer.add(act=3)
    with unchanged(buffer), pytest.raises(error, match="act"):
        buffer.add(act=value)
    np.testing.assert_array_equal(buffer.get_all_transitions()["act"], [[3]])


def test_a_field_of_shape_one_takes_one_number_per_transition_in_a_batch():
    buffer = ReplayBuffer(8, {"obs": {"shape": 2}, "rew": {"shape": 1}})
    buffer.add(obs=np.zeros((3, 2)), rew=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(buffer.get_all_transitions()["rew"], [[1], [2], [3]])


def test_a_single_float_priority_takes_the_fast_path_and_is_stored():
    buffer = PrioritizedReplayBuffer(8, ENV)
    buffer.add(obs=np.zeros(3, np.float32), act=1, rew=0.5, done=0, priorities=2.5)
    assert buffer.get_max_priority() == 2.5


@pytest.mark.parametrize("priority", [-1.0, math.nan, math.inf], ids=["negative", "nan", "inf"])
def test_a_bad_single_float_priority_is_refused_and_changes_nothing(priority, unchanged):
    buffer = PrioritizedReplayBuffer(8, ENV)
    with unchanged(buffer), pytest.raises(ValueError, match="priorities"):
        buffer.add(obs=np.zeros(3, np.float32), act=1, rew=0.5, done=0, priorities=priority)


def test_a_complex_field_stores_complex_values():
    buffer = ReplayBuffer(8, {"z": {"dtype": np.complex64}})
    buffer.add(z=1 + 2j)
    buffer.add(z=np.array([3, 4j], dtype=np.complex64))
    np.testing.assert_array_equal(buffer.get_all_transitions()["z"], np.array([1 + 2j, 3, 4j], np.complex64))


def test_complex_values_are_refused_in_a_float_field(unchanged):
    buffer = ReplayBuffer(8, ENV)
    with unchanged(buffer), pytest.raises(TypeError, match="rew"):
        buffer.add(obs=np.zeros(3), act=1, rew=1j, done=0)


# -- reading slots --------------------------------------------------------------------------------
@EACH_BUFFER_CLASS
def test_read_returns_the_transitions_in_the_slots_given(cls):
    buffer = cls(4, {"a": {}})
    buffer.add(a=np.arange(6, dtype=np.float32))  # slots 0, 1 hold 4, 5
    np.testing.assert_array_equal(buffer.read([1, 0, 3])["a"], [5, 4, 3])


@EACH_BUFFER_CLASS
def test_read_refuses_a_slot_that_holds_no_transition(cls):
    buffer = cls(4, {"a": {}})
    buffer.add(a=1.0)
    with pytest.raises(ValueError, match="slot 2"):
        buffer.read([0, 2])


@pytest.mark.parametrize("index", [-1, 4])
def test_read_refuses_a_slot_outside_the_buffer(index):
    buffer = ReplayBuffer(4, {"a": {}})
    buffer.add(a=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="indexes"):
        buffer.read([index])


def test_all_transitions_can_say_their_slots():
    buffer = ReplayBuffer(4, {"a": {}})
    buffer.add(a=np.arange(6, dtype=np.float32))
    rows = buffer.get_all_transitions(indexes=True)
    np.testing.assert_array_equal(rows["indexes"], [2, 3, 0, 1])
    np.testing.assert_array_equal(rows["a"], [2, 3, 4, 5])


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


def test_an_unknown_new_priority_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="new_priority: expected one of 'max_stored', 'max_ever', got 'max'"):
        PrioritizedReplayBuffer(4, {"x": {}}, new_priority="max")


def test_weights_dtype_float32_gives_float32_weights_of_the_same_values():
    wide = PrioritizedReplayBuffer(8, {"x": {}}, seed=3)
    narrow = PrioritizedReplayBuffer(8, {"x": {}}, seed=3, weights_dtype=np.float32)
    for rb in (wide, narrow):
        rb.add(x=np.arange(8.0), priorities=np.arange(1.0, 9.0))
    w64, w32 = wide.sample(16)["weights"], narrow.sample(16)["weights"]
    assert w32.dtype == np.float32 and w32.tolist() == w64.astype(np.float32).tolist()


def test_indexes_dtype_uint64_gives_uint64_indexes_that_update_priorities_takes():
    rb = PrioritizedReplayBuffer(8, {"x": {}}, alpha=1.0, eps=0.0, indexes_dtype=np.uint64)
    rb.add(x=np.arange(8.0))
    idx = rb.sample(4)["indexes"]
    assert idx.dtype == np.uint64
    rb.update_priorities(idx, np.full(4, 3.0))
    assert rb.get_max_priority() == 3.0


@pytest.mark.parametrize(
    "option, value", [("weights_dtype", np.int32), ("indexes_dtype", np.int32), ("indexes_dtype", "not a dtype")]
)
def test_an_unsupported_sample_dtype_is_refused_by_name(option, value):
    with pytest.raises(ValueError, match=f"{option}: expected one of the dtypes"):
        PrioritizedReplayBuffer(4, {"x": {}}, **{option: value})


def test_mmap_prefix_keeps_every_array_in_a_file_and_the_data_survives_close(tmp_path):
    prefix = str(tmp_path / "rb")
    rb = PrioritizedReplayBuffer(8, {"obs": {"shape": (2,)}, "done": {}}, mmap_prefix=prefix)
    rb.add(obs=np.ones((3, 2)), done=np.zeros(3))
    assert rb.sample(4)["obs"].tolist() == [[1.0, 1.0]] * 4
    rb.close()
    assert np.fromfile(f"{prefix}_obs.dat", dtype=np.float32)[:6].tolist() == [1.0] * 6
    assert os.path.exists(f"{prefix}.header.dat") and os.path.exists(f"{prefix}.tree.dat")


def test_an_episode_writer_of_a_file_mapped_buffer_writes_into_the_same_files(tmp_path):
    rb = ReplayBuffer(
        64,
        {"obs": {"shape": (2,)}, "next_obs": {"shape": (2,)}, "done": {}},
        next_of="obs",
        lanes=2,
        mmap_prefix=str(tmp_path / "rb"),
    )
    rb.episode_writer().add(obs=np.zeros(2), next_obs=np.ones(2), done=1.0)
    assert rb.get_stored_size() == 1


def test_a_shared_buffer_refuses_mmap_prefix():
    with pytest.raises(ValueError, match="mmap_prefix: a shared buffer lives in a shared-memory segment"):
        MPReplayBuffer(8, {"x": {}}, mmap_prefix="rb")


def test_mmap_prefix_must_be_a_path():
    with pytest.raises(TypeError, match="mmap_prefix: expected a path prefix"):
        ReplayBuffer(8, {"x": {}}, mmap_prefix=3)
