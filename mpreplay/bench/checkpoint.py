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
   Then the same with ``table.checkpoint(path, compress=True)`` (each chunk deflated, by ISA-L
   where installed) and its restore, interleaved with the others, against the same floors: its
   size against the segment's and the raw checkpoint's, its seconds against the segment's bytes
   written and read.
2. **save_transitions** of the same table (the portable export, plain layout, not deflated), for
   tables of at most ``--save-max`` transitions (20,000: the plain layout is 8 times the bytes).
3. **Reverb** (``--peers DIR``: the Reverb venv at ``DIR/reverb``, see :mod:`mpreplay.bench.peers`),
   for tables of at most ``--reverb-max`` transitions (20,000): its server filled with the same
   transitions as items of ``obs`` + ``next_obs`` stacks, ``client.checkpoint()`` timed, a new
   server restoring it, and its writer and learner timed alone and while it checkpoints
   (:mod:`mpreplay.bench.reverb_checkpoint`); its size and seconds against mpreplay's raw and
   deflated checkpoints'.
4. **Waits**: a writer process adding a row per call (the demo's actor) and a learner sampling
   256 + updating, for ``W`` seconds without a checkpoint, then ``W`` seconds with checkpoints
   taken one after the other, then ``W`` seconds with deflated ones: the longest, the 99th and
   99.9th percentiles of each call and how many took over 50 ms, the rows each live checkpoint
   left out, and how long its lock was held for the cut.

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
from pathlib import Path
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench._report import positive_int, positive_seconds
from mpreplay.bench.apex import LANES, compressed_buffer, fill
from mpreplay.bench.apex_episodes import Episode, record
from mpreplay.bench.apex_measures import learner_op, writer_op
from mpreplay.bench.checkpoint_report import Case, Deflated, Waits, report
from mpreplay.bench.peers import ENV_VAR, REVERB, peers_python
from mpreplay.bench.reverb_checkpoint import drop_cache, timed_calls
from mpreplay.checkpoint_codec import DEFAULT_CODEC, crc32
from mpreplay.checkpoint_read import PART, READERS
from mpreplay.writeback import Writeback

PIECE = 16 * 2**20  # the floor's write and read size (the checkpoint's chunk)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    print(
        f"mpreplay {mpreplay.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; checksums by "
        f"{'ISA-L' if crc32.__module__.startswith('isal') else 'zlib'}, deflate by {DEFAULT_CODEC}; {_load()}"
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
    report(cases)
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


def _case(capacity: int, episodes: list[Episode], folder: Path, seconds: float, export: bool, repeats: int) -> Case:
    with compressed_buffer(capacity, LANES) as table:
        fill(table, episodes, capacity + capacity // 10)
        checkpoint: list[float] = []
        restore: list[float] = []
        floor_write, floor_read = [], []
        deflated = Deflated(DEFAULT_CODEC, 0, [], [])
        for _ in range(repeats):  # interleaved: a burst of other work on the machine skews one of each, not all
            doc, size = _checkpoint_and_restore(table, folder / "ck", False, checkpoint, restore)
            write, read = _floor(folder / "floor.bin", size)
            floor_write.append(write)
            floor_read.append(read)
            _, deflated.size = _checkpoint_and_restore(
                table, folder / "ckz", True, deflated.checkpoint, deflated.restore
            )
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
        deflated,
    )


def _checkpoint_and_restore(
    table: Any, path: Path, compress: bool, checkpoint: list[float], restore: list[float]
) -> tuple[dict[str, Any], int]:
    """Checkpoint ``table`` to ``path`` (replacing the previous run's, as a run's checkpoints do)
    and restore it (its pages dropped from the cache first), appending the seconds of each; the
    manifest and the checkpoint's bytes."""
    start = time.perf_counter()
    doc = table.checkpoint(path, compress=compress)
    checkpoint.append(time.perf_counter() - start)
    size = sum(f.stat().st_size for f in path.iterdir())
    drop_cache(path / "data.bin")
    start = time.perf_counter()
    with mpreplay.restore(path):
        restore.append(time.perf_counter() - start)
    return doc, size


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
    taken one after the other into ``path``, then ``seconds`` with deflated ones; their waits, and
    the live checkpoints' manifests."""
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
        windows = {"alone": quiet}
        for window, compress in (("checkpointing", False), ("checkpointing deflated", True)):
            begin, taken = time.monotonic(), len(live)
            while time.monotonic() < begin + seconds or len(live) == taken:
                live.append(table.checkpoint(path, compress=compress))
            windows[window] = (begin, time.monotonic())
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
        for window, (a, b) in windows.items():
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
