"""PrioritizedSelector: items drawn in proportion to (priority + eps) ** alpha over a sum tree."""
import numpy as np
import pytest

from mpreplay._ext.prioritized import PrioritizedSelector
from mpreplay._ext.sumtree import PriorityTree, tree_buffer_size


def _selector(capacity: int, alpha: float = 1.0, eps: float = 0.0) -> PrioritizedSelector:
    tree = PriorityTree(np.zeros(tree_buffer_size(capacity)), capacity)
    return PrioritizedSelector(tree, alpha, eps)


def test_an_item_weighs_its_priority_plus_eps_to_the_alpha():
    selector = _selector(4, alpha=0.5, eps=0.25)
    selector.insert(2, 8.75)
    assert selector.item_weight(2) == pytest.approx(3.0)
    assert selector.total_weight == pytest.approx(3.0)


def test_draw_frequencies_follow_the_weights(assert_frequencies):
    selector = _selector(8)
    priorities = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 5.0, 0.0])
    for item in np.flatnonzero(priorities):
        selector.insert(item, priorities[item])
    counts = np.bincount(selector.sample_items(80_000, np.random.default_rng(0)), minlength=8)
    assert_frequencies(counts, priorities)


def test_alpha_zero_draws_uniformly():
    selector = _selector(4, alpha=0.0)
    selector.insert(0, 1.0)
    selector.insert(3, 1000.0)
    assert selector.item_weight(0) == selector.item_weight(3) == 1.0


def test_a_removed_item_is_never_drawn():
    selector = _selector(4)
    selector.insert(0, 1.0)
    selector.insert(1, 1.0)
    selector.remove(0)
    assert set(selector.sample_items(1_000, np.random.default_rng(1)).tolist()) == {1}
    assert selector.smallest_weight == 1.0


def test_stratified_draws_take_one_item_from_each_stratum():
    selector = _selector(4)
    for item in range(4):
        selector.insert(item, 1.0)
    assert sorted(selector.sample_items(4, np.random.default_rng(2), stratified=True).tolist()) == [0, 1, 2, 3]


def test_the_largest_priority_accepted_keeps_every_sum_finite():
    selector = _selector(1024, alpha=1.0)
    for item in range(1024):
        selector.insert(item, selector.max_priority)
    assert np.isfinite(selector.total_weight)
