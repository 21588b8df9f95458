"""``bench apex``'s actor loop beside each replay library: the same recorded steps, each library's
replay path timed per env step (:mod:`mpreplay.bench.apex_peers` runs it and prints the table).

A *script* is a vector of games replayed from recorded Breakout episodes: per vector step each
game's new 84x84 frame, the action that led to it, its reward, whether the episode ended there
(terminated or truncated), whether the step is a reset (gymnasium's NextStep autoreset: the first
frame of the next episode, no transition), the Q-values the actor's network would have computed
for the new stack, and a priority for the row the step starts.  The driver builds each game's
4-frame stack from the frames, untimed (the actor's env wrapper does that for every library),
and hands each library the step as its users feed it; only the library's side is timed (CPU
time of this thread): the n-step fold, the rows' adds, the episode ends.

Contenders here: ``floor`` (the step's new bytes -- a frame per game, action, reward, done flag,
priority -- copied by numpy into arrays in a shared-memory segment), ``mpreplay`` (the demo
actor's path: ``VectorTransitions`` + ``PendingRows`` + ``VectorWriter`` into a shared
``MPPrioritizedReplayBuffer`` with ``next_of`` + ``stack_compress`` and a lane per game),
``cpprb`` (its ``NstepBuffer`` per game + ``MPPrioritizedReplayBuffer`` with ``next_of`` +
``stack_compress``); Reverb's and TorchRL's are in :mod:`reverb_roles` and :mod:`torchrl_roles`.
Imports only the standard library and numpy at the top: the peers' venvs have no mpreplay.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

NSTEP, GAMMA, ALPHA, DEPTH = 3, 0.99, 0.6, 4
FRAME = (84, 84)
FIELDS = ("frames", "act", "rew", "ended", "terminated", "restart", "q", "priority")


class Actor(Protocol):
    """One library's side of the actor: ``begin`` with the games' first stacks (untimed), then
    ``step`` once a vector step (timed)."""

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None: ...

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None: ...

    def close(self) -> None: ...


def save_script(directory: str, script: dict[str, np.ndarray]) -> None:
    """Write ``script`` (arrays named by :data:`FIELDS`, each ``(steps + 1, games, ...)``; step 0 is
    the games' reset) as ``.npy`` files in ``directory``: every venv's numpy reads them."""
    for name in FIELDS:
        np.save(os.path.join(directory, f"{name}.npy"), script[name])


def load_script(directory: str) -> dict[str, np.ndarray]:
    return {name: np.load(os.path.join(directory, f"{name}.npy")) for name in FIELDS}


def _stacks(frames: np.ndarray) -> np.ndarray:
    """``(games, 84, 84, DEPTH)`` from ``(games, DEPTH, 84, 84)``, a fresh array (nothing aliases it)."""
    return np.ascontiguousarray(np.moveaxis(frames, 1, -1))


def run(actor: Actor, script: dict[str, np.ndarray]) -> dict[str, Any]:
    """Drive ``actor`` through ``script`` once: its CPU seconds in ``step``, the env steps taken
    (game steps that were no reset), and the CPU seconds of its parts where it times them."""
    frames = np.repeat(script["frames"][0][:, None], DEPTH, axis=1)  # every game starts by a reset
    stacks = _stacks(frames)
    actor.begin(stacks, script["q"][0])
    cpu, env_steps = 0.0, 0
    clock = time.thread_time
    for s in range(1, len(script["act"])):
        step = {name: script[name][s] for name in FIELDS}
        restart = step["restart"]
        frames = np.concatenate([frames[:, 1:], step["frames"][:, None]], axis=1)
        frames[restart] = step["frames"][restart][:, None]  # a new episode's stack: its first frame repeated
        previous, stacks = stacks, _stacks(frames)
        env_steps += int((~restart).sum())
        start = clock()
        actor.step(step, stacks, previous)
        cpu += clock() - start
    return {"cpu": cpu, "env_steps": env_steps, "parts": dict(getattr(actor, "parts", {}))}


def play(actor: Actor, directory: str, script: dict[str, np.ndarray]) -> dict[str, Any]:
    """One :func:`run` of the script in ``directory`` (loaded: ``script``) -- by ``actor`` itself
    where its loop runs in a process of its own (TorchRL's writer, which the buffer is handed to)."""
    own = getattr(actor, "play", None)
    return own(directory, script) if own is not None else run(actor, script)


# -- the floor: the step's new bytes into a shared-memory segment -------------------------------
class Floor:
    """Arrays in one shared-memory segment, a row per env step: the new frame, action, reward,
    done flag and priority, written by numpy at a ring position per step."""

    def __init__(self, capacity: int):
        from multiprocessing import shared_memory

        layout = [("frame", FRAME, np.uint8), ("act", (), np.int64), ("rew", (), np.float32)]
        layout += [("done", (), np.float32), ("priority", (), np.float32)]
        sizes = [capacity * int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for _, shape, dt in layout]
        self._segment = shared_memory.SharedMemory(create=True, size=sum(sizes))
        self._arrays, offset = {}, 0
        for (name, shape, dtype), size in zip(layout, sizes, strict=True):
            self._arrays[name] = np.ndarray((capacity, *shape), dtype, self._segment.buf, offset)
            offset += size
        self._capacity, self._next = capacity, 0

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None:
        pass

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None:
        taken = ~step["restart"]
        k = int(taken.sum())
        rows = (self._next + np.arange(k)) % self._capacity
        self._next = (self._next + k) % self._capacity
        a = self._arrays
        a["frame"][rows] = step["frames"][taken]
        a["act"][rows] = step["act"][taken]
        a["rew"][rows] = step["rew"][taken]
        a["done"][rows] = step["terminated"][taken]
        a["priority"][rows] = step["priority"][taken]

    def close(self) -> None:
        self._arrays = {}
        self._segment.close()
        self._segment.unlink()


# -- mpreplay: the demo actor's path --------------------------------------------------------------
class Mpreplay:
    """The demo actor's replay path (``mpreplay demo --env atari``): the n-step fold of the games'
    stacks and Q-values, the pending rows merged with their initial priorities, one ``add`` per
    game's lane through ``VectorWriter``; each episode end with its rows."""

    def __init__(self, capacity: int):
        from mpreplay import MPPrioritizedReplayBuffer
        from mpreplay.demo.apex_atari import replay_fields

        self._buffer = MPPrioritizedReplayBuffer(
            capacity, replay_fields(), next_of="obs", stack_compress="obs", lanes=8, alpha=ALPHA
        )
        self._writer: Any = None
        self.parts: dict[str, float] = {}

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None:
        from types import SimpleNamespace

        from gymnasium.spaces import Discrete

        from mpreplay.demo.apex_atari import PendingRows
        from mpreplay.demo.atari import AtariConfig, stacked_spaces
        from mpreplay.vector_env import VectorTransitions, VectorWriter

        self.close_writer()
        games = len(stacks)
        env = SimpleNamespace(
            num_envs=games, single_action_space=Discrete(q.shape[1]), metadata={"autoreset_mode": "NextStep"}
        )
        self._fold = VectorTransitions(stacked_spaces(env), nstep=NSTEP, gamma=GAMMA)
        self._fold.reset({"frames": stacks, "q": q})
        self._pending, self._due = PendingRows(), AtariConfig().actor_batch
        self._writer = VectorWriter(self._buffer, games)
        self.parts = {}

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None:
        clock, parts = time.thread_time, self.parts
        start = clock()
        ended = step["ended"]
        batch = self._fold.step(
            step["act"],
            {"frames": stacks, "q": step["q"]},
            step["rew"],
            step["terminated"],
            ended & ~step["terminated"],
            {},
        )
        self._pending.append(batch)
        folded = clock()
        parts["n-step fold"] = parts.get("n-step fold", 0.0) + folded - start
        if self._pending.due(self._due):
            rows, priorities = self._pending.take()
            merged = clock()
            self._writer.add(rows, priorities)
            parts["rows merged, initial priorities"] = (
                parts.get("rows merged, initial priorities", 0.0) + merged - folded
            )
            parts["add + episode ends"] = parts.get("add + episode ends", 0.0) + clock() - merged

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self.close_writer()
        self._buffer.close()


# -- cpprb: NstepBuffer per game + its shared prioritized buffer ---------------------------------
class Cpprb:
    """cpprb as its documentation composes an n-step Ape-X actor: an ``NstepBuffer`` per game (it
    folds one environment's steps) and ``MPPrioritizedReplayBuffer(next_of="obs",
    stack_compress="obs")``.  Its ``next_of`` takes a row's next stack from the row stored after
    it, so a buffer holds one episode at a time in order: each game's folded rows wait until its
    episode ends, then go in one ``add`` with their priorities, then ``on_episode_end``.  (The
    rows' rewards are 3-step returns; the next stack the buffer gives back is 1 step on: the only
    layout cpprb's ``next_of`` has.)"""

    def __init__(self, capacity: int):
        from cpprb import MPPrioritizedReplayBuffer

        stack = {"shape": (*FRAME, DEPTH), "dtype": np.uint8}
        self._env_dict = {"obs": stack, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
        self._buffer = MPPrioritizedReplayBuffer(
            capacity, self._env_dict, alpha=ALPHA, next_of="obs", stack_compress="obs"
        )

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None:
        from cpprb import PyReplayBuffer  # NstepBuffer is not exported at the top

        nstep = {"size": NSTEP, "gamma": GAMMA, "rew": "rew", "next": "next_obs"}
        folders = {**self._env_dict, "next_obs": self._env_dict["obs"]}
        self._nstep = [PyReplayBuffer.NstepBuffer(folders, Nstep=nstep) for _ in range(len(stacks))]
        self._rows: list[list[dict[str, np.ndarray]]] = [[] for _ in range(len(stacks))]
        self._priorities: list[list[float]] = [[] for _ in range(len(stacks))]

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None:
        for g in np.flatnonzero(~step["restart"]):
            done = float(step["terminated"][g])
            rows = self._nstep[g].add(
                obs=previous[g], act=step["act"][g], rew=step["rew"][g], next_obs=stacks[g], done=done
            )
            self._priorities[g].append(float(step["priority"][g]))
            if rows is not None:
                self._rows[g].append(rows)
            if step["ended"][g]:
                self._end(int(g))

    def _end(self, g: int) -> None:
        rest = self._nstep[g].on_episode_end()
        rows = self._rows[g] + ([rest] if rest is not None else [])
        self._rows[g] = []
        priorities, self._priorities[g] = self._priorities[g], []
        if rows:
            columns = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
            self._buffer.add(**columns, priorities=np.asarray(priorities[: len(columns["act"])]))
        self._buffer.on_episode_end()

    def close(self) -> None:
        self._buffer = None


def make(name: str, capacity: int) -> Actor:
    """Contender ``name``'s side of the actor, writing into a buffer of ``capacity`` rows."""
    if name in ("reverb", "torchrl"):  # the peers' venvs load these modules by path, by these names
        import importlib

        roles = importlib.import_module(f"{__package__}.{name}_roles" if __package__ else f"{name}_roles")
        actor: Actor = roles.Actor(capacity, NSTEP, GAMMA)
        return actor
    makers: dict[str, Callable[[int], Actor]] = {"floor": Floor, "mpreplay": Mpreplay, "cpprb": Cpprb}
    if name not in makers:
        raise ValueError(f"name: expected one of floor, mpreplay, cpprb, reverb, torchrl, got {name!r}")
    return makers[name](capacity)
