"""``mpreplay bench learner``: a learner step with and without batches prefetched on a thread.

``mpreplay bench learner [--quick] [--capacity N] [--batch-size B] [--train-ms T] [--steps S] [--rounds R]``

A prioritized buffer holds ``N`` (default 20,000) Atari transitions: ``obs`` and ``next_obs``
(84, 84, 4) uint8, ``act``, ``rew``, ``done``; once stored as they are, once compressed
(``next_of`` + ``stack_compress``, each frame stored once).  A learner step samples ``B`` (256) of them,
"trains" and updates their priorities.  The training step is synthetic: PyTorch matrix
products on one thread, sized to take ``T`` ms (5) -- like a real step, it computes without
holding the GIL.  The learner runs five ways, each for ``S`` steps:

* ``train`` -- the training step alone;
* ``sample`` -- ``sample(B, out=...)`` alone, into reused arrays;
* ``sample, no out=`` -- ``sample(B)`` alone, the previous batch held meanwhile as a loop holds the
  batch it trains on (a batch let go of is filled again by a later sample);
* ``in turn`` -- sample, then train, then update: the usual loop;
* ``prefetched`` -- ``for batch in buffer.batches(B, prefetch=2)``: train and update while a
  background thread draws the next batches.

Figures are median wall-clock milliseconds per step (the overlap is what is measured, so
CPU time would not show it), over ``R`` rounds that alternate the five ways.  Target
(issue: a learner that never waits): prefetched <= 1.1 x max(train, sample).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import mpreplay
from mpreplay.bench._report import positive_int, print_table

FRAME = (84, 84, 4)
TARGET = 1.1
_EPISODE = 500  # steps per filled episode (a quarter of the capacity at most)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpreplay bench learner", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="capacity 2,000, 30 steps, 2 rounds")
    parser.add_argument("--capacity", type=positive_int, default=None, help="transitions stored (default 20,000)")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--train-ms", type=float, default=5.0, help="length of the synthetic training step")
    parser.add_argument("--steps", type=positive_int, default=None, help="steps per way and round (default 200)")
    parser.add_argument("--rounds", type=positive_int, default=None, help="rounds alternating the ways (default 5)")
    args = parser.parse_args(argv)
    capacity = args.capacity or (2_000 if args.quick else 20_000)
    steps = args.steps or (30 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(1)  # the training step takes one core; sampling may use the other

    train = _synthetic_step(args.train_ms / 1e3)
    for compressed in (False, True):
        buffer = _filled(capacity, compressed)
        ways = _ways(buffer, args.batch_size, train)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(rounds):
            for name, run in ways.items():
                times[name].append(run(steps) / steps)
        buffer.close()
        median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        floor = max(median["train"], median["sample"])
        what = "compressed (next_of + stack_compress)" if compressed else "uncompressed"
        print_table(
            f"learner step, {what}: batch {args.batch_size} of {FRAME} uint8 stacks, capacity {capacity:,}, "
            f"{rounds} rounds x {steps} steps (median wall ms per step)",
            ["way", "ms / step", "÷ max(train, sample)"],
            [[name, f"{ms:.2f}", f"{ms / floor:.2f}"] for name, ms in median.items()],
        )
        ratio = median["prefetched"] / floor
        print(
            f"{what}: prefetched / max(train, sample) = {ratio:.2f} "
            f"(target <= {TARGET}: {'met' if ratio <= TARGET else 'not met'}); "
            f"in turn / prefetched = {median['in turn'] / median['prefetched']:.2f}"
        )
    return 0


def _filled(capacity: int, compressed: bool) -> mpreplay.PrioritizedReplayBuffer:
    """A full buffer of Atari-like episodes: random frames, stacked 4 deep (the first frame of an
    episode repeated), each row with its next stack; compressed with next_of + stack_compress."""
    frame = {"shape": FRAME, "dtype": np.uint8}
    options: dict[str, Any] = {"next_of": "obs", "stack_compress": "obs"} if compressed else {}
    buffer = mpreplay.PrioritizedReplayBuffer(
        capacity,
        {"obs": frame, "next_obs": frame, "act": {"dtype": np.int64}, "rew": {}, "done": {}},
        seed=0,
        **options,
    )
    rng = np.random.default_rng(0)
    stack, episode = FRAME[-1], min(_EPISODE, capacity // 4)
    while buffer.get_stored_size() < capacity - episode:
        frames = rng.integers(0, 256, (episode + 1,) + FRAME[:-1], dtype=np.uint8)
        # Stack t holds frames t-3..t, the episode's first frame standing in before it.
        stacks = np.stack(
            [frames[np.clip(np.arange(episode + 1) - (stack - 1) + j, 0, None)] for j in range(stack)], axis=-1
        )
        for start in range(0, episode, 32):
            k = min(32, episode - start)
            done = np.zeros(k)
            done[-1] = start + k == episode
            buffer.add(
                obs=stacks[start : start + k],
                next_obs=stacks[start + 1 : start + k + 1],
                act=rng.integers(0, 6, k),
                rew=rng.random(k),
                done=done,
                priorities=rng.random(k) + 0.1,
            )
    return buffer


def _synthetic_step(seconds: float) -> Callable[[], None]:
    """A function that computes for about ``seconds`` (matrix products, calibrated here)."""
    a = torch.randn(256, 256)

    def products(n: int) -> None:
        x = a
        for _ in range(n):
            x = torch.tanh(x @ a)

    products(10)
    start = time.perf_counter()
    products(200)
    n = max(1, round(seconds / ((time.perf_counter() - start) / 200)))
    return lambda: products(n)


def _ways(
    buffer: mpreplay.PrioritizedReplayBuffer, batch_size: int, train: Callable[[], None]
) -> dict[str, Callable[[int], float]]:
    rng = np.random.default_rng(1)
    out = {name: a for name, a in buffer.sample(batch_size).items() if name not in ("indexes", "weights")}

    def new_priorities() -> np.ndarray:
        return rng.random(batch_size) + 0.1

    def timed(step: Callable[[], object]) -> Callable[[int], float]:
        def run(steps: int) -> float:
            start = time.perf_counter()
            for _ in range(steps):
                step()
            return time.perf_counter() - start

        return run

    def in_turn() -> None:
        batch = buffer.sample(batch_size, out=out)
        train()
        buffer.update_priorities(batch["indexes"], new_priorities())

    def prefetched(steps: int) -> float:
        with buffer.batches(batch_size, prefetch=2) as batches:
            next(batches)  # the thread's start and first batches are not a step
            start = time.perf_counter()
            for _, batch in zip(range(steps), batches, strict=False):
                train()
                buffer.update_priorities(batch["indexes"], new_priorities())
            return time.perf_counter() - start

    held = [buffer.sample(batch_size)]

    def sample_held() -> None:
        held[0] = buffer.sample(batch_size)

    return {
        "train": timed(train),
        "sample": timed(lambda: buffer.sample(batch_size, out=out)),
        "sample, no out=": timed(sample_held),
        "in turn": timed(in_turn),
        "prefetched": prefetched,
    }


if __name__ == "__main__":
    raise SystemExit(main())
