"""PrioritizedSelector: items drawn in proportion to (priority + eps) ** alpha over a sum tree.

What every selector does is in test_selector_contract.py; this is what is prioritized's own.
"""

import numpy as np
import pytest

from mpreplay import PrioritizedReplayBuffer
from mpreplay._ext.prioritized import PrioritizedSelector, state_size, weight_lanes


def _selector(capacity: int, alpha: float = 1.0, eps: float = 0.0) -> PrioritizedSelector:
    return PrioritizedSelector(np.zeros(state_size(capacity)), capacity, alpha=alpha, eps=eps)


@pytest.fixture(params=[4, 2], ids=["4-lanes", "2-lanes"])
def lanes(request):
    """Weights computed 4 at a time (AVX2) or 2 (other x86-64) for the test."""
    before = weight_lanes(request.param)
    try:
        if weight_lanes() != request.param:
            pytest.skip(f"this CPU or build does not compute {request.param} weights a call")
        yield
    finally:
        weight_lanes(before)


def test_an_item_weighs_its_priority_plus_eps_to_the_alpha():
    selector = _selector(4, alpha=0.5, eps=0.25)
    selector.insert(2, 8.75)
    assert selector.item_weight(2) == pytest.approx(3.0)
    assert selector.total_weight == pytest.approx(3.0)


@pytest.mark.parametrize("alpha, eps", [(0.6, 1e-4), (0.4, 0.0), (2.0, 0.5), (7.0, 0.0)])
def test_weights_are_p_plus_eps_to_the_alpha_to_within_rounding(alpha, eps, lanes):
    priorities = np.concatenate([[0.0], np.geomspace(1e-6, 1e6, 999)])
    selector = _selector(len(priorities), alpha, eps)
    for item, p in enumerate(priorities):
        selector.insert(item, p)
    weights = np.array([selector.item_weight(item) for item in range(len(priorities))])
    exact = (priorities + eps) ** alpha
    positive = priorities + eps > 0
    bound = (1.0 + np.abs(alpha * np.log(priorities[positive] + eps))) * 1e-15 * exact[positive]
    assert np.all(np.abs(weights[positive] - exact[positive]) <= bound)
    assert np.all(weights[~positive] == 0.0)


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_alpha_one_weighs_p_plus_eps_exactly(eps):
    priorities = np.geomspace(1e-6, 1e6, 101)
    selector = _selector(len(priorities), alpha=1.0, eps=eps)
    for item, p in enumerate(priorities):
        selector.insert(item, p)
    assert [selector.item_weight(item) for item in range(len(priorities))] == list(priorities + eps)


def test_a_priority_weighs_the_same_set_alone_or_in_a_batch(lanes):
    # add() sets each row's priority alone; update_priorities() weighs its rows as a batch.
    size = 33  # an odd batch: pairs of values and a lone last one
    priorities = np.geomspace(0.5, 2.0, size)  # every row is drawn often
    env = {"x": {}}
    alone = PrioritizedReplayBuffer(size, env, alpha=0.6, eps=1e-4, seed=0)
    for item, p in enumerate(priorities):
        alone.add(x=float(item), priorities=[p])
    batch = PrioritizedReplayBuffer(size, env, alpha=0.6, eps=1e-4, seed=0)
    batch.add(x=np.arange(size, dtype=float), priorities=np.ones(size))
    batch.update_priorities(np.arange(size), priorities)

    def leaves(buffer: PrioritizedReplayBuffer) -> dict[int, float]:
        drawn = buffer.sample_leaves(50 * size)
        return dict(zip(drawn["indexes"].tolist(), drawn["leaf"].tolist(), strict=True))

    alone_leaves, batch_leaves = leaves(alone), leaves(batch)
    assert set(alone_leaves) == set(batch_leaves) == set(range(size))
    assert alone_leaves == batch_leaves


def test_a_lone_priority_weighs_the_same_whatever_lone_one_came_before(lanes):
    # One lone weight is remembered: the same priority again reuses it, another one does not.
    priorities = [2.0, 3.0, 3.0, 2.0, 0.0, 2.0, 5.0]
    selector = _selector(len(priorities), alpha=0.6, eps=1e-4)
    for item, p in enumerate(priorities):
        selector.insert(item, p)
    fresh = _selector(1, alpha=0.6, eps=1e-4)
    for item, p in enumerate(priorities):
        fresh.remove(0)
        fresh.insert(0, p)
        assert selector.item_weight(item) == fresh.item_weight(0)
        fresh.remove(0)
        fresh.insert(0, 7.0)  # what the next insert of `fresh` follows is not what `selector`'s did


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


def test_the_smallest_weight_follows_removals():
    selector = _selector(4)
    selector.insert(0, 0.5)
    selector.insert(1, 1.0)
    selector.remove(0)
    assert selector.smallest_weight == 1.0


def test_an_update_reweighs_a_drawable_item():
    selector = _selector(4, alpha=0.5, eps=0.0)
    selector.insert(1, 1.0)
    selector.update(1, 9.0)
    assert selector.item_weight(1) == pytest.approx(3.0, rel=1e-15)
    assert selector.item_priority(1) == 9.0


def test_the_largest_priority_accepted_keeps_every_sum_finite():
    selector = _selector(1024, alpha=1.0)
    for item in range(1024):
        selector.insert(item, selector.max_priority)
    assert np.isfinite(selector.total_weight)
