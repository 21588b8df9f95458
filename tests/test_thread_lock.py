"""The lock of a local buffer: the threads of its process (a prefetching sampler, the
training thread's updates and adds) take turns at the tree, as processes do at a shared one."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest

from mpreplay import PrioritizedReplayBuffer

# A draw this large holds the lock for a long while (the descent runs without the GIL).
_CAPACITY, _BATCH = 1 << 16, 3_000_000


def _filled(**options) -> PrioritizedReplayBuffer:
    buffer = PrioritizedReplayBuffer(_CAPACITY, {"x": {"dtype": np.float32}, "done": {}}, seed=0, **options)
    buffer.add(
        x=np.arange(_CAPACITY, dtype=np.float32), done=np.zeros(_CAPACITY), priorities=np.linspace(0.1, 2.0, _CAPACITY)
    )
    return buffer


def _sampling_in_background(sampler: PrioritizedReplayBuffer) -> tuple[threading.Thread, threading.Event]:
    """A started thread that samples a huge batch from ``sampler``, and the event it sets when done."""
    done = threading.Event()

    def sample() -> None:
        try:
            sampler.sample(_BATCH)
        finally:
            done.set()

    thread = threading.Thread(target=sample)
    thread.start()
    return thread, done


def _refused_while_sampling(sampler: PrioritizedReplayBuffer, writer: PrioritizedReplayBuffer) -> int:
    """Try ``writer.add(timeout=0)`` again and again while another thread samples a huge batch
    from ``sampler``; how many tries were refused for the lock."""
    refused = 0
    thread, done = _sampling_in_background(sampler)
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


def _add_within_a_second(buffer: PrioritizedReplayBuffer, result) -> None:
    try:
        buffer.add(x=np.float32(-1.0), done=0.0, timeout=1.0)
        result.put("added")
    except BaseException as error:  # reported to the parent, which asserts on it
        result.put(repr(error))


@pytest.mark.timeout(120, method="thread")
def test_a_forked_child_takes_a_fresh_lock_though_a_parent_thread_held_it_at_the_fork():
    buffer = _filled()
    context = mp.get_context("fork")
    result = context.Queue()
    thread, done = _sampling_in_background(buffer)
    with pytest.raises(TimeoutError):  # the sampling thread holds the lock ...
        while not done.is_set():
            buffer.add(x=np.float32(-1.0), done=0.0, timeout=0)
    child = context.Process(target=_add_within_a_second, args=(buffer, result))
    child.start()  # ... and still does at the fork: the draw takes far longer than this
    held_at_fork = not done.is_set()
    outcome = result.get(timeout=60)
    child.join(60)
    thread.join()
    assert held_at_fork
    assert outcome == "added"
