"""``mpreplay bench seq``: sampling R2D2 sequences of Atari frames, against TorchRL's slice sampler.

``mpreplay bench seq [--quick] [--capacity N] [--batch B] [--episode E] [--repeats R] [--calls C]``

A synthetic Atari-like stream fills every buffer with the same steps: ``obs`` is four stacked
(84, 84) uint8 frames, each step's stack the previous one shifted by one new frame (an episode
starts with its first frame repeated), plus ``act``, ``rew``, ``done``; episodes have geometric
lengths of mean ``E`` (400) and every step a random initial priority.  ``N`` (default 100,000)
steps of capacity, filled with 1.25 N steps so every buffer has wrapped.

Contenders, prioritized (alpha 0.6, beta 0.6), sampling ``B`` (64) sequences of 80 steps:

* mpreplay's shared ``MPPrioritizedSequenceReplayBuffer`` (length 80, period 40), frames stored
  once (``stack_compress="obs"``), sampling into its previous batch (``out=``) and into new arrays;
* the same buffer uncompressed, for reference;
* TorchRL's ``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` with a
  ``PrioritizedSliceSampler`` (``slice_len=80``, ``traj_key="episode"``), its usual setup:
  trajectory boundaries found at each sample, as a buffer written between samples needs (its
  sampler also reads the sampled rows once for their done flags before the buffer gathers them).
  When TorchRL is installed but its prioritized samplers cannot run (their C++ extension was
  built for another torch), its uniform ``SliceSampler`` stands in, labelled so, and the speed
  target is not judged.

A round times ``C`` sample calls of every contender in turn (wall clock and process CPU time,
every thread counted); figures are medians over ``R`` rounds, ratios from the same run.  Memory:
bytes of each buffer per stored step (mpreplay: its segment's pages in /dev/shm, as ``mpreplay ls``
shows them; TorchRL: its storage's tensors) against one frame (84 x 84 bytes) and against storing
each sampleable sequence whole (80 steps' fields per sequence, as a store without shared steps does).
Targets: mpreplay compressed >= 3x TorchRL's sampled steps per second; <= 1.1 frames per step.
"""
from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import mpreplay
from mpreplay import MPPrioritizedSequenceReplayBuffer
from mpreplay.bench._report import positive_int, print_table
from mpreplay.monitor import list_segments

FRAME = (84, 84)
STACK = 4
ONE_FRAME = int(np.prod(FRAME))  # bytes: the limit of a per-step frame store
LENGTH, PERIOD = 80, 40  # R2D2's sequences
ALPHA, BETA = 0.6, 0.6
SPEED_TARGET, MEMORY_TARGET = 3.0, 1.1
ENV = {"obs": {"shape": FRAME + (STACK,), "dtype": np.uint8}, "act": {"dtype": np.int64},
       "rew": {"dtype": np.float32}, "done": {"dtype": np.float32}}
STEP_BYTES = sum(int(np.prod(f.get("shape", ()))) * np.dtype(f["dtype"]).itemsize for f in ENV.values())
LAYOUTS = {"compressed": {"stack_compress": "obs"}, "uncompressed": {}}


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
        yield ({"obs": np.moveaxis(frames[index], 1, -1), "act": rng.integers(0, 6, k),
                "rew": rng.standard_normal(k).astype(np.float32), "done": done},
               rng.uniform(0.01, 2.0, k))
        added += k


# -- contenders ------------------------------------------------------------------
@dataclass
class _Contender:
    name: str
    add: Callable[[int, dict[str, np.ndarray], np.ndarray], None]  # (episode id, fields, priorities)
    sample: Callable[[], Any]
    memory: Callable[[], tuple[int, int, int]] | None  # (bytes, stored steps, sampleable sequences or -1)
    close: Callable[[], None]
    wall: list[float] = field(default_factory=list)  # seconds per call, one entry per round
    cpu: list[float] = field(default_factory=list)


def _mpreplay(layout: str, capacity: int, batch: int, seed: int, *, new_arrays: bool) -> list[_Contender]:
    """The buffer sampling into its previous batch and, with ``new_arrays``, the same buffer
    sampling into fresh arrays (a second contender that adds nothing and owns no memory)."""
    rb = MPPrioritizedSequenceReplayBuffer(capacity, ENV, length=LENGTH, period=PERIOD, alpha=ALPHA,
                                           seed=seed, **LAYOUTS[layout])
    previous: dict[str, dict[str, np.ndarray]] = {}

    def reuse() -> dict[str, np.ndarray]:
        previous["batch"] = rb.sample(batch, BETA, out=previous.get("batch"))
        return previous["batch"]

    def memory() -> tuple[int, int, int]:
        segment = next(s for s in list_segments() if s.name == rb.name)
        return segment.nbytes, rb.get_stored_size(), int(rb.stats()["sequences"])

    out = [_Contender(f"mpreplay {layout}, out=", lambda _, fields, priorities: rb.add(priorities=priorities, **fields),
                      reuse, memory, rb.close)]
    if new_arrays:
        out.append(_Contender(f"mpreplay {layout}, new arrays", lambda *_: None, lambda: rb.sample(batch, BETA),
                              None, lambda: None))
    return out


def _torchrl_samplers() -> tuple[Any, str | None]:
    """TorchRL's sampler class to use and, when it is not PrioritizedSliceSampler, why.

    Raises ImportError when TorchRL is not installed."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

    try:
        PrioritizedSliceSampler(max_capacity=2, alpha=ALPHA, beta=BETA, slice_len=1)
    except RuntimeError as exc:
        import torch
        import torchrl

        try:  # the usual cause: TorchRL's compiled segment trees were built against another torch
            importlib.import_module("torchrl._torchrl")
            cause = str(exc)
        except ImportError as why:
            cause = f"its C++ extension does not load: {str(why).split('.so: ', 1)[-1][:60]}..."
        return SliceSampler, (f"TorchRL {torchrl.__version__}'s PrioritizedSliceSampler does not run with torch "
                              f"{torch.__version__} ({cause}); its uniform SliceSampler stands in")
    return PrioritizedSliceSampler, None


def _torchrl(sampler_class: Any, capacity: int, batch: int) -> _Contender:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    prioritized = sampler_class.__name__.startswith("Prioritized")
    options = {"max_capacity": capacity, "alpha": ALPHA, "beta": BETA} if prioritized else {}
    sampler = sampler_class(slice_len=LENGTH, traj_key="episode", **options)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch * LENGTH)
    row_bytes = [0]

    def add(episode: int, fields: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        k = len(priorities)
        data = {key: torch.from_numpy(value) for key, value in fields.items()}
        data["done"] = data["done"].bool()
        data["episode"] = torch.full((k,), episode, dtype=torch.int64)
        steps = TensorDict(data, batch_size=[k])
        row_bytes[0] = sum(t[0].nbytes for t in steps.values())
        index = rb.extend(steps)
        if prioritized:
            rb.update_priority(index, torch.as_tensor(priorities, dtype=torch.float32))  # the trees' dtype

    def memory() -> tuple[int, int, int]:
        # LazyTensorStorage allocates every field for the whole capacity at its first write;
        # the sampler's priority trees are not counted.
        return capacity * row_bytes[0], len(rb), -1

    label = "TorchRL " + sampler_class.__name__ + ("" if prioritized else " (uniform, stand-in)")
    return _Contender(label, add, lambda: rb.sample().reshape(batch, LENGTH), memory, lambda: None)


# -- measuring -------------------------------------------------------------------
def _time_rounds(contenders: list[_Contender], repeats: int, calls: int) -> None:
    for c in contenders:  # warm-up: first-touch page faults and lazy setup stay out of the rounds
        c.sample()
    for _ in range(repeats):
        for c in contenders:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                c.sample()
            c.wall.append((time.perf_counter() - wall) / calls)
            c.cpu.append((time.process_time() - cpu) / calls)


def _rate(c: _Contender, steps: int) -> tuple[float, float]:
    """Sampled steps per second and per CPU-second, from the median call."""
    return steps / float(np.median(c.wall)), steps / float(np.median(c.cpu))


def _judged(ratio: float | None, goal: float, at_least: bool) -> str:
    if ratio is None:
        return "not measured"
    return "yes" if (ratio >= goal if at_least else ratio <= goal) else "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpreplay bench seq", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="capacity 3,000, batch 8, 3 rounds: a smoke run")
    parser.add_argument("--capacity", type=positive_int, help="steps stored (default 100,000)")
    parser.add_argument("--batch", type=positive_int, help="sequences per sample (default 64)")
    parser.add_argument("--episode", type=positive_int, help="mean episode length (default 400)")
    parser.add_argument("--repeats", type=positive_int, help="rounds; figures are their medians (default 7)")
    parser.add_argument("--calls", type=positive_int, help="sample calls per contender and round (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    capacity = args.capacity or (3_000 if quick else 100_000)
    batch = args.batch or (8 if quick else 64)
    episode = args.episode or (150 if quick else 400)
    repeats = args.repeats or (3 if quick else 7)
    calls = args.calls or (1 if quick else 5)
    if capacity < LENGTH:
        parser.error(f"--capacity: a sequence of {LENGTH} steps must fit, got {capacity}")

    versions = [f"mpreplay {mpreplay.__version__}", f"numpy {np.__version__}"]
    note = None
    contenders: list[_Contender] = []
    try:
        contenders += _mpreplay("compressed", capacity, batch, args.seed, new_arrays=True)
        contenders += _mpreplay("uncompressed", capacity, batch, args.seed, new_arrays=False)
        try:
            sampler_class, note = _torchrl_samplers()
        except ImportError:
            note = "TorchRL is not installed (pip install torchrl): no TorchRL row, its ratio is not measured"
        else:
            import torch
            import torchrl

            versions += [f"torchrl {torchrl.__version__}",
                         f"torch {torch.__version__} ({torch.get_num_threads()} threads)"]
            contenders.append(_torchrl(sampler_class, capacity, batch))
        for i, (fields, priorities) in enumerate(episodes(args.seed, capacity + capacity // 4, episode)):
            for c in contenders:
                c.add(i, fields, priorities)
        memory = {c.name: c.memory() for c in contenders if c.memory is not None}
        _time_rounds(contenders, repeats, calls)
    finally:
        for c in contenders:
            c.close()

    print(f"capacity {capacity:,} steps, filled with {capacity + capacity // 4:,} in episodes of mean length "
          f"{episode}; sample({batch}) sequences of {LENGTH} (period {PERIOD}), obs {FRAME + (STACK,)} uint8; "
          f"medians of {repeats} rounds x {calls} calls; {len(os.sched_getaffinity(0))} cores; {', '.join(versions)}")
    if note:
        print(note)
    _report(contenders, memory, batch)
    return 0


def _report(contenders: list[_Contender], memory: dict[str, tuple[int, int, int]], batch: int) -> None:
    """The speed, memory and target tables of one run."""
    steps = batch * LENGTH
    rates = {c.name: _rate(c, steps) for c in contenders}
    torch_row = next((c.name for c in contenders if c.name.startswith("TorchRL")), None)
    rows = []
    for c in contenders:
        per_s, per_cpu = rates[c.name]
        vs = ["", ""] if torch_row is None else [f"{per_s / rates[torch_row][0]:.2f}",
                                                 f"{per_cpu / rates[torch_row][1]:.2f}"]
        rows.append([c.name, f"{float(np.median(c.wall)) * 1e3:.1f}", f"{per_s:,.0f}", f"{per_cpu:,.0f}", *vs])
    print_table(f"Sampling {batch} sequences x {LENGTH} steps", ["buffer", "ms / sample", "steps/s",
                "steps / CPU s", "÷ TorchRL", "÷ TorchRL per CPU s"], rows)

    rows = []
    for name, (nbytes, stored, sequences) in memory.items():
        whole = "" if sequences < 0 else f"{nbytes / (sequences * LENGTH * STEP_BYTES):.4f}"
        rows.append([name.removesuffix(", out="), f"{nbytes / 2**20:,.0f}", f"{stored:,}", f"{nbytes / stored:,.0f}",
                     f"{nbytes / stored / ONE_FRAME:.3f}", whole])
    print_table(f"Memory per stored step (one frame: {ONE_FRAME:,} B; a step's fields: {STEP_BYTES:,} B)",
                ["buffer", "MiB", "steps", "bytes / step", "÷ one frame", "÷ sequences stored whole"], rows)

    speed = None
    if torch_row is not None and torch_row.startswith("TorchRL Prioritized"):
        speed = rates[contenders[0].name][0] / rates[torch_row][0]
    nbytes, stored, _ = memory[contenders[0].name]
    frames = nbytes / stored / ONE_FRAME
    print_table("Targets (this run)", ["target", "measured", "goal", "met"], [
        ["mpreplay compressed ÷ TorchRL PrioritizedSliceSampler, steps/s",
         "" if speed is None else f"{speed:.2f}", f">= {SPEED_TARGET:g}", _judged(speed, SPEED_TARGET, True)],
        ["mpreplay compressed, bytes per step ÷ one frame", f"{frames:.3f}", f"<= {MEMORY_TARGET:g}",
         _judged(frames, MEMORY_TARGET, False)]])
