"""Rate limiters: MinSize, SampleToInsertRatio, blocking, timeouts and shutdown."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import resource
import signal
import threading
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, rows_of

from mpreplay import (
    BufferClosed,
    MinSize,
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    RateLimiter,
    ReplayBuffer,
    SampleToInsertRatio,
)
from mpreplay._ext.schema import RESERVED, SAMPLES

ENV = {"obs": {"shape": (2,)}, "id": {"dtype": np.int64}}


def _row(i: int) -> dict:
    return {"obs": np.full(2, i, np.float32), "id": i}


# -- child-process bodies ---------------------------------------------------------


def _add_later(buffer, delay: float, count: int) -> None:
    time.sleep(delay)
    buffer.add(**rows_of(ENV, range(count)))


def _add_until_stopped(buffer, rank: int, stop) -> None:
    i = rank * 10**9
    while not stop.is_set():
        try:
            buffer.add(**_row(i), timeout=0.05)
        except TimeoutError:
            continue
        except BufferClosed:
            return
        i += 1


def _sample_blocking(buffer, queue, ready) -> None:
    ready.set()
    try:
        buffer.sample(1)
        queue.put("sampled")
    except BufferClosed as exc:
        queue.put(f"closed: {exc}")


def _add_forever(buffer) -> None:
    i = 0
    while True:
        buffer.add(**_row(i))
        i += 1


# -- construction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "limiter, message",
    [
        pytest.param(lambda: MinSize(101), "exceeds the buffer's capacity", id="min-size-above-capacity"),
        pytest.param(
            lambda: SampleToInsertRatio(4.0, 10, 3.0),
            "could each wait for the other forever",
            id="window-narrower-than-one-insert",
        ),
        pytest.param(
            lambda: SampleToInsertRatio(1.0, 200, 100.0),
            "exceeds the buffer's capacity",
            id="ratio-min-size-above-capacity",
        ),
    ],
)
def test_a_limiter_that_could_deadlock_is_rejected_at_construction(limiter, message):
    with pytest.raises(ValueError, match=message):
        PrioritizedReplayBuffer(100, ENV, rate_limiter=limiter())


@pytest.mark.parametrize(
    "make, name",
    [
        pytest.param(lambda: MinSize(0), "min_size_to_sample", id="min-size-zero"),
        pytest.param(lambda: SampleToInsertRatio(0.0, 1, 5.0), "samples_per_insert", id="ratio-zero"),
        pytest.param(lambda: SampleToInsertRatio(math.nan, 1, 5.0), "samples_per_insert", id="ratio-nan"),
        pytest.param(lambda: SampleToInsertRatio(1.0, 1, -1.0), "error_buffer", id="negative-error-buffer"),
        pytest.param(lambda: RateLimiter(1.0, 1, 5.0, 1.0), "min_diff", id="min-diff-above-max-diff"),
        pytest.param(lambda: RateLimiter(-0.5, 1, 0.0, 5.0), "samples_per_insert", id="negative-ratio"),
        pytest.param(lambda: RateLimiter(1.0, 1, math.nan, 5.0), "min_diff", id="min-diff-nan"),
        pytest.param(lambda: RateLimiter(1.0, 1, 0.0, math.nan), "max_diff", id="max-diff-nan"),
        pytest.param(lambda: SampleToInsertRatio(1.0, 0, 5.0), "min_size_to_sample", id="ratio-min-size-zero"),
        pytest.param(lambda: SampleToInsertRatio(1.0, 1, (math.nan, 5.0)), "error_buffer", id="window-nan"),
    ],
)
def test_bad_limiter_settings_name_the_setting(make, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        make()


# SampleToInsertRatio(spi, min_size, e) has the window [spi * min_size - e, spi * min_size + e]: 2 * e wide.
@pytest.mark.parametrize(
    "limiter",
    [
        pytest.param(SampleToInsertRatio(1, 1, 1.0), id="window-exactly-twice-one-insert"),
        pytest.param(SampleToInsertRatio(2.0, 1, 2.0), id="window-exactly-twice-samples-per-insert"),
        pytest.param(SampleToInsertRatio(1.0, 8, 5.0), id="min-size-exactly-the-capacity"),
        pytest.param(MinSize(8), id="min-size-limiter-exactly-the-capacity"),
    ],
)
def test_a_limiter_exactly_at_its_limits_is_accepted(limiter):
    with ReplayBuffer(8, ENV, rate_limiter=limiter) as buffer:
        buffer.add(**rows_of(ENV, range(limiter.min_size_to_sample)), timeout=0)
        assert buffer.sample(1, timeout=0)["id"].shape == (1,)


@pytest.mark.parametrize(
    "limiter, message",
    [
        pytest.param(SampleToInsertRatio(1, 1, 0.99), "could each wait for the other forever", id="window-just-below"),
        pytest.param(
            SampleToInsertRatio(2.0, 1, 1.99), "could each wait for the other forever", id="window-just-below-2-spi"
        ),
        pytest.param(SampleToInsertRatio(1.0, 9, 5.0), "exceeds the buffer's capacity", id="min-size-one-past"),
        pytest.param(MinSize(9), "exceeds the buffer's capacity", id="min-size-limiter-one-past"),
    ],
)
def test_a_limiter_just_past_its_limits_is_refused(limiter, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(8, ENV, rate_limiter=limiter)


@pytest.mark.parametrize(
    "make, window",
    [
        pytest.param(lambda: RateLimiter(0.0, 1, 5.0, 5.0), (5.0, 5.0), id="no-samples-and-one-point-window"),
        pytest.param(lambda: SampleToInsertRatio(1.0, 1, 0.0), (1.0, 1.0), id="no-error-buffer"),
        pytest.param(lambda: SampleToInsertRatio(1.0, 1, math.inf), (-math.inf, math.inf), id="infinite-error-buffer"),
        pytest.param(
            lambda: SampleToInsertRatio(1.0, 1, (-math.inf, math.inf)), (-math.inf, math.inf), id="infinite-window"
        ),
    ],
)
def test_a_limiters_settings_at_their_bounds_make_a_limiter(make, window):
    # Whether a buffer can keep it (a window of at least two inserts' worth) is the buffer's check.
    limiter = make()
    assert (limiter.min_diff, limiter.max_diff) == window


def test_a_rate_limiter_must_be_a_rate_limiter():
    with pytest.raises(TypeError, match="rate_limiter"):
        ReplayBuffer(10, ENV, rate_limiter=5)


# -- local buffers -------------------------------------------------------------------


def test_min_size_holds_samples_back_until_enough_is_stored():
    buffer = ReplayBuffer(100, ENV, rate_limiter=MinSize(5))
    buffer.add(**rows_of(ENV, range(4)))
    with pytest.raises(TimeoutError, match="no other process"):
        buffer.sample(1)
    buffer.add(**_row(4))
    assert len(buffer.sample(3)["id"]) == 3


def test_sample_to_insert_ratio_holds_inserts_back_until_enough_is_sampled():
    buffer = PrioritizedReplayBuffer(100, ENV, rate_limiter=SampleToInsertRatio(1.0, 10, 5.0))
    buffer.add(**rows_of(ENV, range(10)))  # below min size, inserts always go
    buffer.add(**rows_of(ENV, range(10, 15)))  # cursor 15 - 0 reaches max_diff 10 + 5
    with pytest.raises(TimeoutError, match="holds inserts back"):
        buffer.add(**_row(15), timeout=0)
    buffer.sample(1)
    buffer.add(**_row(15), timeout=0)


def test_sample_to_insert_ratio_holds_samples_back_until_more_is_inserted():
    buffer = PrioritizedReplayBuffer(100, ENV, rate_limiter=SampleToInsertRatio(1.0, 10, 5.0))
    buffer.add(**rows_of(ENV, range(10)))
    buffer.sample(5)  # cursor 10 - 5 = min_diff 5
    with pytest.raises(TimeoutError, match="holds samples back"):
        buffer.sample(1, timeout=0)
    buffer.add(**_row(10))
    buffer.sample(1, timeout=0)


def test_a_batch_wider_than_the_limiters_window_is_rejected():
    buffer = PrioritizedReplayBuffer(100, ENV, rate_limiter=SampleToInsertRatio(1.0, 10, 5.0))
    buffer.add(**rows_of(ENV, range(10)))
    with pytest.raises(ValueError, match="batch_size"):
        buffer.sample(11)
    with pytest.raises(ValueError, match="add fewer"):
        buffer.add(**rows_of(ENV, range(10, 21)))


def test_a_bad_timeout_is_rejected():
    buffer = ReplayBuffer(10, ENV, rate_limiter=MinSize(1))
    with pytest.raises(ValueError, match="timeout"):
        buffer.sample(1, timeout=-1)


# -- shared buffers -------------------------------------------------------------------


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_blocked_sample_wakes_when_another_process_inserts(method):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(100, ENV, rate_limiter=MinSize(8)) as buffer:
        writer = ctx.Process(target=_add_later, args=(buffer, 0.5, 8))
        writer.start()
        batch = buffer.sample(4, timeout=30)
        assert len(batch["id"]) == 4
        writer.join(10)


@pytest.mark.timeout(60)
def test_stats_count_the_calls_blocked_now():
    with MPReplayBuffer(100, ENV, rate_limiter=MinSize(8)) as buffer:
        sampler = threading.Thread(target=lambda: buffer.sample(2, timeout=30))
        sampler.start()
        while buffer.stats()["blocked_calls"] == 0:  # until the sample sleeps in the limiter
            time.sleep(0.01)
        assert buffer.stats()["blocked_calls"] == 1
        buffer.add(obs=np.zeros((8, 2)), id=np.arange(8))
        sampler.join(30)
        assert buffer.stats()["blocked_calls"] == 0


@pytest.mark.timeout(30)
def test_a_blocked_sample_times_out_with_a_clear_error():
    with MPReplayBuffer(100, ENV, rate_limiter=MinSize(8)) as buffer, pytest.raises(TimeoutError, match="timed out"):
        buffer.sample(1, timeout=0.2)


@pytest.mark.timeout(30)
def test_a_blocked_caller_does_not_spin_a_core():
    with MPReplayBuffer(100, ENV, rate_limiter=MinSize(8)) as buffer:
        before = resource.getrusage(resource.RUSAGE_SELF)
        with pytest.raises(TimeoutError):
            buffer.sample(1, timeout=1.0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 0.2, f"waiting 1 s used {cpu:.3f} s of CPU"


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_closing_the_buffer_wakes_a_blocked_process_with_buffer_closed(method):
    ctx = mp.get_context(method)
    buffer = MPReplayBuffer(100, ENV, rate_limiter=MinSize(8))
    queue, ready = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_sample_blocking, args=(buffer, queue, ready))
    child.start()
    assert ready.wait(30)
    time.sleep(0.3)  # let it block (if it has not yet, it sees the closed buffer at once)
    buffer.close()
    assert queue.get(timeout=30).startswith("closed")
    child.join(10)
    assert child.exitcode == 0


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_the_ratio_stays_within_the_error_buffer_with_two_writers(method):
    ctx = mp.get_context(method)
    spi, min_size, error = 2.0, 100, 40.0
    with MPPrioritizedReplayBuffer(1000, ENV, rate_limiter=SampleToInsertRatio(spi, min_size, error)) as buffer:
        stop = ctx.Event()
        writers = [ctx.Process(target=_add_until_stopped, args=(buffer, r, stop)) for r in range(2)]
        for w in writers:
            w.start()
        header = buffer.inspection().arrays["header"]
        offset = spi * min_size
        sampled = 0
        while sampled < 10_000:
            batch = buffer.sample(8, timeout=30)
            sampled += 8
            cursor = header[RESERVED] * spi - header[SAMPLES]
            # After a sample the cursor is >= min_diff; inserts may have raised it up to max_diff.
            assert offset - error <= cursor <= offset + error, cursor
            buffer.update_priorities(batch["indexes"], np.ones(8))
        stop.set()
        for w in writers:
            w.join(10)
            assert w.exitcode == 0
        inserts = header[RESERVED]
        assert abs(inserts * spi - header[SAMPLES] - offset) <= error + 2 * spi


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_learner_waiting_on_a_writer_that_dies_is_not_deadlocked(method):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(1000, ENV, rate_limiter=SampleToInsertRatio(1.0, 10, 20.0)) as buffer:
        writer = ctx.Process(target=_add_forever, args=(buffer,))
        writer.start()
        for _ in range(20):
            buffer.sample(4, timeout=30)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(10)
        with pytest.raises(TimeoutError):
            while True:  # drains what the dead writer left, then must time out, not hang
                buffer.sample(4, timeout=0.5)
        buffer.add(**rows_of(ENV, range(10)))  # another writer takes over: the learner goes on
        buffer.sample(4, timeout=5)
