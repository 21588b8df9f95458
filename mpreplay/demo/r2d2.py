"""R2D2 on CartPole with the velocities hidden: recurrent actors and a learner around one shared sequence buffer.

Run it with ``mpreplay demo --agent r2d2`` (or ``python examples/r2d2_cartpole.py``).
The actors observe only the cart position and the pole angle: the velocities
must be inferred from the observations before, which a feed-forward Q-network
cannot do (``mpreplay demo --hide-velocity`` shows Ape-X failing at it).

::

    actors (ε ladder, LSTM)                                          learner
    vector env ─> steps + the LSTM state (h, c) each started from ─add─> sequence buffer ─sample─> burn-in, n-step
                                                                          ^                          double Q step
                                                                          └──update_priorities───────┤
    weights <──────────────────── ParameterStore <───────── publish every K steps ──────────────────┘

* Every actor steps ``--envs-per-actor`` CartPoles (the Ape-X ε ladder over all
  sub-environments, as in :mod:`mpreplay.demo.apex`), each written through an
  :meth:`~mpreplay.ReplayBuffer.episode_writer` of its own so that an episode's
  steps sit together in one lane.  A step is stored with the LSTM state it
  started from; the state is reset to zeros when an episode ends.
* The shared :class:`~mpreplay.MPPrioritizedSequenceReplayBuffer` cuts each
  episode into sequences of ``--length`` steps, one starting every ``--period``
  steps, the last one padded; a new sequence gets the largest priority stored.
* The learner unrolls the online LSTM from each sequence's stored first state.
  The first ``--burn-in`` steps only refresh that (stale) state and are not
  trained on, unless the sequence starts its episode, whose stored state (zeros)
  is exact.  Targets are double-Q n-step returns computed inside the sequence
  (:func:`nstep_targets`): a step whose n-step window leaves the sequence before
  the episode ends has no target and is left out, as are padding steps.  The
  sequences' new priorities follow R2D2's rule (:func:`~mpreplay.sequence_priority`).
  No value rescaling: CartPole's discounted returns stay below 100.

Default sizes are chosen for two CPU cores: sequences of 40 steps with a burn-in
of 10 and a period of 20 (R2D2's 80/40/40 triple the learner's cost per trained
step on a task whose memory needs a few steps: the velocities follow from two
consecutive positions), batches of 32 sequences, an LSTM of 64 units.

CartPole counts as solved when the last 20 episodes of the greedy end of the
ladder (ε ≤ 0.01) average 400 or more.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import MPPrioritizedSequenceReplayBuffer, ReplayBuffer
from ..launcher import Context
from ..limiter import SampleToInsertRatio
from ..sequences import sequence_priority
from .processes import Agent, add_until_stopped, import_torch, run_learner
from .task import NUM_ACTIONS, Config, actor_epsilons, actor_seed, vector_env

__all__ = ["R2D2", "R2D2_SOLVED_RETURN", "R2D2Config", "nstep_targets", "trained_steps"]

R2D2_SOLVED_RETURN = 400.0


@dataclass(frozen=True)
class R2D2Config(Config):
    """The demo's settings for R2D2: sizes count steps (capacity, learning_starts, actor_batch) or
    sequences (batch_size, samples_per_insert: sampled sequences per inserted step)."""

    capacity: int = 100_000
    out: str = "./mpreplay-demo-r2d2"
    target_update: int = 100
    publish_every: int = 10
    learning_starts: int = 2_000
    samples_per_insert: float = 2.0
    actor_batch: int = 16
    hide_velocity: bool = True
    length: int = 20
    period: int = 10
    burn_in: int = 5
    eta: float = 0.9

    def __post_init__(self) -> None:
        if not 0 <= self.burn_in < self.length:
            raise ValueError(f"--burn-in: expected 0 <= burn-in < --length ({self.length}), got {self.burn_in}")
        if not 1 <= self.period <= self.length:
            raise ValueError(f"--period: expected 1 <= period <= --length ({self.length}), got {self.period}")
        if self.capacity // self.lanes < self.length:
            raise ValueError(
                f"--capacity: {self.capacity} steps over {self.lanes} lanes (one per sub-environment) "
                f"leave fewer than --length ({self.length}) steps per lane"
            )

    @property
    def lanes(self) -> int:
        """Writers at once: one per sub-environment of every actor."""
        return self.actors * self.envs_per_actor


# ------------------------------------------------------------------- the model


def _q_network(config: Config) -> Any:
    from torch import nn

    hidden = config.hidden
    return nn.ModuleDict(
        {
            "encode": nn.Sequential(nn.Linear(config.obs_dim, hidden), nn.ReLU()),
            "lstm": nn.LSTM(hidden, hidden, batch_first=True),
            "head": nn.Linear(hidden, NUM_ACTIONS),
        }
    )


def _unroll(net: Any, obs: Any, state: tuple[Any, Any]) -> tuple[Any, tuple[Any, Any]]:
    """Q-values ``(B, T, actions)`` of ``obs`` ``(B, T, obs_dim)`` from the LSTM state ``(h, c)``, each
    ``(B, hidden)``; and the state after the last step."""
    out, (h, c) = net["lstm"](net["encode"](obs), (state[0].unsqueeze(0), state[1].unsqueeze(0)))
    return net["head"](out), (h.squeeze(0), c.squeeze(0))


def _replay_fields(config: R2D2Config) -> dict[str, dict[str, Any]]:
    state = {"shape": (config.hidden,)}
    # first: the step starts its episode (the learner trains a sequence starting there from its first step)
    return {
        "obs": {"shape": (config.obs_dim,)},
        "act": {"dtype": np.int64},
        "rew": {},
        "done": {},
        "truncated": {},
        "first": {"dtype": np.bool_},
        "h": state,
        "c": state,
    }


def _replay(config: R2D2Config) -> MPPrioritizedSequenceReplayBuffer:
    # Inserts count steps and samples count sequences; the window lets every writer's batch in at once.
    slack = config.samples_per_insert * config.actor_batch * config.lanes * 2 + config.batch_size
    limiter = SampleToInsertRatio(config.samples_per_insert, config.learning_starts, slack)
    return MPPrioritizedSequenceReplayBuffer(
        config.capacity,
        _replay_fields(config),
        length=config.length,
        period=config.period,
        pad_end=True,
        lanes=config.lanes,
        alpha=config.alpha,
        eta=config.eta,
        seed=config.seed,
        rate_limiter=limiter,
        **config.table_options(),
    )


# ---------------------------------------------------------------------- targets


def _shifted(x: Any, k: int, fill: Any) -> Any:
    """``x[:, t + k]`` at every ``t`` of ``(B, L)`` ``x``; ``fill`` past the end."""
    import torch

    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], 1) if k < x.shape[1] else torch.full_like(x, fill)


def nstep_targets(rew: Any, done: Any, mask: Any, bootstrap: Any, gamma: float, n: int) -> tuple[Any, Any]:
    """n-step targets of every step of ``(B, L)`` sequences, computed inside each sequence.

    ``y_t = r_t + γ r_{t+1} + … + γ^{n-1} r_{t+n-1} + γ^n bootstrap_{t+n}``, the sum ending at
    the first step whose ``done`` is set (no bootstrap then).  ``mask`` marks real steps
    (False: padding, which also follows an episode's last step).  Returns ``(y, defined)``:
    ``y_t`` is defined where step ``t`` is real and its episode either terminates within the
    n steps or step ``t + n`` is real (a step whose window leaves the sequence first, or ends
    at a truncation, has no target).  All inputs are tensors; ``done`` and ``mask`` bool.
    """
    import torch

    y = torch.zeros_like(rew)
    running = mask.clone()  # steps t..t+k are real and none of t..t+k-1 terminated
    ended = torch.zeros_like(mask)
    for k in range(n):
        running = running & _shifted(mask, k, False)
        y = y + (gamma**k) * torch.where(running, _shifted(rew, k, 0.0), torch.zeros_like(rew))
        terminal = running & _shifted(done, k, False)
        ended = ended | terminal
        running = running & ~terminal
    bootstrapped = running & _shifted(mask, n, False)
    y = y + (gamma**n) * torch.where(bootstrapped, _shifted(bootstrap, n, 0.0), torch.zeros_like(rew))
    return y, ended | bootstrapped


def trained_steps(first: np.ndarray, burn_in: int) -> np.ndarray:
    """The burn-in split: ``(B, L)`` bools, True at the steps a learner trains on.

    ``first`` is the sample's ``(B, L)`` "step starts its episode" field.  A sequence's
    first ``burn_in`` steps only bring its stored LSTM state up to date with the current
    weights, unless the sequence starts an episode: its stored state (zeros) is exact,
    so every step of it is trained on.
    """
    first = np.asarray(first, dtype=bool)
    if first.ndim != 2:
        raise ValueError(f"first: expected a (batch, length) array, got shape {first.shape}")
    return (np.arange(first.shape[1]) >= burn_in)[None, :] | first[:, :1]


def _td_errors(online: Any, target: Any, batch: Mapping[str, np.ndarray], config: R2D2Config) -> tuple[Any, Any]:
    """Double-Q n-step TD errors ``y - Q(s, a)`` ``(B, L)`` of sampled sequences (gradients flow through
    Q(s, a)), and where they count: ``(B, L)`` bools."""
    import torch

    obs = torch.from_numpy(batch["obs"])
    state = (torch.from_numpy(batch["h"][:, 0]), torch.from_numpy(batch["c"][:, 0]))
    burn = config.burn_in
    # Gradients stop at the end of the burn-in: those steps train only sequences that start an episode.
    if burn:
        q_burn, after = _unroll(online, obs[:, :burn], state)
        q_rest, _ = _unroll(online, obs[:, burn:], (after[0].detach(), after[1].detach()))
        q = torch.cat([q_burn, q_rest], 1)
    else:
        q, _ = _unroll(online, obs, state)
    with torch.no_grad():
        q_target, _ = _unroll(target, obs, state)
        bootstrap = q_target.gather(2, q.argmax(2, keepdim=True)).squeeze(2)
        mask = torch.from_numpy(batch["mask"])
        y, defined = nstep_targets(
            torch.from_numpy(batch["rew"]),
            torch.from_numpy(batch["done"] > 0),
            mask,
            bootstrap,
            config.gamma,
            config.nstep,
        )
    taken = q.gather(2, torch.from_numpy(batch["act"]).unsqueeze(2)).squeeze(2)
    counted = defined & torch.from_numpy(trained_steps(batch["first"], burn))
    return y - taken, counted


# ---------------------------------------------------------------------- actors


class _Pending:
    """Each sub-environment's steps not yet added: arrays of ``actor_batch`` rows, filled in place."""

    def __init__(self, fields: Mapping[str, Mapping[str, Any]], num_envs: int, rows: int):
        self.arrays = {
            key: np.zeros((num_envs, rows, *spec.get("shape", ())), spec.get("dtype", np.float32))
            for key, spec in fields.items()
        }
        self.count = np.zeros(num_envs, np.int64)
        self.rows = rows

    def put(self, **columns: np.ndarray) -> None:
        """One step of every sub-environment."""
        e = np.arange(len(self.count))
        for key, values in columns.items():
            self.arrays[key][e, self.count] = values
        self.count += 1

    def take(self, e: int) -> dict[str, np.ndarray]:
        """Sub-environment ``e``'s pending steps (views, valid until its next put)."""
        n, self.count[e] = self.count[e], 0
        return {key: array[e, :n] for key, array in self.arrays.items()}


def _actor(ctx: Context, config: R2D2Config) -> None:
    """Play CartPole with the LSTM's ε-greedy actions; store every step with the state it started from."""
    from gymnasium.vector import AutoresetMode

    torch = import_torch()
    replay, log = ctx.buffer["replay"], ctx.buffer["episodes"]
    num_envs = config.envs_per_actor
    eps = actor_epsilons(ctx, config)
    seed = actor_seed(ctx, config)
    rng = np.random.default_rng(seed)
    # Same-step autoreset: an episode's last step returns the next episode's first observation.
    env = vector_env(config, autoreset_mode=AutoresetMode.SAME_STEP)
    writers: list[ReplayBuffer] = [replay.episode_writer() for _ in range(num_envs)]  # a lane each
    pending = _Pending(_replay_fields(config), num_envs, config.actor_batch)
    net = _q_network(config)
    weights, version = net.state_dict(), -1  # the state dict's tensors share the network's memory
    h, c = torch.zeros(num_envs, config.hidden), torch.zeros(num_envs, config.hidden)
    obs, _ = env.reset(seed=seed)
    first = np.ones(num_envs, bool)
    episode, env_steps = 0, 0
    returns = np.zeros(num_envs)
    while not ctx.stop.is_set():
        newer = ctx.params.read_if_newer(version, out=weights)
        if newer is not None:
            version = newer[1]
        with torch.no_grad():
            q, (h_next, c_next) = _unroll(net, torch.from_numpy(obs).unsqueeze(1), (h, c))
        act = q[:, 0].argmax(1).numpy()
        explore = rng.random(num_envs) < eps
        act = np.where(explore, rng.integers(NUM_ACTIONS, size=num_envs), act)
        next_obs, rew, terminated, truncated, _ = env.step(act)
        pending.put(
            obs=obs, act=act, rew=rew, done=terminated, truncated=truncated, first=first, h=h.numpy(), c=c.numpy()
        )
        ended = terminated | truncated
        h, c = h_next, c_next
        h[torch.from_numpy(ended)], c[torch.from_numpy(ended)] = 0.0, 0.0
        obs, first = next_obs, ended
        env_steps += num_envs
        returns += rew
        for e in np.flatnonzero(ended | (pending.count >= pending.rows)):
            if not add_until_stopped(ctx, writers[e], pending.take(e)):
                return
        for e in np.flatnonzero(ended):
            log.add(rank=ctx.rank, episode=episode, eps=eps[e], ret=returns[e], steps=env_steps, time=time.time())
            episode, returns[e] = episode + 1, 0.0


# --------------------------------------------------------------------- learner


def _loss(online: Any, target: Any, batch: Mapping[str, np.ndarray], config: R2D2Config) -> tuple[Any, np.ndarray]:
    """The importance-weighted Huber loss over the steps with a target, and R2D2's sequence priorities."""
    import torch
    from torch.nn import functional as F

    td, counted = _td_errors(online, target, batch, config)
    weights = torch.from_numpy(batch["weights"].astype(np.float32)).unsqueeze(1)
    per_step = F.huber_loss(td, torch.zeros_like(td), reduction="none") * counted
    loss = (weights * per_step).sum() / counted.sum().clamp(min=1)
    return loss, _priorities(td.detach().abs().numpy(), counted.numpy(), batch["mask"], config.eta)


def _learner(ctx: Context, config: R2D2Config) -> dict[str, Any]:
    """Train until the greedy sub-environments average R2D2_SOLVED_RETURN or the run is stopped."""
    return run_learner(ctx, config, _q_network, _loss, R2D2_SOLVED_RETURN)


def _priorities(abs_td: np.ndarray, counted: np.ndarray, mask: np.ndarray, eta: float) -> np.ndarray:
    """R2D2's rule over the steps that had a target; a sequence with none (a short tail cut by a
    truncation) gets the rule over zeros, the lowest priority."""
    has_any = counted.any(1, keepdims=True)
    return sequence_priority(np.where(counted, abs_td, 0.0), np.where(has_any, counted, mask), eta=eta)


def _arguments(p: argparse.ArgumentParser, d: R2D2Config) -> None:
    p.add_argument("--length", type=int, default=d.length, help="steps per sampled sequence")
    p.add_argument("--period", type=int, default=d.period, help="steps between the starts of an episode's sequences")
    p.add_argument(
        "--burn-in",
        type=int,
        default=d.burn_in,
        help="first steps of a sequence that only refresh its stored LSTM state",
    )
    p.add_argument("--eta", type=float, default=d.eta, help="R2D2's priority mix: eta * max + (1 - eta) * mean")


R2D2 = Agent(
    "R2D2",
    __doc__.split("\n\n")[0],
    R2D2Config,
    R2D2_SOLVED_RETURN,
    _q_network,
    _replay,
    _actor,
    _learner,
    _arguments,
    module=__name__,
    positive=("length", "period"),
)
