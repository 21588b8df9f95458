"""Ape-X DQN on Atari (``mpreplay demo --env atari``): the actor's loop and the compressed replay buffer.

The learner is the Ape-X learner of :mod:`mpreplay.demo.apex` (the shared loop, on prefetched
batches) with the Nature CNN (:mod:`mpreplay.demo.nature_cnn`); what differs on pixels is here.

* Each actor steps ``--envs-per-actor`` games in one gymnasium ``SyncVectorEnv``
  (:mod:`mpreplay.demo.atari`), each sub-environment at its rung of the Ape-X ε ladder.  It
  keeps every sub-environment's last 4 frames in a :class:`~mpreplay.demo.atari.FrameStacks`
  (a new episode's stack repeats its first frame) and computes the stacks' Q-values once per
  step, for acting.
* :class:`~mpreplay.vector_env.VectorTransitions` folds each sub-environment's 3-step returns
  from the stacks, with each stack's Q-values riding beside it: a folded row carries Q(s) and
  Q(s'), so its initial priority |R + γ^m max Q(s') - Q(s, a)| costs no second forward pass.
* :class:`~mpreplay.vector_env.VectorWriter` writes every sub-environment's rows through an
  episode writer of its own (a lane of the buffer) and ends each episode where it ended: the
  buffer (``next_of`` + ``stack_compress``) checks every stack against the step before and
  stores one frame a step.
* The episode log gets one row per *game* (``info["game_over"]``), whether or not each lost
  life ended a replay episode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..buffers import MPPrioritizedReplayBuffer
from ..errors import BufferClosed
from ..launcher import Context
from ..limiter import SampleToInsertRatio
from ..vector_env import TransitionBatch, VectorTransitions, VectorWriter
from .atari import DEPTH, AtariConfig, FrameStacks, stacked_spaces, vector_env
from .nature_cnn import nature_cnn
from .processes import WAIT, import_torch
from .task import actor_epsilons, actor_seed

__all__ = [
    "PendingRows",
    "StackedSteps",
    "atari_actor",
    "atari_network",
    "atari_replay",
    "initial_priorities",
    "replay_fields",
    "stored",
]

_Q = ("obs_q", "next_obs_q")  # the fields of the Q-values riding with the stacks (never stored)
_RENAMED = {"obs_frames": "obs", "next_obs_frames": "next_obs"}


def atari_network(config: AtariConfig, num_actions: int) -> Any:
    return nature_cnn(num_actions, DEPTH, dueling=config.dueling)


def replay_fields() -> dict[str, dict[str, Any]]:
    stack = {"shape": (84, 84, DEPTH), "dtype": np.uint8}
    return {
        "obs": stack,
        "act": {"dtype": np.int64},
        "rew": {},
        "next_obs": stack,
        "done": {},
        "discount": {},
    }  # discount: gamma**m


def atari_replay(config: AtariConfig) -> MPPrioritizedReplayBuffer:
    """Stacks stored one frame a step: a lane per sub-environment of every actor."""
    slack = config.samples_per_insert * config.actor_batch * config.actors * 2 + config.batch_size * (
        1 + config.prefetch
    )
    limiter = SampleToInsertRatio(config.samples_per_insert, config.learning_starts, slack)
    return MPPrioritizedReplayBuffer(
        config.capacity,
        replay_fields(),
        alpha=config.alpha,
        seed=config.seed,
        rate_limiter=limiter,
        next_of="obs",
        stack_compress="obs",
        lanes=config.actors * config.envs_per_actor,
        **config.table_options(),
    )


def initial_priorities(rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """|R + discount (1 - done) max_a Q(s', a) - Q(s, act)| from the Q-values the rows carry."""
    taken = np.take_along_axis(rows["obs_q"], rows["act"][:, None], 1)[:, 0]
    bootstrap = rows["next_obs_q"].max(1)
    target = rows["rew"] + rows["discount"] * (1.0 - rows["done"]) * bootstrap
    return np.abs(target - taken)


def stored(batch: TransitionBatch) -> TransitionBatch:
    """The batch's rows as the buffer stores them: the stacks under their field names, no Q-values."""
    rows = {_RENAMED.get(name, name): value for name, value in batch.rows.items() if name not in _Q}
    return TransitionBatch(rows, batch.envs, batch.ended)


class PendingRows:
    """The step batches not yet written, merged into one batch whose priorities are computed together.

    A write is due once ``actor_batch`` rows wait, or as soon as an episode has ended: a merged
    batch holds each sub-environment's rows in time order and may end episodes only after them,
    so it never spans an episode's end.  Its rows go in one ``add`` per sub-environment.

    The merged rows are gathered in one pass into arrays kept from one :meth:`take` to the next
    (a fresh batch's arrays are megabytes: new ones would cost a page fault every 4 KB): a
    taken batch is valid until the next ``take``, which is what an actor that writes it first needs.
    """

    def __init__(self) -> None:
        self._batches: list[TransitionBatch] = []
        self.rows = 0
        self._ended = False
        self._merged: dict[str, np.ndarray] = {}  # per field, the arrays every take gathers into

    def append(self, batch: TransitionBatch) -> None:
        if len(batch) or len(batch.ended):
            self._batches.append(batch)
            self.rows += len(batch)
            self._ended = bool(len(batch.ended))

    def due(self, actor_batch: int) -> bool:
        return self._ended or self.rows >= actor_batch

    def take(self) -> tuple[TransitionBatch, np.ndarray]:
        """The pending rows as the buffer stores them, each sub-environment's together, and their
        initial priorities (valid until the next take); nothing is pending after."""
        batches, self._batches, self.rows, self._ended = self._batches, [], 0, False
        if not batches:
            return TransitionBatch({}, np.zeros(0, np.int64), np.zeros(0, np.int64)), np.zeros(0)
        envs = np.concatenate([b.envs for b in batches])
        order = np.argsort(envs, kind="stable")  # each sub-environment's rows, in time order
        place = np.empty_like(order)
        place[order] = np.arange(len(order))  # where each pending row goes in the merged batch
        bounds = np.cumsum([0] + [len(b) for b in batches])
        rows = {}
        for key, first in batches[0].rows.items():
            held = self._merged.get(key)
            if held is None or len(held) < len(envs):
                # Grown by half again or more: an end's flush makes a take a few rows longer.
                size = max(len(envs), 0 if held is None else len(held) * 3 // 2)
                held = self._merged[key] = np.empty((size, *first.shape[1:]), first.dtype)
            rows[key] = held[: len(envs)]
            for b, lo, hi in zip(batches, bounds[:-1], bounds[1:], strict=True):
                rows[key][place[lo:hi]] = b.rows[key]
        return stored(TransitionBatch(rows, envs[order], batches[-1].ended)), initial_priorities(rows)


def _write(ctx: Context, writer: VectorWriter, batch: TransitionBatch, priorities: np.ndarray) -> bool:
    """``writer.add``, waiting on the rate limiter; False if the run ends first.  A timed-out add goes
    on where it stopped (VectorWriter keeps the place)."""
    while not ctx.stop.is_set():
        try:
            writer.add(batch, priorities, timeout=WAIT)
            return True
        except TimeoutError:
            continue
    return False


class StackedSteps:
    """A vector of games as the actor sees them: each sub-environment's last 4 frames, the stacks'
    Q-values from ``q_values`` (computed once a step, for acting and for the priorities), and the
    folded transitions each step completes.

    ``step(act)`` returns the :class:`~mpreplay.vector_env.TransitionBatch` of the step (rows
    carrying ``obs_q`` and ``next_obs_q``: see :func:`initial_priorities`, then :func:`stored`),
    its rewards, the sub-environments whose episode ended and those whose game ended.
    """

    def __init__(self, env: Any, q_values: Callable[[np.ndarray], np.ndarray], nstep: int, gamma: float):
        self._env, self._q_values = env, q_values
        self._stacks = FrameStacks(env.num_envs)
        self.transitions = VectorTransitions(stacked_spaces(env), nstep=nstep, gamma=gamma)  # the n-step folder
        self._resetting = np.zeros(env.num_envs, bool)  # NextStep autoreset: their next step is a reset
        self.q = np.zeros((env.num_envs, int(env.single_action_space.n)), np.float32)

    @property
    def stacks(self) -> np.ndarray:
        """``(num_envs, 84, 84, 4)`` uint8: each sub-environment's current stack."""
        return self._stacks.stacks

    @property
    def resetting(self) -> np.ndarray:
        """The sub-environments whose next step is a reset (it is no env step: it counts none)."""
        return self._resetting.copy()

    def reset(self, seed: int) -> None:
        frames, _ = self._env.reset(seed=seed)
        self._stacks.restart(frames)
        self.q = self._q_values(self._stacks.stacks)
        self.transitions.reset({"frames": self._stacks.stacks, "q": self.q})

    def step(self, act: np.ndarray) -> tuple[TransitionBatch, np.ndarray, np.ndarray, np.ndarray]:
        frames, rew, terminated, truncated, info = self._env.step(act)
        self._stacks.push(frames, restart=self._resetting)
        self.q = self._q_values(self._stacks.stacks)
        obs = {"frames": self._stacks.stacks, "q": self.q}
        batch = self.transitions.step(act, obs, rew, terminated, truncated, info)
        self._resetting = ended = terminated | truncated
        return batch, rew, ended, ended & info["game_over"]


def atari_actor(ctx: Context, config: AtariConfig) -> None:
    """Play the game on a vector of sub-environments with ε-greedy actions; write prioritized
    3-step transitions of frame stacks, each episode through a lane of its own."""
    torch = import_torch()

    replay, log = ctx.buffer["replay"], ctx.buffer["episodes"]
    env = vector_env(config)
    num_envs, num_actions = env.num_envs, int(env.single_action_space.n)
    eps = actor_epsilons(ctx, config)
    seed = actor_seed(ctx, config)
    rng = np.random.default_rng(seed)
    writer = VectorWriter(replay, num_envs)
    net = atari_network(config, num_actions)
    weights, version = net.state_dict(), -1  # the state dict's tensors share the network's memory

    def q_values(stacks: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(stacks)).numpy()

    steps = StackedSteps(env, q_values, config.nstep, config.gamma)
    steps.reset(seed)
    pending = PendingRows()
    games, env_steps = 0, 0
    returns = np.zeros(num_envs)
    try:
        while not ctx.stop.is_set():
            newer = ctx.params.read_if_newer(version, out=weights)
            if newer is not None:
                version = newer[1]
            act = np.where(rng.random(num_envs) < eps, rng.integers(num_actions, size=num_envs), steps.q.argmax(1))
            env_steps += int(num_envs - steps.resetting.sum())
            batch, rew, _, game_over = steps.step(act)
            pending.append(batch)
            returns += rew
            for e in np.flatnonzero(game_over):
                log.add(rank=ctx.rank, episode=games, eps=eps[e], ret=returns[e], steps=env_steps, time=time.time())
                games, returns[e] = games + 1, 0.0
            if pending.due(config.actor_batch) and not _write(ctx, writer, *pending.take()):
                return
    except BufferClosed:
        return
    finally:
        writer.close()
        env.close()
