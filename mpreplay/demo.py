"""Ape-X DQN on CartPole: actor processes and a learner around one shared prioritized buffer.

Run it with ``mpreplay demo`` (or ``python examples/apex_dqn.py``); it needs
PyTorch and gymnasium, and shows a live view with rich when rich is installed.

::

    actors (ε ladder)                                        learner
    vector env ─> VectorTransitions ─> |TD| ─add─> replay buffer ─sample─> double DQN step
                                                  ^                      │
                                                  └─update_priorities────┤
    weights <──────────── ParameterStore <─────── publish every K steps ──┘
    episode returns ─add─> episode log ─> parent (live view, summary, plot) and learner (solved?)

* Every actor steps a vector of ``--envs-per-actor`` CartPoles (gymnasium's
  SyncVectorEnv), each sub-environment with its own exploration rate from the
  Ape-X ladder (:func:`epsilon`) over all the sub-environments of all actors;
  :class:`~mpreplay.vector_env.VectorTransitions` turns the vector's steps into
  each sub-environment's transitions, folded over n = 3, computes the initial priorities of a few
  dozen folded transitions at once with its copy of the network, and writes
  them into the shared :class:`~mpreplay.MPPrioritizedReplayBuffer` in one
  ``add``.  It picks up the learner's newest weights from the
  :class:`~mpreplay.params.ParameterStore` as soon as they are published.
* The learner trains a double DQN with a target network: importance weights
  scale the Huber loss, the new |TD| errors become the priorities.
* A :class:`~mpreplay.SampleToInsertRatio` limiter keeps the learner from
  over-fitting a small buffer and the actors from outrunning the learner.
* Episode returns travel to the parent (and to the learner, which ends the run
  once CartPole is solved) through a second, uniform shared buffer used as an
  append-only log: one row per episode.

CartPole counts as solved when the last 20 episodes of the greedy end of the
ladder (sub-environments with ε ≤ 0.01: with 2 actors of 8, 7 of the 16) average
475 or more; the run then stops, else it stops after ``--seconds``.

``--hide-velocity`` shows the actors only the cart position and the pole angle
(:func:`hide_velocity`): a partially observed task that this feed-forward network
cannot solve, and the recurrent agent of ``--agent r2d2`` (:mod:`mpreplay.demo_r2d2`)
can.  Both agents share this module's processes, live view, summary and plot
(:class:`Agent` names what differs).

The processes fork from a server that has imported torch once (start method
"forkserver"), and each sets ``torch.set_num_threads(1)``: they share a few
cores, and a thread pool apiece would only add contention.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import checks
from .buffer import MPPrioritizedReplayBuffer, MPReplayBuffer
from .errors import BufferClosed
from .launcher import Context, launch
from .limiter import SampleToInsertRatio
from .params import ParameterStore
from .vector_env import VectorTransitions

__all__ = ["Agent", "Config", "epsilon", "hide_velocity", "main", "solve_point"]

ENV_ID = "CartPole-v1"
APEX_SOLVED_RETURN = 475.0  # CartPole-v1's reward threshold
WINDOW = 20  # episodes in the running mean that decides "solved"
# "Solved" is judged on the greedy end of the ladder, the actors with ε at most this:
# a perfect policy still averages about 300 when 40% of its actions are random.
GREEDY_EPSILON = 0.01

NUM_ACTIONS = 2
# CartPole's observation is (cart position, cart velocity, pole angle, pole angular velocity);
# hiding the velocities keeps these, a partially observed task.
POSITIONS = (0, 2)
_EPISODE_FIELDS = {"rank": {"dtype": np.int64}, "episode": {"dtype": np.int64}, "eps": {"dtype": np.float64},
                   "ret": {"dtype": np.float64}, "steps": {"dtype": np.int64}, "time": {"dtype": np.float64}}
_EPISODE_LOG_SIZE = 1 << 14  # rows; far more episodes than can end between two reads of the log
WAIT = 0.2  # seconds a blocked add/sample waits before the caller looks at the stop flag again
_SOLVED_CHECK = 0.5  # seconds between the learner's looks at the episode log
_RATE_SPAN = 5.0  # seconds the live rates average over (env steps arrive an episode at a time)


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

    @property
    def obs_dim(self) -> int:
        """Numbers an actor observes per step."""
        return len(POSITIONS) if self.hide_velocity else 4


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
    return gym.make_vec(ENV_ID, num_envs=config.envs_per_actor, vectorization_mode="sync",
                        vector_kwargs=vector_kwargs, wrappers=[hide_velocity] if config.hide_velocity else None)


def env_title(config: Config) -> str:
    """What the live view, summary and plot call the task."""
    return f"{ENV_ID}, velocities hidden" if config.hide_velocity else ENV_ID


def actor_epsilons(ctx: Context, config: Config) -> np.ndarray:
    """The exploration rate of each of this actor's sub-environments: the Ape-X ladder over every
    sub-environment of every actor."""
    num_envs = config.envs_per_actor
    return np.array([epsilon(ctx.rank * num_envs + e, ctx.num_actors * num_envs) for e in range(num_envs)])


def actor_seed(ctx: Context, config: Config) -> int:
    """This actor's seed (sub-environment e: seed + e); a restarted actor plays other episodes."""
    return config.seed * 1_000_000 + ctx.rank * 10_000 + ctx.restarts * 1_000


# ------------------------------------------------------------------- the model

def import_torch() -> Any:
    """torch, limited to one thread: the processes share a few cores."""
    import torch

    torch.set_num_threads(1)
    return torch


def _q_network(config: Config) -> Any:
    from torch import nn

    hidden = config.hidden
    return nn.Sequential(nn.Linear(config.obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, NUM_ACTIONS))


def _replay_fields(config: Config) -> dict[str, dict[str, Any]]:
    obs = {"shape": (config.obs_dim,)}
    return {"obs": obs, "act": {"dtype": np.int64}, "rew": {}, "next_obs": obs, "done": {},
            "discount": {}}  # discount: gamma**m


def _td_errors(online: Any, target: Any, batch: Mapping[str, np.ndarray]) -> Any:
    """Double-DQN TD errors ``y - Q(s, a)`` of n-step transitions (gradients flow through Q(s, a)).

    ``y = R + discount * (1 - done) * Q_target(s', argmax_a Q_online(s', a))``;
    the actors pass their one network as both.
    """
    import torch

    obs, next_obs = torch.from_numpy(batch["obs"]), torch.from_numpy(batch["next_obs"])
    act = torch.from_numpy(batch["act"]).unsqueeze(1)
    q = online(obs).gather(1, act).squeeze(1)
    with torch.no_grad():
        best = online(next_obs).argmax(1, keepdim=True)
        bootstrap = target(next_obs).gather(1, best).squeeze(1)
        keep = torch.from_numpy(batch["discount"] * (1.0 - batch["done"]))
        y = torch.from_numpy(batch["rew"]) + keep * bootstrap
    return y - q


# ---------------------------------------------------------------------- actors

def _actor(ctx: Context, config: Config) -> None:
    """Play CartPole on a vector of sub-environments with ε-greedy actions; push prioritized n-step transitions."""
    torch = import_torch()
    replay, log = ctx.buffer["replay"], ctx.buffer["episodes"]
    num_envs = config.envs_per_actor
    eps = actor_epsilons(ctx, config)
    seed = actor_seed(ctx, config)
    rng = np.random.default_rng(seed)
    env = vector_env(config)
    steps = VectorTransitions(env, nstep=config.nstep, gamma=config.gamma)
    net = _q_network(config)
    weights, version = net.state_dict(), -1  # the state dict's tensors share the network's memory
    pending: list[dict[str, np.ndarray]] = []
    pending_rows = 0
    obs, _ = env.reset(seed=seed)
    steps.reset(obs)
    episode, env_steps = 0, 0
    returns = np.zeros(num_envs)
    resetting = np.zeros(num_envs, bool)  # NextStep autoreset: these sub-environments' next step is a reset
    while not ctx.stop.is_set():
        newer = ctx.params.read_if_newer(version, out=weights)
        if newer is not None:
            version = newer[1]
        with torch.inference_mode():
            act = net(torch.from_numpy(obs)).argmax(1).numpy()
        explore = rng.random(num_envs) < eps
        act = np.where(explore, rng.integers(NUM_ACTIONS, size=num_envs), act)
        obs, rew, terminated, truncated, info = env.step(act)
        batch = steps.step(act, obs, rew, terminated, truncated, info)
        # The replay buffer neither folds nor compresses: rows of interleaved episodes go in as they come.
        pending.append(batch.rows)
        pending_rows += len(batch)
        env_steps += int(num_envs - resetting.sum())
        returns += rew
        resetting = terminated | truncated
        for e in np.flatnonzero(resetting):
            log.add(rank=ctx.rank, episode=episode, eps=eps[e], ret=returns[e], steps=env_steps, time=time.time())
            episode, returns[e] = episode + 1, 0.0
        if pending_rows >= config.actor_batch:
            rows = _concat(pending)
            pending, pending_rows = [], 0
            with torch.inference_mode():
                priorities = _td_errors(net, net, rows).abs().numpy()
            if not add_until_stopped(ctx, replay, rows, priorities=priorities):
                return


def _concat(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}


def add_until_stopped(ctx: Context, replay: Any, batch: Mapping[str, np.ndarray], **options: Any) -> bool:
    """``replay.add(**batch, **options)``, waiting as long as the rate limiter says; False if the run ends first."""
    while not ctx.stop.is_set():
        try:
            replay.add(timeout=WAIT, **options, **batch)
            return True
        except TimeoutError:
            continue
        except BufferClosed:
            break
    return False


# --------------------------------------------------------------------- learner

Loss = Callable[[Any, Any, Mapping[str, np.ndarray], Config], tuple[Any, np.ndarray]]


def run_learner(ctx: Context, config: Config, network: Callable[[Config], Any], loss_of: Loss,
                goal: float) -> dict[str, Any]:
    """The learner both agents run: sample, step, write priorities back, publish, sync the target network.

    ``loss_of(online, target, batch, config)`` returns the batch's loss (a scalar tensor,
    importance weights applied) and the sampled rows' new priorities.  Stops when the run
    does or when the greedy sub-environments average ``goal`` (see :class:`SolvedCheck`);
    returns the learner's counters.
    """
    torch = import_torch()

    torch.manual_seed(config.seed)
    replay = ctx.buffer["replay"]
    online = network(config)
    online.load_state_dict(ctx.params.read()[0])
    target = copy.deepcopy(online)
    optimizer = torch.optim.Adam(online.parameters(), lr=config.lr)
    counts = {"learner_steps": 0, "priority_updates": 0, "solved": False}
    solved = SolvedCheck(ctx.buffer["episodes"], goal)
    while not ctx.stop.is_set():
        if solved():
            counts["solved"] = True
            break
        try:
            batch = replay.sample(config.batch_size, config.beta, timeout=WAIT)
        except TimeoutError:
            continue
        except BufferClosed:
            break
        loss, priorities = loss_of(online, target, batch, config)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.parameters(), config.grad_clip)
        optimizer.step()
        replay.update_priorities(batch["indexes"], priorities)
        counts["priority_updates"] += len(priorities)
        counts["learner_steps"] = steps = counts["learner_steps"] + 1
        if steps % config.publish_every == 0:
            ctx.params.publish(online.state_dict())
        if steps % config.target_update == 0:
            target.load_state_dict(online.state_dict())
    return counts


def _loss(online: Any, target: Any, batch: Mapping[str, np.ndarray], config: Config) -> tuple[Any, np.ndarray]:
    """The importance-weighted Huber loss of the batch's TD errors, and their sizes as priorities."""
    import torch
    from torch.nn import functional as F

    td = _td_errors(online, target, batch)
    weights = torch.from_numpy(batch["weights"].astype(np.float32))
    loss = (weights * F.huber_loss(td, torch.zeros_like(td), reduction="none")).mean()
    return loss, td.detach().abs().numpy()


def _learner(ctx: Context, config: Config) -> dict[str, Any]:
    """Train until CartPole is solved or the run is stopped; return the learner's counters."""
    return run_learner(ctx, config, _q_network, _loss, APEX_SOLVED_RETURN)


class SolvedCheck:
    """Whether the greedy sub-environments' last WINDOW episodes average ``goal`` or more.

    A learner calls it every step; it reads the episode log at most every
    ``_SOLVED_CHECK`` seconds and answers False in between.
    """

    def __init__(self, log: MPReplayBuffer, goal: float):
        self._log, self._goal, self._next = log, goal, time.monotonic()

    def __call__(self) -> bool:
        if time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + _SOLVED_CHECK
        return _recent_mean(self._log.get_all_transitions()) >= self._goal


def _recent_mean(log_rows: Mapping[str, np.ndarray]) -> float:
    """Mean return of the last WINDOW greedy episodes of the log (-inf before there are that many)."""
    returns = log_rows["ret"][log_rows["eps"] <= GREEDY_EPSILON]
    return float(returns[-WINDOW:].mean()) if len(returns) >= WINDOW else -math.inf


# -------------------------------------------------------------------- the parent

@dataclass
class _Episodes:
    """Every finished episode, in the order the log holds them."""

    time: list[float]  # seconds since the run started
    env_steps: list[int]  # env steps of all actors so far
    ret: list[float]
    rank: list[int]
    eps: list[float]

    def arrays(self) -> dict[str, np.ndarray]:
        return {key: np.asarray(values) for key, values in asdict(self).items()}


def _running_mean(values: np.ndarray) -> np.ndarray:
    """Mean of the last WINDOW values (fewer at the start) at every position."""
    total = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - WINDOW, 0)
    return (total[ends] - total[starts]) / (ends - starts)


class _Monitor:
    """Reads the buffers' counters and the episode log; computes rates over the last few seconds."""

    def __init__(self, replay: MPPrioritizedReplayBuffer, log: MPReplayBuffer, params: ParameterStore,
                 start: float, goal: float):
        self._replay, self._log, self._params, self.start, self.goal = replay, log, params, start, goal
        self.episodes = _Episodes([], [], [], [], [])
        self._seen: dict[int, int] = {}  # rank -> last episode number read
        self._steps: dict[int, int] = {}  # rank -> env steps at its last episode
        # (time, env steps, inserts, samples) of the recent reads: rates span _RATE_SPAN seconds
        self._history: collections.deque[tuple[float, int, int, int]] = collections.deque([(start, 0, 0, 0)])

    def _drain(self) -> None:
        rows = self._log.get_all_transitions()
        for rank, episode, eps, ret, steps, when in zip(*(rows[k].tolist() for k in _EPISODE_FIELDS)):
            if episode <= self._seen.get(rank, -1):  # read before: the log keeps its rows
                continue
            self._seen[rank], self._steps[rank] = episode, steps
            self.episodes.time.append(when - self.start)
            self.episodes.env_steps.append(sum(self._steps.values()))
            self.episodes.ret.append(ret)
            self.episodes.rank.append(rank)
            self.episodes.eps.append(eps)

    def poll(self) -> dict[str, Any]:
        """A snapshot of the run: totals, recent rates, recent returns."""
        self._drain()
        stats = self._replay.stats()
        now = time.time()
        env_steps = sum(self._steps.values())
        current = (now, env_steps, stats["inserts"], stats["samples"])
        while len(self._history) > 1 and now - self._history[1][0] >= _RATE_SPAN:
            self._history.popleft()
        previous = self._history[0]
        self._history.append(current)
        dt = max(now - previous[0], 1e-9)
        rates = [(c - p) / dt for c, p in zip(current[1:], previous[1:])]
        episodes = self.episodes.arrays()
        return {
            "elapsed": now - self.start,
            "env_steps": env_steps, "env_steps_per_s": rates[0],
            "inserts": stats["inserts"], "inserts_per_s": rates[1],
            "samples": stats["samples"], "samples_per_s": rates[2],
            "stored": stats["stored"], "capacity": self._replay.get_buffer_size(),
            "episodes": len(episodes["ret"]),
            "mean_return_greedy": _recent_mean(episodes),
            "mean_return_all": float(episodes["ret"][-WINDOW:].mean()) if len(episodes["ret"]) else -math.inf,
            "stale_updates_dropped": stats["stale_updates_dropped"],
            "torn_rows_resampled": stats["torn_rows_resampled"],
            "weights_version": self._params.version,
            "goal": self.goal,
        }


def _number(value: float) -> str:
    return "-" if value == -math.inf else f"{value:.1f}"


def _live_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        ("elapsed", f"{s['elapsed']:.0f} s"),
        ("env steps/s", f"{s['env_steps_per_s']:,.0f}  ({s['env_steps']:,} in {s['episodes']:,} episodes)"),
        ("inserts/s", f"{s['inserts_per_s']:,.0f}"),
        ("samples/s", f"{s['samples_per_s']:,.0f}"),
        ("buffer fill", f"{s['stored']:,} / {s['capacity']:,}"),
        (f"return, last {WINDOW} episodes", (f"{_number(s['mean_return_all'])} (all actors)  "
                                             f"{_number(s['mean_return_greedy'])} (ε ≤ {GREEDY_EPSILON:g}; "
                                             f"solved at {s['goal']:g})")),
        ("stale updates dropped", f"{s['stale_updates_dropped']:,}"),
        ("weights published", f"{s['weights_version']:,}"),
    ]


def _plain_line(s: Mapping[str, Any]) -> str:
    return " | ".join(f"{name} {value}" for name, value in _live_rows(s))


def _use_rich(plain: bool) -> bool:
    if plain:
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def _live_view(plain: bool, title: str) -> Iterator[Any]:
    """A function that shows a snapshot: a rich Live table, or one printed line per call."""
    if not _use_rich(plain):
        yield lambda s: print(_plain_line(s), flush=True)
        return
    from rich.live import Live
    from rich.table import Table

    def table(s: Mapping[str, Any]) -> Table:
        t = Table(title=f"mpreplay demo: {title}", show_header=False)
        for name, value in _live_rows(s):
            t.add_row(name, value)
        return t

    with Live(refresh_per_second=4, transient=False) as live:
        yield lambda s: live.update(table(s))


def _watch(monitor: _Monitor, show: Any, done: threading.Event) -> None:
    while not done.wait(1.0):
        show(monitor.poll())


# ------------------------------------------------------------------- the report

def solve_point(episodes: Mapping[str, Sequence[float]], goal: float) -> tuple[float, int] | None:
    """(seconds, env steps) when the mean of the last WINDOW greedy returns first reached ``goal``.

    ``episodes``: the lists of a run's ``episodes.json`` (or its :class:`_Episodes`, as arrays).
    """
    ep = {key: np.asarray(values) for key, values in episodes.items()}
    greedy = np.flatnonzero(ep["eps"] <= GREEDY_EPSILON)
    full = np.arange(len(greedy)) >= WINDOW - 1
    hits = np.flatnonzero(full & (_running_mean(ep["ret"][greedy]) >= goal))
    if not len(hits):
        return None
    i = greedy[hits[0]]
    return float(ep["time"][i]), int(ep["env_steps"][i])


def _rounded(value: float) -> float | None:
    return None if value == -math.inf else round(value, 1)


def _summary(config: Config, agent: Agent, snapshot: Mapping[str, Any], learner: Mapping[str, Any] | None,
             episodes: _Episodes, reason: str) -> dict[str, Any]:
    solved = solve_point(episodes.arrays(), agent.solved_return)
    learner = learner or {}
    return {
        "agent": agent.name,
        "env": env_title(config),
        "solved_at": agent.solved_return,
        "reason": reason,
        "solved": solved is not None,
        "seconds_to_solve": None if solved is None else round(solved[0], 1),
        "env_steps_to_solve": None if solved is None else solved[1],
        "elapsed_seconds": round(snapshot["elapsed"], 1),
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "mean_return_last_20_greedy": _rounded(snapshot["mean_return_greedy"]),
        "mean_return_last_20_all": _rounded(snapshot["mean_return_all"]),
        "inserts": snapshot["inserts"],
        "samples": snapshot["samples"],
        "learner_steps": learner.get("learner_steps"),
        "priority_updates": learner.get("priority_updates"),
        "weights_published": snapshot["weights_version"],
        "stale_updates_dropped": snapshot["stale_updates_dropped"],
        "torn_rows_resampled": snapshot["torn_rows_resampled"],
        "config": asdict(config),
    }


def _print_summary(summary: Mapping[str, Any], plain: bool) -> None:
    rows = [(key, "-" if value is None else f"{value:,}" if isinstance(value, int) and not isinstance(value, bool)
             else str(value)) for key, value in summary.items() if key != "config"]
    if not _use_rich(plain):
        width = max(len(key) for key, _ in rows)
        print("\n".join(f"{key:<{width}}  {value}" for key, value in rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="summary", show_header=False)
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _plot(episodes: _Episodes, summary: Mapping[str, Any], path: str) -> None:
    """Returns against wall time and against env steps, with running means and the goal."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    ep = episodes.arrays()
    goal = summary["solved_at"]
    greedy = ep["eps"] <= GREEDY_EPSILON
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, label in ((axes[0], "time", "wall time (s)"), (axes[1], "env_steps", "env steps")):
        ax.scatter(ep[key], ep["ret"], s=4, alpha=0.3, c=ep["rank"], cmap="viridis", label="episodes (colour: actor)")
        ax.plot(ep[key], _running_mean(ep["ret"]), color="C0", linewidth=1, label=f"mean of the last {WINDOW}")
        ax.plot(ep[key][greedy], _running_mean(ep["ret"][greedy]), color="C3",
                label=f"mean of the last {WINDOW} with ε ≤ {GREEDY_EPSILON:g}")
        ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"solved ({goal:g})")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    axes[0].legend(loc="upper left", fontsize=7)
    solved = (f"solved in {summary['seconds_to_solve']:.0f} s, {summary['env_steps_to_solve']:,} env steps"
              if summary["solved"] else "not solved")
    fig.suptitle(f"{summary['agent']} on {summary['env']}, {summary['config']['actors']} actors: {solved}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ------------------------------------------------------------------- the agents

@dataclass(frozen=True)
class Agent:
    """What one of the demo's agents brings; the processes, live view, summary and plot are shared.

    ``actor`` and ``learner`` are the launched processes' functions (see
    :func:`~mpreplay.launch`); they find the replay buffer as ``ctx.buffer["replay"]``
    and the episode log as ``ctx.buffer["episodes"]``.
    """

    name: str  # what the live view and the plot call it
    description: str  # the first line of `mpreplay demo --help`
    config: type[Config]  # its settings: Config or a subclass with defaults and fields of its own
    solved_return: float  # the greedy sub-environments' mean return over WINDOW episodes that ends the run
    network: Callable[[Config], Any]  # a fresh Q-network; its state dict is what the learner publishes
    replay: Callable[[Config], Any]  # the shared replay buffer, with its rate limiter
    actor: Callable[[Context, Config], None]
    learner: Callable[[Context, Config], dict[str, Any]]
    arguments: Callable[[argparse.ArgumentParser, Config], None]  # its own flags beside the common ones
    positive: tuple[str, ...] = ()  # its own integer settings that must be >= 1
    module: str = __name__  # imported by the process server before it forks


def _apex_replay(config: Config) -> MPPrioritizedReplayBuffer:
    # The window lets every actor's batch in at once; SampleToInsertRatio centres it.
    slack = config.samples_per_insert * config.actor_batch * config.actors * 2 + config.batch_size
    limiter = SampleToInsertRatio(config.samples_per_insert, config.learning_starts, slack)
    return MPPrioritizedReplayBuffer(config.capacity, _replay_fields(config), alpha=config.alpha, seed=config.seed,
                                     rate_limiter=limiter)


def _apex_arguments(p: argparse.ArgumentParser, d: Config) -> None:
    p.add_argument("--hide-velocity", action="store_true",
                   help="observe only the cart position and the pole angle (a task for a recurrent agent)")


APEX = Agent("Ape-X DQN", __doc__.split("\n\n")[0], Config, APEX_SOLVED_RETURN, _q_network, _apex_replay, _actor,
             _learner, _apex_arguments)


def _agent(name: str) -> Agent:
    if name == "r2d2":
        from .demo_r2d2 import R2D2  # it builds on this module

        return R2D2
    return APEX


# ------------------------------------------------------------------------- main

def _parse(argv: Sequence[str] | None) -> tuple[Agent, Config]:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--agent", choices=("apex", "r2d2"), default="apex")
    agent = _agent(first.parse_known_args(argv)[0].agent)
    d = agent.config()
    p = argparse.ArgumentParser(prog="mpreplay demo", description=agent.description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--agent", choices=("apex", "r2d2"), default="apex",
                   help="apex: Ape-X DQN (feed-forward); r2d2: R2D2 (LSTM, sequence replay) with the velocities "
                        "hidden; `--agent r2d2 --help` lists its flags")
    p.add_argument("--actors", type=int, default=d.actors, help="actor processes")
    p.add_argument("--seconds", type=float, default=d.seconds, help="stop after this long if not solved")
    p.add_argument("--capacity", type=int, default=d.capacity, help="replay buffer size (transitions or steps)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="learner batch size (transitions or sequences)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="folder for summary.json and learning_curve.png")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=d.gamma, help="discount factor")
    p.add_argument("--nstep", type=int, default=d.nstep, help="steps of reward in a target")
    p.add_argument("--hidden", type=int, default=d.hidden, help="units in each hidden layer")
    p.add_argument("--target-update", type=int, default=d.target_update, help="learner steps between target syncs")
    p.add_argument("--publish-every", type=int, default=d.publish_every, help="learner steps between publishes")
    p.add_argument("--learning-starts", type=int, default=d.learning_starts, help="rows stored before sampling")
    p.add_argument("--samples-per-insert", type=float, default=d.samples_per_insert,
                   help="sampled rows per inserted row, kept by the rate limiter")
    p.add_argument("--alpha", type=float, default=d.alpha, help="priority exponent")
    p.add_argument("--beta", type=float, default=d.beta, help="importance-sampling exponent")
    p.add_argument("--actor-batch", type=int, default=d.actor_batch, help="rows an actor adds at once")
    p.add_argument("--envs-per-actor", type=int, default=d.envs_per_actor,
                   help="CartPole sub-environments each actor steps as one vector env")
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient norm limit")
    p.add_argument("--plain", action="store_true", help="print one line per second instead of a rich table")
    agent.arguments(p, d)
    args = vars(p.parse_args(argv))
    del args["agent"]
    for name in ("actors", "capacity", "batch_size", "nstep", "hidden", "target_update", "publish_every",
                 "learning_starts", "actor_batch", "envs_per_actor", *agent.positive):
        if args[name] < 1:
            p.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {args[name]}")
    if not args["seconds"] > 0:
        p.error(f"--seconds: expected a positive number, got {args['seconds']}")
    if args["learning_starts"] > args["capacity"]:
        p.error(f"--learning-starts ({args['learning_starts']}) exceeds --capacity ({args['capacity']})")
    try:
        return agent, agent.config(**args)
    except ValueError as exc:  # a check across an agent's own settings
        p.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit status (0, or 130 after Ctrl-C)."""
    agent, config = _parse(argv)
    try:
        import gymnasium  # noqa: F401  (checked here: a child would only fail later)
        import_torch()
    except ImportError as exc:
        print(f"mpreplay demo needs PyTorch and gymnasium (the 'examples' extra): {exc}", file=sys.stderr)
        return 1
    ladder = config.actors * config.envs_per_actor
    if epsilon(ladder - 1, ladder) > GREEDY_EPSILON:
        print(f"note: no sub-environment explores with ε ≤ {GREEDY_EPSILON:g} (that takes 2 or more, over all "
              "actors), so the run cannot be judged solved; it ends at --seconds", file=sys.stderr)
    os.makedirs(config.out, exist_ok=True)
    summary, episodes = _run(agent, config)
    with open(os.path.join(config.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(config.out, "episodes.json"), "w") as f:
        json.dump(asdict(episodes), f)
    _plot(episodes, summary, os.path.join(config.out, "learning_curve.png"))
    _print_summary(summary, config.plain)
    print(f"wrote {config.out}/summary.json, episodes.json and learning_curve.png")
    return 130 if summary["reason"] == "interrupted" else 0


def _run(agent: Agent, config: Config) -> tuple[dict[str, Any], _Episodes]:
    """Create the shared buffers and the parameter store, run the processes, watch them."""
    import_torch().manual_seed(config.seed)  # the initial weights, published as version 0
    # The processes fork from a server that has imported torch and gymnasium
    # once, instead of importing them each (seconds apiece on a busy machine).
    # The server only imports torch; forking after torch has run is what can deadlock.
    multiprocessing.set_forkserver_preload(["torch", "gymnasium", agent.module])
    reason, learner = "interrupted", None
    with ExitStack() as resources:
        replay = resources.enter_context(agent.replay(config))
        log = resources.enter_context(MPReplayBuffer(_EPISODE_LOG_SIZE, _EPISODE_FIELDS))
        params = resources.enter_context(ParameterStore(agent.network(config).state_dict()))
        monitor = _Monitor(replay, log, params, time.time(), agent.solved_return)
        done = threading.Event()
        with _live_view(config.plain, f"{agent.name} on {env_title(config)}") as show:
            watcher = threading.Thread(target=_watch, args=(monitor, show, done), daemon=True)
            watcher.start()
            try:
                result = launch({"replay": replay, "episodes": log}, actors=(agent.actor, config.actors),
                                learner=agent.learner, params=params, args=(config,), start_method="forkserver",
                                timeout=config.seconds, close=False)
                learner = result.value
                reason = "solved" if learner and learner["solved"] else result.reason
            except KeyboardInterrupt:
                pass  # launch has stopped the processes; the summary still gets written
            finally:
                done.set()
                watcher.join()  # before the buffers close under it
            snapshot = monitor.poll()
            show(snapshot)
    return _summary(config, agent, snapshot, learner, monitor.episodes, reason), monitor.episodes
