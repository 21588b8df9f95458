"""The ordered selectors: a batch of k is the first k drawable items in the selector's order.

Each is compared with a model of its order: items keyed by their insertion number or their
priority, ties to the item inserted first (see mpreplay.selectors).  What every selector does is
in test_selector_contract.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ID_FIELD, drawn_items, registered_selector

from mpreplay import CorruptBufferError, PrioritizedReplayBuffer, ReplayBuffer, selectors

# Each ordered selector's key of an item (priority, insertion number): the smallest is drawn first.
KEYS = {
    "fifo": lambda priority, number: (number,),
    "lifo": lambda priority, number: (-number,),
    "max_heap": lambda priority, number: (-priority,),
    "min_heap": lambda priority, number: (priority,),
}
ORDERED = pytest.mark.parametrize("name", sorted(KEYS))
ENV = ID_FIELD


def test_every_ordered_selector_of_the_registry_is_modelled_here():
    assert {name for name in selectors.names() if selectors.entry(name).ordered} == set(KEYS)


class Model:
    """The drawable items and their order, kept in Python."""

    def __init__(self, name: str):
        self.key, self.items, self.inserts = KEYS[name], {}, 0

    def insert(self, item: int, priority: float) -> None:
        if item not in self.items:
            self.items[item] = [priority, self.inserts]
            self.inserts += 1

    def update(self, item: int, priority: float) -> None:
        if item in self.items:
            self.items[item][0] = priority

    def remove(self, item: int) -> None:
        self.items.pop(item, None)

    def order(self) -> list[int]:
        return sorted(self.items, key=lambda i: (*self.key(*self.items[i]), self.items[i][1]))


def _both(name: str, capacity: int, items_priorities):
    selector, model = registered_selector(name, capacity), Model(name)
    for item, priority in items_priorities:
        selector.insert(item, priority)
        model.insert(item, priority)
    return selector, model


@ORDERED
def test_a_batch_is_the_first_items_in_order_each_once(name):
    selector, model = _both(name, 16, [(5, 2.0), (2, 7.0), (9, 1.0), (4, 7.0), (11, 3.0)])
    assert drawn_items(selector, 3) == model.order()[:3]
    assert drawn_items(selector, 5) == model.order()


@ORDERED
def test_a_batch_larger_than_the_drawable_items_repeats_them_in_order(name):
    selector, model = _both(name, 8, [(1, 1.0), (6, 2.0), (3, 3.0)])
    assert drawn_items(selector, 7) == (model.order() * 3)[:7]


@ORDERED
def test_drawing_removes_nothing_so_the_next_batch_is_the_same(name):
    selector, _ = _both(name, 8, [(1, 1.0), (6, 2.0), (3, 3.0)])
    assert drawn_items(selector, 2) == drawn_items(selector, 2)


@ORDERED
def test_removing_the_first_item_makes_the_next_one_first(name):
    selector, model = _both(name, 8, [(0, 4.0), (1, 2.0), (2, 9.0), (3, 1.0)])
    first = model.order()[0]
    selector.remove(first)
    model.remove(first)
    assert drawn_items(selector, 3) == model.order()


@ORDERED
def test_the_order_survives_a_recompute(name):
    selector, model = _both(
        name, 32, [(i, float(p)) for i, p in zip(range(0, 32, 3), [5, 1, 5, 2, 8, 1, 3, 5, 2, 7, 4], strict=True)]
    )
    selector.recompute()
    assert drawn_items(selector, 11) == model.order()


@ORDERED
def test_any_mix_of_inserts_updates_and_removals_keeps_the_order_of_the_model(name):
    rng = np.random.default_rng(3)
    selector, model = registered_selector(name, 48), Model(name)
    for step in range(3_000):
        item, priority, op = int(rng.integers(48)), float(rng.integers(4)), rng.random()
        if op < 0.45:
            selector.insert(item, priority)
            model.insert(item, priority)
        elif op < 0.7:
            selector.update(item, priority)
            model.update(item, priority)
        else:
            selector.remove(item)
            model.remove(item)
        if step % 50 == 0 and model.items:
            assert drawn_items(selector, len(model.items)) == model.order()


@ORDERED
def test_a_buffer_samples_its_rows_in_the_selectors_order(name):
    by_priority = selectors.entry(name).by_priority
    buffer = (PrioritizedReplayBuffer if by_priority else ReplayBuffer)(8, ENV, selector=name)
    model = Model(name)
    priorities = [3.0, 1.0, 4.0, 1.0, 5.0]
    for slot, p in enumerate(priorities):
        buffer.add(id=slot, **({"priorities": p} if by_priority else {}))
        model.insert(slot, p)
    batch = buffer.sample(4)
    assert batch["indexes"].tolist() == batch["id"].tolist() == model.order()[:4]


@ORDERED
def test_a_saved_buffer_loads_into_one_that_draws_in_the_same_order(name, tmp_path):
    # Ties of priority are drawn in the order of insertion, which the file keeps.
    by_priority = selectors.entry(name).by_priority
    cls = PrioritizedReplayBuffer if by_priority else ReplayBuffer
    buffer = cls(8, ENV, selector=name)
    for i, p in enumerate([2.0, 1.0, 2.0, 3.0, 1.0, 2.0, 1.0, 3.0, 2.0, 1.0, 3.0]):  # wraps the ring
        buffer.add(id=i, **({"priorities": p} if by_priority else {}))
    if by_priority:
        batch = buffer.sample(2)
        buffer.update_priorities(batch["indexes"], np.array([1.0, 2.0]))
    buffer.save_transitions(tmp_path / "ordered.npz", priorities=by_priority)
    loaded = cls(8, ENV, selector=name)
    loaded.load_transitions(tmp_path / "ordered.npz")
    assert loaded.sample(8)["id"].tolist() == buffer.sample(8)["id"].tolist()


@ORDERED
def test_verify_names_a_heap_whose_entries_and_places_disagree(name):
    buffer = _buffer_of(name)
    damaged = buffer.inspection().writable(f"selector:{name}")
    damaged[2], damaged[3] = damaged[3].copy(), damaged[2].copy()  # the heap's first two entries swapped
    with pytest.raises(CorruptBufferError, match="heap: its entries and the items' places disagree"):
        buffer.verify()


@ORDERED
def test_verify_names_a_heap_out_of_order(name):
    buffer = _buffer_of(name)
    damaged = buffer.inspection().writable(f"selector:{name}")
    capacity = buffer.get_buffer_size()
    keys = damaged[2 + 3 * capacity : 2 + 4 * capacity].view(np.float64)
    keys[damaged[2]] = np.inf  # the first item's key now orders it last
    with pytest.raises(CorruptBufferError, match="entries come before their parent"):
        buffer.verify()


def _buffer_of(name: str):
    """A buffer of selector ``name`` holding 8 items of distinct priorities."""
    if selectors.entry(name).by_priority:
        buffer = PrioritizedReplayBuffer(16, ENV, selector=name)
        buffer.add(id=np.arange(8), priorities=np.arange(8) + 1.0)
    else:
        buffer = ReplayBuffer(16, ENV, selector=name)
        buffer.add(id=np.arange(8))
    return buffer


STEP_ENV = {"obs": {"shape": (2,)}, "id": {"dtype": np.int64}, "next_obs": {"shape": (2,)}, "done": {}}
ENDINGS = {
    # How an episode of 4 steps ends: several rows complete in one call.
    "done step": ({}, lambda table: None),
    "on_episode_end with nstep": ({"nstep": {"size": 2, "gamma": 0.9}}, lambda table: table.on_episode_end()),
}


def _episode_of_steps(name: str, ending: str, tmp_path=None) -> ReplayBuffer:
    """A next_of table of ``name`` given one 4-step episode (equal priorities: a heap draws in
    order of insertion), saved and loaded back when ``tmp_path`` is given."""
    options, end = ENDINGS[ending]
    cls = PrioritizedReplayBuffer if selectors.entry(name).by_priority else ReplayBuffer
    table = cls(32, STEP_ENV, selector=name, next_of="obs", **options)
    for t in range(4):
        done = float(t == 3 and not options)
        table.add(obs=[t, t], id=t, next_obs=[t + 1, t + 1], done=done)
    end(table)
    if tmp_path is None:
        return table
    table.save_transitions(tmp_path / "steps.npz")
    loaded = cls(32, STEP_ENV, selector=name, next_of="obs", **options)
    loaded.load_transitions(tmp_path / "steps.npz")
    return loaded


@ORDERED
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_rows_one_call_completes_enter_the_selector_in_the_order_of_their_steps(name, ending):
    table = _episode_of_steps(name, ending)
    expected = [3, 2, 1, 0] if name == "lifo" else [0, 1, 2, 3]
    assert table.sample(4)["id"].tolist() == expected


@ORDERED
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_rows_one_call_completes_keep_the_order_of_their_steps_through_a_file(name, ending, tmp_path):
    table = _episode_of_steps(name, ending, tmp_path)
    expected = [3, 2, 1, 0] if name == "lifo" else [0, 1, 2, 3]
    assert table.sample(4)["id"].tolist() == expected
