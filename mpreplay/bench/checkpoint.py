"""``mpreplay bench checkpoint``: checkpoint and restore of a table of real Atari frames, against the disk.

``mpreplay bench checkpoint [--quick] [--capacity N,N...] [--record-steps S] [--seconds W] [--dir DIR]
[--save-max N] [--repeats R] [--peers DIR] [--reverb-max N]``

Real Breakout episodes are recorded as ``mpreplay bench apex`` records them, and a compressed table
(``next_of`` + ``stack_compress``, 8 lanes, the demo's rows) of each capacity ``N`` is filled past
capacity with them (a table larger than the episodes recorded holds them several times over: the
frames are the recorded ones, tiled).  Then, on the disk of ``--dir`` (default: a temporary folder):

1. **Checkpoint and restore**: ``table.checkpoint(path)`` (nothing else running) and
   ``mpreplay.restore(path)`` into a new shared table, with the checkpoint's pages dropped from
   the page cache first (``posix_fadvise``: the restore reads the disk, as after a reboot); the
   floor beside them: writing the same number of bytes to one file sequentially, in the same
   16 MB pieces, with an fsync, and reading them back cold, each the faster of two ways: plainly
   (through the page cache) and as the checkpoint does (write-back streamed; direct reads, 4 in
   flight).  Each of the four is measured
   ``--repeats`` times, interleaved (default 3): the tables show the medians and their ratios,
   a line below each run's ratios.  Sizes: the checkpoint against the table's memory (its segment).
2. **save_transitions** of the same table (the portable export, plain layout, not deflated), for
   tables of at most ``--save-max`` transitions (20,000: the plain layout is 8 times the bytes).
3. **Reverb** (``--peers DIR``: the Reverb venv at ``DIR/reverb``, see :mod:`mpreplay.bench.peers`),
   for tables of at most ``--reverb-max`` transitions (20,000): its server filled with the same
   transitions as items of ``obs`` + ``next_obs`` stacks, ``client.checkpoint()`` timed, a new
   server restoring it, and its writer and learner timed alone and while it checkpoints
   (:mod:`mpreplay.bench.reverb_checkpoint`).
4. **Waits**: a writer process adding a row per call (the demo's actor) and a learner sampling
   256 + updating, for ``W`` seconds without a checkpoint, then ``W`` seconds with checkpoints
   taken one after the other: the longest, the 99th and 99.9th percentiles of each call and how
   many took over 50 ms, the rows each live checkpoint left out, and how long its lock was held
   for the cut.

Other work on the machine and the disk's own cache skew every figure; the floor is measured in the
same run, on the same disk, so the ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench._report import positive_int, positive_seconds
from mpreplay.bench.apex import LANES, compressed_buffer, fill
from mpreplay.bench.apex_episodes import Episode, record
from mpreplay.bench.apex_measures import learner_op, print_table, writer_op
from mpreplay.bench.peers import ENV_VAR, REVERB, peers_python
from mpreplay.bench.reverb_checkpoint import drop_cache, timed_calls
from mpreplay.checkpoint import crc32
from mpreplay.checkpoint_read import PART, READERS
from mpreplay.writeback import Writeback

PIECE = 16 * 2**20  # the floor's write and read size (the checkpoint's chunk)
MB = 1e6


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    print(
        f"mpreplay {mpreplay.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; checksums by "
        f"{'ISA-L' if crc32.__module__.startswith('isal') else 'zlib'}; {_load()}"
    )
    episodes = record(args.record_steps)
    print(f"recorded {sum(len(e) for e in episodes):,} env steps of real Breakout ({len(episodes)} episodes)")
    folder = Path(tempfile.mkdtemp(prefix="mpreplay-bench-checkpoint-", dir=args.dir))
    try:
        cases = [_case(c, episodes, folder, args.seconds, c <= args.save_max, args.repeats) for c in args.capacity]
        python, why_not = peers_python(args.peers, REVERB)
        for c in cases:
            if c.capacity <= args.reverb_max:
                c.reverb = _reverb(python, why_not, episodes, c.capacity, args.seconds, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{_load()} at the end")
    _report(cases)
    return 0


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench checkpoint", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small table and short windows: a smoke run")
    parser.add_argument("--capacity", default=None, help="transitions of each table, comma separated (default 100000)")
    parser.add_argument("--record-steps", type=positive_int, default=None, help="real env steps (default 8,000)")
    parser.add_argument("--seconds", type=positive_seconds, default=None, help="window of each wait case (default 5)")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temporary folder)")
    parser.add_argument(
        "--save-max", type=int, default=20_000, help="largest table save_transitions is timed on (default 20,000)"
    )
    parser.add_argument("--peers", default=None, help=f"the peers' venvs (Reverb's at DIR/reverb; or {ENV_VAR})")
    parser.add_argument(
        "--reverb-max", type=int, default=20_000, help="largest table Reverb checkpoints (default 20,000)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=None, help="runs of checkpoint, restore and floors (default 3)"
    )
    args = parser.parse_args(list(argv))
    try:
        args.capacity = [positive_int(str(int(float(c)))) for c in (args.capacity or "").split(",") if c] or [
            2_000 if args.quick else 100_000
        ]
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(f"--capacity: expected transitions, comma separated ({exc})")
    args.record_steps = args.record_steps or (600 if args.quick else 8_000)
    args.seconds = args.seconds or (0.5 if args.quick else 5.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


SLOW = 0.050  # a call's seconds the target allows


@dataclass
class Waits:
    """The longest, the 99th and 99.9th percentiles of a call's seconds in a window, how many
    calls, and how many of them took over SLOW."""

    longest: float
    p99: float
    p999: float
    calls: int
    slow: int

    @classmethod
    def of(cls, seconds: np.ndarray) -> Waits:
        if not len(seconds):
            return cls(float("nan"), float("nan"), float("nan"), 0, 0)
        p99, p999 = np.percentile(seconds, [99, 99.9])
        return cls(float(seconds.max()), float(p99), float(p999), len(seconds), int((seconds > SLOW).sum()))


@dataclass
class Case:
    capacity: int
    segment: int  # the table's memory, bytes
    size: int  # the checkpoint's bytes
    checkpoint: list[float]  # seconds, one per repeat
    restore: list[float]
    floor_write: list[float]
    floor_read: list[float]
    save_transitions: float | None  # seconds, None: not timed (a table above --save-max)
    save_bytes: int
    waits: dict[str, Waits]  # "<role> <window>"
    left_out: list[int]  # rows each live checkpoint left out
    cut: float  # the longest lock hold of a live checkpoint's cut, seconds
    live: int  # live checkpoints taken
    reverb: dict[str, Any] | str | None = None  # Reverb's figures (reverb_checkpoint.py), why not, or not run


def _case(capacity: int, episodes: list[Episode], folder: Path, seconds: float, export: bool, repeats: int) -> Case:
    with compressed_buffer(capacity, LANES) as table:
        fill(table, episodes, capacity + capacity // 10)
        checkpoint, restore, floor_write, floor_read = [], [], [], []
        for _ in range(repeats):  # interleaved: a burst of other work on the machine skews one of each, not all
            start = time.perf_counter()
            doc = table.checkpoint(folder / "ck")
            checkpoint.append(time.perf_counter() - start)
            size = sum(f.stat().st_size for f in (folder / "ck").iterdir())
            write, read = _floor(folder / "floor.bin", size)
            floor_write.append(write)
            floor_read.append(read)
            drop_cache(folder / "ck" / "data.bin")
            start = time.perf_counter()
            with mpreplay.restore(folder / "ck"):
                restore.append(time.perf_counter() - start)
        save, save_bytes = None, 0
        if export:
            start = time.perf_counter()
            table.save_transitions(str(folder / "rows.npz"), compress=False)
            save = time.perf_counter() - start
            save_bytes = (folder / "rows.npz").stat().st_size
            (folder / "rows.npz").unlink()
        waits, live = _waits(table, episodes, folder / "live", seconds)
    return Case(
        capacity,
        int(doc["nbytes"]),
        size,
        checkpoint,
        restore,
        floor_write,
        floor_read,
        save,
        save_bytes,
        waits,
        [d["rows_left_out"] for d in live],
        max((d["cut_seconds"] for d in live), default=float("nan")),
        len(live),
    )


def _reverb(
    python: str | None, why_not: str, episodes: list[Episode], capacity: int, seconds: float, folder: Path
) -> dict[str, Any] | str:
    """Reverb's figures for a table of ``capacity`` of the episodes' transitions, or why there are none."""
    if python is None:
        return why_not
    rows = folder / "reverb-rows.npz"
    frames, obs_at, next_at, small, base = [], [], [], [], 0
    for e in episodes:
        t, ahead, fields = e.steps()
        frames.append(e.frames)
        obs_at.append(base + e.stack_frames(t))
        next_at.append(base + e.stack_frames(ahead))
        small.append(fields)
        base += len(e.frames)
    np.savez(
        rows,
        frames=np.concatenate(frames),
        obs_at=np.concatenate(obs_at),
        next_at=np.concatenate(next_at),
        **{name: np.concatenate([f[name] for f in small]) for name in small[0]},  # type: ignore[arg-type]
    )
    worker = Path(__file__).with_name("reverb_checkpoint.py")
    command = [python, str(worker), str(rows), str(capacity), str(seconds), str(folder / "reverb")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "Reverb's run did not end within 900 s"
    finally:
        rows.unlink()
        shutil.rmtree(folder / "reverb", ignore_errors=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return f"Reverb's run failed (status {done.returncode}): {tail}"
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def _floor(path: Path, nbytes: int) -> tuple[float, float]:
    """Seconds to write ``nbytes`` to ``path`` sequentially and fsync it, and to read them back cold:
    each the faster of two ways, plainly (PIECE writes and reads through the page cache) and as the
    checkpoint does (the write-back streamed, :class:`~mpreplay.writeback.Writeback`; direct reads,
    READERS of PART in flight)."""
    piece = np.random.default_rng(0).integers(0, 256, PIECE, dtype=np.uint8)
    writes = []
    for streamed in (False, True):
        start = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            writeback, offset = Writeback(f.fileno()), 0
            while offset < nbytes:
                n = f.write(piece.data[: min(nbytes - offset, PIECE)])
                if streamed:
                    writeback.wrote(offset, n)
                offset += n
            writeback.finish()
            os.fsync(f.fileno())
        writes.append(time.perf_counter() - start)
    drop_cache(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(piece.data):
            pass
    reads = [time.perf_counter() - start]
    drop_cache(path)
    start = time.perf_counter()
    _direct_read(path, nbytes)
    reads.append(time.perf_counter() - start)
    path.unlink()
    return min(writes), min(reads)


def _direct_read(path: Path, nbytes: int) -> None:
    """Read ``path`` by direct I/O (where the system has it), READERS reads of PART in flight."""
    buffers = [mmap.mmap(-1, PART) for _ in range(READERS)]  # page-aligned, as direct I/O needs
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        with ThreadPoolExecutor(READERS) as pool:
            # Two reads may share a buffer: the bytes are thrown away, only the disk's time counts.
            list(pool.map(lambda k: os.preadv(fd, [buffers[k % READERS]], k * PART), range(-(-nbytes // PART))))
    finally:
        os.close(fd)
        for b in buffers:
            b.close()


def _timed(role: str, table: Any, episodes: list[Episode], stop: Any, conn: Any) -> None:
    """A writer's add or the learner's sample + update, over and over until ``stop``: each call's
    ``(start, seconds)`` (monotonic clock, the same in every process), sent at the end."""
    try:
        op: Callable[[], None] = writer_op(table, episodes) if role == "writer" else learner_op(table)
        conn.send("ready")
        conn.send(timed_calls(op, stop))
    except BaseException as exc:  # the parent raises it
        conn.send(exc)
        raise


def _waits(
    table: Any, episodes: list[Episode], path: Path, seconds: float
) -> tuple[dict[str, Waits], list[dict[str, Any]]]:
    """The writer's and the learner's calls for ``seconds`` alone, then ``seconds`` with checkpoints
    taken one after the other into ``path``; their waits, and the live checkpoints' manifests."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    ended = [e for e in episodes if e.terminated][:6]
    roles, procs, conns = ("writer", "learner"), [], []
    try:
        for role in roles:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_timed, args=(role, table, ended, stop, theirs), daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        for role, conn in zip(roles, conns, strict=True):
            _receive(role, conn, 120.0)
        time.sleep(0.5)  # warm-up
        quiet = (time.monotonic(), time.monotonic() + seconds)
        time.sleep(seconds)
        live: list[dict[str, Any]] = []
        begin = time.monotonic()
        while time.monotonic() < begin + seconds or not live:
            live.append(table.checkpoint(path))
        during = (begin, time.monotonic())
        stop.set()
        marks = {role: _receive(role, conn, 60.0) for role, conn in zip(roles, conns, strict=True)}
    finally:
        stop.set()
        for proc in procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    waits = {}
    for role, m in marks.items():
        for window, (a, b) in (("alone", quiet), ("checkpointing", during)):
            inside = (m[:, 0] >= a) & (m[:, 0] < b) if len(m) else np.zeros(0, bool)
            waits[f"{role} {window}"] = Waits.of(m[inside, 1] if len(m) else np.zeros(0))
    shutil.rmtree(path, ignore_errors=True)
    return waits, live


def _receive(role: str, conn: Any, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"the {role} process did not answer within {timeout:.0f} s")
    message = conn.recv()
    if isinstance(message, BaseException):
        raise RuntimeError(f"the {role} process failed") from message
    return message


def _export(c: Case) -> str:
    if c.save_transitions is None:
        return "not timed"
    return f"{c.save_transitions:.2f} ({c.save_bytes / MB:,.0f} MB, {c.save_transitions / _median(c.checkpoint):.1f}x)"


def _median(seconds: list[float]) -> float:
    return float(np.median(seconds))


def _runs(c: Case) -> str:
    """Each run's seconds and ratios to its floor, in the order run."""

    def each(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    def ratios(a: list[float], b: list[float]) -> str:
        return " ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))

    return (
        f"capacity {c.capacity:,}, each run: checkpoint s {each(c.checkpoint)}, write floor s "
        f"{each(c.floor_write)} (ratios {ratios(c.checkpoint, c.floor_write)}); restore s {each(c.restore)}, "
        f"read floor s {each(c.floor_read)} (ratios {ratios(c.restore, c.floor_read)})"
    )


def _report(cases: list[Case]) -> None:
    rows = []
    for c in cases:
        checkpoint, restore = _median(c.checkpoint), _median(c.restore)
        write, read = _median(c.floor_write), _median(c.floor_read)
        rows.append(
            [
                f"{c.capacity:,}",
                f"{c.segment / MB:,.0f}",
                f"{c.size / MB:,.0f} ({c.size / c.segment:.3f}x)",
                f"{checkpoint:.2f} ({c.size / MB / checkpoint:,.0f} MB/s)",
                f"{write:.2f} ({checkpoint / write:.2f}x)",
                f"{restore:.2f} ({c.size / MB / restore:,.0f} MB/s)",
                f"{read:.2f} ({restore / read:.2f}x)",
                _export(c),
            ]
        )
    print_table(
        "Checkpoint and restore (seconds, medians) against the disk's sequential write and cold read of the same bytes",
        [
            "capacity",
            "segment MB",
            "checkpoint MB",
            "checkpoint s",
            "write floor s (ratio)",
            "restore s",
            "read floor s (ratio)",
            "save_transitions s",
        ],
        rows,
    )
    for c in cases:
        print(_runs(c))
    rows = []
    for c in cases:
        for name, w in c.waits.items():
            rows.append(
                [
                    f"{c.capacity:,}",
                    name,
                    f"{w.calls:,}",
                    f"{w.longest * 1e3:.1f}",
                    f"{w.p99 * 1e3:.2f}",
                    f"{w.p999 * 1e3:.2f}",
                    f"{w.slow:,}",
                ]
            )
    print_table(
        "Waits of a writer's add and a learner's sample + update (ms)",
        ["capacity", "call", "calls", "longest", "p99", "p99.9", f"over {SLOW * 1e3:.0f} ms"],
        rows,
    )
    _report_reverb(cases)
    for c in cases:
        print(
            f"capacity {c.capacity:,}: {c.live} live checkpoints, rows left out {c.left_out}, "
            f"longest cut (lock held) {c.cut * 1e3:.1f} ms"
        )


def _report_reverb(cases: list[Case]) -> None:
    """Reverb's figures beside mpreplay's, for the tables it ran."""
    rows, waits = [], []
    for c in cases:
        if isinstance(c.reverb, str):
            print(f"capacity {c.capacity:,}: Reverb not measured: {c.reverb}")
        if not isinstance(c.reverb, dict):
            continue
        r = c.reverb
        checkpoint, restore = _median(c.checkpoint), _median(c.restore)
        live = r["live_checkpoints_s"]
        rows.append(
            [
                f"{c.capacity:,}",
                f"{r['stored']:,}",
                f"{r['checkpoint_bytes'] / MB:,.0f} ({r['checkpoint_bytes'] / c.size:.1f}x)",
                f"{r['checkpoint_s']:.2f} ({r['checkpoint_s'] / checkpoint:.1f}x)",
                f"{r['restore_s']:.2f} ({r['restore_s'] / restore:.1f}x)",
                f"{len(live)}, longest {max(live):.2f}",
            ]
        )
        for name, w in r["waits"].items():
            waits.append(
                [
                    f"{c.capacity:,}",
                    f"reverb {name}",
                    f"{w['calls']:,}",
                    f"{w.get('longest', float('nan')) * 1e3:.1f}",
                    f"{w.get('p99', float('nan')) * 1e3:.2f}",
                    f"{w.get('p999', float('nan')) * 1e3:.2f}",
                    f"{w.get('slow', 0):,}",
                ]
            )
    if not rows:
        return
    version = next(c.reverb["reverb"] for c in cases if isinstance(c.reverb, dict))
    print_table(
        f"Reverb {version} checkpointing the same transitions (obs + next_obs items); x: Reverb's over mpreplay's",
        ["capacity", "stored", "checkpoint MB", "checkpoint s", "restore s", "live checkpoints"],
        rows,
    )
    print_table(
        "Waits of Reverb's writer (one transition per call) and learner (sample 256 + mutate_priorities) (ms)",
        ["capacity", "call", "calls", "longest", "p99", "p99.9", f"over {SLOW * 1e3:.0f} ms"],
        waits,
    )
