"""Atari-sized workloads of the peers' benchmarks, on the worker's side (numpy and one library only).

* :func:`episodes` -- the synthetic Atari stream of ``bench seq`` and of the throughput table:
  four stacked (84, 84) uint8 frames a step, each stack the previous one shifted by one new frame.
* :func:`transitions_buffer` -- a prioritized buffer of (obs, act, rew, next_obs, done) transitions
  from that stream, in one library's layout, timed at ``sample(256)``: the second table of
  ``mpreplay bench per``.
* :func:`slice_buffer` -- TorchRL's ``PrioritizedSliceSampler`` over the stream: ``bench seq``'s peer.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

FRAME = (84, 84)
STACK = 4
ALPHA, BETA = 0.6, 0.4
TPUT_BATCH = 256
SEQ_LENGTH, SEQ_BETA = 80, 0.6
_EPISODE = 400  # mean episode length of the throughput table's stream


def episodes(seed: int, steps: int, mean_length: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Episodes of the synthetic stream, ``steps`` steps in all: (fields, per-step priorities).

    Each step's stack is the previous one shifted by one new frame, as a frame-stacking
    wrapper makes them; an episode starts with its first frame repeated.
    """
    rng = np.random.default_rng(seed)
    added = 0
    while added < steps:
        k = int(min(rng.geometric(1 / mean_length), 4 * mean_length, steps - added))
        frames = rng.integers(0, 256, (k,) + FRAME, dtype=np.uint8)
        index = np.maximum(0, np.arange(k)[:, None] - np.arange(STACK - 1, -1, -1)[None, :])
        done = np.zeros(k, np.float32)
        done[-1] = 1.0
        yield (
            {
                "obs": np.moveaxis(frames[index], 1, -1),
                "act": rng.integers(0, 6, k),
                "rew": rng.standard_normal(k).astype(np.float32),
                "done": done,
            },
            rng.uniform(0.01, 2.0, k),
        )
        added += k


def transition_episodes(seed: int, capacity: int) -> Iterator[tuple[dict[str, Any], np.ndarray]]:
    """The stream as transitions, an episode at a time: k steps make k - 1 transitions, the last done."""
    for fields, priorities in episodes(seed, capacity + capacity // 8, _EPISODE):
        if len(priorities) < 2:
            continue
        done = np.zeros(len(priorities) - 1, np.float32)
        done[-1] = 1.0
        yield (
            {
                "obs": fields["obs"][:-1],
                "next_obs": fields["obs"][1:],
                "act": fields["act"][:-1],
                "rew": fields["rew"][:-1],
                "done": done,
            },
            priorities[:-1],
        )


class Timed:
    """A filled buffer and the sample calls to time on it, by variant (e.g. ``new``, ``out``)."""

    def __init__(
        self,
        samplers: dict[str, Callable[[], Any]],
        note: str,
        rows: int,
        memory: Callable[[], tuple[int, int]] | None = None,
    ):
        self.variants, self.note, self.rows, self._memory = samplers, note, rows, memory

    def run(self, calls: int, variant: str) -> dict[str, Any]:
        """``calls`` sample calls: CPU seconds of this process (every thread) and wall seconds."""
        sample = self.variants[variant]
        sample()  # first-touch page faults and lazy setup stay out of the timing
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            sample()
        return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "rows": self.rows * calls}

    def memory(self) -> tuple[int, int]:
        assert self._memory is not None  # asked only of the buffers made with a memory figure
        return self._memory()


# -- the throughput table: sample(256) transitions of Atari stacks ---------------------------
def _mpreplay(layout: str, capacity: int, seed: int) -> Timed:
    import mpreplay

    frame = {"shape": FRAME + (STACK,), "dtype": np.uint8}
    env: dict[str, dict[str, Any]] = {
        "obs": frame,
        "next_obs": frame,
        "act": {"dtype": np.int64},
        "rew": {"dtype": np.float32},
        "done": {"dtype": np.float32},
    }
    options: dict[str, Any] = {"next_of": "obs", "stack_compress": "obs"} if layout == "compressed" else {}
    rb = mpreplay.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, seed=seed, **options)
    for fields, priorities in transition_episodes(seed, capacity):
        rb.add(**fields, priorities=priorities)
    previous = {"batch": rb.sample(TPUT_BATCH, BETA)}

    def reuse() -> Any:
        previous["batch"] = rb.sample(TPUT_BATCH, BETA, out=previous["batch"])
        return previous["batch"]

    what = "next_of + stack_compress: one frame stored per step" if layout == "compressed" else "every field stored"
    return Timed({"new": lambda: rb.sample(TPUT_BATCH, BETA), "out": reuse}, what, TPUT_BATCH)


def _floor(layout: str, capacity: int, seed: int) -> Timed:
    """numpy's copy of as many bytes as a plain sample returns, into reused arrays: 256
    consecutive rows of every field from a random start (no gather, no priorities, no page
    faults of new arrays).  A reference rather than a bound: a copy loop of its own (mpreplay's)
    can beat numpy's ``copyto``."""
    rng = np.random.default_rng(seed)
    shapes = {"obs": FRAME + (STACK,), "next_obs": FRAME + (STACK,), "act": (), "rew": (), "done": ()}
    dtypes = {"obs": np.uint8, "next_obs": np.uint8, "act": np.int64, "rew": np.float32, "done": np.float32}
    arrays = {k: np.ones((capacity,) + s, dtypes[k]) for k, s in shapes.items()}
    out = {k: v[:TPUT_BATCH].copy() for k, v in arrays.items()}

    def copy() -> dict[str, np.ndarray]:
        start = int(rng.integers(0, capacity - TPUT_BATCH + 1))
        for k, v in arrays.items():
            np.copyto(out[k], v[start : start + TPUT_BATCH])
        return out

    return Timed(
        {"out": copy}, "numpy.copyto of 256 consecutive rows into reused arrays; no gather, no priorities", TPUT_BATCH
    )


def _cpprb(layout: str, capacity: int, seed: int) -> Timed:
    import cpprb

    frame = {"shape": FRAME + (STACK,), "dtype": np.uint8}
    env = {"obs": frame, "act": {"dtype": np.int64}, "rew": {"dtype": np.float32}, "done": {"dtype": np.float32}}
    if layout == "compressed":
        options = {"next_of": "obs", "stack_compress": "obs"}
    else:
        options, env = {}, {**env, "next_obs": frame}
    rb = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, **options)
    for fields, priorities in transition_episodes(seed, capacity):
        rb.add(**fields, priorities=priorities)
        rb.on_episode_end()
    what = "next_of + stack_compress (cpprb's)" if layout == "compressed" else "every field stored"
    return Timed({"new": lambda: rb.sample(TPUT_BATCH, BETA)}, what, TPUT_BATCH)


def _tianshou(layout: str, capacity: int, seed: int) -> Timed:
    from tianshou.data import Batch, PrioritizedReplayBuffer

    np.random.seed(seed)  # noqa: NPY002 -- Tianshou draws from numpy's global generator
    compressed = layout == "compressed"
    options = {"stack_num": STACK, "ignore_obs_next": True, "save_only_last_obs": True} if compressed else {}
    rb = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA, **options)
    for fields, priorities in transition_episodes(seed, capacity):
        # Tianshou's frame stacks put the stack axis first; it stores the last frame of each.
        obs = np.moveaxis(fields["obs"], -1, 1) if compressed else fields["obs"]
        indexes = []
        for t in range(len(priorities)):
            step = {
                "obs": obs[t],
                "act": fields["act"][t],
                "rew": float(fields["rew"][t]),
                "terminated": bool(fields["done"][t]),
                "truncated": False,
            }
            if not compressed:
                step["obs_next"] = fields["next_obs"][t]
            indexes.append(rb.add(Batch(**step))[0][0])
        rb.update_weight(np.asarray(indexes), priorities)
    what = (
        "stack_num=4, save_only_last_obs, ignore_obs_next: one frame stored per step, stacks (4, 84, 84)"
        if compressed
        else "every field stored"
    )
    return Timed({"new": lambda: rb.sample(TPUT_BATCH)}, what, TPUT_BATCH)


def _torchrl(layout: str, capacity: int, seed: int) -> Timed:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    torch.manual_seed(seed)
    rb = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity), batch_size=TPUT_BATCH)
    for fields, priorities in transition_episodes(seed, capacity):
        index = rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in fields.items()}, [len(priorities)]))
        rb.update_priority(index, torch.from_numpy(priorities.astype(np.float32)))
    return Timed(
        {"new": lambda: rb.sample(return_info=True)},
        f"LazyTensorStorage, every field stored; torch {torch.get_num_threads()} threads",
        TPUT_BATCH,
    )


def _flashbax(layout: str, capacity: int, seed: int) -> Timed:
    import flashbax
    import jax
    import jax.numpy as jnp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buffer = flashbax.make_prioritised_flat_buffer(
            max_length=capacity,
            min_length=TPUT_BATCH,
            sample_batch_size=TPUT_BATCH,
            add_sequences=True,
            priority_exponent=ALPHA,
            device="cpu",
        )
    pieces: dict[str, list[np.ndarray]] = {"obs": [], "act": [], "rew": [], "done": []}
    for fields, _ in transition_episodes(seed, capacity):
        for k in pieces:
            pieces[k].append(fields[k])
    steps = {k: np.concatenate(v)[:capacity] for k, v in pieces.items()}
    steps["act"] = steps["act"].astype(np.int32)  # JAX's default 32 bits
    state = buffer.init({k: jnp.asarray(v[0]) for k, v in steps.items()})
    add = jax.jit(buffer.add, donate_argnums=0)
    for i in range(0, capacity, 1_000):
        state = add(state, {k: v[i : i + 1_000] for k, v in steps.items()})
    priorities = np.random.default_rng(seed).uniform(0.01, 2.0, capacity)
    state = jax.jit(buffer.set_priorities, donate_argnums=0)(state, np.arange(capacity), priorities)

    @jax.jit
    def draw(state: Any, key: Any) -> Any:
        key, k = jax.random.split(key)
        batch = buffer.sample(state, k)
        first, second = batch.experience.first, batch.experience.second
        weights = (capacity * batch.probabilities) ** -BETA
        return key, {**first, "next_obs": second["obs"], "indexes": batch.indices, "weights": weights / weights.max()}

    holder = {"key": jax.random.PRNGKey(seed)}

    def sample() -> dict[str, np.ndarray]:
        holder["key"], out = draw(state, holder["key"])
        return {k: np.asarray(v) for k, v in out.items()}  # on the host, as a numpy learner reads them

    return Timed(
        {"new": sample},
        "flat buffer: each step stored once, next_obs from the pair's second step; sample + weights jitted",
        TPUT_BATCH,
    )


_TRANSITIONS = {
    "mpreplay": _mpreplay,
    "floor": _floor,
    "cpprb": _cpprb,
    "tianshou": _tianshou,
    "torchrl": _torchrl,
    "flashbax": _flashbax,
}


def transitions_buffer(name: str, layout: str, capacity: int, seed: int) -> Timed:
    """A full prioritized buffer of ``capacity`` Atari transitions from ``name``, layout
    ``compressed`` (the library's way of storing each frame once, where it has one) or ``plain``."""
    return _TRANSITIONS[name](layout, capacity, seed)


# -- bench seq: TorchRL's PrioritizedSliceSampler --------------------------------------------
def slice_buffer(capacity: int, batch: int, mean_length: int, seed: int) -> Timed:
    """TorchRL's ``TensorDictReplayBuffer`` over a ``LazyTensorStorage``, sampled by
    ``PrioritizedSliceSampler(slice_len=80, traj_key="episode")``, filled with 1.25 x ``capacity``
    steps of the stream, each with its priority."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

    sampler = PrioritizedSliceSampler(
        max_capacity=capacity, alpha=ALPHA, beta=SEQ_BETA, slice_len=SEQ_LENGTH, traj_key="episode"
    )
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch * SEQ_LENGTH)
    row_bytes = 0
    for i, (fields, priorities) in enumerate(episodes(seed, capacity + capacity // 4, mean_length)):
        data = {key: torch.from_numpy(value) for key, value in fields.items()}
        data["done"] = data["done"].bool()
        data["episode"] = torch.full((len(priorities),), i, dtype=torch.int64)
        steps = TensorDict(data, batch_size=[len(priorities)])
        row_bytes = sum(t[0].nbytes for t in steps.values())
        index = rb.extend(steps)
        rb.update_priority(index, torch.as_tensor(priorities, dtype=torch.float32))  # the trees' dtype

    def memory() -> tuple[int, int]:
        # LazyTensorStorage allocates every field for the whole capacity at its first write;
        # the sampler's priority trees are not counted.
        return capacity * row_bytes, len(rb)

    return Timed(
        {"new": lambda: rb.sample().reshape(batch, SEQ_LENGTH)},
        f"torch {torch.get_num_threads()} threads",
        batch * SEQ_LENGTH,
        memory,
    )
