"""The loop of ``mpreplay bench per``: its transitions, its fields and the loop itself, which the
in-process table and every peer's table (:mod:`mpreplay.bench.peer_worker`) time alike.

Standard library and numpy only: the peers' worker loads this file by path in the peers' venv,
which has no mpreplay.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "ALPHA",
    "BATCH",
    "BETA",
    "EPS",
    "NOISE_POOL",
    "POOL",
    "PREFILL_CHUNK",
    "Floor",
    "as_cpprb",
    "drive",
    "env_dict",
    "timed_drive",
    "workload",
]

BATCH = 32
ALPHA, BETA, EPS = 0.6, 0.4, 1e-4
OBS_SHAPE = (4,)
# Distinct prebuilt transitions and noise vectors the loop cycles through, so no buffer sees the
# same object twice in a row; primes keep the two cycles from lining up.
POOL, NOISE_POOL = 61, 67
PREFILL_CHUNK = 10_000


def env_dict(scalar_shape: tuple[int, ...] | None) -> dict[str, dict[str, Any]]:
    """The transition's fields, cpprb's way; scalars get ``scalar_shape`` (cpprb stores them as (1,))."""
    scalar = {} if scalar_shape is None else {"shape": scalar_shape}
    return {
        "obs": {"shape": OBS_SHAPE, "dtype": np.float32},
        "act": {**scalar, "dtype": np.int64},
        "rew": {**scalar, "dtype": np.float32},
        "next_obs": {"shape": OBS_SHAPE, "dtype": np.float32},
        "done": {**scalar, "dtype": np.float32},
    }


def workload(seed: int) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """The transitions the loop adds and the noise it perturbs the weights with."""
    rng = np.random.default_rng(seed)
    pool: list[dict[str, np.ndarray]] = [
        {
            "obs": rng.standard_normal(OBS_SHAPE).astype(np.float32),
            "act": np.asarray(rng.integers(0, 4), dtype=np.int64),
            "rew": np.asarray(rng.standard_normal(), dtype=np.float32),
            "next_obs": rng.standard_normal(OBS_SHAPE).astype(np.float32),
            "done": np.asarray(rng.random() < 0.01, dtype=np.float32),
        }
        for _ in range(POOL)
    ]
    noise = [rng.uniform(-0.5, 0.5, BATCH) for _ in range(NOISE_POOL)]
    return pool, noise


def drive(
    buffer: Any, frames: int, pool: Sequence[dict[str, Any]], noise: Sequence[np.ndarray], *, first_sample: int = BATCH
) -> float:
    """Run the loop for ``frames`` frames; return the CPU seconds it took.

    Each frame adds one transition and, from frame ``first_sample`` on (by default once more than
    32 are stored), samples 32, perturbs their weights and writes them back as priorities."""
    add, sample, update = buffer.add, buffer.sample, buffer.update_priorities
    n_pool, n_noise, clip = len(pool), len(noise), np.clip
    start = time.process_time()
    for t in range(frames):
        add(**pool[t % n_pool])
        if t >= first_sample:
            batch = sample(BATCH)
            update(batch["indexes"], clip(batch["weights"] + noise[t % n_noise], 0.01, 1.0))
    return time.process_time() - start


def timed_drive(
    buffer: Any, frames: int, pool: Sequence[dict[str, Any]], noise: Sequence[np.ndarray], *, first_sample: int = BATCH
) -> float:
    """:func:`drive` with the garbage collector off: a collection inside one run but not another
    is noise, not buffer cost."""
    gc.collect()
    gc.disable()
    try:
        return drive(buffer, frames, pool, noise, first_sample=first_sample)
    finally:
        gc.enable()


class Floor:
    """A buffer that stores nothing: every method returns at once (what the loop itself costs)."""

    def __init__(self, size: int, seed: int):
        rng = np.random.default_rng(seed)
        self._batch = {
            name: np.zeros((BATCH,) + tuple(spec.get("shape", ())), spec["dtype"])
            for name, spec in env_dict(None).items()
        }
        self._batch["indexes"] = rng.integers(0, size, BATCH)
        self._batch["weights"] = rng.random(BATCH)

    def add(self, **fields: np.ndarray) -> None:
        return None

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        return self._batch

    def update_priorities(self, indexes: np.ndarray, priorities: np.ndarray) -> None:
        return None


def as_cpprb(transition: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """cpprb stores a field without shape as shape (1,)."""
    return {name: value.reshape(1) if value.ndim == 0 else value for name, value in transition.items()}
