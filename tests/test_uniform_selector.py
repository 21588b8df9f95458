"""UniformSelector: every drawable item equally likely, O(1) draws, state in a caller-owned array."""
import numpy as np
import pytest

from mpreplay._ext.uniform import UniformSelector, uniform_state_size


def _selector(capacity: int, items=()) -> UniformSelector:
    selector = UniformSelector(np.zeros(uniform_state_size(capacity), np.int64), capacity)
    for item in items:
        selector.insert(item)
    return selector


def test_a_new_selector_has_nothing_to_draw():
    selector = _selector(8)
    assert selector.total_weight == 0.0
    assert selector.smallest_weight == np.inf
    assert selector.sample_items(4, np.random.default_rng(0)).size == 0


def test_inserting_an_item_twice_counts_it_once():
    selector = _selector(8, [3, 3])
    assert selector.total_weight == 1.0
    assert selector.item_weight(3) == 1.0


def test_a_removed_item_is_never_drawn():
    selector = _selector(8, [1, 2, 5])
    selector.remove(2)
    drawn = selector.sample_items(10_000, np.random.default_rng(1))
    assert set(drawn.tolist()) == {1, 5}
    assert selector.item_weight(2) == 0.0


def test_removing_an_item_that_is_not_drawable_changes_nothing():
    selector = _selector(8, [4])
    before = np.array(selector.sample_items(16, np.random.default_rng(2)))
    selector.remove(6)
    assert selector.total_weight == 1.0
    assert (selector.sample_items(16, np.random.default_rng(2)) == before).all()


def test_draw_frequencies_are_uniform_over_the_drawable_items(assert_frequencies):
    items = [0, 3, 4, 7, 9, 12]
    selector = _selector(16, items)
    counts = np.bincount(selector.sample_items(60_000, np.random.default_rng(3)), minlength=16)
    assert_frequencies(counts, np.isin(np.arange(16), items))


def test_stratified_draws_take_one_item_from_each_stratum():
    selector = _selector(8, range(8))
    drawn = selector.sample_items(8, np.random.default_rng(4), stratified=True)
    assert sorted(drawn.tolist()) == list(range(8))  # members in insertion order, one per stratum


def test_removals_in_any_order_keep_the_drawable_set_exact():
    rng = np.random.default_rng(5)
    selector, live = _selector(64), set()
    for _ in range(2_000):
        item = int(rng.integers(64))
        if rng.random() < 0.5:
            selector.insert(item)
            live.add(item)
        else:
            selector.remove(item)
            live.discard(item)
        assert selector.total_weight == len(live)
    assert set(selector.sample_items(20_000, rng).tolist()) == live


def test_recompute_repairs_a_removal_interrupted_after_its_first_store():
    state = np.zeros(uniform_state_size(8), np.int64)
    selector = UniformSelector(state, 8)
    for item in (1, 2, 6):
        selector.insert(item)
    state[1 + 8 + 2] = -1  # item 2's position cleared; the holder died before the rest
    selector.recompute()
    assert selector.total_weight == 2.0
    assert set(selector.sample_items(1_000, np.random.default_rng(6)).tolist()) == {1, 6}


def test_a_second_view_of_the_same_state_sees_the_same_items():
    state = np.zeros(uniform_state_size(8), np.int64)
    UniformSelector(state, 8).insert(5)
    attached = UniformSelector(state, 8, reset=False)
    assert attached.total_weight == 1.0
    assert attached.sample_items(3, np.random.default_rng(7)).tolist() == [5, 5, 5]


def test_a_state_array_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="state: expected 17 int64 entries"):
        UniformSelector(np.zeros(16, np.int64), 8)


def test_an_item_outside_the_capacity_is_refused():
    with pytest.raises(IndexError, match=r"item: expected an integer in \[0, 8\)"):
        _selector(8).insert(8)
