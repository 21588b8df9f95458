"""Reverb's side of ``mpreplay bench checkpoint --peers``: its server checkpointing a table of the same
transitions, with a writer and a learner measured as mpreplay's are.

Run by the Reverb venv's interpreter (``DIR/reverb``, see :mod:`mpreplay.bench.peers`) as
``python reverb_checkpoint.py ROWS.npz CAPACITY SECONDS FOLDER``: numpy and the standard library at
the top, Reverb and TensorFlow imported where used (the writer and the learner are processes of
their own, started with ``spawn``: gRPC's threads do not survive a fork).  ``ROWS.npz`` holds the
recorded frames and, per transition, the frame indices of its two stacks and its small fields
(written by :func:`mpreplay.bench.checkpoint.reverb_rows`); each item is one transition with
``obs`` and ``next_obs`` stacks of (84, 84, 4), as a Reverb user stores them (Reverb keeps no frame
once for both stacks).  The table is the one of ``bench mp --peers``: ``Prioritized(0.6)``,
``Fifo`` remover, ``MinSize(1)``.

1. The table is filled with ``CAPACITY`` transitions and ``client.checkpoint()`` timed (nothing
   else running); its size is the checkpoint folder's bytes.
2. Restore: a new server given the checkpoint's folder (Reverb loads the latest checkpoint when it
   starts), the files' pages dropped from the page cache first.
3. Waits: a writer adding one transition per call (``append`` + ``create_item`` + ``flush``) and a
   learner sampling 256 + ``mutate_priorities``, ``SECONDS`` alone then ``SECONDS`` with
   checkpoints taken one after the other; each call's seconds.

One JSON line on stdout: the figures.
"""

from __future__ import annotations

import os
import sys

if not __package__:  # run as a script: its folder leaves the path, where the benchmarks' modules
    # (queue.py, ...) would shadow the standard library's
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import json  # after the path is cleaned
import multiprocessing
import time
from typing import Any

import numpy as np

TABLE = "replay"
BATCH = 256
FILL_ROWS = 32
FIELDS = ("obs", "act", "rew", "next_obs", "done", "discount")


class Rows:
    """The transitions of ``ROWS.npz``, each as one step of Reverb's writer."""

    def __init__(self, path: str) -> None:
        with np.load(path) as data:
            self.frames = data["frames"]
            self.obs_at, self.next_at = data["obs_at"], data["next_at"]
            self.small = {name: data[name] for name in ("act", "rew", "done", "discount")}

    def __len__(self) -> int:
        return len(self.obs_at)

    def step(self, i: int) -> dict[str, np.ndarray]:
        i %= len(self)
        out = {
            "obs": np.ascontiguousarray(np.moveaxis(self.frames[self.obs_at[i]], 0, -1)),
            "next_obs": np.ascontiguousarray(np.moveaxis(self.frames[self.next_at[i]], 0, -1)),
        }
        out.update({name: values[i] for name, values in self.small.items()})
        return out


def _table(capacity: int, rows: Rows) -> Any:
    import reverb
    import tensorflow as tf

    step = rows.step(0)
    signature = {name: tf.TensorSpec(np.shape(step[name]), np.asarray(step[name]).dtype) for name in FIELDS}
    return reverb.Table(
        TABLE,
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=capacity,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def _writer_op(address: str, rows: Rows, per_call: int, start: int) -> Any:
    import reverb

    writer = reverb.Client(address).trajectory_writer(num_keep_alive_refs=1)
    at = [start]

    def write() -> None:
        for _ in range(per_call):
            writer.append(rows.step(at[0]))
            writer.create_item(TABLE, priority=1.0, trajectory={name: writer.history[name][-1] for name in FIELDS})
            at[0] += 1
        writer.flush(block_until_num_items=0)  # the call ends when the server has the rows, as mpreplay's add

    return write


def _learner_op(address: str) -> Any:
    import reverb

    client = reverb.Client(address)
    samples = iter(
        reverb.TrajectoryDataset.from_table_signature(address, TABLE, max_in_flight_samples_per_worker=2 * BATCH).batch(
            BATCH
        )
    )
    priorities = np.random.default_rng(2).random(BATCH) + 0.1

    def learn() -> None:
        sample = next(samples)
        client.mutate_priorities(
            TABLE, updates=dict(zip(sample.info.key.numpy().tolist(), priorities.tolist(), strict=True))
        )

    return learn


def _timed(role: str, address: str, rows_path: str, stop: Any, conn: Any) -> None:
    try:
        op = _writer_op(address, Rows(rows_path), 1, 7) if role == "writer" else _learner_op(address)
        for _ in range(3):  # the learner's dataset starts its workers and traces its graph
            op()
        conn.send("ready")
        conn.send(timed_calls(op, stop))
    except BaseException as exc:
        conn.send(repr(exc))
        raise


def timed_calls(op: Any, stop: Any) -> np.ndarray:
    """``op()`` over and over until ``stop`` is set: each call's ``(start, seconds)`` (monotonic
    clock, the same in every process).  mpreplay's side of the bench times its calls so too."""
    marks = []
    while not stop.is_set():
        start = time.monotonic()
        op()
        marks.append((start, time.monotonic() - start))
    return np.array(marks)


def _bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def drop_cache(path: str | os.PathLike[str]) -> None:
    """Drop the pages of file ``path`` (or of every file in folder ``path``) from the page cache,
    so the next read is the disk's.  mpreplay's side of the bench drops its files' so too."""
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _waits(marks: np.ndarray, window: tuple[float, float]) -> dict[str, float]:
    inside = marks[(marks[:, 0] >= window[0]) & (marks[:, 0] < window[1]), 1] if len(marks) else np.zeros(0)
    if not len(inside):
        return {"calls": 0}
    p99, p999 = np.percentile(inside, [99, 99.9])
    return {
        "calls": len(inside),
        "longest": float(inside.max()),
        "p99": float(p99),
        "p999": float(p999),
        "slow": int((inside > 0.050).sum()),
    }


def main(rows_path: str, capacity: int, seconds: float, folder: str) -> dict[str, Any]:
    import reverb
    from reverb.platform import checkpointers_lib

    rows = Rows(rows_path)
    from importlib.metadata import version

    out: dict[str, Any] = {"reverb": version("dm-reverb")}
    server = reverb.Server(
        [_table(capacity, rows)], port=None, checkpointer=checkpointers_lib.DefaultCheckpointer(folder)
    )
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    write = _writer_op(address, rows, FILL_ROWS, 0)
    start = time.perf_counter()
    for _ in range(-(-capacity // FILL_ROWS)):
        write()
    out["fill_s"] = time.perf_counter() - start
    out["stored"] = int(client.server_info()[TABLE].current_size)
    start = time.perf_counter()
    path = client.checkpoint()
    out["checkpoint_s"] = time.perf_counter() - start
    out["checkpoint_bytes"] = _bytes(path)
    drop_cache(folder)
    start = time.perf_counter()
    restored = reverb.Server(
        [_table(capacity, rows)], port=None, checkpointer=checkpointers_lib.DefaultCheckpointer(folder)
    )
    out["restore_s"] = time.perf_counter() - start
    out["restored"] = int(reverb.Client(f"localhost:{restored.port}").server_info()[TABLE].current_size)
    restored.stop()
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs, conns = [], []
    try:
        for role in ("writer", "learner"):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_timed, args=(role, address, rows_path, stop, theirs), daemon=True)
            proc.start()
            procs.append(proc)
            conns.append(mine)
        for conn in conns:
            if not conn.poll(300) or conn.recv() != "ready":
                raise RuntimeError("a writer or learner process did not start")
        time.sleep(0.5)
        quiet = (time.monotonic(), time.monotonic() + seconds)
        time.sleep(seconds)
        begin, live = time.monotonic(), list[float]()
        while time.monotonic() < begin + seconds or not live:
            started = time.perf_counter()
            client.checkpoint()
            live.append(time.perf_counter() - started)
        during = (begin, time.monotonic())
        stop.set()
        marks = {}
        for role, conn in zip(("writer", "learner"), conns, strict=True):
            if not conn.poll(120):
                raise RuntimeError(f"the {role} process did not answer")
            marks[role] = conn.recv()
            if isinstance(marks[role], str):
                raise RuntimeError(f"the {role} process failed: {marks[role]}")
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        server.stop()
    out["live_checkpoints_s"] = live
    out["waits"] = {
        f"{role} {name}": _waits(m, window)
        for role, m in marks.items()
        for name, window in (("alone", quiet), ("checkpointing", during))
    }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])), flush=True)
