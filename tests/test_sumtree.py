"""Specification of the priority tree: sum, min and max trees over a caller-owned float64 array.

Every property is checked against a plain numpy reference over the leaves, at capacities that
leave partial wide nodes at every level (1, 2, 7, 8, 9, 63, 64, 65, 513, 4097, ...), never
against the storage layout (which only ``leaf_views`` and the module's header length expose).
"""

from __future__ import annotations

import math
from multiprocessing import shared_memory

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpreplay import PrioritizedReplayBuffer
from mpreplay._ext.prioritized import PrioritizedSelector
from mpreplay._ext.schema import TREE_ARRAY
from mpreplay._ext.sumtree import TREE_HEAD_LEN, PriorityTree, leaf_views, tree_buffer_size

DBL_MAX = np.finfo(np.float64).max
DBL_TINY = np.finfo(np.float64).tiny  # smallest normal
DENORMAL_MIN = np.nextafter(0.0, 1.0)


def _slots(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _f64(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


def _tree(capacity: int, leaves=None) -> tuple[PriorityTree, np.ndarray]:
    """A tree (and its storage) whose first ``len(leaves)`` slots hold ``leaves`` (raw = weight)."""
    buf = np.empty(tree_buffer_size(capacity), dtype=np.float64)
    tree = PriorityTree(buf, capacity)
    if leaves is not None:
        leaves = np.asarray(leaves, dtype=np.float64)
        tree.set(np.arange(len(leaves), dtype=np.int64), leaves, leaves)
    return tree, buf


def _search(tree: PriorityTree, prefixes) -> np.ndarray:
    prefixes = np.ascontiguousarray(prefixes, dtype=np.float64)
    out = np.empty(len(prefixes), dtype=np.int64)
    tree.search(prefixes, out)
    return out


def _leaves(tree: PriorityTree, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the leaves' weights and raw priorities, through the module's one reading of them."""
    values, raw = leaf_views(buf, tree.capacity)
    return values.copy(), raw.copy()


def _draw(buf: np.ndarray, capacity: int, k: int, rng: np.random.Generator, *, stratified: bool) -> np.ndarray:
    """``k`` slots drawn from the tree in ``buf`` as sampling does: through a selector over the same
    storage whose weights are the priorities themselves (alpha 1, eps 0), the uniforms taken from
    ``rng``."""
    return PrioritizedSelector(buf, capacity, False, 1.0, 0.0).sample_items(k, rng, stratified)


def _search_many(tree: PriorityTree, prefixes) -> np.ndarray:
    prefixes = np.ascontiguousarray(prefixes, dtype=np.float64)
    out = np.empty(len(prefixes), dtype=np.int64)
    tree.search_many(prefixes, out)
    return out


# Capacities around every boundary of 8-wide nodes: one node, a node and one slot, full and
# partial nodes at two, three and four levels.
CAPACITIES = [1, 2, 7, 8, 9, 63, 64, 65, 100, 511, 512, 513, 4095, 4096, 4097, 32769]


def _random_leaves(capacity: int, rng: np.random.Generator, zeros: float = 0.3) -> np.ndarray:
    """Small integer weights (every partial sum exact), a share of them zero."""
    values = rng.integers(1, 20, capacity).astype(np.float64)
    values[rng.random(capacity) < zeros] = 0.0
    return values


class _Reference:
    """The tree's contract in plain numpy: leaves, total, min, max and prefix search."""

    def __init__(self, capacity: int):
        self.values = np.zeros(capacity)
        self.raw = np.zeros(capacity)

    def set(self, slots, values, raw) -> None:
        for s, v, r in zip(slots, values, raw, strict=True):  # in order: the last duplicate wins
            self.values[s], self.raw[s] = v, r

    def total(self) -> float:
        return math.fsum(self.values)

    def min(self) -> float:
        positive = self.values[self.values > 0]
        return positive.min() if len(positive) else math.inf

    def max(self) -> float:
        sampleable = self.raw[self.values > 0]
        return sampleable.max() if len(sampleable) else -math.inf

    def search(self, prefixes) -> np.ndarray:
        # Exact when every partial sum is exact (small integer weights):
        # the slot whose range [cumsum[i-1], cumsum[i]) holds u; beyond
        # either end, the nearest sampleable slot.
        positive = np.flatnonzero(self.values > 0)
        found = np.searchsorted(np.cumsum(self.values), prefixes, side="right")
        return np.clip(found, positive[0], positive[-1])


# -- storage ------------------------------------------------------------------


@pytest.mark.parametrize("capacity", CAPACITIES + [10**6])
def test_storage_is_whole_cache_lines_and_far_below_the_binary_trees_48_bytes_a_slot(capacity):
    need = tree_buffer_size(capacity)
    assert need % 8 == 0  # whole 64-byte lines: nodes stay aligned when the storage is
    # Three trees of 8/7 entries a slot (plus a partial node a level) and a line of header.
    assert 8 * need <= 64 + 3 * 8 * (capacity * 8 / 7 + 8 * 8)
    if capacity >= 4096:
        assert 8 * need / capacity < 28


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_every_slot_of_storage_of_exactly_the_size_given_is_usable(capacity):
    buf = np.full(tree_buffer_size(capacity) + 8, 7.0)
    tree = PriorityTree(buf[:-8], capacity)
    tree.set(_slots(capacity - 1, 0), _f64(3.0, 1.0 if capacity > 1 else 3.0), _f64(5.0, 6.0))
    assert list(_search(tree, [tree.total() - 0.5])) == [capacity - 1]
    assert (buf[-8:] == 7.0).all()


@pytest.mark.parametrize("capacity", [0, -1])
def test_storage_size_rejects_capacity_below_one(capacity):
    with pytest.raises(ValueError, match="capacity"):
        tree_buffer_size(capacity)


def test_tree_rejects_storage_shorter_than_needed():
    with pytest.raises(ValueError, match="buf"):
        PriorityTree(np.zeros(tree_buffer_size(5) - 1), 5)


@pytest.mark.parametrize(
    "storage",
    [
        pytest.param(np.zeros(tree_buffer_size(4), dtype=np.float32), id="float32"),
        pytest.param(np.zeros(2 * tree_buffer_size(4))[::2], id="strided"),
    ],
)
def test_tree_rejects_storage_that_is_not_contiguous_float64(storage):
    with pytest.raises(ValueError):
        PriorityTree(storage, 4)


def test_new_tree_has_nothing_to_sample():
    tree, _ = _tree(5)
    assert (tree.total(), tree.min(), tree.max()) == (0.0, math.inf, -math.inf)
    with pytest.raises(ValueError, match="no sampleable slot"):
        _search(tree, [0.0])


def test_leaves_keep_full_float64_precision():
    value = 1.0 + 2.0**-50  # not representable in float32
    tree, buf = _tree(4, [value, value])
    values, raw = _leaves(tree, buf)
    assert values[0] == raw[0] == value
    assert tree.total() == 2 * value


def test_tree_lives_in_a_view_of_a_larger_array_and_writes_only_there():
    capacity, need = 5, tree_buffer_size(5)
    outer = np.full(need + 20, 7.0)
    tree = PriorityTree(outer[10 : 10 + need], capacity)
    tree.set(_slots(0, 4), _f64(1.0, 3.0), _f64(1.0, 3.0))
    assert tree.total() == 4.0
    assert (outer[:10] == 7.0).all() and (outer[10 + need :] == 7.0).all()


def test_tree_attached_without_reset_sees_the_state_already_in_its_storage():
    _, buf = _tree(6, [1.0, 0.0, 2.5])
    reader = PriorityTree(buf, 6, reset=False)
    assert (reader.total(), reader.min(), reader.max()) == (3.5, 1.0, 2.5)
    assert list(_search(reader, [0.5, 1.0, 3.4])) == [0, 2, 2]


def test_tree_in_shared_memory_is_seen_through_another_mapping_of_the_segment():
    capacity = 6
    nbytes = tree_buffer_size(capacity) * 8
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        other = shared_memory.SharedMemory(name=segment.name)
        try:
            writer = PriorityTree(np.ndarray(tree_buffer_size(capacity), np.float64, segment.buf), capacity)
            reader = PriorityTree(np.ndarray(tree_buffer_size(capacity), np.float64, other.buf), capacity, reset=False)
            writer.set(_slots(1, 5), _f64(2.0, 6.0), _f64(2.0, 6.0))
            assert (reader.total(), reader.min(), reader.max()) == (8.0, 2.0, 6.0)
            assert list(_search(reader, [1.0, 2.0])) == [1, 5]
            del writer, reader  # release the mappings' exports before closing them
        finally:
            other.close()
    finally:
        segment.close()
        segment.unlink()


# -- leaves and inner nodes ---------------------------------------------------------------


def test_root_total_is_the_sum_and_min_max_cover_sampleable_leaves():
    tree, _ = _tree(7, [3.0, 0.0, 0.5, 8.0, 0.0, 2.0])
    assert tree.total() == 13.5
    assert tree.min() == 0.5
    assert tree.max() == 8.0


def test_zero_weight_leaf_is_ignored_by_min_and_max_whatever_its_raw_priority():
    tree, buf = _tree(4, [2.0, 3.0])
    tree.set(_slots(1), _f64(0.0), _f64(100.0))
    assert (tree.min(), tree.max()) == (2.0, 2.0)
    assert _leaves(tree, buf)[1][1] == -math.inf


def test_max_tree_holds_raw_priorities_while_sum_and_min_hold_weights():
    tree, _ = _tree(4)
    tree.set(_slots(0, 1), _f64(0.5, 4.0), _f64(10.0, 3.0))
    assert (tree.total(), tree.min(), tree.max()) == (4.5, 0.5, 10.0)


def test_set_with_duplicate_slots_keeps_the_last_value():
    tree, buf = _tree(8, [1.0] * 8)
    tree.set(_slots(3, 5, 3, 3, 5), _f64(10.0, 20.0, 30.0, 40.0, 50.0), _f64(1.0, 2.0, 3.0, 4.0, 5.0))
    values, raw = _leaves(tree, buf)
    assert (values[3], raw[3], values[5], raw[5]) == (40.0, 4.0, 50.0, 5.0)
    assert tree.total() == 6.0 + 40.0 + 50.0
    assert tree.max() == 5.0


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 600), count=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_setting_many_slots_at_once_builds_the_tree_setting_them_one_by_one_builds(capacity, count, seed):
    rng = np.random.default_rng(seed)
    slots = rng.integers(0, capacity, count)  # repeats included: the last value wins either way
    values = np.where(rng.random(count) < 0.2, 0.0, rng.random(count) * 10)
    raw = rng.random(count)
    batched, batched_buf = _tree(capacity)
    batched.set(slots, values, raw)
    single, single_buf = _tree(capacity)
    for s, v, r in zip(slots, values, raw, strict=True):
        single.set(_slots(int(s)), _f64(v), _f64(r))
    assert batched_buf.tobytes() == single_buf.tobytes()


def test_set_rejects_arrays_of_different_lengths():
    tree, _ = _tree(4)
    with pytest.raises(ValueError, match="same length"):
        tree.set(_slots(0, 1), _f64(1.0), _f64(1.0, 2.0))


def test_a_zero_weight_makes_slots_unsampleable():
    tree, _ = _tree(4, [1.0, 2.0, 4.0, 8.0])
    tree.set(_slots(3, 0), _f64(0.0, 0.0), _f64(8.0, 1.0))
    assert (tree.total(), tree.min(), tree.max()) == (6.0, 2.0, 4.0)


def test_reset_empties_every_node():
    tree, buf = _tree(65, [1.0, 2.0, 3.0] + [0.0] * 60 + [4.0])
    empty = _tree(65)[1]
    tree.reset()
    assert buf.tobytes() == empty.tobytes()
    assert (tree.total(), tree.min(), tree.max(), tree.max_ever()) == (0.0, math.inf, -math.inf, -math.inf)


def _random_updates(tree: PriorityTree, rounds: int, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        slots = rng.integers(0, tree.capacity, batch)
        # Weights over many orders of magnitude, some zero: the worst case for drifting deltas.
        values = np.where(rng.random(batch) < 0.1, 0.0, 10.0 ** rng.uniform(-12, 12, batch))
        tree.set(slots, values, rng.random(batch))


# Batches of 1000 walk their paths in chunks of 64; batches of 3 and 32 (a learner's
# update) stop carrying a min or max up where it stopped changing, at every level.
@pytest.mark.parametrize(
    "capacity, batch, rounds", [(1000, 1000, 300), (4097, 1000, 300), (4097, 3, 20_000), (40_000, 32, 5000)]
)
def test_after_many_updates_every_entry_is_what_a_rebuild_from_the_leaves_makes(capacity, batch, rounds):
    # Parents are recomputed from their children, never adjusted by deltas: no drift.
    tree, buf = _tree(capacity)
    _random_updates(tree, rounds=rounds, batch=batch, seed=1)
    values, raw = _leaves(tree, buf)
    assert tree.total() == pytest.approx(math.fsum(values), rel=1e-12)
    fresh, fresh_buf = _tree(capacity)
    fresh.set(np.arange(capacity, dtype=np.int64), values, raw)
    # The header remembers leaves overwritten since (max_ever); all else is the leaves'.
    assert buf[TREE_HEAD_LEN:].tobytes() == fresh_buf[TREE_HEAD_LEN:].tobytes()
    updated = buf.copy()
    tree.rebuild()
    assert buf.tobytes() == updated.tobytes()
    assert (tree.min(), tree.max()) == (values[values > 0].min(), raw[values > 0].max())


@settings(max_examples=50, deadline=None)
@given(
    leaves=st.lists(st.floats(0.0, 1e6, allow_subnormal=True), min_size=1, max_size=40),
    garbage=st.lists(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e300]), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_rebuild_restores_everything_but_the_leaves_from_the_leaves(leaves, garbage, seed):
    # What a writer that died mid-update leaves behind: any entry but the leaf weights and
    # raw priorities (and the header) may be stale; rebuild() makes the tree whole again.
    tree, buf = _tree(len(leaves), leaves)
    pristine = buf.copy()
    weights, raw = leaf_views(buf, len(leaves))
    derived = np.ones(len(buf), dtype=bool)
    derived[:TREE_HEAD_LEN] = False
    for view in (weights, raw):
        start = (view.ctypes.data - buf.ctypes.data) // 8
        derived[start : start + len(view)] = False
    rng = np.random.default_rng(seed)
    where = np.flatnonzero(derived)
    count = min(len(garbage), len(where))
    hit = rng.choice(where, count, replace=False)
    buf[hit] = garbage[:count]
    tree.rebuild()
    assert buf.tobytes() == pristine.tobytes()
    assert tree.total() == pytest.approx(math.fsum(leaves))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_rebuild_restores_every_derived_entry_at_every_capacity(capacity):
    tree, buf = _tree(capacity, _random_leaves(capacity, np.random.default_rng(capacity)))
    pristine = buf.copy()
    weights, raw = (v.copy() for v in leaf_views(buf, capacity))
    buf[TREE_HEAD_LEN:] = math.nan
    leaf_views(buf, capacity)[0][:] = weights
    leaf_views(buf, capacity)[1][:] = raw
    tree.rebuild()
    assert buf.tobytes() == pristine.tobytes()


# -- search ---------------------------------------------------------------------


def test_search_finds_the_slot_whose_cumulative_range_holds_each_prefix():
    tree, _ = _tree(6, [1.0, 0.0, 2.0, 0.0, 0.0, 3.0])
    found = _search(tree, [0.0, 0.999, 1.0, 2.5, 2.999, 3.0, 5.999])
    assert list(found) == [0, 0, 2, 2, 2, 5, 5]


def test_search_rejects_an_output_shorter_than_the_prefixes():
    tree, _ = _tree(4, [1.0])
    with pytest.raises(ValueError, match="out"):
        tree.search(_f64(0.1, 0.2), np.empty(1, dtype=np.int64))


_ADVERSARIAL_LEAVES = {
    "total-near-float-max": [DBL_MAX / 4, 0.0, DBL_MAX / 4, DBL_MAX / 4, 0.0],
    "one-leaf-near-float-max": [0.0, 0.0, DBL_MAX / 2],
    "huge-beside-tiny": [1e300, DENORMAL_MIN, 0.0, 1e-300, 1e300, DBL_TINY, 0.0],
    "tiny-last": [1e300, 0.0, 0.0, 0.0, DENORMAL_MIN],
    "tiny-first": [DENORMAL_MIN, 1e300, 0.0],
    "only-denormals": [0.0, DENORMAL_MIN, 0.0, 3 * DENORMAL_MIN],
    "inexact-decimals": [0.1] * 10 + [0.0] * 3 + [0.7],
    "last-stored-slot-before-padding": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
}


def _awkward_prefixes(total: float) -> list[float]:
    # Rounding pushes real draws onto these: the total itself and its neighbours.
    return [
        0.0,
        -0.0,
        DENORMAL_MIN,
        total,
        np.nextafter(total, math.inf),
        np.nextafter(total, 0.0),
        total * (1 - 2**-52),
        total * (1 + 2**-52),
        2 * total,
        DBL_MAX,
        math.inf,
        -1.0,
        -math.inf,
        math.nan,
    ]


@pytest.mark.parametrize("leaves", list(_ADVERSARIAL_LEAVES.values()), ids=list(_ADVERSARIAL_LEAVES))
def test_search_never_lands_on_an_unsampleable_or_unstored_slot(leaves):
    capacity = len(leaves) + 1  # one stored-but-empty slot at the end, plus padding beyond capacity
    tree, _ = _tree(capacity, leaves)
    assert math.isfinite(tree.total())
    prefixes = _awkward_prefixes(tree.total()) + list(np.cumsum(leaves)) + list(tree.total() * np.linspace(0, 1, 257))
    found = _search(tree, prefixes)
    assert (found >= 0).all() and (found < len(leaves)).all()
    assert (np.asarray(leaves)[found] > 0).all()


def test_prefix_at_or_beyond_the_total_finds_the_last_sampleable_slot():
    tree, _ = _tree(7, [1.0, 2.0, 0.0, 4.0, 0.0])
    total = tree.total()
    assert list(_search(tree, [total, np.nextafter(total, math.inf), 100.0])) == [3, 3, 3]


def test_negative_prefix_finds_the_first_sampleable_slot():
    tree, _ = _tree(7, [0.0, 0.0, 2.0, 4.0])
    assert list(_search(tree, [-1.0, -0.0])) == [2, 2]


@settings(max_examples=200, deadline=None)
@given(
    leaves=st.lists(
        st.one_of(st.just(0.0), st.floats(0.0, DBL_MAX / 64, allow_subnormal=True)), min_size=1, max_size=40
    ).filter(lambda v: any(x > 0 for x in v)),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
)
def test_search_lands_on_a_sampleable_slot_for_any_leaves_and_prefixes_up_to_the_total(leaves, fractions):
    tree, _ = _tree(len(leaves), leaves)
    total = tree.total()
    prefixes = [f * total for f in fractions] + [np.nextafter(f * total, math.inf) for f in fractions]
    found = _search(tree, prefixes)
    assert (np.asarray(leaves)[found] > 0).all()


def test_a_stratified_draw_descends_from_each_stratum_of_the_total_mass():
    tree, buf = _tree(9, [1.0, 0.0, 3.0, 2.0, 0.0, 5.0, 1.0])
    r = np.random.default_rng(0).random(8)  # the uniforms the selector draws from the same generator
    drawn = _draw(buf, 9, 8, np.random.default_rng(0), stratified=True)
    np.testing.assert_array_equal(drawn, _search(tree, (np.arange(8) + r) * 12.0 / 8))


def test_an_unstratified_draw_descends_from_anywhere_in_the_total_mass():
    tree, buf = _tree(9, [1.0, 0.0, 3.0, 2.0, 0.0, 5.0, 1.0])
    r = np.random.default_rng(0).random(8)
    drawn = _draw(buf, 9, 8, np.random.default_rng(0), stratified=False)
    np.testing.assert_array_equal(drawn, _search(tree, r * 12.0))


def test_an_empty_tree_draws_nothing():
    _, buf = _tree(4)
    assert _draw(buf, 4, 3, np.random.default_rng(0), stratified=True).size == 0


# -- property test against the numpy reference ------------------------------------------

_CAPACITY = 13  # not a power of two: padding leaves exist


@st.composite
def _operation(draw):
    if draw(st.booleans()):
        k = draw(st.integers(1, 2 * _CAPACITY))  # up to twice the capacity: duplicate slots are common
        slots = draw(st.lists(st.integers(0, _CAPACITY - 1), min_size=k, max_size=k))
        # Small integer weights keep every partial sum exact, so the reference is exact too.
        values = draw(st.lists(st.integers(0, 50).map(float), min_size=k, max_size=k))
        raw = draw(st.lists(st.floats(-1e3, 1e3), min_size=k, max_size=k))
        return "set", np.array(slots, dtype=np.int64), _f64(*values), _f64(*raw)
    prefixes = draw(st.lists(st.floats(-10.0, 50.0 * _CAPACITY + 10.0), min_size=1, max_size=10))
    return "search", _f64(*prefixes)


@settings(max_examples=150, deadline=None)
@given(operations=st.lists(_operation(), min_size=1, max_size=25))
def test_random_set_and_search_sequences_agree_with_a_numpy_reference(operations):
    tree, buf = _tree(_CAPACITY)
    reference = _Reference(_CAPACITY)
    for name, *args in operations:
        if name == "set":
            tree.set(*args)
            reference.set(*args)
            assert tree.total() == reference.total()
            assert tree.min() == reference.min()
            assert tree.max() == reference.max()
        elif reference.total() > 0:
            np.testing.assert_array_equal(_search(tree, args[0]), reference.search(args[0]))
    values, raw = _leaves(tree, buf)
    np.testing.assert_array_equal(values, reference.values)
    np.testing.assert_array_equal(raw, np.where(reference.values > 0, reference.raw, -math.inf))


def test_max_ever_remembers_the_largest_priority_of_a_leaf_overwritten_since():
    tree, _ = _tree(4)
    tree.set(np.array([0, 1], dtype=np.int64), np.array([1.0, 1.0]), np.array([7.0, 2.0]))
    tree.set(np.array([0], dtype=np.int64), np.array([1.0]), np.array([3.0]))
    assert (tree.max(), tree.max_ever()) == (3.0, 7.0)
    tree.forget_max_ever()
    assert tree.max_ever() == -np.inf


def test_forget_max_ever_then_a_new_leaf_sets_it_again():
    tree, _ = _tree(9, [5.0])
    tree.forget_max_ever()
    tree.set(_slots(8), _f64(1.0), _f64(2.0))
    tree.set(_slots(7), _f64(0.0), _f64(50.0))  # unsampleable: not a priority "given"
    assert tree.max_ever() == 2.0


# -- every capacity against the numpy reference ------------------------------------------


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_sums_min_max_leaves_and_search_agree_with_the_reference(capacity):
    rng = np.random.default_rng(capacity)
    values = _random_leaves(capacity, rng)
    values[rng.integers(0, capacity)] = 3.0  # something sampleable
    raw = rng.uniform(-5, 5, capacity)
    tree, buf = _tree(capacity)
    tree.set(np.arange(capacity, dtype=np.int64), values, raw)
    reference = _Reference(capacity)
    reference.set(range(capacity), values, raw)
    assert (tree.total(), tree.min(), tree.max()) == (reference.total(), reference.min(), reference.max())
    total = tree.total()
    prefixes = np.concatenate(
        [np.cumsum(values), np.cumsum(values) - 0.5, rng.uniform(0, total, 500), [0.0, total, total + 1, -1.0]]
    )
    expected = reference.search(prefixes)
    np.testing.assert_array_equal(_search(tree, prefixes), expected)
    np.testing.assert_array_equal(_search_many(tree, prefixes), expected)
    weights, raws = leaf_views(buf, capacity)
    np.testing.assert_array_equal(weights, values)
    np.testing.assert_array_equal(raws, np.where(values > 0, raw, -math.inf))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_stratified_draws_land_on_each_slot_in_exact_proportion_to_its_weight(capacity):
    # Integer weights and one stratum per unit of mass: draw j covers [j, j + 1), which lies in
    # exactly one slot, so every slot is drawn exactly as often as its weight.
    rng = np.random.default_rng(capacity + 1)
    values = _random_leaves(capacity, rng, zeros=0.5)
    values[-1] = 2.0
    tree, buf = _tree(capacity, values)
    k = int(values.sum())
    assert tree.total() == k
    out = _draw(buf, capacity, k, rng, stratified=True)
    np.testing.assert_array_equal(np.bincount(out, minlength=capacity), values)


@pytest.mark.parametrize("capacity", [9, 65, 4097])
def test_unstratified_draws_land_in_proportion_to_the_weights(capacity):
    rng = np.random.default_rng(7)
    values = _random_leaves(capacity, rng)
    values[0] = 1.0
    _, buf = _tree(capacity, values)
    n = 200_000
    out = _draw(buf, capacity, n, rng, stratified=False)
    counts = np.bincount(out, minlength=capacity)
    expected = n * values / values.sum()
    assert (counts[values == 0] == 0).all()
    # Every count within 5 standard deviations of its expectation.
    assert (np.abs(counts - expected) <= 5 * np.sqrt(expected) + 1).all()


def _lonely_positions(capacity: int) -> list[int]:
    return sorted({0, 7, 8, 9, 63, 64, capacity // 2, capacity - 2, capacity - 1} & set(range(capacity)))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_a_lone_sampleable_slot_is_found_from_any_prefix(capacity):
    # Every other child on the way down has zero mass: none is ever entered.
    for slot in _lonely_positions(capacity):
        for weight in (DENORMAL_MIN, 1.0, 1e300):
            tree, _ = _tree(capacity)
            tree.set(_slots(slot), _f64(weight), _f64(1.0))
            prefixes = _awkward_prefixes(tree.total())
            assert set(_search(tree, prefixes)) == {slot}
            assert set(_search_many(tree, prefixes)) == {slot}


@pytest.mark.parametrize("capacity", [9, 65, 513, 4097])
def test_a_child_too_light_to_move_the_sum_is_never_drawn_but_its_zero_neighbours_are_never_entered(capacity):
    # Beside 1e16 a weight of 1 does not change the rounded prefix: that slot cannot be drawn.
    # Prefixes at and past the total must still stop on a sampleable slot, never on the
    # zeros after it.
    values = np.zeros(capacity)
    values[0], values[1] = 1e16, 1.0
    tree, _ = _tree(capacity, values)
    found = _search(tree, _awkward_prefixes(tree.total()))
    assert set(found) <= {0, 1}
    assert set(_search_many(tree, _awkward_prefixes(tree.total()))) == set(found)


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.sampled_from(CAPACITIES[:10]),
    positions=st.lists(st.integers(0, 10**6), min_size=1, max_size=12),
    weights=st.lists(st.floats(DENORMAL_MIN, DBL_MAX / 2**40, allow_subnormal=True), min_size=12, max_size=12),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
)
def test_draws_land_on_sampleable_slots_for_any_weights_at_any_capacity(capacity, positions, weights, fractions):
    slots = np.array([p % capacity for p in positions], dtype=np.int64)
    values = np.array(weights[: len(slots)])
    tree, buf = _tree(capacity)
    tree.set(slots, values, values)
    live, _ = _leaves(tree, buf)
    total = tree.total()
    prefixes = [f * total for f in fractions] + [np.nextafter(f * total, math.inf) for f in fractions]
    prefixes += _awkward_prefixes(total)
    assert (live[_search(tree, prefixes)] > 0).all()
    np.testing.assert_array_equal(_search_many(tree, prefixes), _search(tree, prefixes))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_fixing_a_run_of_slots_gives_the_tree_setting_them_gives(capacity):
    rng = np.random.default_rng(capacity + 2)
    base = _random_leaves(capacity, rng)
    for first, last in {
        (0, capacity - 1),
        (capacity // 3, capacity - 1),
        (capacity // 2, capacity // 2),
        (max(0, capacity - 9), capacity - 1),
        (0, min(8, capacity - 1)),
    }:
        run = np.arange(first, last + 1, dtype=np.int64)
        values = rng.integers(0, 9, len(run)).astype(np.float64)
        fixed, fixed_buf = _tree(capacity, base)
        fixed.write_leaves(run, values, values)
        fixed.fix_slots(first, last)
        reference, reference_buf = _tree(capacity, base)
        reference.set(run, values, values)
        assert fixed_buf.tobytes() == reference_buf.tobytes()


def test_leaves_written_without_a_fix_leave_the_inner_entries_stale():
    # The fix methods are what the tests above exercise: without them nothing moves.
    tree, _ = _tree(65, [1.0] * 65)
    tree.write_leaves(_slots(64), _f64(100.0), _f64(100.0))
    assert tree.total() == 65.0
    tree.fix_slots(64, 64)
    assert tree.total() == 164.0


def test_fix_slots_rejects_a_range_outside_the_capacity():
    tree, _ = _tree(9)
    for first, last in [(-1, 3), (0, 9), (5, 4)]:
        with pytest.raises(IndexError):
            tree.fix_slots(first, last)


def test_search_many_rejects_short_output_and_an_empty_tree():
    tree, _ = _tree(9)
    with pytest.raises(ValueError, match="no sampleable slot"):
        _search_many(tree, [0.0])
    tree.set(_slots(3), _f64(1.0), _f64(1.0))
    with pytest.raises(ValueError, match="out"):
        tree.search_many(_f64(0.1, 0.2), np.empty(1, dtype=np.int64))


@pytest.mark.parametrize("capacity", [65, 4097])
def test_a_tree_attached_without_reset_at_a_wide_capacity_sees_and_changes_the_same_state(capacity):
    writer, buf = _tree(capacity, _random_leaves(capacity, np.random.default_rng(3)))
    reader = PriorityTree(buf, capacity, reset=False)
    assert (reader.total(), reader.min(), reader.max()) == (writer.total(), writer.min(), writer.max())
    reader.set(_slots(capacity - 1), _f64(1000.0), _f64(1000.0))
    assert writer.max() == 1000.0 and writer.total() == reader.total()
    np.testing.assert_array_equal(_search(writer, [writer.total() - 1.0]), [capacity - 1])


# -- leaf views ---------------------------------------------------------------------


def test_leaf_views_show_weights_and_raw_priorities_as_they_change():
    tree, buf = _tree(65)
    weights, raw = leaf_views(buf, 65)
    assert weights.shape == raw.shape == (65,)
    assert (weights == 0).all() and (raw == -math.inf).all()
    tree.set(_slots(0, 64), _f64(2.0, 3.0), _f64(5.0, 6.0))
    assert (weights[0], weights[64], raw[0], raw[64]) == (2.0, 3.0, 5.0, 6.0)
    tree.set(_slots(0), _f64(0.0), _f64(5.0))
    assert (weights[0], raw[0]) == (0.0, -math.inf)


@pytest.mark.parametrize(
    "buf, capacity, match",
    [
        (np.zeros(tree_buffer_size(9) - 1), 9, "at least"),
        (np.zeros(tree_buffer_size(9), dtype=np.float32), 9, "float64"),
        (np.zeros((2, tree_buffer_size(9))), 9, "one-dimensional"),
        (np.zeros(100), 0, "capacity"),
    ],
)
def test_leaf_views_reject_storage_that_cannot_hold_the_tree(buf, capacity, match):
    with pytest.raises(ValueError, match=match):
        leaf_views(buf, capacity)


def test_a_heap_buffers_tree_starts_on_a_cache_line():
    for size in (9, 1000):
        buffer = PrioritizedReplayBuffer(size, {"obs": {}})
        assert buffer.inspection().arrays[TREE_ARRAY].ctypes.data % 64 == 0
