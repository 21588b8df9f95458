"""A buffer object dropped without close() lets go of its memory as its last reference goes:
no reference cycle leaves it to the cyclic garbage collector (docs/architecture.md, "Segment
lifecycle").  Every test runs with the collector off, as a busy loop sees it between collections."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import EACH_START_METHOD

from mpreplay import (
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    MPSequenceReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
)

STACK = 3
TRANSITIONS = {"obs": {"shape": (2, STACK)}, "next_obs": {"shape": (2, STACK)}, "rew": {}, "done": {}}
STEPS = {"obs": {"shape": (2,)}, "done": {}}
NSTEP = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}

TRANSITION_CLASSES = [ReplayBuffer, PrioritizedReplayBuffer, MPReplayBuffer, MPPrioritizedReplayBuffer]
SEQUENCE_CLASSES = [
    SequenceReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    MPSequenceReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
]
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "nstep": {"nstep": NSTEP},
    "next_of": {"next_of": "obs", "lanes": 2},
    "stack_compress": {"stack_compress": "obs", "next_of": "obs", "lanes": 2},
}

# (class, its env_dict, options): every class, and the transition classes with each option; a
# compressed buffer has a lane for its own writer and one for a handle's.
KINDS = [
    pytest.param(cls, TRANSITIONS, options, id=f"{cls.__name__}-{name}")
    for cls in TRANSITION_CLASSES
    for name, options in OPTIONS.items()
] + [pytest.param(cls, STEPS, {"length": 2, "lanes": 2}, id=cls.__name__) for cls in SEQUENCE_CLASSES]
SHARED_KINDS = [kind for kind in KINDS if kind.values[0].__name__.startswith("MP")]
# The kinds that keep state between an episode's steps: their episode writers are handles of their own.
WRITER_KINDS = [kind for kind in KINDS if kind.values[2] != {}]


@pytest.fixture(autouse=True)
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the test: only reference counting frees what it drops."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()  # what a failed test left in a cycle


def _steps(env: dict[str, dict[str, Any]], n: int) -> dict[str, np.ndarray]:
    return {name: np.zeros((n,) + spec.get("shape", ()), np.float32) for name, spec in env.items()}


def _use(buffer: Any, env: dict[str, dict[str, Any]]) -> None:
    """What a handle does before it is dropped: write, end an episode, sample."""
    buffer.add(**_steps(env, 4))
    buffer.on_episode_end()
    buffer.sample(2)


def _held(path: str) -> tuple[list[int], list[str]]:
    """The file descriptors and mappings of this process that name ``path`` (a file or a segment)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(path):
                fds.append(int(fd))
        except FileNotFoundError:  # the descriptor listdir itself had open
            pass
    with open("/proc/self/maps") as maps:
        return fds, [line for line in maps if path in line]


def _segment(buffer: Any) -> str:
    return f"/dev/shm/{buffer.name}"


@pytest.mark.parametrize(("cls", "env", "options"), KINDS)
def test_a_buffer_dropped_without_close_is_freed_at_once(cls, env, options):
    buffer = cls(64, env, **options)
    _use(buffer, env)
    ref = weakref.ref(buffer)
    del buffer
    assert ref() is None, "a reference cycle keeps the dropped buffer"


@pytest.mark.parametrize(("cls", "env", "options"), SHARED_KINDS)
def test_a_creating_buffer_dropped_without_close_unlinks_and_unmaps_its_segment_at_once(cls, env, options):
    buffer = cls(64, env, **options)
    _use(buffer, env)
    segment = _segment(buffer)
    del buffer
    assert not os.path.exists(segment)
    assert _held(segment) == ([], [])


@pytest.mark.parametrize(("cls", "env", "options"), SHARED_KINDS)
def test_an_attached_handle_dropped_without_close_is_freed_at_once_and_holds_no_fd_or_mapping(cls, env, options):
    with cls(64, env, **options) as buffer:
        _use(buffer, env)
        stored = buffer.get_stored_size()
        segment = _segment(buffer)
        before = _held(segment)
        handle = pickle.loads(pickle.dumps(buffer))
        _use(handle, env)
        ref = weakref.ref(handle)
        del handle
        assert ref() is None, "a reference cycle keeps the dropped handle"
        assert _held(segment) == before
        assert buffer.get_stored_size() == 2 * stored  # the segment is still there, with the handle's rows


@pytest.mark.parametrize(("cls", "env", "options"), WRITER_KINDS)
def test_an_episode_writer_dropped_without_close_is_freed_at_once(cls, env, options):
    with cls(64, env, **options) as buffer:
        writer = buffer.episode_writer()
        _use(writer, env)
        ref = weakref.ref(writer)
        del writer
        assert ref() is None, "a reference cycle keeps the dropped writer"


@pytest.mark.parametrize("cls", [ReplayBuffer, MPReplayBuffer])
def test_a_compressed_writer_dropped_without_close_gives_its_lane_back_at_once(cls):
    last_step = {**_steps(TRANSITIONS, 1), "done": np.ones(1, np.float32)}  # its row is complete at once
    with cls(64, TRANSITIONS, next_of="obs") as buffer:  # one lane
        writer = buffer.episode_writer()
        writer.add(**last_step)
        del writer
        buffer.add(**last_step)  # raises ValueError while the dropped writer holds the lane
        assert buffer.get_stored_size() == 2


def test_a_file_mapped_buffer_dropped_without_close_unmaps_its_files_at_once(tmp_path):
    buffer = ReplayBuffer(64, TRANSITIONS, mmap_prefix=tmp_path / "buffer")
    _use(buffer, TRANSITIONS)
    del buffer
    assert _held(str(tmp_path)) == ([], [])


# -- a process that attaches in a loop ------------------------------------------


def _attach_and_drop(blob: bytes, segment: str, times: int, queue: Any) -> None:
    gc.disable()
    before = _held(segment)
    for _ in range(times):
        handle = pickle.loads(blob)
        handle.sample(4, beta=0.4)
        del handle
    queue.put((before, _held(segment)))


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_child_that_attaches_and_drops_handles_in_a_loop_holds_no_more_fds_or_mappings(method):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(64, TRANSITIONS) as buffer:
        buffer.add(**_steps(TRANSITIONS, 8))
        queue = ctx.Queue()
        child = ctx.Process(target=_attach_and_drop, args=(pickle.dumps(buffer), _segment(buffer), 20, queue))
        child.start()
        before, after = queue.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
        assert after == before
