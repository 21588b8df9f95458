"""Queue(size) and Stack(size) over every way a buffer stores its rows: plain fields, next_of,
stack_compress, both, each with and without n-step folding.  Every item whose add returned is
delivered exactly once, and every observation it carries is rebuilt exactly."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD

from mpreplay import MPReplayBuffer, Queue, ReplayBuffer, Stack

LIMITERS = pytest.mark.parametrize("limiter", [Queue, Stack])
COMPRESSION = {
    "plain": {},
    "next_of": {"next_of": "obs"},
    "stack_compress": {"stack_compress": "obs"},
    "both": {"next_of": "obs", "stack_compress": "obs"},
}
STORAGE = pytest.mark.parametrize("compression", sorted(COMPRESSION))
NSTEP = pytest.mark.parametrize("nstep", [None, 3], ids=["1-step", "3-step"])
STACK = 3
GAMMA = 0.5


def frame_stack(t: int, writer: int = 0) -> np.ndarray:
    """The stacked observation of step t (last axis: the stack, oldest first, step 0 repeated at
    the start): each frame names its step and its writer."""
    steps = [max(0, t - STACK + 1 + j) for j in range(STACK)]
    return np.stack([np.array([s, writer, 7], np.float32) for s in steps], axis=-1)


def make(cls, size: int, limiter, compression: str, nstep: int | None, lanes: int = 1):
    env = {"obs": {"shape": (3, STACK)}, "next_obs": {"shape": (3, STACK)}, "rew": {}, "done": {}}
    options = dict(COMPRESSION[compression])
    if compression != "plain":
        options["lanes"] = lanes
    if nstep:
        options["nstep"] = {"size": nstep, "gamma": GAMMA}
    return cls(size, env, rate_limiter=limiter(size), **options)


def step(t: int, writer: int = 0) -> dict[str, np.ndarray | float]:
    return {"obs": frame_stack(t, writer), "next_obs": frame_stack(t + 1, writer), "rew": 1.0, "done": 0.0}


class Learner:
    """Takes items and checks each against the step it names: the observations it carries, and
    with n-step folding the folded reward, discount and next observation of an episode of
    ``length`` steps (known once it ended)."""

    def __init__(self, buffer, nstep: int | None):
        self.buffer, self.nstep, self.delivered = buffer, nstep, []

    def take(self, k: int = 1, timeout: float | None = 0) -> None:
        batch = self.buffer.sample(k, timeout=timeout)
        for j in range(k):
            t, writer = int(batch["obs"][j][0, -1]), int(batch["obs"][j][1, -1])
            assert np.array_equal(batch["obs"][j], frame_stack(t, writer)), f"wrong obs for step {t}"
            self.delivered.append(
                (writer, t, {name: batch[name][j] for name in ("next_obs", "rew", "discount") if name in batch})
            )

    def make_room(self, write) -> None:
        """``write(timeout=0)`` once the items it waits for were taken: one at a time, as a
        compressed writer's next slots free up only once every item reading them was read."""
        while True:
            with contextlib.suppress(TimeoutError):
                write(timeout=0)
                return
            self.take()

    def drain(self) -> None:
        while self.buffer.get_stored_size():
            self.take()

    def check(self, written: dict[int, int]) -> None:
        """``written``: each writer's steps, all of one episode ended after its last."""
        got = sorted((w, t) for w, t, _ in self.delivered)
        assert got == [(w, t) for w in sorted(written) for t in range(written[w])], "lost or repeated items"
        for writer, t, row in self.delivered:
            m = 1 if self.nstep is None else min(self.nstep, written[writer] - t)
            assert np.array_equal(row["next_obs"], frame_stack(t + m, writer)), f"wrong next_obs for step {t}"
            if self.nstep is not None:
                assert row["rew"] == pytest.approx(sum(GAMMA**i for i in range(m)))
                assert row["discount"] == pytest.approx(GAMMA**m)


@LIMITERS
@STORAGE
@NSTEP
def test_a_learner_one_item_behind_a_full_queue_gets_every_item_once_and_exact(limiter, compression, nstep):
    # The writer fills the queue, then alternates with a learner that takes one item: a write
    # that finds no room times out (changing nothing) and is made again later.
    buffer = make(MPReplayBuffer, 32, limiter, compression, nstep)
    learner, t = Learner(buffer, nstep), 0
    for op in "a" * 40 + "ta" * 80:
        if op == "t":
            if buffer.get_stored_size():
                learner.take()
            continue
        with contextlib.suppress(TimeoutError):
            buffer.add(**step(t), timeout=0)
            t += 1
    learner.make_room(buffer.on_episode_end)
    learner.drain()
    learner.check({0: t})
    assert t > 32, "the writer should have gone on after the queue was full"
    assert buffer.verify()["complete"] == 0
    buffer.close()


@LIMITERS
@STORAGE
def test_a_local_queue_takes_a_write_once_room_is_made(limiter, compression):
    buffer = make(ReplayBuffer, 32, limiter, compression, None)
    learner, t = Learner(buffer, None), 0
    while True:
        try:
            buffer.add(**step(t), timeout=0)
        except TimeoutError:
            break
        t += 1
    learner.take()
    learner.make_room(lambda timeout: buffer.add(**step(t), timeout=timeout))
    learner.make_room(buffer.on_episode_end)
    learner.drain()
    learner.check({0: t + 1})


def _actor(buffer, writer: int, steps: int) -> None:
    for t in range(steps):
        buffer.add(**step(t, writer), timeout=60)
    buffer.on_episode_end(timeout=60)


@EACH_START_METHOD
@LIMITERS
@pytest.mark.parametrize("compression", ["plain", "both"])
@pytest.mark.timeout(120, method="thread")
def test_actor_processes_episodes_reach_the_learner_once_each_and_exact(method, limiter, compression):
    # Two actor processes, a lane each, push 100-step episodes through a 64-item queue while the
    # learner takes items as they come.
    buffer = make(MPReplayBuffer, 64, limiter, compression, None, lanes=2)
    ctx = mp.get_context(method)
    actors = [ctx.Process(target=_actor, args=(buffer, w, 100)) for w in range(2)]
    for p in actors:
        p.start()
    learner = Learner(buffer, None)
    deadline = time.monotonic() + 100
    while any(p.is_alive() for p in actors) or buffer.get_stored_size():
        assert time.monotonic() < deadline, "the actors' items never all arrived"
        with contextlib.suppress(TimeoutError):
            learner.take(timeout=0.2)
    for p in actors:
        p.join(30)
        assert p.exitcode == 0
    learner.check({0: 100, 1: 100})
    buffer.close()


@LIMITERS
@STORAGE
@NSTEP
def test_a_learner_drawing_pairs_never_leaves_the_writer_waiting_while_the_queue_has_room(limiter, compression, nstep):
    # A Stack draws its newest items first, so its oldest stay where a compressed writer's lane
    # wraps around to: the writer moves its episode past them rather than wait for a learner that
    # waits for a second item.
    buffer = make(ReplayBuffer, 32, limiter, compression, nstep)
    learner, t = Learner(buffer, nstep), 0
    for _ in range(6):
        while True:
            try:
                buffer.add(**step(t), timeout=0)
            except TimeoutError:
                break
            t += 1
        while buffer.get_stored_size() >= 2:
            learner.take(2)
        buffer.add(**step(t), timeout=0)  # one item or none stored: there is room
        t += 1
    learner.make_room(buffer.on_episode_end)
    learner.drain()
    learner.check({0: t})
    assert buffer.verify()["complete"] == 0


@EACH_START_METHOD
@LIMITERS
@pytest.mark.timeout(120, method="thread")
def test_actor_processes_and_a_learner_drawing_pairs_never_wait_for_each_other(method, limiter):
    buffer = make(MPReplayBuffer, 64, limiter, "both", None, lanes=2)
    ctx = mp.get_context(method)
    actors = [ctx.Process(target=_actor, args=(buffer, w, 150)) for w in range(2)]
    for p in actors:
        p.start()
    learner = Learner(buffer, None)
    deadline = time.monotonic() + 100
    while any(p.is_alive() for p in actors):
        assert time.monotonic() < deadline, "the actors and the learner waited for each other"
        with contextlib.suppress(TimeoutError):
            learner.take(2, timeout=0.2)
    for p in actors:
        p.join(30)
        assert p.exitcode == 0
    learner.drain()
    learner.check({0: 150, 1: 150})
    buffer.close()
