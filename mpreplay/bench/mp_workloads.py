"""``mpreplay bench mp``'s workloads: the observations, the prebuilt adds a writer cycles through, and
the buffers compared (mpreplay's and cpprb's multi-process prioritized buffers).

numpy at the top only (each buffer's library is imported where it is made): the peers' workers load
this file by its path, so a Reverb or TorchRL writer cycles through the same transitions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH = 256
ALPHA, BETA, EPS = 0.6, 0.4, 1e-4
ROWS_PER_ADD = (1, 32)
POOL = 8  # distinct prebuilt adds (and priority vectors) each process cycles through
_FILL_ROWS = 32  # rows per add while filling a buffer before the cases


@dataclass(frozen=True)
class Obs:
    """An observation and the capacity it is benchmarked at; ``lanes`` > 0: stored
    compressed (next_of + stack_compress), one lane per writer."""

    label: str
    shape: tuple[int, ...]
    dtype: str
    capacity: int
    lanes: int = 0

    def resized(self, capacity: int) -> Obs:
        return Obs(self.label, self.shape, self.dtype, capacity, self.lanes)

    def uncompressed(self, capacity: int) -> Obs:
        return Obs(self.label, self.shape, self.dtype, capacity)


SMALL = Obs("(4,) float32", (4,), "float32", 100_000)
ATARI = Obs("(84, 84, 4) uint8", (84, 84, 4), "uint8", 20_000)
ATARI_SCALE_WRITERS = 8
ATARI_SCALE = Obs("(84, 84, 4) uint8", (84, 84, 4), "uint8", 1_000_000, lanes=ATARI_SCALE_WRITERS)
CPPRB_ATARI_CAPACITY = 100_000  # uncompressed (84, 84, 4) obs + next_obs: 5.6 GB; 1e6 would need 56 GB
SWEEP = (10_000, 100_000, 1_000_000)
QUICK_CAPACITY = {SMALL.label: 2_000, ATARI.label: 500}
QUICK_SWEEP = (1_000, 10_000)


def env_dict(obs: Obs, scalar_shape: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    scalar = {"shape": scalar_shape} if scalar_shape else {}
    return {
        "obs": {"shape": obs.shape, "dtype": obs.dtype},
        "act": {**scalar, "dtype": np.int64},
        "rew": {**scalar, "dtype": np.float32},
        "next_obs": {"shape": obs.shape, "dtype": obs.dtype},
        "done": {**scalar, "dtype": np.float32},
    }


def transitions(obs: Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """``POOL`` adds of ``k`` rows each, as an actor would pass them.

    One row is an observation array plus Python scalars; ``k`` rows are
    arrays of exact dtypes, scalar fields shaped ``(k,) + scalar_shape``.
    """
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(POOL):
        o = rng.integers(0, 255, (k,) + obs.shape).astype(obs.dtype)
        o2 = rng.integers(0, 255, (k,) + obs.shape).astype(obs.dtype)
        act, rew, done = rng.integers(0, 4, k), rng.standard_normal(k), (rng.random(k) < 0.01)
        if k == 1:
            pool.append(
                {"obs": o[0], "act": int(act[0]), "rew": float(rew[0]), "next_obs": o2[0], "done": float(done[0])}
            )
        else:
            scalar = (k,) + scalar_shape
            pool.append(
                {
                    "obs": o,
                    "act": act.astype(np.int64).reshape(scalar),
                    "rew": rew.astype(np.float32).reshape(scalar),
                    "next_obs": o2,
                    "done": done.astype(np.float32).reshape(scalar),
                }
            )
    return pool


def episode(obs: Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """Adds of ``k`` consecutive steps of one episode of frame stacks (at least 256 steps),
    the last step done: cycling through them replays the episode, so every stack is the
    one before shifted by a new frame, as a compressed buffer checks."""
    rng = np.random.default_rng(seed)
    adds = max(POOL, -(-256 // k))
    steps = adds * k
    frames = rng.integers(0, 255, (steps + 1,) + obs.shape[:-1]).astype(obs.dtype)
    depth = obs.shape[-1]
    # Stack t holds frames t-depth+1 .. t, the first frame repeated before the episode began.
    order = np.maximum(np.arange(steps + 1)[:, None] - np.arange(depth - 1, -1, -1)[None, :], 0)
    stacks = np.moveaxis(frames[order], 1, -1)
    act, rew = rng.integers(0, 4, steps).astype(np.int64), rng.standard_normal(steps).astype(np.float32)
    done = (np.arange(steps) == steps - 1).astype(np.float32)
    scalar = (k,) + scalar_shape
    pool = []
    for a in range(adds):
        t = slice(a * k, (a + 1) * k)
        if k == 1:
            i = a
            pool.append(
                {
                    "obs": stacks[i],
                    "act": int(act[i]),
                    "rew": float(rew[i]),
                    "next_obs": stacks[i + 1],
                    "done": float(done[i]),
                }
            )
        else:
            pool.append(
                {
                    "obs": stacks[t],
                    "act": act[t].reshape(scalar),
                    "rew": rew[t].reshape(scalar),
                    "next_obs": stacks[a * k + 1 : (a + 1) * k + 1],
                    "done": done[t].reshape(scalar),
                }
            )
    return pool


def adds(obs: Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """What a writer cycles through: random transitions, or an episode for a compressed buffer."""
    return (episode if obs.lanes else transitions)(obs, k, scalar_shape, seed)


@dataclass(frozen=True)
class Contender:
    """A multi-process prioritized buffer: how to make one, and its scalar field shape."""

    name: str
    scalar_shape: tuple[int, ...]
    make: Callable[[Obs, Any], Any]  # (obs, multiprocessing context) -> context manager yielding the buffer


@contextmanager
def _mpreplay_buffer(obs: Obs, ctx: Any) -> Iterator[Any]:
    import mpreplay

    compression: dict[str, Any] = {"next_of": "obs", "stack_compress": "obs", "lanes": obs.lanes} if obs.lanes else {}
    with mpreplay.MPPrioritizedReplayBuffer(
        obs.capacity, env_dict(obs, ()), alpha=ALPHA, eps=EPS, **compression
    ) as buffer:
        yield buffer


@contextmanager
def _cpprb_buffer(obs: Obs, ctx: Any) -> Iterator[Any]:
    import cpprb

    # cpprb stores a field without shape as shape (1,); its default
    # "sharedctypes" memory is unlinked at once, so it needs no cleanup.
    yield cpprb.MPPrioritizedReplayBuffer(obs.capacity, env_dict(obs, (1,)), alpha=ALPHA, eps=EPS, ctx=ctx)


MPREPLAY = Contender("mpreplay", (), _mpreplay_buffer)
CPPRB = Contender("cpprb", (1,), _cpprb_buffer)


def fill(buffer: Any, obs: Obs, contender: Contender) -> None:
    pool = transitions(obs, _FILL_ROWS, contender.scalar_shape, seed=1)
    for i in range(-(-obs.capacity // _FILL_ROWS)):
        buffer.add(**pool[i % len(pool)])
