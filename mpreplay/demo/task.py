"""The task both agents of the demo play: CartPole, the Ape-X exploration ladder, and when it counts as solved."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from .. import checks
from ..launcher import Context

__all__ = [
    "ENV_ID",
    "GREEDY_EPSILON",
    "NUM_ACTIONS",
    "POSITIONS",
    "WINDOW",
    "Config",
    "actor_epsilons",
    "actor_seed",
    "env_title",
    "epsilon",
    "hide_velocity",
    "recent_mean",
    "run_seed",
    "running_mean",
    "solve_point",
    "vector_env",
]

ENV_ID = "CartPole-v1"
WINDOW = 20  # episodes in the running mean that decides "solved"
# "Solved" is judged on the greedy end of the ladder, the actors with ε at most this:
# a perfect policy still averages about 300 when 40% of its actions are random.
GREEDY_EPSILON = 0.01

NUM_ACTIONS = 2
# CartPole's observation is (cart position, cart velocity, pole angle, pole angular velocity);
# hiding the velocities keeps these, a partially observed task.
POSITIONS = (0, 2)


@dataclass(frozen=True)
class Config:
    """Settings of a run (the command line flags); sent to every process."""

    actors: int = 2
    seconds: float = 300.0
    capacity: int = 50_000
    batch_size: int = 64
    seed: int = 0
    out: str = "./mpreplay-demo"
    lr: float = 1e-3
    gamma: float = 0.99
    nstep: int = 3
    hidden: int = 64
    target_update: int = 100
    publish_every: int = 25
    learning_starts: int = 1_000
    samples_per_insert: float = 8.0
    alpha: float = 0.6
    beta: float = 0.4
    actor_batch: int = 32
    envs_per_actor: int = 8
    grad_clip: float = 10.0
    hide_velocity: bool = False
    plain: bool = False
    prefetch: int = 0
    table: str | None = None  # the replay's name: a persistent table a restarted run joins
    checkpoint_every: float | None = None  # seconds between the run's checkpoints (None: none)
    resumes: int = 0  # how many times the run was resumed from a checkpoint (not a flag: --resume counts)

    # What `--env` names this task; whether a run of it can be judged solved (else it ends at --seconds);
    # the modules the process server imports before it forks the processes.
    env: ClassVar[str] = "cartpole"
    solvable: ClassVar[bool] = True
    preload: ClassVar[tuple[str, ...]] = ("gymnasium",)

    def table_options(self) -> dict[str, Any]:
        """What makes the run's replay the persistent table ``--table`` names (nothing without one)."""
        return {} if self.table is None else {"name": self.table, "persist": True}

    @property
    def obs_dim(self) -> int:
        """Numbers an actor observes per step."""
        return len(POSITIONS) if self.hide_velocity else 4

    @classmethod
    def arguments(cls, p: argparse.ArgumentParser, d: Config) -> None:
        """The task's own flags beside the common ones (CartPole has none; an agent may add some)."""

    @property
    def title(self) -> str:
        """What the live view, summary and plot call the task."""
        return f"{ENV_ID}, velocities hidden" if self.hide_velocity else ENV_ID


def epsilon(rank: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Exploration rate of actor ``rank`` of ``num_actors`` on the Ape-X ladder.

    ``base ** (1 + alpha * rank / (num_actors - 1))``: from ``base`` (0.4) for
    actor 0 down to ``base ** 8`` for the last; a lone actor gets ``base``.
    """
    num_actors = checks.integer("num_actors", num_actors, low=1)
    rank = checks.integer("rank", rank, low=0, high=num_actors - 1)
    if num_actors == 1:
        return base
    return base ** (1 + alpha * rank / (num_actors - 1))


def hide_velocity(env: Any) -> Any:
    """``env`` (a CartPole) observing only the cart position and the pole angle."""
    from gymnasium.spaces import Box
    from gymnasium.wrappers import TransformObservation

    keep = list(POSITIONS)
    space = env.observation_space
    return TransformObservation(env, lambda obs: obs[keep], Box(space.low[keep], space.high[keep], dtype=space.dtype))


def vector_env(config: Config, **vector_kwargs: Any) -> Any:
    """``config.envs_per_actor`` CartPoles stepped in this process, velocities hidden if the config says so."""
    import gymnasium as gym

    # CartPole steps in microseconds: sub-environments in this process beat a process apiece.
    return gym.make_vec(
        ENV_ID,
        num_envs=config.envs_per_actor,
        vectorization_mode="sync",
        vector_kwargs=vector_kwargs,
        wrappers=[hide_velocity] if config.hide_velocity else None,
    )


def env_title(config: Config) -> str:
    """What the live view, summary and plot call the task."""
    return config.title


def actor_epsilons(ctx: Context, config: Config) -> np.ndarray:
    """The exploration rate of each of this actor's sub-environments: the Ape-X ladder over every
    sub-environment of every actor."""
    num_envs = config.envs_per_actor
    return np.array([epsilon(ctx.rank * num_envs + e, ctx.num_actors * num_envs) for e in range(num_envs)])


# A resumed run's seeds are its first run's moved this far per resume: none meets another's
# (a first run's actor seeds stay below it while --seed does below 10**6).
_RESUME_SEED_STRIDE = 2**40


def run_seed(config: Config) -> int:
    """The seed of the learner's torch stream: ``--seed``, moved on at each resume so that a
    resumed run does not replay its first run's random stream."""
    return config.seed + config.resumes * _RESUME_SEED_STRIDE


def actor_seed(ctx: Context, config: Config) -> int:
    """This actor's seed (sub-environment e: seed + e); a restarted actor, and every actor of a
    resumed run, plays other episodes."""
    first = config.seed * 1_000_000 + ctx.rank * 10_000 + ctx.restarts * 1_000
    return first + config.resumes * _RESUME_SEED_STRIDE


def running_mean(values: np.ndarray) -> np.ndarray:
    """Mean of the last WINDOW values (fewer at the start) at every position."""
    total = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - WINDOW, 0)
    return (total[ends] - total[starts]) / (ends - starts)


def recent_mean(log_rows: Mapping[str, np.ndarray]) -> float:
    """Mean return of the last WINDOW greedy episodes of the log (-inf before there are that many)."""
    returns = log_rows["ret"][log_rows["eps"] <= GREEDY_EPSILON]
    return float(returns[-WINDOW:].mean()) if len(returns) >= WINDOW else -math.inf


def solve_point(episodes: Mapping[str, ArrayLike], goal: float) -> tuple[float, int] | None:
    """(seconds, env steps) when the mean of the last WINDOW greedy returns first reached ``goal``.

    ``episodes``: the lists of a run's ``episodes.json`` (or its :class:`~mpreplay.demo.report.Episodes`, as arrays).
    """
    ep = {key: np.asarray(values) for key, values in episodes.items()}
    greedy = np.flatnonzero(ep["eps"] <= GREEDY_EPSILON)
    full = np.arange(len(greedy)) >= WINDOW - 1
    hits = np.flatnonzero(full & (running_mean(ep["ret"][greedy]) >= goal))
    if not len(hits):
        return None
    i = greedy[hits[0]]
    return float(ep["time"][i]), int(ep["env_steps"][i])
