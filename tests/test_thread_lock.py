"""The lock of a local buffer: the threads of its process (a prefetching sampler, the
training thread's updates and adds) take turns at the tree, as processes do at a shared one."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from mpreplay import PrioritizedReplayBuffer

# A draw this large holds the lock for a long while (the descent runs without the GIL).
_CAPACITY, _BATCH = 1 << 16, 3_000_000


def _filled(**options) -> PrioritizedReplayBuffer:
    buffer = PrioritizedReplayBuffer(_CAPACITY, {"x": {"dtype": np.float32}, "done": {}}, seed=0, **options)
    buffer.add(x=np.arange(_CAPACITY, dtype=np.float32), done=np.zeros(_CAPACITY),
               priorities=np.linspace(0.1, 2.0, _CAPACITY))
    return buffer


def _refused_while_sampling(sampler: PrioritizedReplayBuffer, writer: PrioritizedReplayBuffer) -> int:
    """Try ``writer.add(timeout=0)`` again and again while another thread samples a huge batch
    from ``sampler``; how many tries were refused for the lock."""
    done, refused = threading.Event(), 0

    def sample() -> None:
        try:
            sampler.sample(_BATCH)
        finally:
            done.set()

    thread = threading.Thread(target=sample)
    thread.start()
    while not done.is_set():
        try:
            writer.add(x=np.float32(-1.0), done=0.0, timeout=0)
        except TimeoutError as error:
            assert "held by another thread of this process" in str(error)
            refused += 1
    thread.join()
    return refused


@pytest.mark.timeout(120, method="thread")
def test_an_add_waits_while_another_thread_of_the_process_draws_from_the_tree():
    buffer = _filled()
    assert _refused_while_sampling(buffer, buffer) > 0


@pytest.mark.timeout(120, method="thread")
def test_the_handles_of_a_local_buffer_share_its_lock():
    buffer = _filled(nstep={"size": 1})  # an n-step buffer's writer is a handle of its own
    writer = buffer.episode_writer()
    assert writer is not buffer
    assert _refused_while_sampling(buffer, writer) > 0
