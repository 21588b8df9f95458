"""``mpreplay bench memory``: what next_of and stack_compress save, and what rebuilding costs.

Pixel replay, Atari style: observations (84, 84, 4) uint8, four stacked frames.
The limit is one 84x84 frame per step (7,056 bytes); a naive buffer stores
obs and next_obs, eight frames per transition.

Table 1: bytes per stored transition at capacity 100k for each layout, filled
with episodes of random length (a lone frame per episode end counts against
the compressed layouts).  Table 2: median seconds to sample a batch of 256
from a compressed buffer vs an uncompressed one of the same content, into fresh
arrays and into the previous batch's (`out=`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from mpreplay import ReplayBuffer
from mpreplay.bench._report import print_table

FRAME = (84, 84)
STACK = 4
LIMIT = int(np.prod(FRAME))  # one frame per step
LAYOUTS: dict[str, dict[str, Any]] = {
    "obs + next_obs": {},
    "next_of": {"next_of": "obs"},
    "stack_compress": {"stack_compress": "obs"},
    "next_of + stack_compress": {"next_of": "obs", "stack_compress": "obs"},
}
ENV: dict[str, dict[str, Any]] = {
    "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "next_obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {},
    "done": {},
}


def _episode(rng: np.random.Generator, length: int) -> dict[str, Any]:
    """One episode as a batch: stacked observations that really share frames."""
    frames = rng.integers(0, 256, (length + 1,) + FRAME, dtype=np.uint8)
    index = np.maximum(0, np.arange(length + 1)[:, None] - np.arange(STACK - 1, -1, -1)[None, :])
    stacks = np.moveaxis(frames[index], 1, -1)  # (length + 1, 84, 84, 4)
    return {
        "obs": stacks[:-1],
        "next_obs": stacks[1:],
        "act": rng.integers(0, 6, length),
        "rew": rng.standard_normal(length).astype(np.float32),
        "done": (np.arange(length) == length - 1).astype(np.float32),
    }


def _fill(buffer: ReplayBuffer, transitions: int, mean_length: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    added = 0
    while added < transitions:
        length = int(min(rng.geometric(1 / mean_length), 4 * mean_length, transitions - added + 1))
        buffer.add(**_episode(rng, length))
        added += length


def _bytes_per_transition(layout: dict[str, Any], capacity: int, mean_length: int) -> tuple[int, int, float]:
    buffer = ReplayBuffer(capacity, ENV, **layout)
    nbytes = buffer.inspection().nbytes
    if layout:  # only compressed layouts lose slots to episode ends; fill to count them
        _fill(buffer, capacity + capacity // 4, mean_length, seed=0)
        stored = buffer.get_stored_size()
    else:
        stored = capacity
    buffer.close()
    return nbytes, stored, nbytes / stored


def _median_sample_seconds(buffers: dict[str, ReplayBuffer], batch: int, repeats: int, reuse: bool) -> dict[str, float]:
    """Median seconds of ``sample(batch)`` per buffer: into fresh arrays, or with ``reuse`` into the
    last batch's.  The buffers take turns, call by call, so a change of the machine's state
    (another process's load, the caches' contents) weighs on all of them alike."""
    last = {name: buffer.sample(batch) for name, buffer in buffers.items()}
    times: dict[str, list[float]] = {name: [] for name in buffers}
    for _ in range(repeats):
        for name, buffer in buffers.items():
            start = time.perf_counter()
            last[name] = buffer.sample(batch, out=last[name] if reuse else None)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--capacity", type=int, default=100_000, help="capacity of table 1 (default 100k)")
    parser.add_argument("--sample-capacity", type=int, default=10_000, help="capacity of table 2 (default 10k)")
    parser.add_argument("--episode", type=int, default=200, help="mean episode length (default 200)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.capacity, args.sample_capacity, args.repeats, args.episode = 2_000, 1_000, 5, 50

    rows = []
    for name, layout in LAYOUTS.items():
        nbytes, stored, per = _bytes_per_transition(layout, args.capacity, args.episode)
        rows.append([name, f"{nbytes / 2**20:,.0f}", f"{stored:,}", f"{per:,.0f}", f"{per / LIMIT:.3f}"])
    print_table(
        f"Bytes per transition, obs {FRAME + (STACK,)} uint8, capacity {args.capacity:,}, "
        f"episodes of mean length {args.episode}",
        ["layout", "MiB", "transitions", "bytes/transition", "÷ one frame per step"],
        rows,
    )

    buffers = {}
    for name in ("obs + next_obs", "next_of + stack_compress"):
        buffers[name] = ReplayBuffer(args.sample_capacity, ENV, seed=1, **LAYOUTS[name])
        _fill(buffers[name], args.sample_capacity, args.episode, seed=1)
    seconds = {
        (name, reuse): t
        for reuse in (False, True)
        for name, t in _median_sample_seconds(buffers, args.batch, args.repeats, reuse).items()
    }
    rows = []
    for name, buffer in buffers.items():
        row = [name]
        for reuse in (False, True):
            t, base = seconds[name, reuse], seconds["obs + next_obs", reuse]
            row += [f"{t * 1e3:.2f}", f"{t / base:.2f}"]
        rows.append(row)
        buffer.close()
    print_table(
        f"sample({args.batch}) with obs and next_obs rebuilt, capacity {args.sample_capacity:,}, "
        f"median of {args.repeats}",
        ["layout", "ms, fresh arrays", "÷ uncompressed", "ms, out=", "÷ uncompressed"],
        rows,
    )
    return 0
