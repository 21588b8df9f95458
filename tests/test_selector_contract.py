"""What every registered selector does (mpreplay.selectors): insert, update, remove and sample.

Each test runs over every entry of the registry, so a new selector is held to all of them by
adding its entry.  What is particular to one selector (how prioritized weights priorities, the
order of the ordered ones) lives in its own test file.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    EACH_START_METHOD,
    assert_child_dies_at,
    drawn_items,
    registered_selector,
    rows_of,
    run_in_child,
    selector_state,
)

from mpreplay import (
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RowsDroppedWarning,
    monitor,
    selectors,
)
from mpreplay.selectors import SelectorSpec

NAMES = pytest.mark.parametrize("name", selectors.names())
ENV = {"obs": {"shape": (2,), "dtype": np.int64}, "id": {"dtype": np.int64}}


def _drawn(selector, k: int = 4096, seed: int = 0) -> set[int]:
    return set(drawn_items(selector, k, seed))


def _buffer(name: str, size: int, shared: bool = False, **options):
    """A buffer drawing with selector ``name``: prioritized classes for selectors that draw by priority."""
    cls = {
        (False, False): ReplayBuffer,
        (False, True): MPReplayBuffer,
        (True, False): PrioritizedReplayBuffer,
        (True, True): MPPrioritizedReplayBuffer,
    }[selectors.entry(name).by_priority, shared]
    return cls(size, ENV, selector=name, **options)


def test_the_registry_holds_the_selectors_the_buffers_have_always_had():
    assert {"uniform", "prioritized"} <= set(selectors.names())


@NAMES
def test_a_new_selector_has_nothing_to_draw(name):
    selector = registered_selector(name, 8)
    assert selector.total_weight == 0.0
    assert selector.smallest_weight == np.inf
    assert selector.sample_items(4, np.random.default_rng(0)).size == 0


@NAMES
def test_only_inserted_items_are_drawn(name):
    selector = registered_selector(name, 16, [2, 9, 11])
    assert _drawn(selector) == {2, 9, 11}
    assert [selector.item_weight(i) > 0 for i in range(16)] == [i in (2, 9, 11) for i in range(16)]


@NAMES
def test_inserting_an_item_twice_holds_it_once(name):
    selector = registered_selector(name, 8, [3, 3])
    assert selector.total_weight == selector.item_weight(3) > 0.0
    assert _drawn(selector) == {3}


@NAMES
def test_a_removed_item_is_never_drawn(name):
    selector = registered_selector(name, 8, [1, 2, 5])
    selector.remove(2)
    assert _drawn(selector) == {1, 5}
    assert selector.item_weight(2) == 0.0


@NAMES
def test_removing_every_item_leaves_nothing_to_draw(name):
    selector = registered_selector(name, 8, [0, 7])
    selector.remove(7)
    selector.remove(0)
    assert selector.total_weight == 0.0
    assert selector.sample_items(2, np.random.default_rng(0)).size == 0


@NAMES
def test_removing_an_item_that_is_not_drawable_changes_nothing(name):
    selector = registered_selector(name, 8, [4, 6])
    before = selector.sample_items(16, np.random.default_rng(2)).tolist()
    selector.remove(5)
    assert selector.total_weight == selector.item_weight(4) + selector.item_weight(6)
    assert selector.sample_items(16, np.random.default_rng(2)).tolist() == before


@NAMES
def test_updating_an_item_that_is_not_drawable_leaves_it_not_drawable(name):
    selector = registered_selector(name, 8, [1])
    selector.update(3, 2.0)
    assert selector.item_weight(3) == 0.0
    assert _drawn(selector) == {1}


@NAMES
def test_updating_a_drawable_item_keeps_it_drawable(name):
    selector = registered_selector(name, 8, [1, 4])
    selector.update(4, 3.0)
    assert _drawn(selector) == {1, 4}


@NAMES
def test_inserts_and_removals_in_any_order_keep_the_drawable_set_exact(name):
    rng = np.random.default_rng(5)
    selector, live = registered_selector(name, 64), set()
    for _ in range(2_000):
        item = int(rng.integers(64))
        if rng.random() < 0.5:
            selector.insert(item, float(rng.integers(1, 4)))
            live.add(item)
        else:
            selector.remove(item)
            live.discard(item)
        assert {i for i in range(64) if selector.item_weight(i) > 0} == live
    assert _drawn(selector, 20_000) == live


@NAMES
def test_a_batch_of_all_the_items_holds_each_once_when_stratified(name):
    selector = registered_selector(name, 8, range(8))
    drawn = selector.sample_items(8, np.random.default_rng(4), stratified=True)
    assert sorted(drawn.tolist()) == list(range(8))


@NAMES
def test_an_ordered_selector_numbers_its_items_in_insertion_order_and_others_keep_no_order(name):
    selector = registered_selector(name, 8, items=[5, 2, 7])
    selector.remove(2)
    selector.insert(2, 1.0)
    arrivals = [selector.item_arrival(item) for item in (5, 7, 2)]
    if selectors.entry(name).ordered:
        assert arrivals == sorted(arrivals) and len(set(arrivals)) == 3
    else:
        assert arrivals == [-1, -1, -1]
    assert selector.item_arrival(0) == -1  # not drawable


@NAMES
def test_recompute_gives_back_the_same_state(name):
    # What crash recovery calls: everything derived is recomputed from the per-item entries.
    rng = np.random.default_rng(6)
    selector = registered_selector(name, 32)
    for item in rng.permutation(32)[:20]:
        selector.insert(int(item), float(rng.integers(1, 5)))
    for item in rng.permutation(32)[:8]:
        selector.remove(int(item))
    weights, total = [selector.item_weight(i) for i in range(32)], selector.total_weight
    drawn = _drawn(selector, 20_000)
    selector.recompute()
    assert [selector.item_weight(i) for i in range(32)] == weights
    assert selector.total_weight == total
    assert _drawn(selector, 20_000) == drawn


@NAMES
def test_a_second_view_of_the_same_state_draws_the_same_items(name):
    state = selector_state(name, 8)
    first = registered_selector(name, 8, [5], state=state)
    attached = registered_selector(name, 8, state=state, reset=False)
    assert attached.total_weight == first.total_weight
    assert attached.sample_items(3, np.random.default_rng(7)).tolist() == [5, 5, 5]


@NAMES
def test_a_state_array_of_the_wrong_length_is_refused(name):
    _, length, dtype = selectors.state_array(name, 8)
    with pytest.raises(ValueError, match="state: expected"):
        selectors.make(SelectorSpec(name), np.zeros(length - 1, dtype), 8, True)


@NAMES
def test_an_item_outside_the_capacity_is_refused(name):
    with pytest.raises(IndexError, match=r"item: expected an integer in \[0, 8\)"):
        registered_selector(name, 8).insert(8, 1.0)


@NAMES
def test_a_draw_of_no_items_is_refused(name):
    with pytest.raises(ValueError, match="k: expected an integer >= 1"):
        registered_selector(name, 8, [1]).sample_items(0, np.random.default_rng(8))


@NAMES
def test_an_unknown_option_is_refused_by_name(name):
    with pytest.raises(TypeError, match="colour"):
        SelectorSpec(name, colour="red")


def test_an_unknown_selector_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"selector: expected one of \['uniform', 'prioritized'"):
        SelectorSpec("roulette")


# -- in a table ------------------------------------------------------------------------------
@NAMES
def test_a_buffer_draws_only_rows_that_are_stored(name):
    buffer = _buffer(name, 8, seed=0)
    with pytest.warns(RowsDroppedWarning, match="the 12 oldest were dropped"):
        buffer.add(**rows_of(ENV, range(20)))
    for _ in range(20):
        batch = buffer.sample(4)
        assert set(batch["id"].tolist()) <= set(range(12, 20))
        assert (batch["obs"] == batch["id"][:, None]).all()


@NAMES
def test_an_empty_buffer_refuses_to_sample(name):
    with pytest.raises(ValueError, match="holds no transition"):
        _buffer(name, 8).sample(1)


@NAMES
def test_a_buffer_names_its_selector_in_its_manifest(name):
    buffer = _buffer(name, 8, shared=True)
    try:
        [segment] = [s for s in monitor.list_segments() if s.name == buffer.name]
        assert segment.kind == name
    finally:
        buffer.close()


def _add_in_child(buffer, ids) -> None:
    buffer.add(**rows_of(ENV, ids))


@NAMES
@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_rows_another_process_adds_are_drawn_here(name, method):
    with _buffer(name, 16, shared=True, seed=1) as buffer:
        assert run_in_child(method, _add_in_child, buffer, range(100, 106)) == 0
        assert buffer.get_stored_size() == 6
        assert set(buffer.sample(64)["id"].tolist()) <= set(range(100, 106))


@NAMES
@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_a_writer_killed_while_publishing_leaves_only_whole_rows_drawable(name, method):
    with _buffer(name, 16, shared=True, seed=2) as buffer:
        buffer.add(**rows_of(ENV, range(4)))
        assert_child_dies_at(method, "publish", _add_in_child, buffer, range(200, 204), timeout=30)
        stored = buffer.get_all_transitions()
        assert buffer.get_stored_size() == len(stored["id"])
        for _ in range(10):
            batch = buffer.sample(8)
            assert set(batch["id"].tolist()) <= set(stored["id"].tolist())
            assert (batch["obs"] == batch["id"][:, None]).all()


@NAMES
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_every_buffer_class_takes_every_selector_and_samples_by_its_rule(name, cls):
    buffer = cls(8, ENV, selector=name)
    buffer.add(**rows_of(ENV, np.arange(4)))
    batch = buffer.sample(2)
    assert set(batch["id"].tolist()) <= {0, 1, 2, 3}
    assert ("weights" in batch) == selectors.entry(name).by_priority


def test_the_prioritized_options_go_with_the_prioritized_selector_only():
    with pytest.raises(TypeError, match="alpha: an option of the prioritized selector"):
        PrioritizedReplayBuffer(8, ENV, alpha=0.5, selector=SelectorSpec("prioritized"))
    assert PrioritizedReplayBuffer(8, ENV, selector=SelectorSpec("prioritized", alpha=0.5)).alpha == 0.5


@NAMES
@pytest.mark.parametrize("shared", [False, True])
def test_verify_finds_the_selectors_state_agreeing_with_the_slots_after_adds_samples_updates_and_wraps(name, shared):
    with _buffer(name, 16, shared) as buffer:
        with pytest.warns(RowsDroppedWarning):
            buffer.add(**rows_of(ENV, np.arange(40)))
        buffer.sample(8)
        if selectors.entry(name).by_priority:
            buffer.update_priorities(np.arange(4), np.array([9.0, 0.5, 3.0, 7.0]))
        assert buffer.verify()["drawable"] == 16
