"""What the processes of both agents share: the learner's loop, adds that wait for the rate limiter,
the check that ends a solved run, and :class:`Agent`, what an agent brings."""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import MPReplayBuffer
from ..errors import BufferClosed
from ..launcher import Context
from .task import Config, recent_mean, run_seed

__all__ = [
    "LEARNER_COUNTERS",
    "WAIT",
    "Agent",
    "Loss",
    "SolvedCheck",
    "add_until_stopped",
    "import_torch",
    "learner_state",
    "load_learner_state",
    "make_optimizer",
    "run_learner",
]

WAIT = 0.2  # seconds a blocked add/sample waits before the caller looks at the stop flag again
_SOLVED_CHECK = 0.5  # seconds between the learner's looks at the episode log
# The learner's counters that a checkpoint keeps (beside "solved", which a resumed run judges anew).
LEARNER_COUNTERS = ("learner_steps", "priority_updates")


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
    module: str  # its module, imported by the process server before it forks
    positive: tuple[str, ...] = ()  # its own integer settings that must be >= 1
    envs: tuple[str, ...] = ("cartpole",)  # the tasks it plays (`--env`)

    def goal(self, config: Config) -> float | None:
        """The return that ends a run of ``config``'s task as solved; None: it ends at ``--seconds``."""
        return self.solved_return if config.solvable else None


def import_torch() -> Any:
    """torch, limited to one thread: the processes share a few cores."""
    import torch

    torch.set_num_threads(1)
    return torch


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


Loss = Callable[[Any, Any, Mapping[str, np.ndarray], Config], tuple[Any, np.ndarray]]


def make_optimizer(online: Any, config: Config) -> Any:
    """The learner's optimizer of ``online``'s parameters."""
    return import_torch().optim.Adam(online.parameters(), lr=config.lr)


def learner_state(online: Any, target: Any, optimizer: Any, counts: Mapping[str, Any]) -> dict[str, Any]:
    """The learner's whole state as tensors by name (a :class:`~mpreplay.params.ParameterStore`
    publishes it, ``np.savez`` writes it): ``online.*`` and ``target.*`` (the networks' state
    dicts), ``optimizer.<parameter>.<name>`` (the optimizer's per-parameter state; its settings
    are the run's flags) and ``counters`` (:data:`LEARNER_COUNTERS`)."""
    import torch

    state = {f"online.{key}": value for key, value in online.state_dict().items()}
    state.update({f"target.{key}": value for key, value in target.state_dict().items()})
    for index, entries in optimizer.state_dict()["state"].items():
        for name, value in entries.items():
            state[f"optimizer.{index}.{name}"] = value
    state["counters"] = torch.tensor([counts[key] for key in LEARNER_COUNTERS], dtype=torch.int64)
    return state


def load_learner_state(state: Mapping[str, Any], online: Any, target: Any, optimizer: Any) -> dict[str, int]:
    """Load what :func:`learner_state` gave (tensors or arrays) into the networks and the
    optimizer; return the counters."""
    import torch

    parts: dict[str, dict[str, Any]] = {"online": {}, "target": {}, "optimizer": {}}
    for key, value in state.items():
        part, _, name = key.partition(".")
        if part in parts:
            parts[part][name] = torch.as_tensor(value)
    online.load_state_dict(parts["online"])
    target.load_state_dict(parts["target"])
    per_parameter: dict[int, dict[str, Any]] = {}
    for key, value in parts["optimizer"].items():
        index, _, name = key.partition(".")
        per_parameter.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": per_parameter, "param_groups": optimizer.state_dict()["param_groups"]})
    return {key: int(count) for key, count in zip(LEARNER_COUNTERS, np.asarray(state["counters"]), strict=True)}


def run_learner(
    ctx: Context, config: Config, network: Callable[[Config], Any], loss_of: Loss, goal: float | None
) -> dict[str, Any]:
    """The learner both agents run: sample, step, write priorities back, publish, sync the target network.

    ``loss_of(online, target, batch, config)`` returns the batch's loss (a scalar tensor,
    importance weights applied) and the sampled rows' new priorities.  With ``config.prefetch``
    the batches are drawn that many steps ahead on a background thread (``batches()``) while
    this one trains.  Stops when the run does or when the greedy sub-environments average
    ``goal`` (see :class:`SolvedCheck`; None: never); returns the learner's counters.

    A run that checkpoints gives the learner a second store, ``ctx.buffer["learner"]``: the
    learner publishes its whole state there (:func:`learner_state`) with its weights and once
    more when it stops, for the parent to write; a resumed run's learner starts from the state
    that store holds (``config.resumes``).
    """
    torch = import_torch()

    torch.manual_seed(run_seed(config))
    replay = ctx.buffer["replay"]
    store = ctx.buffer.get("learner")
    online = network(config)
    online.load_state_dict(ctx.params.read()[0])
    target = copy.deepcopy(online)
    optimizer = make_optimizer(online, config)
    counts = {"learner_steps": 0, "priority_updates": 0, "solved": False}
    if store is not None and config.resumes:
        counts.update(load_learner_state(store.read()[0], online, target, optimizer))
    solved = SolvedCheck(ctx.buffer["episodes"], goal)
    for batch in _batches(ctx, replay, config):
        if solved():
            counts["solved"] = True
            break
        loss, priorities = loss_of(online, target, batch, config)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.parameters(), config.grad_clip)
        optimizer.step()
        replay.update_priorities(batch["indexes"], priorities)
        counts["priority_updates"] += len(priorities)
        counts["learner_steps"] = steps = counts["learner_steps"] + 1
        if steps % config.target_update == 0:
            target.load_state_dict(online.state_dict())
        if steps % config.publish_every == 0:
            ctx.params.publish(online.state_dict())
            if store is not None:
                store.publish(learner_state(online, target, optimizer, counts))
    if store is not None and counts["learner_steps"]:
        store.publish(learner_state(online, target, optimizer, counts))
    return counts


def _batches(ctx: Context, replay: Any, config: Config) -> Iterator[dict[str, np.ndarray]]:
    """The learner's batches until the run stops or the buffer closes: sampled in turn, or
    ``config.prefetch`` ahead (a batch stays valid until the next one is asked for)."""
    while not ctx.stop.is_set():
        try:
            if not config.prefetch:
                yield replay.sample(config.batch_size, config.beta, timeout=WAIT)
                continue
            # A wait on the rate limiter longer than WAIT ends the prefetcher: look at the stop
            # flag, then start another.
            with replay.batches(config.batch_size, config.beta, prefetch=config.prefetch, timeout=WAIT) as batches:
                for batch in batches:
                    yield batch
                    if ctx.stop.is_set():
                        return
        except TimeoutError:
            continue
        except BufferClosed:
            return


class SolvedCheck:
    """Whether the greedy sub-environments' last WINDOW episodes average ``goal`` or more.

    A learner calls it every step; it reads the episode log at most every
    ``_SOLVED_CHECK`` seconds and answers False in between.
    """

    def __init__(self, log: MPReplayBuffer, goal: float | None):
        self._log, self._goal, self._next = log, goal, time.monotonic()

    def __call__(self) -> bool:
        if self._goal is None or time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + _SOLVED_CHECK
        return recent_mean(self._log.get_all_transitions()) >= self._goal
