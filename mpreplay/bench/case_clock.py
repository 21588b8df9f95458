"""One multi-process case's clock: processes that get ready, run one unit of work until the same marks of
the monotonic clock, and report what they did; and what the rest of the machine did meanwhile.

Standard library and numpy only: the peers' workers (:mod:`mpreplay.bench.peer_worker`) load this file
by its path in interpreters that have no mpreplay, so a Reverb or TorchRL case is timed by the same
code as mpreplay's (:mod:`mpreplay.bench.mp_processes`).

A child's body is :func:`serve_window`: it builds its unit of work, says ``"ready"``, receives the
marks, runs :func:`run_until` and sends back a :class:`Trace` (or ``("error", traceback)``).
"""

from __future__ import annotations

import os
import resource
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

REPLY_TIMEOUT = 120.0  # seconds a process may take to get ready or to report


@dataclass(frozen=True)
class Timing:
    seconds: float
    warmup: float
    slices: int


@dataclass(frozen=True)
class Trace:
    """What one process did between the first and the last mark."""

    counts: list[int]  # calls done by each mark
    cpu: float  # CPU seconds (user + system), every thread of the process
    faults: int  # minor page faults


def run_until(
    marks: Sequence[float], op: Callable[[], None], stride: int, at_ends: Callable[[], None] | None = None
) -> Trace:
    """Call ``op`` until the monotonic clock passes the last mark.

    The clock (system-wide, so every process shares the marks) is read every
    ``stride`` calls: reading it costs as much as a fraction of a fast add.
    ``at_ends()`` is called at the first and at the last mark.
    """
    calls, counts = 0, []
    clock, strides = time.monotonic, range(stride)
    for mark in marks:
        while clock() < mark:
            for _ in strides:
                op()
            calls += stride
        counts.append(calls)
        if len(counts) == 1:
            if at_ends is not None:
                at_ends()
            first = resource.getrusage(resource.RUSAGE_SELF)
    last = resource.getrusage(resource.RUSAGE_SELF)
    if at_ends is not None:
        at_ends()
    return Trace(
        counts, last.ru_utime + last.ru_stime - first.ru_utime - first.ru_stime, last.ru_minflt - first.ru_minflt
    )


def serve_window(conn: Connection, build: Callable[[], tuple[Callable[[], None], int]]) -> None:
    """A child's body: ``build()`` its unit of work and stride, say ready, run to the marks, report."""
    # A Ctrl-C reaches the whole process group: only the parent reacts, and it stops the children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        op, stride = build()
        conn.send("ready")
        marks = conn.recv()
        conn.send(run_until(marks, op, stride))
    except (EOFError, BrokenPipeError):  # the parent is gone
        pass
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def receive(conn: Connection, proc: Any, timeout: float = REPLY_TIMEOUT) -> Any:
    """The child's next message; its error, its silence or its death raised with its name."""
    ready = wait([conn, proc.sentinel], timeout=timeout)
    if conn in ready:
        try:
            message = conn.recv()
        except EOFError:
            message = None
        if isinstance(message, tuple) and message[0] == "error":
            raise RuntimeError(f"{proc.name} failed:\n{message[1]}")
        if message is not None:
            return message
    if not ready:
        raise TimeoutError(f"{proc.name} did not answer within {timeout:.0f} s")
    proc.join(1.0)
    raise RuntimeError(f"{proc.name} ended without reporting (exit code {proc.exitcode})")


def stop(procs: Sequence[Any]) -> None:
    """End and reap every process: terminate, then kill what is left."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user .. steal: guest time is inside user
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def process_cpu(pid: int) -> tuple[float, int] | None:
    """CPU seconds (every thread, user + system) and minor page faults of process ``pid`` so far (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the name: state is field 0, minflt 7, utime 11 and stime 12 (proc(5) numbers them 3, 10, 14, 15).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def others_cores(busy_before: float | None, busy_after: float | None, window: float, ours: float) -> float | None:
    """Cores other work used during the window (other programs, and the benchmark's parent)."""
    if busy_before is None or busy_after is None:
        return None
    return max(0.0, (busy_after - busy_before) / window - ours)


def marks(timing: Timing) -> list[float]:
    """Monotonic times: the end of the warm-up from now, then the end of every slice."""
    start = time.monotonic() + timing.warmup
    return [start + timing.seconds * i / timing.slices for i in range(timing.slices + 1)]


def slice_rates(counts: Sequence[int], at: Sequence[float], rows: int) -> np.ndarray:
    return np.diff(counts) * rows / np.diff(at)


@dataclass(frozen=True)
class Window:
    """What one case's processes did: their reports in the order they were started, and the machine's
    busy seconds and the watched processes' CPU (seconds, faults, summed) at the first and the last mark."""

    marks: list[float]
    reports: list[Trace]
    busy: tuple[float | None, float | None]
    watched: tuple[tuple[float, int] | None, tuple[float, int] | None]
    snapshots: tuple[Any, Any]


def run_window(
    ctx: Any,
    children: Sequence[tuple[str, Callable[..., None], tuple[Any, ...]]],
    timing: Timing,
    *,
    ready_timeout: float = REPLY_TIMEOUT,
    watch: Sequence[int] = (),
    snapshot: Callable[[], Any] = lambda: None,
    local: tuple[Callable[[], None], int] | None = None,
) -> Window:
    """Start each ``(name, target, args)`` as ``target(*args, conn)`` (a body that calls :func:`serve_window`),
    wait until all are ready, give them the same marks, collect their traces and stop them all.

    ``watch``: the pids of processes not started here whose CPU counts too (servers); ``snapshot()``
    is taken at the first and the last mark (a buffer's counters); ``local``: a unit of work and its
    stride that this process runs to the same marks (its trace is the last report)."""
    procs, conns = [], []
    try:
        for name, target, args in children:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*args, theirs), name=name, daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        for conn, proc in zip(conns, procs, strict=True):
            receive(conn, proc, ready_timeout)
        at = marks(timing)
        for conn in conns:
            conn.send(at)
        seen: list[tuple[Any, Any, Any]] = []
        if local is None:
            seen = [_observe_at(at[0], watch, snapshot), _observe_at(at[-1], watch, snapshot)]
            mine = []
        else:
            mine = [run_until(at, local[0], local[1], lambda: seen.append(_observe_at(0.0, watch, snapshot)))]
        first, last = seen
        reports = [receive(conn, proc) for conn, proc in zip(conns, procs, strict=True)] + mine
    finally:
        stop(procs)
        for conn in conns:
            conn.close()
    return Window(at, reports, (first[0], last[0]), (first[1], last[1]), (first[2], last[2]))


def _observe_at(when: float, watch: Sequence[int], snapshot: Callable[[], Any]) -> tuple[Any, Any, Any]:
    time.sleep(max(0.0, when - time.monotonic()))
    busy = machine_busy_seconds()
    seen = [process_cpu(pid) for pid in watch]
    found = [x for x in seen if x is not None]
    watched = (sum(x[0] for x in found), sum(x[1] for x in found)) if found and len(found) == len(seen) else None
    return busy, watched, snapshot()
