"""UniformSelector: every drawable item equally likely, O(1) draws, state in a caller-owned array.

What every selector does is in test_selector_contract.py; this is what is uniform's own.
"""

import numpy as np

from mpreplay._ext.uniform import UniformSelector, state_size


def _selector(capacity: int, items=()) -> UniformSelector:
    selector = UniformSelector(np.zeros(state_size(capacity), np.int64), capacity)
    for item in items:
        selector.insert(item)
    return selector


def test_every_drawable_item_weighs_one():
    selector = _selector(8, [0, 5])
    assert [selector.item_weight(i) for i in range(8)] == [1.0, 0, 0, 0, 0, 1.0, 0, 0]
    assert selector.total_weight == 2.0
    assert selector.smallest_weight == 1.0


def test_draw_frequencies_are_uniform_over_the_drawable_items(assert_frequencies):
    items = [0, 3, 4, 7, 9, 12]
    selector = _selector(16, items)
    counts = np.bincount(selector.sample_items(60_000, np.random.default_rng(3)), minlength=16)
    assert_frequencies(counts, np.isin(np.arange(16), items))


def test_recompute_repairs_a_removal_interrupted_after_its_first_store():
    state = np.zeros(state_size(8), np.int64)
    selector = UniformSelector(state, 8)
    for item in (1, 2, 6):
        selector.insert(item)
    state[1 + 8 + 2] = -1  # item 2's position cleared; the holder died before the rest
    selector.recompute()
    assert selector.total_weight == 2.0
    assert set(selector.sample_items(1_000, np.random.default_rng(6)).tolist()) == {1, 6}
