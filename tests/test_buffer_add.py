"""Adding to a local buffer: one transition or a batch, the slots it returns, wrapping, a batch as
its rows one by one, clearing; fields of shape one and of complex numbers."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    EACH_BUFFER_CLASS,
    NUMBERED_FIELDS,
    assert_numbered,
    numbered_row,
    numbered_transitions,
    wrapped_buffer,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer, RowsDroppedWarning, SampleToInsertRatio
from mpreplay._ext.schema import MEMBERS_ARRAY, TREE_ARRAY, field_array
from mpreplay._ext.sumtree import TREE_HEAD_LEN

ENV = NUMBERED_FIELDS


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
    with pytest.warns(
        RowsDroppedWarning,
        match=f"{k} rows written at once into a table of 5 slots: it keeps the newest 5, the {k - 5} oldest were",
    ):
        assert buffer.add(**numbered_transitions(range(2, 2 + k))) == 2  # where its first row would have gone
    assert (buffer.get_stored_size(), buffer.get_next_index()) == (5, (2 + k) % 5)
    assert_numbered(buffer.get_all_transitions(), range(k - 3, k + 2))


@EACH_BUFFER_CLASS
def test_batch_of_exactly_the_capacity_keeps_every_row_without_a_warning(cls, recwarn):
    buffer = cls(5, ENV)
    buffer.add(**numbered_transitions(range(5)))
    assert not [w for w in recwarn if issubclass(w.category, RowsDroppedWarning)]


def test_batch_larger_than_the_capacity_that_times_out_warns_of_nothing_dropped(recwarn):
    with ReplayBuffer(5, ENV, rate_limiter=SampleToInsertRatio(1.0, 1, (-1e9, 4.0))) as buffer:
        buffer.add(**numbered_transitions(range(2)))
        with pytest.raises(TimeoutError):
            buffer.add(**numbered_transitions(range(2, 9)), timeout=0)
    assert not [w for w in recwarn if issubclass(w.category, RowsDroppedWarning)]


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


# Batches larger than the capacity warn of the rows they drop: that is tested above.
DROPS_ROWS = pytest.mark.filterwarnings("ignore::mpreplay.RowsDroppedWarning")


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("lengths", list(_BATCHINGS.values()), ids=list(_BATCHINGS))
@DROPS_ROWS
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
@DROPS_ROWS
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


@EACH_BUFFER_CLASS
def test_timeout_0_means_do_not_wait(cls):
    buffer = wrapped_buffer(cls)
    assert buffer.add(**numbered_row(0), timeout=0) >= 0
    assert len(buffer.sample(2, timeout=0)["indexes"]) == 2


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


def test_a_field_of_shape_one_takes_a_scalar_for_one_transition():
    buffer = ReplayBuffer(8, {"rew": {"shape": 1}})
    buffer.add(rew=0.5)
    np.testing.assert_array_equal(buffer.get_all_transitions()["rew"], [[0.5]])


def test_a_field_of_shape_one_takes_one_number_per_transition_in_a_batch():
    buffer = ReplayBuffer(8, {"obs": {"shape": 2}, "rew": {"shape": 1}})
    buffer.add(obs=np.zeros((3, 2)), rew=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(buffer.get_all_transitions()["rew"], [[1], [2], [3]])


def test_a_complex_field_stores_complex_values():
    buffer = ReplayBuffer(8, {"z": {"dtype": np.complex64}})
    buffer.add(z=1 + 2j)
    buffer.add(z=np.array([3, 4j], dtype=np.complex64))
    np.testing.assert_array_equal(buffer.get_all_transitions()["z"], np.array([1 + 2j, 3, 4j], np.complex64))
