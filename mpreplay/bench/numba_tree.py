"""A proportional prioritized buffer over a sum tree and a min tree compiled by ``numba.njit``: the third
contender of the comparison the project started from (Cython, numba, numpy), in ``bench per --peers``.

Written the way numba is meant to be used: the trees are flat numpy arrays (a binary heap: node
``i``'s children are ``2i`` and ``2i + 1``, the leaves from ``leaf0`` on), and every loop over them --
setting leaves and recomputing their paths, the stratified descent of a batch's draws, building the
trees from a filled buffer -- is one ``@njit`` function in nopython mode, called once per batch;
Python only gathers the drawn rows with numpy.  Standard library and numpy at the top, numba
imported when the first buffer is made: the peers' venv runs it (numba comes with Tianshou).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_KERNELS: dict[str, Callable[..., Any]] = {}


def _kernels() -> dict[str, Callable[..., Any]]:
    if _KERNELS:
        return _KERNELS
    import numba

    @numba.njit(cache=False, nogil=True)
    def set_leaves(sums: np.ndarray, mins: np.ndarray, leaf0: int, slots: np.ndarray, values: np.ndarray) -> None:
        for k in range(slots.shape[0]):
            node = leaf0 + slots[k]
            sums[node] = values[k]
            mins[node] = values[k]
            node //= 2
            while node >= 1:
                left, right = 2 * node, 2 * node + 1
                sums[node] = sums[left] + sums[right]
                mins[node] = min(mins[left], mins[right])
                node //= 2

    @numba.njit(cache=False, nogil=True)
    def build(sums: np.ndarray, mins: np.ndarray, leaf0: int) -> None:
        for node in range(leaf0 - 1, 0, -1):
            sums[node] = sums[2 * node] + sums[2 * node + 1]
            mins[node] = min(mins[2 * node], mins[2 * node + 1])

    @numba.njit(cache=False, nogil=True)
    def draw(sums: np.ndarray, leaf0: int, stored: int, uniforms: np.ndarray, slots: np.ndarray) -> None:
        n = uniforms.shape[0]
        segment = sums[1] / n
        for k in range(n):  # stratified: one draw in each of n equal slices of the total
            mass = (k + uniforms[k]) * segment
            node = 1
            while node < leaf0:
                left = 2 * node
                if mass < sums[left]:
                    node = left
                else:
                    mass -= sums[left]
                    node = left + 1
            slots[k] = min(node - leaf0, stored - 1)  # rounding can step past the last stored leaf

    _KERNELS.update(set_leaves=set_leaves, build=build, draw=draw)
    return _KERNELS


class NumbaPER:
    """``add(**fields)``, ``sample(n)`` (fields + ``indexes`` + ``weights``), ``update_priorities``."""

    def __init__(
        self,
        capacity: int,
        seed: int,
        fields: dict[str, dict[str, Any]],
        alpha: float,
        beta: float,
        eps: float,
    ):
        kernels = _kernels()
        self._set, self._build, self._draw = kernels["set_leaves"], kernels["build"], kernels["draw"]
        self.capacity, self.alpha, self.beta, self.eps = capacity, alpha, beta, eps
        self.leaf0 = 1 << max(0, (capacity - 1).bit_length())
        self.sums = np.zeros(2 * self.leaf0)
        self.mins = np.full(2 * self.leaf0, np.inf)
        self.fields = {
            name: np.zeros((capacity, *spec.get("shape", ())), spec["dtype"]) for name, spec in fields.items()
        }
        self.next = self.stored = 0
        self.max_priority = 1.0
        self.rng = np.random.default_rng(seed)
        self._one_slot = np.zeros(1, np.int64)
        self._one_value = np.zeros(1)

    def add(self, **fields: Any) -> None:
        slot = self.next
        for name, value in fields.items():
            self.fields[name][slot] = value
        self._one_slot[0] = slot
        self._one_value[0] = (self.max_priority + self.eps) ** self.alpha
        self._set(self.sums, self.mins, self.leaf0, self._one_slot, self._one_value)
        self.next = (slot + 1) % self.capacity
        self.stored = min(self.stored + 1, self.capacity)

    def sample(self, n: int) -> dict[str, np.ndarray]:
        slots = np.empty(n, np.int64)
        self._draw(self.sums, self.leaf0, self.stored, self.rng.random(n), slots)
        batch = {name: column[slots] for name, column in self.fields.items()}
        # (N P(i))^-beta / max_j (N P(j))^-beta: N and the total cancel, the max is at the min leaf.
        batch["weights"] = (self.sums[self.leaf0 + slots] / self.mins[1]) ** -self.beta
        batch["indexes"] = slots
        return batch

    def update_priorities(self, indexes: np.ndarray, priorities: np.ndarray) -> None:
        priorities = np.asarray(priorities, np.float64)
        values = (priorities + self.eps) ** self.alpha
        self._set(self.sums, self.mins, self.leaf0, np.asarray(indexes, np.int64), values)
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def fill(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        """Store ``columns`` from slot 0 with ``priorities`` at once (the trees built bottom-up)."""
        n = len(priorities)
        for name, column in columns.items():
            self.fields[name][:n] = column
        self.sums[self.leaf0 : self.leaf0 + n] = (priorities + self.eps) ** self.alpha
        self.mins[self.leaf0 : self.leaf0 + n] = self.sums[self.leaf0 : self.leaf0 + n]
        self._build(self.sums, self.mins, self.leaf0)
        self.next, self.stored = n % self.capacity, n
        self.max_priority = max(self.max_priority, float(priorities.max()))
