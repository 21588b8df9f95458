"""cpprb's ``HindsightReplayBuffer``: Hindsight Experience Replay (Andrychowicz et al. 2017).

Steps of the running episode wait in a small episode buffer; at the episode's
end they are stored with the episode's goal and, relabelled, with goals the
episode did reach (by the chosen strategy), each with its reward recomputed by
``reward_func``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import numpy as np

from ... import checks
from ...spec import EnvDict
from .buffers import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["HindsightReplayBuffer"]

_STRATEGIES = ("future", "episode", "random", "final")


class HindsightReplayBuffer:
    """Replay buffer relabelling episodes with achieved goals (cpprb's signature).

    Parameters
    ----------
    size : int
        Capacity of the main buffer.
    env_dict : dict of dict
        Fields of a step (without ``rew`` and ``goal``, which are added).
    max_episode_len : int
        Longest episode; adding more steps to one raises ValueError.
    reward_func : callable
        ``reward_func(next_state, action, goal)`` on batches.
    goal_func : callable, optional
        Goal achieved by a batch of states (identity when None).
    goal_shape : iterable of int, optional
        Shape of a goal (the state's when None).
    state, action, next_state : str
        Names of those fields.
    strategy : {"future", "episode", "random", "final"}
        Where relabelled goals come from: a later step of the episode, any step of it, any
        stored transition, or its last step.
    additional_goals : int
        Relabelled copies per step (1 for "final").
    prioritized : bool
        Prioritized main buffer.
    **kwargs
        Options of the main buffer.
    """

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        max_episode_len: int,
        reward_func: Callable,
        *,
        goal_func: Callable | None = None,
        goal_shape: Iterable[int] | None = None,
        state: str = "obs",
        action: str = "act",
        next_state: str = "next_obs",
        strategy: str = "future",
        additional_goals: int = 4,
        prioritized: bool = True,
        **kwargs: Any,
    ):
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy: expected one of {list(_STRATEGIES)}, got {strategy!r}")
        for option, name in (("state", state), ("action", action), ("next_state", next_state)):
            if name not in env_dict:
                raise ValueError(f"{option}: {name!r} is not a field of env_dict (fields {list(env_dict)})")
        self.max_episode_len = checks.integer("max_episode_len", max_episode_len, low=1)
        self.reward_func = reward_func
        self.goal_func = goal_func or (lambda s: s)
        self.state, self.action, self.next_state = state, action, next_state
        self.strategy = strategy
        self.additional_goals = (
            1 if strategy == "final" else checks.integer("additional_goals", additional_goals, low=0)
        )
        self.prioritized = checks.flag("prioritized", prioritized)
        state_dict = dict(cast("Mapping[str, Any]", env_dict[state]))  # checked by the buffer below
        goal_dict = {**state_dict, "shape": goal_shape} if goal_shape else state_dict
        self.goal_shape = tuple(np.array(goal_dict.get("shape", 1), ndmin=1).tolist())
        goal_dict.pop("add_shape", None)
        main = PrioritizedReplayBuffer if self.prioritized else ReplayBuffer
        self.rb = main(size, {**env_dict, "rew": {}, "goal": goal_dict}, **kwargs)
        self.episode_rb = ReplayBuffer(self.max_episode_len, env_dict)
        self.rng = np.random.default_rng()

    def add(self, **kwargs: Any) -> None:
        """Add steps to the running episode."""
        if self.episode_rb.get_stored_size() >= self.max_episode_len:
            raise ValueError(f"add: the episode exceeds max_episode_len={self.max_episode_len}")
        self.episode_rb.add(**kwargs)

    def sample(self, batch_size: int, **kwargs: Any) -> dict[str, np.ndarray]:
        """Sample the main buffer."""
        return self.rb.sample(batch_size, **kwargs)

    def on_episode_end(self, goal: Any) -> None:
        """Store the running episode with its original ``goal`` and its relabelled copies."""
        length = self.episode_rb.get_stored_size()
        if length == 0:
            return
        episode = self.episode_rb.get_all_transitions()
        achieved = episode[self.next_state]
        self._store(episode, np.broadcast_to(np.asarray(goal), (length, *self.goal_shape)))
        if self.strategy == "final":
            self._store(episode, self.goal_func(np.broadcast_to(achieved[-1], achieved.shape)))
        elif self.strategy == "random":
            drawn = self.rb._encode_sample(
                self.rng.integers(0, self.rb.get_stored_size(), self.additional_goals * length)
            )
            goals = self.goal_func(drawn[self.next_state])
            for g in goals.reshape((self.additional_goals, length) + goals.shape[1:]):
                self._store(episode, g)
        else:
            for _ in range(self.additional_goals):
                if self.strategy == "future":
                    picks = self.rng.integers(np.arange(length), length)  # a step at or after each one
                else:
                    picks = self.rng.integers(0, length, length)
                self._store(episode, self.goal_func(achieved[picks]))
        self.episode_rb.clear()
        self.rb.on_episode_end()

    def _store(self, episode: dict[str, np.ndarray], goal: np.ndarray) -> None:
        rew = self.reward_func(episode[self.next_state], episode[self.action], goal)
        self.rb.add(**episode, goal=goal, rew=rew)

    def clear(self) -> None:
        """Forget every transition and the running episode."""
        self.rb.clear()
        self.episode_rb.clear()

    def get_stored_size(self) -> int:
        """Transitions in the main buffer."""
        return self.rb.get_stored_size()

    def get_buffer_size(self) -> int:
        """Capacity of the main buffer."""
        return self.rb.get_buffer_size()

    def get_all_transitions(self, shuffle: bool = False) -> dict[str, np.ndarray]:
        """Every transition of the main buffer."""
        return self.rb.get_all_transitions(shuffle)

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Update priorities (prioritized buffers only: ValueError otherwise)."""
        self._prioritized().update_priorities(indexes, priorities)

    def get_max_priority(self) -> float:
        """The largest priority ever set (prioritized buffers only: ValueError otherwise)."""
        return self._prioritized().get_max_priority()

    def _prioritized(self) -> PrioritizedReplayBuffer:
        if not isinstance(self.rb, PrioritizedReplayBuffer):
            raise ValueError("this HindsightReplayBuffer was built with prioritized=False: it has no priorities")
        return self.rb
