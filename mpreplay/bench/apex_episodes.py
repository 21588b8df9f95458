"""``mpreplay bench apex``'s data: real Atari episodes recorded once, and the rows the demo's actors
would write from them (3-step returns over frame stacks, ``mpreplay demo --env atari``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mpreplay.demo.atari import DEPTH, AtariConfig, vector_env
from mpreplay.returns import n_step_returns

NSTEP, GAMMA = 3, 0.99
ROW_FIELDS = ("obs", "act", "rew", "next_obs", "done", "discount")  # a row's fields, in the actor's order


@dataclass(frozen=True)
class Episode:
    """One episode of one sub-environment: its ``T + 1`` frames, and the ``T`` actions and rewards
    between them; ``terminated``: it ended by a terminal step (a lost life, the game's end)."""

    frames: np.ndarray  # (T + 1, 84, 84) uint8
    act: np.ndarray  # (T,) int64
    rew: np.ndarray  # (T,) float32
    terminated: bool

    def __len__(self) -> int:
        return len(self.act)

    def rows(self, start: int = 0, stop: int | None = None, nstep: int = NSTEP) -> dict[str, np.ndarray]:
        """Rows ``start:stop`` as an actor writes them: the stack at step t (the first frame repeated
        before the episode), the n-step return from t, the stack n steps on (or the last), ``done``
        where a terminal step falls inside the n, ``discount`` = γ^m."""
        t, ahead, small = self.steps(start, stop, nstep)
        stacks = {"obs": self.stacks(t), "next_obs": self.stacks(ahead)}
        return {name: stacks[name] if name in stacks else small[name] for name in ROW_FIELDS}

    def steps(
        self, start: int = 0, stop: int | None = None, nstep: int = NSTEP
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Of rows ``start:stop``: the steps ``t`` of their stacks, the steps ``ahead`` of their next
        stacks, and their small fields (act, rew, done, discount)."""
        steps = len(self)
        stop = steps if stop is None else stop
        dones = np.zeros(steps, np.float32)
        dones[-1] = self.terminated
        folded = n_step_returns(self.rew, dones, GAMMA, nstep)
        t = np.arange(start, stop)
        ahead = t + folded.steps[t]
        return (
            t,
            ahead,
            {
                "act": self.act[t],
                "rew": folded.returns[t],
                "done": ((ahead == steps) & self.terminated).astype(np.float32),
                "discount": folded.discounts[t],
            },
        )

    def stacks(self, at: np.ndarray) -> np.ndarray:
        """``(len(at), 84, 84, DEPTH)``: the stacks whose newest frames are ``at``."""
        return np.moveaxis(self.frames[self.stack_frames(at)], 1, -1)

    @staticmethod
    def stack_frames(at: np.ndarray) -> np.ndarray:
        """``(len(at), DEPTH)``: the frames, oldest first, of the stacks whose newest are ``at``."""
        return np.maximum(at[:, None] - np.arange(DEPTH - 1, -1, -1)[None, :], 0)


def record(steps: int, num_envs: int = 4, seed: int = 0) -> list[Episode]:
    """``steps`` env steps of real Breakout (random actions, an episode per life, as the demo plays
    it); the episodes that ended within them, in the order they ended."""
    env = vector_env(AtariConfig(envs_per_actor=num_envs))
    rng = np.random.default_rng(seed)
    frames, _ = env.reset(seed=seed)
    open_: list[tuple[list[np.ndarray], list[int], list[float]]] = [([f], [], []) for f in frames]
    resetting = np.zeros(num_envs, bool)
    done: list[Episode] = []
    taken = 0
    try:
        while taken < steps:
            act = rng.integers(int(env.single_action_space.n), size=num_envs)
            frames, rew, terminated, truncated, _ = env.step(act)
            for e in range(num_envs):
                if resetting[e]:  # NextStep autoreset: a reset, not a step of the episode
                    open_[e] = ([frames[e]], [], [])
                    continue
                open_[e][0].append(frames[e])
                open_[e][1].append(act[e])
                open_[e][2].append(rew[e])
                taken += 1
                if terminated[e] or truncated[e]:
                    f, a, r = open_[e]
                    done.append(Episode(np.stack(f), np.array(a, np.int64), np.array(r, np.float32), terminated[e]))
            resetting = terminated | truncated
    finally:
        env.close()
    return done


def cycle_rows(episodes: list[Episode], rows: int, nstep: int = NSTEP) -> Iterator[tuple[dict[str, np.ndarray], bool]]:
    """The episodes' n-step rows, ``rows`` at a time (see :func:`chunks`), the episodes over and
    over; with each chunk, whether it is its episode's last."""
    while True:
        for episode in episodes:
            for start, stop in chunks(len(episode), rows):
                yield episode.rows(start, stop, nstep), stop == len(episode)


def chunks(steps: int, rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the adds an episode of ``steps`` rows is written in, ``rows`` at a time but
    the last ``NSTEP`` rows in one: their n steps all reach the episode's end, as the actor's folder
    returns them at once (a buffer that stores each frame once takes the episode's end whole)."""
    starts = list(range(0, steps, rows))
    while len(starts) > 1 and steps - starts[-1] < NSTEP:
        starts.pop()
    return [(a, b) for a, b in zip(starts, [*starts[1:], steps], strict=True)]
