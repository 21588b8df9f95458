"""Ape-X DQN on CartPole: actor processes and a learner around one shared prioritized buffer.

Run it with ``mpreplay demo`` (or ``python examples/apex_dqn.py``); it needs
PyTorch and gymnasium, and shows a live view with rich when rich is installed.
``mpreplay demo --env atari`` runs the same agent on an Atari game's pixels: the
actor and the compressed buffer of that task are :mod:`mpreplay.demo.apex_atari`,
the learner (and its loss) is this one with the Nature CNN.

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
cannot solve, and the recurrent agent of ``--agent r2d2`` (:mod:`mpreplay.demo.r2d2`)
can.  Both agents share the demo's processes, live view, summary and plot
(:class:`~mpreplay.demo.processes.Agent` names what differs).

The processes fork from a server that has imported torch once (start method
"forkserver"), and each sets ``torch.set_num_threads(1)``: they share a few
cores, and a thread pool apiece would only add contention.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..buffers import MPPrioritizedReplayBuffer
from ..launcher import Context
from ..limiter import SampleToInsertRatio
from ..vector_env import VectorTransitions
from .processes import Agent, add_until_stopped, import_torch, run_learner
from .task import NUM_ACTIONS, Config, actor_epsilons, actor_seed, vector_env

__all__ = ["APEX", "APEX_SOLVED_RETURN"]

APEX_SOLVED_RETURN = 475.0  # CartPole-v1's reward threshold


def _q_network(config: Config) -> Any:
    if config.env == "atari":
        from .apex_atari import atari_network
        from .atari import num_actions

        return atari_network(config, num_actions(config))  # type: ignore[arg-type]
    from torch import nn

    hidden = config.hidden
    return nn.Sequential(
        nn.Linear(config.obs_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_ACTIONS),
    )


def _replay_fields(config: Config) -> dict[str, dict[str, Any]]:
    obs = {"shape": (config.obs_dim,)}
    return {
        "obs": obs,
        "act": {"dtype": np.int64},
        "rew": {},
        "next_obs": obs,
        "done": {},
        "discount": {},
    }  # discount: gamma**m


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


def _actor(ctx: Context, config: Config) -> None:
    """Play CartPole on a vector of sub-environments with ε-greedy actions; push prioritized n-step transitions."""
    if config.env == "atari":
        from .apex_atari import atari_actor

        return atari_actor(ctx, config)  # type: ignore[arg-type]
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


def _loss(online: Any, target: Any, batch: Mapping[str, np.ndarray], config: Config) -> tuple[Any, np.ndarray]:
    """The importance-weighted Huber loss of the batch's TD errors, and their sizes as priorities."""
    import torch
    from torch.nn import functional as F

    td = _td_errors(online, target, batch)
    weights = torch.from_numpy(batch["weights"].astype(np.float32))
    loss = (weights * F.huber_loss(td, torch.zeros_like(td), reduction="none")).mean()
    return loss, td.detach().abs().numpy()


def _learner(ctx: Context, config: Config) -> dict[str, Any]:
    """Train until the task is solved (CartPole) or the run is stopped; return the learner's counters."""
    return run_learner(ctx, config, _q_network, _loss, APEX.goal(config))


def _apex_replay(config: Config) -> MPPrioritizedReplayBuffer:
    if config.env == "atari":
        from .apex_atari import atari_replay

        return atari_replay(config)  # type: ignore[arg-type]
    # The window lets every actor's batch in at once; SampleToInsertRatio centres it.
    slack = config.samples_per_insert * config.actor_batch * config.actors * 2 + config.batch_size
    limiter = SampleToInsertRatio(config.samples_per_insert, config.learning_starts, slack)
    return MPPrioritizedReplayBuffer(
        config.capacity,
        _replay_fields(config),
        alpha=config.alpha,
        seed=config.seed,
        rate_limiter=limiter,
        **config.table_options(),
    )


def _apex_arguments(p: argparse.ArgumentParser, d: Config) -> None:
    if d.env != "cartpole":
        return
    p.add_argument(
        "--hide-velocity",
        action="store_true",
        help="observe only the cart position and the pole angle (a task for a recurrent agent)",
    )


APEX = Agent(
    "Ape-X DQN",
    __doc__.split("\n\n")[0],
    Config,
    APEX_SOLVED_RETURN,
    _q_network,
    _apex_replay,
    _actor,
    _learner,
    _apex_arguments,
    module=__name__,
    envs=("cartpole", "atari"),
)
