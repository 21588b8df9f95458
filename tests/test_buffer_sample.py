"""Sampling a local buffer: whole stored rows, drawn in proportion to their weights, with exact
importance weights; the batches it hands out (reused once dropped, never while held, filling the
caller's own arrays); reading given slots."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from helpers import EACH_BUFFER_CLASS, NUMBERED_FIELDS, assert_numbered, numbered_transitions, wrapped_buffer

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer
from mpreplay._ext.schema import field_array

ENV = NUMBERED_FIELDS


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


@EACH_BUFFER_CLASS
def test_sample_fills_the_arrays_given_in_out(cls):
    buffer = wrapped_buffer(cls)
    first = buffer.sample(4)
    again = buffer.sample(4, out=first)
    for name in ENV:
        assert again[name] is first[name]
    np.testing.assert_array_equal(again["obs"], buffer.inspection().arrays[field_array("obs")][again["indexes"]])


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


# Frame stacks: a batch of 32 is 0.9 MB, far above what a handle once kept (64 KiB).
STACKS = {"obs": {"shape": (84, 84, 4), "dtype": np.uint8}, "act": {"dtype": np.int64}}


def stacked_buffer(cls):
    """A buffer of 64 frame stacks, stack ``i`` filled with ``i`` and ``act = i``."""
    buffer = cls(64, STACKS, seed=0)
    numbers = np.arange(64)
    buffer.add(obs=np.broadcast_to(numbers[:, None, None, None], (64, 84, 84, 4)).astype(np.uint8), act=numbers)
    return buffer


def assert_stacks_match_act(batch):
    np.testing.assert_array_equal(batch["obs"], np.broadcast_to(batch["act"][:, None, None, None], batch["obs"].shape))


@EACH_BUFFER_CLASS
def test_a_large_dropped_batch_is_filled_again_by_the_next_sample(cls):
    buffer = stacked_buffer(cls)
    dropped = buffer.sample(32)
    obs = weakref.ref(dropped["obs"])  # no reference: the batch is dropped all the same
    del dropped
    batch = buffer.sample(32)
    assert batch["obs"] is obs()
    assert_stacks_match_act(batch)


@EACH_BUFFER_CLASS
def test_a_handle_keeps_at_most_two_dropped_batches(cls):
    buffer = stacked_buffer(cls)
    batches = [buffer.sample(32) for _ in range(5)]
    kept = [weakref.ref(batch["obs"]) for batch in batches]
    del batches
    assert sum(ref() is not None for ref in kept) == 2


@EACH_BUFFER_CLASS
def test_a_large_batch_held_while_the_next_is_drawn_is_never_refilled(cls):
    buffer = stacked_buffer(cls)
    held = buffer.sample(32)
    for _ in range(8):  # a training loop: it holds the batch it trains on while it draws the next
        kept = {name: array.copy() for name, array in held.items()}
        batch = buffer.sample(32)
        for name in kept:
            np.testing.assert_array_equal(held[name], kept[name])
        assert_stacks_match_act(batch)
        held = batch


HOLDERS = {
    "a slice": lambda obs: obs[1:],
    "np.asarray": np.asarray,
    "a view": lambda obs: obs.view(),
    "a memoryview": memoryview,
}


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("hold", HOLDERS.values(), ids=HOLDERS.keys())
def test_what_still_refers_to_a_dropped_large_batch_keeps_its_rows(cls, hold):
    buffer = stacked_buffer(cls)
    batch = buffer.sample(32)
    held, kept = hold(batch["obs"]), batch["obs"].copy()
    del batch
    for _ in range(8):
        assert_stacks_match_act(buffer.sample(32))
    np.testing.assert_array_equal(np.asarray(held), np.asarray(hold(kept)))


def test_a_tensor_over_a_dropped_large_batch_keeps_its_rows():
    torch = pytest.importorskip("torch", reason="torch.from_numpy: pip install torch")
    buffer = stacked_buffer(ReplayBuffer)
    batch = buffer.sample(32)
    tensor, kept = torch.from_numpy(batch["obs"]), batch["obs"].copy()
    del batch
    for _ in range(8):
        assert_stacks_match_act(buffer.sample(32))
    np.testing.assert_array_equal(tensor.numpy(), kept)


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
