"""``mpreplay bench io``: save_transitions / load_transitions of Atari-like transitions.

``mpreplay bench io [--quick] [--count N] [--repeat K] [--dir DIR]``

The buffer holds ``N`` (default 100,000) transitions of one 84x84 uint8
frame (``obs``, no frame stack and no ``next_obs``: 7 KB a row, 0.7 GB in
all) plus ``act`` int64, ``rew`` float32 and ``done`` uint8.  The frames look
like an Atari screen: a smooth background posterised to 8 grey levels (it
changes every 2,000 frames, a new "level"), four moving sprites, and 1% of
pixels replaced by noise -- compressible as real frames are, neither zeros
nor pure noise.

Contenders, each on the same buffer and the same folder:

* ``mpreplay`` -- ``save_transitions`` (gather, write to a temporary file,
  fsync, rename) and ``load_transitions`` (read, check, add) into an empty
  buffer of the same capacity;
* ``numpy`` -- the same task by hand: ``np.savez(path, **buffer.get_all_transitions())``
  (``np.savez_compressed`` when deflated), with and without an fsync, and
  ``buffer.add(**np.load(path))``.

Rates are MB of transitions (not of file) per second; each figure is the
median of ``K`` repeats, and the repeats interleave the contenders.  Loads
read from the page cache (the file was just written): they measure parsing,
inflating and copying, not the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpreplay
from mpreplay import ReplayBuffer

FRAME = (84, 84)
ENV: dict[str, dict[str, Any]] = {
    "obs": {"shape": FRAME, "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "done": {"dtype": np.uint8},
}
_LEVEL_FRAMES = 2_000
_CHUNK = 2_000  # frames generated at a time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpreplay bench io", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 transitions (default 100,000)")
    parser.add_argument("--count", type=int, default=None, help="transitions in the buffer")
    parser.add_argument("--repeat", type=int, default=5, help="timings per median (default 5)")
    parser.add_argument("--dir", default=None, help="folder for the files (default: a new temporary folder)")
    args = parser.parse_args(argv)
    count = args.count or (5_000 if args.quick else 100_000)
    source = ReplayBuffer(count, ENV)
    source.add(**_atari_like(count, np.random.default_rng(0)))
    target = ReplayBuffer(count, ENV)
    raw_mb = sum(a.nbytes for a in source.get_all_transitions().values()) / 1e6
    folder = tempfile.mkdtemp(prefix="mpreplay-bench-io-", dir=args.dir)
    try:
        rows = [_measure(source, target, folder, compress, args.repeat) for compress in (True, False)]
    finally:
        shutil.rmtree(folder)
    print(
        f"{count:,} transitions: obs {FRAME} uint8, act int64, rew float32, done uint8 = {raw_mb:.1f} MB; "
        f"median of {args.repeat}; mpreplay {mpreplay.__version__}, numpy {np.__version__}"
    )
    _print_table(raw_mb, [row for group in rows for row in group])
    return 0


# -- data --------------------------------------------------------------------------------------


def _atari_like(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``count`` transitions whose frames compress about as real Atari frames do."""
    y, x = np.mgrid[: FRAME[0], : FRAME[1]]
    levels = []
    for _ in range(-(-count // _LEVEL_FRAMES)):
        fx, fy, phase = rng.uniform(0.03, 0.15, 2).tolist() + [rng.uniform(0, 6.3)]
        smooth = np.sin(fx * x + phase) + np.cos(fy * y - phase) + 0.5 * np.sin(0.05 * (x + y))
        levels.append((np.digitize(smooth, np.linspace(-2.5, 2.5, 7)) * 32).astype(np.uint8))
    start, velocity = rng.uniform(0, 80, (4, 2)), rng.uniform(-1.5, 1.5, (4, 2))
    frames = np.empty((count,) + FRAME, np.uint8)
    for first in range(0, count, _CHUNK):
        t = np.arange(first, min(first + _CHUNK, count))
        chunk = np.stack([levels[i // _LEVEL_FRAMES] for i in t])
        for k in range(4):
            # Sprites bounce off the walls: a triangle wave of the straight path.
            pos = np.abs((start[k] + velocity[k] * t[:, None]) % 152 - 76)
            rows = (y[None] >= pos[:, :1, None]) & (y[None] < pos[:, :1, None] + 6)
            cols = (x[None] >= pos[:, 1:, None]) & (x[None] < pos[:, 1:, None] + 4)
            chunk[rows & cols] = 255 - 20 * k
        noisy = rng.random(chunk.shape) < 0.01
        chunk[noisy] = rng.integers(0, 256, int(noisy.sum()), dtype=np.uint8)
        frames[first : first + len(t)] = chunk
    return {
        "obs": frames,
        "act": rng.integers(0, 18, count),
        "rew": rng.choice([0.0, 1.0], count, p=[0.97, 0.03]),
        "done": (rng.random(count) < 0.001).astype(np.uint8),
    }


# -- contenders --------------------------------------------------------------------------------


def _numpy_save(compress: bool, fsync: bool) -> Callable[[ReplayBuffer, str], None]:
    savez = np.savez_compressed if compress else np.savez

    def save(buffer: ReplayBuffer, path: str) -> None:
        with open(path, "wb") as f:
            savez(f, **buffer.get_all_transitions())
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    return save


def _numpy_load(buffer: ReplayBuffer, path: str) -> None:
    with np.load(path, allow_pickle=False) as data:
        buffer.add(**{name: data[name] for name in data.files})


def _measure(
    source: ReplayBuffer, target: ReplayBuffer, folder: str, compress: bool, repeat: int
) -> list[dict[str, Any]]:
    """Save and load timings of every contender, one compression setting."""
    method = "deflated" if compress else "stored"
    contenders: list[tuple[str, Callable[[ReplayBuffer, str], None], Callable[[ReplayBuffer, str], Any]]] = [
        (
            f"mpreplay, {method}",
            lambda b, p: b.save_transitions(p, compress=compress),
            lambda b, p: b.load_transitions(p),
        ),
        (f"np.savez{'_compressed' if compress else ''} + fsync", _numpy_save(compress, True), _numpy_load),
        (f"np.savez{'_compressed' if compress else ''}", _numpy_save(compress, False), _numpy_load),
    ]
    baseline = contenders[1][0]  # numpy with fsync: as durable as save_transitions
    times: dict[str, dict[str, list[float]]] = {name: {"save": [], "load": []} for name, _, _ in contenders}
    sizes: dict[str, int] = {}
    for _ in range(repeat):
        for name, save, load in contenders:
            path = os.path.join(folder, f"{len(sizes)}.npz")
            times[name]["save"].append(_timed(save, source, path))
            sizes[name] = os.path.getsize(path)
            target.clear()
            times[name]["load"].append(_timed(load, target, path))
            assert target.get_stored_size() == source.get_stored_size()
            os.unlink(path)
    medians = {name: {op: statistics.median(t) for op, t in ops.items()} for name, ops in times.items()}
    return [
        {
            "name": name,
            "size": sizes[name],
            **medians[name],
            "save ratio": medians[baseline]["save"] / medians[name]["save"],
            "load ratio": medians[baseline]["load"] / medians[name]["load"],
        }
        for name in medians
    ]


def _timed(run: Callable[[ReplayBuffer, str], Any], buffer: ReplayBuffer, path: str) -> float:
    start = time.perf_counter()
    run(buffer, path)
    return time.perf_counter() - start


def _print_table(raw_mb: float, rows: list[dict[str, Any]]) -> None:
    header = ("contender", "file MB", "raw/file", "save MB/s", "save ratio", "load MB/s", "load ratio")
    table = [header] + [
        (
            row["name"],
            f"{row['size'] / 1e6:.1f}",
            f"{raw_mb * 1e6 / row['size']:.1f}",
            f"{raw_mb / row['save']:.0f}",
            f"{row['save ratio']:.2f}",
            f"{raw_mb / row['load']:.0f}",
            f"{row['load ratio']:.2f}",
        )
        for row in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    print(
        "ratio = median time of numpy + fsync (np.savez or np.savez_compressed; np.load + add) with the same "
        "compression over this row's; above 1 = faster"
    )
