"""Replay buffers with cpprb's API: one implementation over any memory.

Every buffer keeps its state in the arrays of a :mod:`mpreplay.memory`
block: a header of counters, one generation per slot, the priority trees and
the fields.  A local buffer puts the block on the heap and uses a no-op lock;
the shared twins put it in a shared-memory segment behind a process-shared
lock.  The protocol (see DESIGN.md) is the same for both:

* **add** -- convert the whole batch first; under the lock reserve slots,
  make their generation odd and their leaves zero; copy the rows unlocked;
  under the lock make the generations even and publish the priorities.
* **sample** -- under the lock draw slots and note their generations; gather
  unlocked; a row whose generation moved meanwhile is torn and drawn again.
* **update_priorities** -- applied only where the slot still holds what was
  sampled; stale updates are dropped and counted.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._ext.sumtree import PriorityTree, check_priorities, check_slots, tree_buffer_size
from .memory import HeapMemory, Layout
from .spec import FieldSpec, convert_batch, parse_env_dict

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer"]

# Header counters (int64 slots of the "header" array).
_NEXT, _STORED, _INSERTS, _SAMPLES, _STALE, _TORN, _LOCK_WAIT_NS, _LOCK_HOLDS, _CLOSED = range(9)
_HEADER_LEN = 16
_NOT_SAMPLED = np.uint64(2**64 - 1)  # sentinel in the per-process record of sampled generations
_MAX_RESAMPLE_ROUNDS = 64


class _NoLock:
    """The lock of a buffer that only one thread of one process uses."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class ReplayBuffer:
    """Uniform FIFO experience replay.

    Parameters
    ----------
    size : int
        Capacity in transitions; the oldest are overwritten when full.
    env_dict : mapping
        cpprb-style field specs, e.g. ``{"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}``.
        A missing shape means a scalar; a missing dtype means ``default_dtype``.
    default_dtype : numpy dtype, optional
        dtype of fields that do not name one (float32 when None).
    seed : int, optional
        Seed of the sampling generator.
    """

    _prioritized = False

    def __init__(self, size: int, env_dict: Mapping[str, Mapping[str, Any]], *,
                 default_dtype: Any = None, seed: int | None = None, **options: Any):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size: expected an integer >= 1, got {size!r}")
        self._size = int(size)
        self._specs = parse_env_dict(env_dict, default_dtype)
        self._options = options
        self._memory = self._allocate(self._layout())
        self._bind(self._memory.arrays)
        self._init_state()
        self._rng = np.random.default_rng(seed)

    # -- memory -------------------------------------------------------------
    def _layout(self) -> Layout:
        layout = Layout()
        layout.add("header", (_HEADER_LEN,), np.int64)
        layout.add("generation", (self._size,), np.uint64)
        layout.add("tree", (tree_buffer_size(self._size),), np.float64)
        for spec in self._specs.values():
            layout.add(f"field:{spec.name}", (self._size,) + spec.shape, spec.dtype)
        return layout

    def _allocate(self, layout: Layout) -> HeapMemory:
        return HeapMemory(layout)

    def _bind(self, arrays: dict[str, np.ndarray]) -> None:
        self._header = arrays["header"]
        self._generation = arrays["generation"]
        self._tree = PriorityTree(arrays["tree"], self._size, reset=False)
        self._fields = {name: arrays[f"field:{name}"] for name in self._specs}
        self._sampled_generation: np.ndarray | None = None
        self._lock = _NoLock()

    def _init_state(self) -> None:
        self._tree.reset()

    # -- cpprb API ------------------------------------------------------------
    def get_buffer_size(self) -> int:
        """Capacity in transitions."""
        return self._size

    def get_stored_size(self) -> int:
        """Number of transitions stored (at most the capacity)."""
        return int(self._header[_STORED])

    def get_next_index(self) -> int:
        """Slot the next added transition goes to."""
        return int(self._header[_NEXT])

    def get_env_dict(self) -> dict[str, dict[str, Any]]:
        """The normalised field specs."""
        return {n: {"shape": s.shape, "dtype": s.dtype} for n, s in self._specs.items()}

    def add(self, **fields: Any) -> int:
        """Store one transition, or a batch with a leading dimension.

        Returns the slot of the first transition written.  The batch is
        checked as a whole first: on any error nothing is stored.
        """
        priorities = fields.pop("priorities", None)
        k, rows = convert_batch(self._specs, fields)
        prio = self._check_add_priorities(priorities, k)
        return self._store(k, rows, prio)

    def _check_add_priorities(self, priorities: Any, k: int) -> np.ndarray | None:
        if priorities is not None:
            raise TypeError("priorities: only PrioritizedReplayBuffer.add takes initial priorities")
        return None

    def _store(self, k: int, rows: dict[str, np.ndarray], priorities: np.ndarray | None) -> int:
        size = self._size
        if k > size:
            # Only the newest `size` rows would survive: skip the others.
            skip = k - size
            rows = {n: r[skip:] for n, r in rows.items()}
            priorities = None if priorities is None else priorities[skip:]
            with self._lock:
                first = int(self._header[_NEXT])
                self._header[_NEXT] = (first + skip) % size
            self._store(size, rows, priorities)
            return first
        with self._lock:
            start = int(self._header[_NEXT])
            self._header[_NEXT] = (start + k) % size
            slots = self._slots(start, k)
            self._generation[slots] += np.uint64(1)
            self._tree.clear_range(start, k)
        self._copy_rows(start, k, rows)
        with self._lock:
            self._generation[slots] += np.uint64(1)
            self._publish(slots, priorities)
            self._header[_STORED] = min(size, int(self._header[_STORED]) + k)
            self._header[_INSERTS] += k
        return start

    def _slots(self, start: int, k: int) -> np.ndarray:
        return (np.arange(start, start + k, dtype=np.int64)) % self._size

    def _copy_rows(self, start: int, k: int, rows: dict[str, np.ndarray]) -> None:
        head = min(k, self._size - start)
        for name, dst in self._fields.items():
            src = rows[name]
            dst[start:start + head] = src[:head]
            if head < k:
                dst[:k - head] = src[head:]

    def _publish(self, slots: np.ndarray, priorities: np.ndarray | None) -> None:
        # Uniform replay: every published slot weighs 1.
        self._tree.set_priorities(slots, np.ones(len(slots)), 0.0, 0.0)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions uniformly (with replacement)."""
        out, _, _ = self._sample(batch_size, stratified=False)
        return out

    def _sample(self, batch_size: int, *, stratified: bool) -> tuple[dict[str, np.ndarray], np.ndarray, float]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        b = int(batch_size)
        slots = np.empty(b, dtype=np.int64)
        values = np.empty(b, dtype=np.float64)
        with self._lock:
            if not self._tree.total() > 0.0:
                raise ValueError("sample: the buffer holds no transition yet")
            self._tree.sample(self._rng.random(b), slots, values, stratified)
            generations = self._generation[slots]
            vmin = self._tree.min()
            self._header[_SAMPLES] += b
        out = {name: arr.take(slots, axis=0) for name, arr in self._fields.items()}
        torn = self._generation[slots] != generations
        if torn.any():
            vmin = self._redraw_torn(out, slots, values, generations, torn, vmin)
        self._record_sampled(slots, generations)
        out["indexes"] = slots
        return out, values, vmin

    def _redraw_torn(self, out: dict[str, np.ndarray], slots: np.ndarray, values: np.ndarray,
                     generations: np.ndarray, torn: np.ndarray, vmin: float) -> float:
        """Replace rows overwritten while they were copied by fresh draws."""
        for _ in range(_MAX_RESAMPLE_ROUNDS):
            rows = np.flatnonzero(torn)
            self._header[_TORN] += len(rows)
            new_slots = np.empty(len(rows), dtype=np.int64)
            new_values = np.empty(len(rows), dtype=np.float64)
            with self._lock:
                self._tree.sample(self._rng.random(len(rows)), new_slots, new_values, False)
                new_gen = self._generation[new_slots]
                vmin = self._tree.min()
            for name, arr in self._fields.items():
                out[name][rows] = arr.take(new_slots, axis=0)
            slots[rows], values[rows], generations[rows] = new_slots, new_values, new_gen
            torn = self._generation[slots] != generations
            if not torn.any():
                return vmin
        raise RuntimeError("sample: rows kept being overwritten while copied; is the buffer far too small?")

    def _record_sampled(self, slots: np.ndarray, generations: np.ndarray) -> None:
        if self._sampled_generation is None:
            self._sampled_generation = np.full(self._size, _NOT_SAMPLED, dtype=np.uint64)
        self._sampled_generation[slots] = generations

    def get_all_transitions(self) -> dict[str, np.ndarray]:
        """Copies of every stored transition, oldest first."""
        stored, nxt = self.get_stored_size(), self.get_next_index()
        order = np.arange(stored) if stored < self._size else (np.arange(self._size) + nxt) % self._size
        return {name: arr[order] for name, arr in self._fields.items()}

    def clear(self) -> None:
        """Forget every transition (the capacity stays)."""
        with self._lock:
            self._tree.reset()
            self._generation += np.uint64(2)  # updates sampled before the clear become stale
            self._header[_NEXT] = 0
            self._header[_STORED] = 0

    def on_episode_end(self) -> None:
        """Mark the end of an episode (cpprb API)."""

    def stats(self) -> dict[str, float]:
        """Counters since creation: stored, inserts, samples, stale updates dropped,
        torn rows resampled, lock wait seconds and lock acquisitions."""
        h = self._header
        return {
            "stored": int(h[_STORED]),
            "inserts": int(h[_INSERTS]),
            "samples": int(h[_SAMPLES]),
            "stale_updates_dropped": int(h[_STALE]),
            "torn_rows_resampled": int(h[_TORN]),
            "lock_wait_seconds": int(h[_LOCK_WAIT_NS]) * 1e-9,
            "lock_acquisitions": int(h[_LOCK_HOLDS]),
        }


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016), stratified as in Ape-X.

    A transition is drawn with probability ``(p_i + eps)**alpha / sum_j (p_j + eps)**alpha``.
    New transitions without given priorities get the largest priority stored now
    (1.0 in an empty buffer).

    Parameters
    ----------
    alpha : float
        Prioritisation exponent (0 = uniform).
    eps : float
        Added to every priority so none has zero probability.
    """

    _prioritized = True

    def __init__(self, size: int, env_dict: Mapping[str, Mapping[str, Any]], *, alpha: float = 0.6,
                 eps: float = 1e-4, default_dtype: Any = None, seed: int | None = None, **options: Any):
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha: expected a finite number >= 0, got {alpha!r}")
        if not (np.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
        self._alpha, self._eps = float(alpha), float(eps)
        super().__init__(size, env_dict, default_dtype=default_dtype, seed=seed, **options)
        # No leaf may exceed this weight, so the tree total can never overflow.
        self._max_weight = np.finfo(np.float64).max / (2.0 * tree_buffer_size(self._size))

    def get_max_priority(self) -> float:
        """Largest priority stored now (1.0 when the buffer is empty)."""
        m = self._tree.max()
        return 1.0 if m == -np.inf else float(m)

    def _priorities(self, priorities: Any, k: int, what: str) -> np.ndarray:
        try:
            p = np.asarray(priorities, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{what}: expected numbers, got {type(priorities).__name__}") from None
        p = np.ascontiguousarray(p.reshape(-1) if p.ndim <= 1 else p)
        if p.ndim != 1 or len(p) != k:
            raise ValueError(f"{what}: expected {k} values, got shape {np.shape(priorities)}")
        bad = check_priorities(p, self._alpha, self._eps, self._max_weight)
        if bad >= 0:
            raise ValueError(f"{what}: expected finite values >= 0 (and not astronomically large), got {p[bad]!r} at position {bad}")
        return p

    def _check_add_priorities(self, priorities: Any, k: int) -> np.ndarray | None:
        return None if priorities is None else self._priorities(priorities, k, "priorities")

    def _publish(self, slots: np.ndarray, priorities: np.ndarray | None) -> None:
        if priorities is None:
            priorities = np.full(len(slots), self.get_max_priority())
        self._tree.set_priorities(slots, priorities, self._alpha, self._eps)

    def sample(self, batch_size: int, beta: float = 0.4) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions in proportion to their priority.

        Adds ``indexes`` and importance ``weights`` = (N·P(i))^-β / max_j (N·P(j))^-β.
        """
        if not (np.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta: expected a finite number >= 0, got {beta!r}")
        out, values, vmin = self._sample(batch_size, stratified=True)
        # (N P_i)^-b / max_j (N P_j)^-b == (v_i / v_min)^-b: N and the total cancel.
        out["weights"] = np.power(values / vmin, -beta)
        return out

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Set new priorities of sampled transitions.

        An update whose slot was overwritten since this process sampled it is
        dropped (counted in ``stats()["stale_updates_dropped"]``).
        """
        try:
            idx = np.asarray(indexes)
        except (TypeError, ValueError):
            raise TypeError(f"indexes: expected integers, got {type(indexes).__name__}") from None
        if idx.dtype.kind not in "iu" and idx.size:
            raise TypeError(f"indexes: expected integers, got dtype {idx.dtype}")
        if idx.ndim > 1:
            raise ValueError(f"indexes: expected a 1-D array, got shape {idx.shape}")
        idx = np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
        p = self._priorities(priorities, len(idx), "priorities")
        stored = self.get_stored_size()
        bad = check_slots(idx, stored)
        if bad >= 0:
            raise ValueError(f"indexes: expected slots in [0, {stored}), got {idx[bad]} at position {bad}")
        sampled = self._sampled_generation
        with self._lock:
            gen = self._generation[idx]
            fresh = gen % 2 == 0
            if sampled is not None:
                record = sampled[idx]
                fresh &= (record == _NOT_SAMPLED) | (record == gen)
            if fresh.all():
                self._tree.set_priorities(idx, p, self._alpha, self._eps)
            else:
                self._tree.set_priorities(idx[fresh], p[fresh], self._alpha, self._eps)
                self._header[_STALE] += int((~fresh).sum())
