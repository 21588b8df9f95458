"""cpprb's ``SelectiveReplayBuffer``: whole episodes that can be read back and deleted.

cpprb keeps this class on its older fixed-field interface (``obs``, ``act``,
``rew``, ``next_obs``, ``done`` of float64, added positionally) and without a
ring: once full, further steps are dropped.  It has no priorities and no
sharing, so it is plain numpy here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import checks

__all__ = ["SelectiveReplayBuffer"]

_FIELDS = ("obs", "act", "rew", "next_obs", "done")


class SelectiveReplayBuffer:
    """Stores up to ``episode_len * Nepisodes`` steps and remembers where episodes begin.

    Parameters
    ----------
    episode_len : int
        The longest episode expected.
    obs_dim, act_dim, rew_dim : int
        Widths of ``obs``/``next_obs``, ``act`` and ``rew``.
    Nepisodes : int
        How many episodes of ``episode_len`` fit.
    """

    def __init__(self, episode_len: int, obs_dim: int = 1, act_dim: int = 1, *, Nepisodes: int = 10, rew_dim: int = 1):
        size = checks.integer("episode_len", episode_len, low=1) * checks.integer("Nepisodes", Nepisodes, low=1)
        widths = {
            "obs": checks.integer("obs_dim", obs_dim, low=1),
            "act": checks.integer("act_dim", act_dim, low=1),
            "rew": checks.integer("rew_dim", rew_dim, low=1),
            "next_obs": obs_dim,
            "done": 1,
        }
        self._data = {name: np.zeros((size, widths[name])) for name in _FIELDS}
        self._next = 0
        self._begins = [0]  # first step of each episode; the last one is the episode in progress

    def add(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> int:
        """Add one step or consecutive steps (the first axis); returns the index of the first.
        Steps beyond the capacity are dropped; every done step ends an episode."""
        rows = {}
        for name, value in zip(_FIELDS, (obs, act, rew, next_obs, done), strict=True):
            width = self._data[name].shape[1]
            try:
                arr = np.asarray(value, dtype=np.float64).reshape(-1, width)
            except (TypeError, ValueError):
                raise ValueError(f"{name}: expected numbers in rows of {width}, got {np.shape(value)}") from None
            rows[name] = arr
        k = len(rows["done"])
        if any(len(r) != k for r in rows.values()):
            raise ValueError(f"add: every field needs {k} steps, got { ({n: len(r) for n, r in rows.items()}) }")
        first = self._next
        n = min(k, len(self._data["done"]) - first)
        for name, arr in rows.items():
            self._data[name][first : first + n] = arr[:n]
        self._begins += [first + int(i) + 1 for i in np.flatnonzero(rows["done"][:n, 0])]
        self._next = first + n
        return first

    def get_buffer_size(self) -> int:
        """Capacity in steps."""
        return len(self._data["done"])

    def get_stored_size(self) -> int:
        """Steps stored."""
        return self._next

    def get_next_index(self) -> int:
        """Index the next step goes to."""
        return self._next

    def get_stored_episode_size(self) -> int:
        """Episodes stored, the one in progress included once it has a step."""
        return len(self._begins) - (1 if self._next == self._begins[-1] else 0)

    def get_episode(self, i: int) -> dict[str, np.ndarray]:
        """Copies of the steps of episode ``i`` (none when there is no such episode)."""
        i = checks.integer("i", i, low=0)
        if i >= self.get_stored_episode_size():
            return {name: np.zeros((0, arr.shape[1])) for name, arr in self._data.items()}
        end = self._begins[i + 1] if i + 1 < len(self._begins) else self._next
        return {name: arr[self._begins[i] : end].copy() for name, arr in self._data.items()}

    def delete_episode(self, i: int) -> int:
        """Delete episode ``i``, moving later steps back; returns how many steps it had."""
        i = checks.integer("i", i, low=0)
        if i >= len(self._begins):
            return 0
        if i == len(self._begins) - 1:  # the episode in progress
            deleted, self._next = self._next - self._begins[i], self._begins[i]
            return deleted
        begin, end = self._begins[i], self._begins[i + 1]
        deleted = end - begin
        for arr in self._data.values():
            arr[begin : self._next - deleted] = arr[end : self._next]
        self._next -= deleted
        self._begins = self._begins[:i] + [b - deleted for b in self._begins[i + 1 :]]
        return deleted

    def clear(self) -> None:
        """Forget every step and episode."""
        self._next = 0
        self._begins = [0]

    def _encode_sample(self, indexes: Any) -> dict[str, np.ndarray]:
        idx = np.asarray(indexes)
        return {name: arr[idx] for name, arr in self._data.items()}

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` steps drawn uniformly with replacement (numpy's global generator)."""
        batch_size = checks.integer("batch_size", batch_size, low=1)
        if self._next == 0:
            raise ValueError("sample: the buffer holds no step yet")
        return self._encode_sample(np.random.randint(0, self._next, batch_size))  # noqa: NPY002 -- as cpprb
