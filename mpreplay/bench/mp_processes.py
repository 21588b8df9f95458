"""``mpreplay bench mp``'s processes: one case's writers and learner run for the same window of the
monotonic clock and report what they did; and the memory limit, a gather of the same rows in one process."""

from __future__ import annotations

import itertools
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

from mpreplay.bench.mp_workloads import BATCH, BETA, POOL, Contender, Obs, adds, env_dict
from mpreplay.memory import Layout, SharedMemory

_REPLY_TIMEOUT = 120.0  # seconds a process may take to get ready or to report


@dataclass(frozen=True)
class Timing:
    seconds: float
    warmup: float
    slices: int


@dataclass(frozen=True)
class Trace:
    """What one process did between the first and the last mark."""

    counts: list[int]  # calls done by each mark
    cpu: float  # CPU seconds (user + system)
    faults: int  # minor page faults


def run_until(marks: Sequence[float], op: Callable[[], None], stride: int) -> Trace:
    """Call ``op`` until the monotonic clock passes the last mark.

    The clock (system-wide, so every process shares the marks) is read every
    ``stride`` calls: reading it costs as much as a fraction of a fast add.
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
            first = resource.getrusage(resource.RUSAGE_SELF)
    last = resource.getrusage(resource.RUSAGE_SELF)
    return Trace(
        counts, last.ru_utime + last.ru_stime - first.ru_utime - first.ru_stime, last.ru_minflt - first.ru_minflt
    )


@dataclass(frozen=True)
class Role:
    """One process of a case: a writer adding ``rows`` per call, or the learner (``rows`` = batch size)."""

    kind: str  # "writer" | "learner"
    rows: int
    obs: Obs
    scalar_shape: tuple[int, ...]
    seed: int
    reuse: bool = False  # the learner samples into its previous batch (mpreplay's out=)


def _operation(role: Role, buffer: Any) -> tuple[Callable[[], None], int]:
    """The role's unit of work and how many calls to make between clock reads."""
    if role.kind == "writer":
        items = itertools.cycle(adds(role.obs, role.rows, role.scalar_shape, role.seed))
        add = buffer.add

        def write() -> None:
            add(**next(items))

        return write, 16 if role.rows == 1 else 1
    priorities = itertools.cycle(list(np.random.default_rng(role.seed).uniform(0.01, 2.0, (POOL, role.rows))))
    sample, update = buffer.sample, buffer.update_priorities
    last: list[Any] = [None]

    def learn() -> None:
        batch = sample(role.rows, BETA, out=last[0]) if role.reuse else sample(role.rows, BETA)
        update(batch["indexes"], next(priorities))
        last[0] = batch

    return learn, 1


def _child(role: Role, buffer: Any, conn: Connection) -> None:
    """Process body: get ready, receive the marks, run, report a :class:`Trace`."""
    # A Ctrl-C reaches the whole process group: only the parent reacts, and it
    # stops the children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        op, stride = _operation(role, buffer)
        if role.kind == "writer":
            # A process faults on the first write to every page of the
            # segment, a cost a long-running actor pays once: one lap of the
            # ring (of its lane, compressed) before the window leaves only the steady state in it.
            for _ in range(-(-role.obs.capacity // (max(1, role.obs.lanes) * role.rows))):
                op()
        conn.send("ready")
        marks = conn.recv()
        conn.send(run_until(marks, op, stride))
    except (EOFError, BrokenPipeError):  # the parent is gone
        pass
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


@dataclass
class Result:
    """One line of the table."""

    obs: str
    buffer: str
    case: str
    capacity: int
    rows_per_add: int | None = None
    inserts: float | None = None  # rows/s, median over slices
    sampled: float | None = None  # rows/s, median over slices
    updates: float | None = None  # priority updates applied per second over the window
    stale: int | None = None
    lock_wait: float | None = None  # share of the window x processes spent waiting for the lock
    cpu: float | None = None  # cores busy (CPU seconds / window)
    writer_cpu: float | None = None  # the writers' share of `cpu`
    learner_cpu: float | None = None  # the learner's (or the gather's) share of `cpu`
    faults: float | None = None  # minor page faults per second, all processes of the case
    others: float | None = None  # cores busy with other work meanwhile
    learner_faults: float | None = None  # the learner's minor page faults per sample call


def _case_label(writers: int, learner: bool) -> str:
    parts = [f"{writers} writer{'s' if writers > 1 else ''}"] if writers else []
    return " + ".join(parts + ["learner"] * learner)


def _receive(conn: Connection, proc: Any, timeout: float = _REPLY_TIMEOUT) -> Any:
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


def _stop(procs: Sequence[Any]) -> None:
    """End and reap every process: terminate, then kill what is left."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()


def _machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user .. steal: guest time is inside user
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


@dataclass(frozen=True)
class _Snapshot:
    stats: dict[str, float] | None  # the buffer's counters (mpreplay only)
    busy: float | None  # _machine_busy_seconds()


def _snapshot_at(buffer: Any, when: float) -> _Snapshot:
    time.sleep(max(0.0, when - time.monotonic()))
    return _Snapshot(buffer.stats() if hasattr(buffer, "stats") else None, _machine_busy_seconds())


def _others_cores(busy_before: float | None, busy_after: float | None, window: float, ours: float) -> float | None:
    # Other work on the machine during the window (other programs and this
    # benchmark's parent): what the case competed with for the cores.
    if busy_before is None or busy_after is None:
        return None
    return max(0.0, (busy_after - busy_before) / window - ours)


def _marks(timing: Timing) -> list[float]:
    """Monotonic times: the end of the warm-up from now, then the end of every slice."""
    start = time.monotonic() + timing.warmup
    return [start + timing.seconds * i / timing.slices for i in range(timing.slices + 1)]


def _slice_rates(counts: Sequence[int], marks: Sequence[float], rows: int) -> np.ndarray:
    return np.diff(counts) * rows / np.diff(marks)


def run_case(
    ctx: Any,
    buffer: Any,
    contender: Contender,
    obs: Obs,
    writers: int,
    learner: bool,
    rows: int,
    timing: Timing,
    reuse: bool = False,
) -> Result:
    roles = [Role("writer", rows, obs, contender.scalar_shape, seed=10 + i) for i in range(writers)]
    roles += [Role("learner", BATCH, obs, contender.scalar_shape, seed=99, reuse=reuse)] * learner
    procs, conns = [], []
    try:
        for i, role in enumerate(roles):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(role, buffer, theirs), name=f"{role.kind} {i}", daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        # Getting ready includes a writer's lap of its ring: allow 1 ms per slot of the buffer.
        for conn, proc in zip(conns, procs, strict=True):
            _receive(conn, proc, max(_REPLY_TIMEOUT, obs.capacity * 1e-3))
        marks = _marks(timing)
        for conn in conns:
            conn.send(marks)
        before, after = _snapshot_at(buffer, marks[0]), _snapshot_at(buffer, marks[-1])
        reports = [_receive(conn, proc) for conn, proc in zip(conns, procs, strict=True)]
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()
    window = marks[-1] - marks[0]
    cores = sum(r.cpu for r in reports) / window
    result = Result(
        obs.label,
        contender.name,
        _case_label(writers, learner),
        obs.capacity,
        rows if writers else None,
        cpu=cores,
        faults=sum(r.faults for r in reports) / window,
        others=_others_cores(before.busy, after.busy, window, cores),
    )
    if writers:
        rates = sum(_slice_rates(r.counts, marks, rows) for r in reports[:writers])
        result.inserts = float(np.median(rates))
        result.writer_cpu = sum(r.cpu for r in reports[:writers]) / window
    if learner:
        result.learner_cpu = reports[-1].cpu / window
        counts = reports[-1].counts
        result.learner_faults = reports[-1].faults / max(1, counts[-1] - counts[0])
        result.sampled = float(np.median(_slice_rates(counts, marks, BATCH)))
        submitted = (counts[-1] - counts[0]) * BATCH
        if before.stats is not None and after.stats is not None:  # the same buffer's: both or neither
            result.stale = int(after.stats["stale_updates_dropped"] - before.stats["stale_updates_dropped"])
            result.updates = (submitted - result.stale) / window
        else:
            result.updates = submitted / window
    if before.stats is not None and after.stats is not None:
        waited = after.stats["lock_wait_seconds"] - before.stats["lock_wait_seconds"]
        result.lock_wait = waited / (window * len(roles))
    return result


def gather_limit(obs: Obs, timing: Timing) -> Result:
    """Copy ``BATCH`` random rows of every field into a preallocated batch, in this process.

    The source arrays sit in a shared-memory segment, mapped as the buffer's
    are (same page size), and are written first so every page exists.
    """
    specs = env_dict(obs, ())
    layout = Layout()
    for name, spec in specs.items():
        layout.add(name, (obs.capacity,) + tuple(spec.get("shape", ())), spec["dtype"])
    memory = SharedMemory(layout)
    try:
        sources = memory.arrays
        for arr in sources.values():
            arr.fill(1)
        batch = {name: np.empty((BATCH,) + arr.shape[1:], arr.dtype) for name, arr in sources.items()}
        pairs = [(sources[name], batch[name]) for name in sources]
        indexes = itertools.cycle(list(np.random.default_rng(7).integers(0, obs.capacity, (POOL, BATCH))))

        def gather() -> None:
            idx = next(indexes)
            for src, dst in pairs:
                # mode="raise" would gather into a temporary and copy that into
                # `out`; every index is valid, so "clip" gathers the same rows once.
                np.take(src, idx, axis=0, out=dst, mode="clip")

        marks = _marks(timing)
        run_until(marks[:1], gather, 1)  # the warm-up
        busy_at_start = _machine_busy_seconds()
        trace = run_until(marks, gather, 1)
        busy = _machine_busy_seconds()  # read at once: the loop ended at the last mark
        pairs.clear()
        del sources, gather
    finally:
        memory.close()
    window = marks[-1] - marks[0]
    cores = trace.cpu / window
    return Result(
        obs.label,
        "gather",
        "np.take limit",
        obs.capacity,
        sampled=float(np.median(_slice_rates(trace.counts, marks, BATCH))),
        cpu=cores,
        learner_cpu=cores,
        faults=trace.faults / window,
        others=_others_cores(busy_at_start, busy, window, cores),
    )
