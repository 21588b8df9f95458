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
  It runs in a worker process with the peers' venv (``--peers DIR``, or ``$MPREPLAY_PEERS``; made
  by ``python -m mpreplay.bench.peers --setup DIR``): the torch that TorchRL's compiled trees were
  built for.  Without it, the run says why and leaves the speed target unjudged.

A round times ``C`` sample calls of every contender in turn (wall clock and CPU time of the
process that samples, every thread counted); figures are medians over ``R`` rounds, ratios from
the same run.  Memory:
bytes of each buffer per stored step (mpreplay: its segment's pages in /dev/shm, as ``mpreplay ls``
shows them; TorchRL: its storage's tensors) against one frame (84 x 84 bytes) and against storing
each sampleable sequence whole (80 steps' fields per sequence, as a store without shared steps does).
Targets: mpreplay compressed >= 3x TorchRL's sampled steps per second; <= 1.1 frames per step.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import mpreplay
from mpreplay import MPPrioritizedSequenceReplayBuffer
from mpreplay.bench import peers
from mpreplay.bench._report import positive_int, print_table
from mpreplay.bench.peer_frames import FRAME, STACK, episodes
from mpreplay.monitor import list_segments

ONE_FRAME = int(np.prod(FRAME))  # bytes: the limit of a per-step frame store
LENGTH, PERIOD = 80, 40  # R2D2's sequences
ALPHA, BETA = 0.6, 0.6
SPEED_TARGET, MEMORY_TARGET = 3.0, 1.1
ENV: dict[str, dict[str, Any]] = {
    "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "done": {"dtype": np.float32},
}
STEP_BYTES = sum(int(np.prod(f.get("shape", ()))) * np.dtype(f["dtype"]).itemsize for f in ENV.values())
LAYOUTS: dict[str, dict[str, Any]] = {"compressed": {"stack_compress": "obs"}, "uncompressed": {}}


# -- contenders ------------------------------------------------------------------
@dataclass
class _Contender:
    name: str
    add: Callable[[int, dict[str, Any], np.ndarray], object]  # (episode id, fields, priorities)
    run: Callable[[int], tuple[float, float]]  # calls -> (wall, CPU) seconds a call, after one untimed call
    memory: Callable[[], tuple[int, int, int]] | None  # (bytes, stored steps, sampleable sequences or -1)
    close: Callable[[], None]
    wall: list[float] = field(default_factory=list)  # seconds per call, one entry per round
    cpu: list[float] = field(default_factory=list)


def _timed(sample: Callable[[], Any]) -> Callable[[int], tuple[float, float]]:
    def run(calls: int) -> tuple[float, float]:
        sample()  # first-touch page faults and lazy setup stay out of the timing
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            sample()
        return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls

    return run


def _mpreplay(layout: str, capacity: int, batch: int, seed: int, *, new_arrays: bool) -> list[_Contender]:
    """The buffer sampling into its previous batch and, with ``new_arrays``, the same buffer
    sampling into fresh arrays (a second contender that adds nothing and owns no memory)."""
    rb = MPPrioritizedSequenceReplayBuffer(
        capacity, ENV, length=LENGTH, period=PERIOD, alpha=ALPHA, seed=seed, **LAYOUTS[layout]
    )
    previous: dict[str, dict[str, np.ndarray]] = {}

    def reuse() -> dict[str, np.ndarray]:
        previous["batch"] = rb.sample(batch, BETA, out=previous.get("batch"))
        return previous["batch"]

    def memory() -> tuple[int, int, int]:
        segment = next(s for s in list_segments() if s.name == rb.name)
        sequences = rb.stats()["sequences"]
        assert sequences is not None  # a counter: only the lock holder's entries are ever None
        return segment.nbytes, rb.get_stored_size(), int(sequences)

    out = [
        _Contender(
            f"mpreplay {layout}, out=",
            lambda _, fields, priorities: rb.add(priorities=priorities, **fields),
            _timed(reuse),
            memory,
            rb.close,
        )
    ]
    if new_arrays:
        out.append(
            _Contender(
                f"mpreplay {layout}, new arrays",
                lambda *_: None,
                _timed(lambda: rb.sample(batch, BETA)),
                None,
                lambda: None,
            )
        )
    return out


def _torchrl(worker: peers.PeerProcess, capacity: int, batch: int, episode: int, seed: int) -> _Contender:
    """TorchRL's PrioritizedSliceSampler in its worker, filled there with the same stream."""
    reply = worker.request("seq_build", capacity=capacity, batch=batch, mean_length=episode, seed=seed)
    nbytes, stored = reply["memory"]

    def run(calls: int) -> tuple[float, float]:
        timing = worker.request("seq_run", calls=calls)
        return timing["wall"] / calls, timing["cpu"] / calls

    return _Contender(
        "TorchRL PrioritizedSliceSampler", lambda *_: None, run, lambda: (nbytes, stored, -1), worker.close
    )


# -- measuring -------------------------------------------------------------------
def _time_rounds(contenders: list[_Contender], repeats: int, calls: int) -> None:
    for _ in range(repeats):
        for c in contenders:
            wall, cpu = c.run(calls)
            c.wall.append(wall)
            c.cpu.append(cpu)


def _rate(c: _Contender, steps: int) -> tuple[float, float]:
    """Sampled steps per second and per CPU-second, from the median call."""
    return steps / float(np.median(c.wall)), steps / float(np.median(c.cpu))


def _judged(ratio: float | None, goal: float, at_least: bool) -> str:
    if ratio is None:
        return "not measured"
    return "yes" if (ratio >= goal if at_least else ratio <= goal) else "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench seq",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="capacity 3,000, batch 8, 3 rounds: a smoke run")
    parser.add_argument("--capacity", type=positive_int, help="steps stored (default 100,000)")
    parser.add_argument("--batch", type=positive_int, help="sequences per sample (default 64)")
    parser.add_argument("--episode", type=positive_int, help="mean episode length (default 400)")
    parser.add_argument("--repeats", type=positive_int, help="rounds; figures are their medians (default 7)")
    parser.add_argument("--calls", type=positive_int, help="sample calls per contender and round (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peers",
        metavar="DIR",
        help="the peers' venv, where TorchRL runs (default: "
        f"${peers.ENV_VAR}; made by `python -m mpreplay.bench.peers --setup DIR`)",
    )
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
        worker = peers.launch(["torchrl"], args.peers)["torchrl"]
        if isinstance(worker, peers.Unavailable):
            note = f"TorchRL unavailable: {worker.reason}; its ratio is not measured"
        else:
            versions.append(peers.describe(worker))
            try:
                contenders.append(_torchrl(worker, capacity, batch, episode, args.seed))
            except peers.PeerError as exc:
                worker.close()
                note = f"TorchRL failed: {exc}; its ratio is not measured"
        for i, (fields, priorities) in enumerate(episodes(args.seed, capacity + capacity // 4, episode)):
            for c in contenders:
                c.add(i, fields, priorities)
        memory = {c.name: c.memory() for c in contenders if c.memory is not None}
        _time_rounds(contenders, repeats, calls)
    finally:
        for c in contenders:
            c.close()

    print(
        f"capacity {capacity:,} steps, filled with {capacity + capacity // 4:,} in episodes of mean length "
        f"{episode}; sample({batch}) sequences of {LENGTH} (period {PERIOD}), obs {FRAME + (STACK,)} uint8; "
        f"medians of {repeats} rounds x {calls} calls; {len(os.sched_getaffinity(0))} cores; {', '.join(versions)}"
    )
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
        per_s, per_cpu_s = rates[c.name]
        vs = (
            ["", ""]
            if torch_row is None
            else [f"{per_s / rates[torch_row][0]:.2f}", f"{per_cpu_s / rates[torch_row][1]:.2f}"]
        )
        rows.append([c.name, f"{float(np.median(c.wall)) * 1e3:.1f}", f"{per_s:,.0f}", f"{per_cpu_s:,.0f}", *vs])
    print_table(
        f"Sampling {batch} sequences x {LENGTH} steps",
        ["buffer", "ms / sample", "steps/s", "steps / CPU s", "÷ TorchRL", "÷ TorchRL per CPU s"],
        rows,
    )

    rows = []
    for name, (nbytes, stored, sequences) in memory.items():
        whole = "" if sequences < 0 else f"{nbytes / (sequences * LENGTH * STEP_BYTES):.4f}"
        rows.append(
            [
                name.removesuffix(", out="),
                f"{nbytes / 2**20:,.0f}",
                f"{stored:,}",
                f"{nbytes / stored:,.0f}",
                f"{nbytes / stored / ONE_FRAME:.3f}",
                whole,
            ]
        )
    print_table(
        f"Memory per stored step (one frame: {ONE_FRAME:,} B; a step's fields: {STEP_BYTES:,} B)",
        ["buffer", "MiB", "steps", "bytes / step", "÷ one frame", "÷ sequences stored whole"],
        rows,
    )

    speed: float | None = None
    per_cpu: float | None = None
    if torch_row is not None:
        speed, per_cpu = (rates[contenders[0].name][i] / rates[torch_row][i] for i in (0, 1))
    nbytes, stored, _ = memory[contenders[0].name]
    frames = nbytes / stored / ONE_FRAME
    print_table(
        "Targets (this run)",
        ["target", "measured", "goal", "met"],
        [
            [
                "mpreplay compressed ÷ TorchRL PrioritizedSliceSampler, steps/s",
                "" if speed is None else f"{speed:.2f}",
                f">= {SPEED_TARGET:g}",
                _judged(speed, SPEED_TARGET, True),
            ],
            [
                "the same, steps per CPU-second",
                "" if per_cpu is None else f"{per_cpu:.2f}",
                f">= {SPEED_TARGET:g}",
                _judged(per_cpu, SPEED_TARGET, True),
            ],
            [
                "mpreplay compressed, bytes per step ÷ one frame",
                f"{frames:.3f}",
                f"<= {MEMORY_TARGET:g}",
                _judged(frames, MEMORY_TARGET, False),
            ],
        ],
    )
