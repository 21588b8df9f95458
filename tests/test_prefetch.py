"""Batches drawn ahead on a background thread: ``buffer.batches(...)``."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, rows_of

from mpreplay import MinSize, MPPrioritizedReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from mpreplay.errors import BufferClosed

ENV = {"obs": {"shape": (3,), "dtype": np.float32}, "act": {"dtype": np.int64}}
pytestmark = pytest.mark.timeout(60, method="thread")


def filled(cls=PrioritizedReplayBuffer, n: int = 64, **options):
    buffer = cls(n, ENV, **options)
    ids = np.arange(n)
    kwargs = {"priorities": ids + 1.0} if issubclass(cls, PrioritizedReplayBuffer) else {}
    buffer.add(obs=np.repeat(ids[:, None], 3, axis=1).astype(np.float32), act=ids, **kwargs)
    return buffer


def prefetch_threads() -> int:
    return sum(t.name == "mpreplay-prefetch" for t in threading.enumerate())


def test_prefetched_batches_are_the_batches_sample_would_draw():
    reference, buffer = filled(seed=7), filled(seed=7)
    with buffer.batches(16, beta=0.5) as batches:
        for _, batch in zip(range(10), batches, strict=False):
            expected = reference.sample(16, beta=0.5)
            assert batch.keys() == expected.keys()
            for name in expected:
                np.testing.assert_array_equal(batch[name], expected[name])


def test_a_uniform_buffer_prefetches_fields_and_indexes():
    with filled(ReplayBuffer).batches(8) as batches:
        batch = next(batches)
    assert set(batch) == {"obs", "act", "indexes"}
    assert batch["obs"].shape == (8, 3)


def test_batches_reuse_prefetch_plus_one_sets_of_arrays():
    with filled().batches(8, prefetch=2) as batches:
        addresses = {batch["obs"].__array_interface__["data"][0] for _, batch in zip(range(30), batches, strict=False)}
    assert len(addresses) <= 3


def wait_until(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "the condition did not come true in time"
        time.sleep(0.001)


def test_ready_counts_the_batches_drawn_ahead_up_to_prefetch_plus_one():
    with filled().batches(8, prefetch=2) as batches:
        wait_until(lambda: batches.ready == 3)
        time.sleep(0.05)
        assert batches.ready == 3


def test_a_batch_handed_out_leaves_the_ready_count():
    with filled().batches(8, prefetch=2) as batches:
        wait_until(lambda: batches.ready == 3)
        next(batches)
        time.sleep(0.05)  # the held batch's arrays are not free: nothing more is drawn
        assert batches.ready == 2


def test_a_batch_is_not_refilled_while_the_caller_holds_it():
    with filled().batches(8, prefetch=2) as batches:
        batch = next(batches)
        kept = {name: a.copy() for name, a in batch.items()}
        time.sleep(0.2)  # the thread draws the batches ahead meanwhile
        for name in kept:
            np.testing.assert_array_equal(batch[name], kept[name])


def test_priorities_updated_from_the_training_thread_while_prefetching_are_applied():
    buffer = filled()
    with buffer.batches(8) as batches:
        for _, batch in zip(range(50), batches, strict=False):
            buffer.update_priorities(batch["indexes"], np.full(8, 1000.0))
    assert buffer.get_max_priority() == 1000.0


def test_every_row_of_every_batch_is_a_stored_transition():
    with filled().batches(32, prefetch=3) as batches:
        for _, batch in zip(range(50), batches, strict=False):
            np.testing.assert_array_equal(batch["obs"], np.repeat(batch["act"][:, None], 3, axis=1))
            np.testing.assert_array_equal(batch["act"], batch["indexes"])


def test_a_rate_limiter_that_holds_samples_back_past_the_timeout_raises_timeout_error():
    buffer = PrioritizedReplayBuffer(64, ENV, rate_limiter=MinSize(10))
    with buffer.batches(8, timeout=0.2) as batches, pytest.raises(TimeoutError, match=r"timeout=0\.2"):
        next(batches)


def test_close_stops_a_thread_that_waits_for_the_rate_limiter_without_limit():
    before = prefetch_threads()
    batches = PrioritizedReplayBuffer(64, ENV, rate_limiter=MinSize(10)).batches(8)
    assert prefetch_threads() == before + 1
    batches.close()
    assert prefetch_threads() == before


def test_iteration_stops_once_closed():
    batches = filled().batches(8)
    next(batches)
    batches.close()
    with pytest.raises(StopIteration):
        next(batches)


def test_closing_the_buffer_ends_its_batches_with_buffer_closed():
    buffer = filled(MPPrioritizedReplayBuffer)
    batches = buffer.batches(8, prefetch=2)
    next(batches)
    buffer.close()
    with pytest.raises(BufferClosed):
        for _ in range(10):  # the batches drawn before close() come first
            next(batches)
    batches.close()


def test_as_torch_hands_out_tensors_of_the_sampled_values():
    torch = pytest.importorskip("torch", reason="as_torch needs torch (pip install '.[torch]')")
    reference, buffer = filled(seed=3), filled(seed=3)
    with buffer.batches(8, as_torch=True) as batches:
        batch = next(batches)
    expected = reference.sample(8)
    for name in expected:
        assert isinstance(batch[name], torch.Tensor)
        np.testing.assert_array_equal(batch[name].numpy(), expected[name])


@pytest.mark.parametrize(
    "option, value, error",
    [
        ("prefetch", 0, ValueError),
        ("prefetch", 1.5, ValueError),
        ("timeout", -1.0, ValueError),
        ("as_torch", "yes", TypeError),
        ("batch_size", 0, ValueError),
        ("beta", -0.1, ValueError),
    ],
)
def test_a_bad_option_is_refused_by_name_and_starts_no_thread(option, value, error):
    buffer = filled()
    before = prefetch_threads()
    options = {"batch_size": 8, option: value}
    with pytest.raises(error, match=option):
        buffer.batches(**options)
    assert prefetch_threads() == before


def _write(buffer, start: int, count: int) -> None:
    for i in range(start, start + count, 8):
        ids = np.arange(i, i + 8)
        buffer.add(**rows_of(ENV, ids), priorities=np.ones(8))


@EACH_START_METHOD
def test_prefetched_rows_are_whole_while_another_process_writes(method):
    buffer = filled(MPPrioritizedReplayBuffer, n=64)
    writer = mp.get_context(method).Process(target=_write, args=(buffer, 64, 40_000))
    writer.start()
    try:
        with buffer.batches(32, prefetch=2) as batches:
            for _, batch in zip(range(300), batches, strict=False):
                np.testing.assert_array_equal(batch["obs"], np.repeat(batch["act"][:, None], 3, axis=1))
    finally:
        writer.join(30)
    assert writer.exitcode == 0
    buffer.close()
