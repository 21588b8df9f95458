"""The lock of a shared buffer when several threads of one process use the same buffer object
(a prefetching sampler and a training thread that updates priorities): a call gives back only a
hold its own thread took."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mpreplay import MinSize, MPPrioritizedReplayBuffer

_CAPACITY = 1 << 16
_UPDATES = 20_000_000  # an update this large holds the lock for about half a second


@pytest.mark.timeout(120, method="thread")
def test_a_sample_that_times_out_in_the_rate_limiter_leaves_another_threads_hold_alone():
    # The sampler waits in the limiter (too few rows stored) while the updater takes the lock for a
    # huge update; the sampler's wait then times out while taking the lock back.  The lock stays the
    # updater's until its update ends, and is free after it.
    with MPPrioritizedReplayBuffer(
        _CAPACITY, {"x": {"dtype": np.float32}}, rate_limiter=MinSize(_CAPACITY), seed=0
    ) as buffer:
        buffer.add(x=np.zeros(_CAPACITY - 1, np.float32))
        indexes = np.resize(np.arange(_CAPACITY - 1), _UPDATES)
        priorities = np.linspace(0.1, 2.0, _UPDATES)
        sampler_started, updating, sampled = threading.Event(), threading.Event(), threading.Event()
        raised: list[BaseException] = []

        def sample() -> None:
            sampler_started.set()
            try:
                buffer.sample(32, timeout=0.15)
            except BaseException as error:  # the test asserts which one
                raised.append(error)
            sampled.set()

        def update() -> None:
            updating.set()
            buffer.update_priorities(indexes, priorities)

        sampler = threading.Thread(target=sample)
        sampler.start()
        sampler_started.wait()
        time.sleep(0.05)  # the sampler is asleep in the limiter, the lock free
        updater = threading.Thread(target=update)
        updater.start()
        updating.wait()
        assert sampled.wait(10)
        with pytest.raises(TimeoutError):
            buffer.add(x=np.float32(1.0), timeout=0)
        assert updater.is_alive(), "the update ended before the probe: make it larger"
        sampler.join()
        updater.join()
        assert [type(error) for error in raised] == [TimeoutError]
        buffer.add(x=np.float32(1.0), timeout=0)
