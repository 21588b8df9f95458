"""A write that raises TimeoutError changes nothing: the same call may simply be made again.

Every write path -- plain, n-step folding (``nstep=``), compressed observations (``next_of``,
``stack_compress``), sequences, ``episode_writer()``, ``VectorWriter`` -- is driven through a
rate limiter that holds inserts back a few rows ahead of the samples.  A local buffer's blocked
write raises at once; a shared buffer's when its timeout ends.  After a TimeoutError the buffer
is exactly as before the call; the call is made again once a sample made room, and in the end
the buffer holds exactly what a buffer without a limiter holds after the same calls.
"""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing as mp
import pickle
import threading

import numpy as np
import pytest
from helpers import EACH_START_METHOD, retry_after_timeouts

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer, SampleToInsertRatio, SequenceReplayBuffer
from mpreplay.vector_env import TransitionBatch, VectorWriter

STACK = 2
ENV = {
    "obs": {"shape": (3, STACK), "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {},
    "next_obs": {"shape": (3, STACK), "dtype": np.uint8},
    "done": {},
}
NSTEP = {"size": 3, "gamma": 0.9}
SIZE = 256
# Inserts wait once they are 6 rows ahead of the samples (room for the rows an n-step episode end
# stores while earlier ones wait for their next observation); samples never wait for inserts.
AHEAD = 6.0


def _limiter() -> SampleToInsertRatio:
    return SampleToInsertRatio(1.0, 1, (-1e9, AHEAD))


# -- steps of known episodes ------------------------------------------------------------


def _observation(episode: int, t: int) -> np.ndarray:
    """The stacked frames of step t: frame k is (episode, k, 7), the first frame repeated at the start."""
    return np.stack([np.array([episode, max(0, t - STACK + 1 + i), 7], np.uint8) for i in range(STACK)], axis=-1)


def _step(episode: int, t: int, done: bool) -> dict:
    return dict(
        obs=_observation(episode, t),
        act=100 * episode + t,
        rew=0.5 * t + episode,
        next_obs=_observation(episode, t + 1),
        done=float(done),
    )


# Episode lengths, and whether each ends with a done flag (else with on_episode_end()).
EPISODES = [(5, True), (1, False), (7, False), (3, True), (6, False), (2, True)]
FLAGGED = [(length, True) for length, _ in EPISODES]  # every episode ends with a done flag


def _calls(episodes: list[tuple[int, bool]] = EPISODES) -> list[tuple]:
    """The calls of an actor writing ``episodes``: ("add", step, priority) and ("end",)."""
    calls = []
    for episode, (length, done) in enumerate(episodes):
        for t in range(length):
            calls.append(("add", _step(episode, t, done and t == length - 1), 1.0 + episode + 0.125 * t))
        if not done:
            calls.append(("end",))
    return calls


def _make(call, writer, timeout) -> None:
    if call[0] == "end":
        writer.on_episode_end(timeout=timeout)
    elif isinstance(writer, PrioritizedReplayBuffer):
        writer.add(**call[1], priorities=call[2], timeout=timeout)
    else:
        writer.add(**call[1], timeout=timeout)


PATHS = {
    "plain": lambda **kw: ReplayBuffer(SIZE, ENV, **kw),
    "nstep": lambda **kw: ReplayBuffer(SIZE, ENV, nstep=NSTEP, **kw),
    "nstep-prioritized": lambda **kw: PrioritizedReplayBuffer(SIZE, ENV, nstep=NSTEP, **kw),
    "next_of": lambda **kw: ReplayBuffer(SIZE, ENV, next_of="obs", **kw),
    "stack_compress": lambda **kw: ReplayBuffer(SIZE, ENV, stack_compress="obs", **kw),
    "prioritized-next_of-stack_compress": lambda **kw: PrioritizedReplayBuffer(
        SIZE, ENV, next_of="obs", stack_compress="obs", **kw
    ),
    "nstep-next_of-stack_compress": lambda **kw: ReplayBuffer(
        SIZE, ENV, nstep=NSTEP, next_of="obs", stack_compress="obs", **kw
    ),
    "sequences": lambda **kw: SequenceReplayBuffer(SIZE, ENV, length=3, period=2, **kw),
    "sequences-next_of": lambda **kw: SequenceReplayBuffer(SIZE, ENV, length=3, period=2, next_of="obs", **kw),
}
# A buffer's episode_writer() is a writer of its own (its own n-step folder, its own lane).
WRITERS = {"buffer": lambda buffer: buffer, "episode_writer": lambda buffer: buffer.episode_writer()}


def _contents(buffer) -> dict:
    """What the buffer holds, through its public API: its rows (with their slots and, prioritized,
    their priorities), its next slot and its counters (except the lock's)."""
    rows = {name: value.tobytes() for name, value in buffer.get_all_transitions(indexes=True).items()}
    if isinstance(buffer, PrioritizedReplayBuffer):
        file = io.BytesIO()
        buffer.save_transitions(file, priorities=True)
        rows["priorities"] = np.load(io.BytesIO(file.getvalue()))["priorities"].tobytes()
    stats = {name: value for name, value in buffer.stats().items() if not name.startswith("lock_")}
    return {"rows": rows, "next": buffer.get_next_index(), "stats": stats}


def _stored(buffer) -> dict:
    """The stored transitions, and their priorities when the buffer has them."""
    got = _contents(buffer)["rows"]
    got.pop("indexes")
    return got


def _make_room(buffer) -> None:
    buffer.sample(2)


def _reference(path: str, calls: list[tuple]) -> dict:
    """What a buffer without a limiter stores after ``calls``."""
    with PATHS[path]() as buffer:
        for call in calls:
            _make(call, buffer, None)
        return _stored(buffer)


def _make_each(calls: list[tuple], writer, buffer) -> int:
    """Make each call through ``writer``, sampling and making it again while it times out;
    returns how many timed out."""
    make_room = functools.partial(_make_room, buffer)
    return sum(retry_after_timeouts(functools.partial(_make, call, writer, 0), make_room) for call in calls)


# -- one buffer, one writer ---------------------------------------------------------------


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("path", PATHS)
def test_a_write_that_times_out_leaves_every_bit_of_the_buffer_as_it_was(path, writer, memory_of):
    changed = []  # per timeout, the arrays of the buffer's memory it changed
    with PATHS[path](rate_limiter=_limiter()) as buffer:
        w = WRITERS[writer](buffer)
        for call in _calls():
            while True:
                before = memory_of(buffer)
                try:
                    _make(call, w, 0)
                    break
                except TimeoutError:
                    after = memory_of(buffer)
                    changed.append([name for name in before if before[name] != after[name]])
                    _make_room(buffer)
    assert changed and changed == [[]] * len(changed)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("path", PATHS)
def test_writes_made_again_after_timeouts_store_what_writes_that_never_waited_store(path, writer):
    with PATHS[path](rate_limiter=_limiter()) as buffer:
        _make_each(_calls(), WRITERS[writer](buffer), buffer)
        got = _stored(buffer)
    assert got == _reference(path, _calls())


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("path", ["nstep", "nstep-prioritized"])
def test_adds_made_again_after_timeouts_fold_each_step_into_the_rows_once(path, writer):
    with PATHS[path](rate_limiter=_limiter()) as buffer:
        timeouts = _make_each(_calls(FLAGGED), WRITERS[writer](buffer), buffer)
        got = _stored(buffer)
    assert timeouts > 0
    assert got == _reference(path, _calls(FLAGGED))


@pytest.mark.parametrize("path", ["next_of", "nstep-next_of-stack_compress", "sequences-next_of"])
def test_an_episode_end_that_times_out_leaves_every_bit_of_the_buffer_as_it_was(path, unchanged):
    # The end stores the episode's last next observation (and, folding, its pending rows).
    with PATHS[path](rate_limiter=_limiter()) as buffer:
        for t in range(SIZE):
            try:
                buffer.add(**_step(0, t, False), timeout=0)
            except TimeoutError:
                break
        with unchanged(buffer), pytest.raises(TimeoutError):
            buffer.on_episode_end(timeout=0)


def test_a_compressed_writers_first_write_that_times_out_leaves_its_lane_to_another_writer():
    # An ended one-step episode takes 2 slots (its row, its last next observation): refused.
    with (
        ReplayBuffer(
            SIZE, ENV, next_of="obs", lanes=1, rate_limiter=SampleToInsertRatio(1.0, 1, (-1e9, 1.0))
        ) as buffer,
        buffer.episode_writer() as late,
    ):
        with pytest.raises(TimeoutError):
            late.add(**_step(0, 0, True), timeout=0)
        assert buffer.add(**_step(1, 0, False), timeout=0) == 0  # the one lane, from its first slot


def _rows(k: int) -> dict:
    return {name: np.stack([np.asarray(_step(0, t, False)[name]) for t in range(k)]) for name in ENV}


def test_a_batch_longer_than_the_buffer_that_times_out_leaves_every_bit_of_the_buffer_as_it_was(unchanged):
    # Only its newest 8 rows would be kept: the limiter counts 8, and refuses them.
    with ReplayBuffer(8, ENV, rate_limiter=SampleToInsertRatio(1.0, 1, (-1e9, 10.0))) as buffer:
        buffer.add(**_rows(5))
        with unchanged(buffer), pytest.raises(TimeoutError):
            buffer.add(**_rows(12), timeout=0)


def test_a_batch_longer_than_the_buffer_that_the_limiter_could_never_let_through_leaves_the_buffer_as_it_was(unchanged):
    with ReplayBuffer(8, ENV, rate_limiter=SampleToInsertRatio(1.0, 1, (-2.0, 4.0))) as buffer:
        buffer.add(**_rows(3))
        with unchanged(buffer), pytest.raises(ValueError, match="error buffer"):
            buffer.add(**_rows(12), timeout=0)


# -- shared buffers: writers that wait, in other processes ------------------------------


def _write_with_retries(buffer, timeouts) -> None:
    """Make each call, again and again while it times out (a sampler in the parent makes room)."""
    timeouts.put(sum(retry_after_timeouts(functools.partial(_make, call, buffer, 0)) for call in _calls()))


def _sample_while(buffer, process) -> None:
    while process.is_alive():
        with contextlib.suppress(TimeoutError):
            buffer.sample(1, timeout=0.05)
        process.join(0.005)


@EACH_START_METHOD
@pytest.mark.parametrize("path", ["nstep", "nstep-next_of-stack_compress"])
@pytest.mark.timeout(120, method="thread")
def test_a_writer_process_whose_writes_time_out_and_are_made_again_stores_each_transition_once(method, path):
    kind = {
        "nstep": dict(nstep=NSTEP),
        "nstep-next_of-stack_compress": dict(nstep=NSTEP, next_of="obs", stack_compress="obs"),
    }[path]
    ctx = mp.get_context(method)
    with MPReplayBuffer(SIZE, ENV, rate_limiter=_limiter(), **kind) as buffer:
        timeouts = ctx.Queue()
        actor = ctx.Process(target=_write_with_retries, args=(buffer, timeouts))
        actor.start()
        _sample_while(buffer, actor)
        assert actor.exitcode == 0
        assert timeouts.get(timeout=30) > 0
        got = _stored(buffer)
    assert got == _reference(path, _calls())


# -- VectorWriter -----------------------------------------------------------------------------

NUM_ENVS = 3
VECTOR = {"next_of": dict(next_of="obs", lanes=NUM_ENVS), "nstep": dict(nstep=NSTEP)}


def _vector_batches() -> list[TransitionBatch]:
    """Steps of NUM_ENVS sub-environments, one row each per batch; sub-environment e plays episodes of
    2 + (e + 2 * i) % 4 steps, ended by termination (done) or truncation (done 0, in ``ended``)."""
    batches, t, episode = [], [0] * NUM_ENVS, [0] * NUM_ENVS
    for _ in range(14):
        steps, ended = [], []
        for e in range(NUM_ENVS):
            length = 2 + (e + 2 * episode[e]) % 4
            last = t[e] == length - 1
            terminal = last and (e + episode[e]) % 2 == 0
            steps.append(_step(10 * e + episode[e], t[e], terminal))
            t[e] += 1
            if last:
                ended.append(e)
                t[e], episode[e] = 0, episode[e] + 1
        rows = {name: np.stack([np.asarray(s[name]) for s in steps]) for name in steps[0]}
        batches.append(TransitionBatch(rows, np.arange(NUM_ENVS), np.array(ended, np.int64)))
    return batches


def _vector_reference(layout: str) -> dict:
    with ReplayBuffer(SIZE, ENV, **VECTOR[layout]) as buffer, VectorWriter(buffer, NUM_ENVS) as writer:
        for batch in _vector_batches():
            writer.add(batch)
        return _stored(buffer)


@pytest.mark.parametrize("layout", VECTOR)
def test_a_vector_batch_added_again_after_timeouts_is_stored_once(layout):
    # Episode ends store rows too (a folder's pending steps, an episode's last frame): the
    # limiter refuses some of them after the sub-environment's rows were stored.
    with (
        ReplayBuffer(SIZE, ENV, rate_limiter=_limiter(), **VECTOR[layout]) as buffer,
        VectorWriter(buffer, NUM_ENVS) as writer,
    ):
        make_room = functools.partial(_make_room, buffer)
        timeouts = sum(
            retry_after_timeouts(functools.partial(writer.add, batch, timeout=0), make_room)
            for batch in _vector_batches()
        )
        got = _stored(buffer)
    assert timeouts > 0
    assert got == _vector_reference(layout)


def _fill_until_refused(writer) -> None:
    """Sub-environment 0 adds steps of an episode that does not end until the limiter refuses one."""
    for t in range(SIZE):
        try:
            writer.add(
                TransitionBatch(
                    {k: np.asarray(v)[None] for k, v in _step(0, t, False).items()},
                    np.array([0]),
                    np.array([], np.int64),
                ),
                timeout=0.05,
            )
        except TimeoutError:
            return
    raise AssertionError("the limiter never refused a step")


@pytest.mark.parametrize("layout", VECTOR)
@pytest.mark.timeout(60, method="thread")
def test_a_vector_add_on_a_shared_buffer_bounds_the_episode_end_it_passes_on_by_its_timeout(layout):
    with (
        MPReplayBuffer(SIZE, ENV, rate_limiter=_limiter(), **VECTOR[layout]) as buffer,
        VectorWriter(buffer, NUM_ENVS) as writer,
    ):
        _fill_until_refused(writer)
        if layout == "next_of":
            buffer.sample(1)  # room for sub-environment 1's row, not for its episode's last frame
        one_step_episode = TransitionBatch(
            {k: np.asarray(v)[None] for k, v in _step(1, 0, False).items()}, np.array([1]), np.array([1])
        )
        outcome = []

        def add() -> None:
            try:
                writer.add(one_step_episode, timeout=0.2)
                outcome.append("stored")
            except TimeoutError:
                outcome.append("TimeoutError")

        caller = threading.Thread(target=add, daemon=True)
        caller.start()
        caller.join(30)  # generous: the point is that it returns at all
        unblock = pickle.loads(pickle.dumps(buffer))
        while caller.is_alive():  # a call that waits without limit: let it finish, then fail
            with contextlib.suppress(TimeoutError):
                unblock.sample(1, timeout=0.05)
            caller.join(0.05)
        unblock.close()
    assert outcome == ["TimeoutError"]


def _vector_actor(buffer, timeouts) -> None:
    with VectorWriter(buffer, NUM_ENVS) as writer:
        count = sum(
            retry_after_timeouts(functools.partial(writer.add, batch, timeout=0)) for batch in _vector_batches()
        )
    timeouts.put(count)


@EACH_START_METHOD
@pytest.mark.parametrize("layout", VECTOR)
@pytest.mark.timeout(120, method="thread")
def test_a_vector_actor_process_whose_adds_time_out_and_are_made_again_stores_each_transition_once(method, layout):
    ctx = mp.get_context(method)
    with MPReplayBuffer(SIZE, ENV, rate_limiter=_limiter(), **VECTOR[layout]) as buffer:
        timeouts = ctx.Queue()
        actor = ctx.Process(target=_vector_actor, args=(buffer, timeouts))
        actor.start()
        _sample_while(buffer, actor)
        assert actor.exitcode == 0
        assert timeouts.get(timeout=30) > 0
        got = _stored(buffer)
    assert got == _vector_reference(layout)
