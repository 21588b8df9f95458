"""``mpreplay bench mp``: a shared prioritized buffer under writers and a learner.

Every case runs its processes for the same wall window after a warm-up, on a
buffer filled to capacity beforehand: the learner alone, 1 and 2 writers
alone, and 1 and 2 writers beside a learner, writers adding 1 or 32
transitions per call.  A writer adds prebuilt transitions as fast as it can;
the learner loops ``sample(256)`` + ``update_priorities``.  The cases run for
two observations, each stored with its next_obs: (4,) float32 at capacity
100k and Atari-like (84, 84, 4) uint8 at capacity 20k.

* ``mpreplay`` -- :class:`mpreplay.MPPrioritizedReplayBuffer`;
* ``cpprb`` -- cpprb's MPPrioritizedReplayBuffer, when cpprb is installed;
* ``gather`` -- the memory limit: one process copying the same number of
  random rows with ``np.take`` into a preallocated batch, from arrays in a
  shared-memory segment like the buffer's.

A final sweep runs the learner alone over capacities 1e4, 1e5 and 1e6.

``--atari-scale`` runs instead the case of a user at Atari scale: (84, 84, 4)
uint8 stacks stored compressed (``next_of`` + ``stack_compress``), capacity
1e6 (6.65 GiB), 8 writers adding episodes of consecutive frame stacks (1 or
32 steps per add) beside a learner; reported per CPU second, with the share
of time spent waiting for the lock and the learner's page faults per sample,
beside cpprb's uncompressed buffer at the largest capacity that fits in memory.
Rates are medians over slices of the window; stale updates, lock waits
(mpreplay's ``stats()``) and CPU are totals over the window.  The targets
table compares figures of this same run.  Other work on the machine skews
every figure: the "others' cores" column shows how much there was.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

import mpreplay
from mpreplay.memory import Layout, SharedMemory
from mpreplay.bench._report import print_table

BATCH = 256
ALPHA, BETA, EPS = 0.6, 0.4, 1e-4
ROWS_PER_ADD = (1, 32)
_POOL = 8  # distinct prebuilt adds (and priority vectors) each process cycles through
_FILL_ROWS = 32  # rows per add while filling a buffer before the cases
_REPLY_TIMEOUT = 120.0  # seconds a process may take to get ready or to report


@dataclass(frozen=True)
class _Obs:
    """An observation and the capacity it is benchmarked at; ``lanes`` > 0: stored
    compressed (next_of + stack_compress), one lane per writer."""

    label: str
    shape: tuple[int, ...]
    dtype: str
    capacity: int
    lanes: int = 0

    def resized(self, capacity: int) -> "_Obs":
        return _Obs(self.label, self.shape, self.dtype, capacity, self.lanes)

    def uncompressed(self, capacity: int) -> "_Obs":
        return _Obs(self.label, self.shape, self.dtype, capacity)


_SMALL = _Obs("(4,) float32", (4,), "float32", 100_000)
_ATARI = _Obs("(84, 84, 4) uint8", (84, 84, 4), "uint8", 20_000)
_ATARI_SCALE_WRITERS = 8
_ATARI_SCALE = _Obs("(84, 84, 4) uint8", (84, 84, 4), "uint8", 1_000_000, lanes=_ATARI_SCALE_WRITERS)
_CPPRB_ATARI_CAPACITY = 100_000  # uncompressed (84, 84, 4) obs + next_obs: 5.6 GB; 1e6 would need 56 GB
_SWEEP = (10_000, 100_000, 1_000_000)
_QUICK_CAPACITY = {_SMALL.label: 2_000, _ATARI.label: 500}
_QUICK_SWEEP = (1_000, 10_000)


@dataclass(frozen=True)
class _Timing:
    seconds: float
    warmup: float
    slices: int


# -- workloads ----------------------------------------------------------------
def _env_dict(obs: _Obs, scalar_shape: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    scalar = {"shape": scalar_shape} if scalar_shape else {}
    return {
        "obs": {"shape": obs.shape, "dtype": obs.dtype},
        "act": {**scalar, "dtype": np.int64},
        "rew": {**scalar, "dtype": np.float32},
        "next_obs": {"shape": obs.shape, "dtype": obs.dtype},
        "done": {**scalar, "dtype": np.float32},
    }


def _transitions(obs: _Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """``_POOL`` adds of ``k`` rows each, as an actor would pass them.

    One row is an observation array plus Python scalars; ``k`` rows are
    arrays of exact dtypes, scalar fields shaped ``(k,) + scalar_shape``.
    """
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(_POOL):
        o = rng.integers(0, 255, (k,) + obs.shape).astype(obs.dtype)
        o2 = rng.integers(0, 255, (k,) + obs.shape).astype(obs.dtype)
        act, rew, done = rng.integers(0, 4, k), rng.standard_normal(k), (rng.random(k) < 0.01)
        if k == 1:
            pool.append({"obs": o[0], "act": int(act[0]), "rew": float(rew[0]), "next_obs": o2[0],
                         "done": float(done[0])})
        else:
            scalar = (k,) + scalar_shape
            pool.append({"obs": o, "act": act.astype(np.int64).reshape(scalar),
                         "rew": rew.astype(np.float32).reshape(scalar), "next_obs": o2,
                         "done": done.astype(np.float32).reshape(scalar)})
    return pool


def _episode(obs: _Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """Adds of ``k`` consecutive steps of one episode of frame stacks (at least 256 steps),
    the last step done: cycling through them replays the episode, so every stack is the
    one before shifted by a new frame, as a compressed buffer checks."""
    rng = np.random.default_rng(seed)
    adds = max(_POOL, -(-256 // k))
    steps = adds * k
    frames = rng.integers(0, 255, (steps + 1,) + obs.shape[:-1]).astype(obs.dtype)
    depth = obs.shape[-1]
    # Stack t holds frames t-depth+1 .. t, the first frame repeated before the episode began.
    order = np.maximum(np.arange(steps + 1)[:, None] - np.arange(depth - 1, -1, -1)[None, :], 0)
    stacks = np.moveaxis(frames[order], 1, -1)
    act, rew = rng.integers(0, 4, steps).astype(np.int64), rng.standard_normal(steps).astype(np.float32)
    done = (np.arange(steps) == steps - 1).astype(np.float32)
    scalar = (k,) + scalar_shape
    pool = []
    for a in range(adds):
        t = slice(a * k, (a + 1) * k)
        if k == 1:
            i = a
            pool.append({"obs": stacks[i], "act": int(act[i]), "rew": float(rew[i]), "next_obs": stacks[i + 1],
                         "done": float(done[i])})
        else:
            pool.append({"obs": stacks[t], "act": act[t].reshape(scalar), "rew": rew[t].reshape(scalar),
                         "next_obs": stacks[a * k + 1:(a + 1) * k + 1], "done": done[t].reshape(scalar)})
    return pool


def _adds(obs: _Obs, k: int, scalar_shape: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    """What a writer cycles through: random transitions, or an episode for a compressed buffer."""
    return (_episode if obs.lanes else _transitions)(obs, k, scalar_shape, seed)


@dataclass(frozen=True)
class _Contender:
    """A multi-process prioritized buffer: how to make one, and its scalar field shape."""

    name: str
    scalar_shape: tuple[int, ...]
    make: Callable[[_Obs, Any], Any]  # (obs, multiprocessing context) -> context manager yielding the buffer


@contextmanager
def _mpreplay_buffer(obs: _Obs, ctx: Any) -> Iterator[Any]:
    compression = {"next_of": "obs", "stack_compress": "obs", "lanes": obs.lanes} if obs.lanes else {}
    with mpreplay.MPPrioritizedReplayBuffer(obs.capacity, _env_dict(obs, ()), alpha=ALPHA, eps=EPS,
                                            **compression) as buffer:
        yield buffer


@contextmanager
def _cpprb_buffer(obs: _Obs, ctx: Any) -> Iterator[Any]:
    import cpprb

    # cpprb stores a field without shape as shape (1,); its default
    # "sharedctypes" memory is unlinked at once, so it needs no cleanup.
    yield cpprb.MPPrioritizedReplayBuffer(obs.capacity, _env_dict(obs, (1,)), alpha=ALPHA, eps=EPS, ctx=ctx)


_MPREPLAY = _Contender("mpreplay", (), _mpreplay_buffer)
_CPPRB = _Contender("cpprb", (1,), _cpprb_buffer)


def _fill(buffer: Any, obs: _Obs, contender: _Contender) -> None:
    pool = _transitions(obs, _FILL_ROWS, contender.scalar_shape, seed=1)
    for i in range(-(-obs.capacity // _FILL_ROWS)):
        buffer.add(**pool[i % len(pool)])


# -- the timed loop -------------------------------------------------------------
@dataclass(frozen=True)
class _Trace:
    """What one process did between the first and the last mark."""

    counts: list[int]  # calls done by each mark
    cpu: float  # CPU seconds (user + system)
    faults: int  # minor page faults


def _run_until(marks: Sequence[float], op: Callable[[], None], stride: int) -> _Trace:
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
    return _Trace(counts, last.ru_utime + last.ru_stime - first.ru_utime - first.ru_stime,
                  last.ru_minflt - first.ru_minflt)


@dataclass(frozen=True)
class _Role:
    """One process of a case: a writer adding ``rows`` per call, or the learner (``rows`` = batch size)."""

    kind: str  # "writer" | "learner"
    rows: int
    obs: _Obs
    scalar_shape: tuple[int, ...]
    seed: int
    reuse: bool = False  # the learner samples into its previous batch (mpreplay's out=)


def _operation(role: _Role, buffer: Any) -> tuple[Callable[[], None], int]:
    """The role's unit of work and how many calls to make between clock reads."""
    if role.kind == "writer":
        items = itertools.cycle(_adds(role.obs, role.rows, role.scalar_shape, role.seed))
        add = buffer.add

        def write() -> None:
            add(**next(items))

        return write, 16 if role.rows == 1 else 1
    priorities = itertools.cycle(list(np.random.default_rng(role.seed).uniform(0.01, 2.0, (_POOL, role.rows))))
    sample, update = buffer.sample, buffer.update_priorities
    last: list[Any] = [None]

    def learn() -> None:
        batch = sample(role.rows, BETA, out=last[0]) if role.reuse else sample(role.rows, BETA)
        update(batch["indexes"], next(priorities))
        last[0] = batch

    return learn, 1


def _child(role: _Role, buffer: Any, conn: Connection) -> None:
    """Process body: get ready, receive the marks, run, report a :class:`_Trace`."""
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
        conn.send(_run_until(marks, op, stride))
    except (EOFError, BrokenPipeError):  # the parent is gone
        pass
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


@dataclass
class _Result:
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


def _marks(timing: _Timing) -> list[float]:
    """Monotonic times: the end of the warm-up from now, then the end of every slice."""
    start = time.monotonic() + timing.warmup
    return [start + timing.seconds * i / timing.slices for i in range(timing.slices + 1)]


def _slice_rates(counts: Sequence[int], marks: Sequence[float], rows: int) -> np.ndarray:
    return np.diff(counts) * rows / np.diff(marks)


def _run_case(ctx: Any, buffer: Any, contender: _Contender, obs: _Obs, writers: int, learner: bool,
              rows: int, timing: _Timing, reuse: bool = False) -> _Result:
    roles = [_Role("writer", rows, obs, contender.scalar_shape, seed=10 + i) for i in range(writers)]
    roles += [_Role("learner", BATCH, obs, contender.scalar_shape, seed=99, reuse=reuse)] * learner
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
        for conn, proc in zip(conns, procs):
            _receive(conn, proc, max(_REPLY_TIMEOUT, obs.capacity * 1e-3))
        marks = _marks(timing)
        for conn in conns:
            conn.send(marks)
        before, after = _snapshot_at(buffer, marks[0]), _snapshot_at(buffer, marks[-1])
        reports = [_receive(conn, proc) for conn, proc in zip(conns, procs)]
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()
    window = marks[-1] - marks[0]
    cores = sum(r.cpu for r in reports) / window
    result = _Result(obs.label, contender.name, _case_label(writers, learner), obs.capacity,
                     rows if writers else None, cpu=cores, faults=sum(r.faults for r in reports) / window,
                     others=_others_cores(before.busy, after.busy, window, cores))
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
        if before.stats is not None:
            result.stale = after.stats["stale_updates_dropped"] - before.stats["stale_updates_dropped"]
            result.updates = (submitted - result.stale) / window
        else:
            result.updates = submitted / window
    if before.stats is not None:
        waited = after.stats["lock_wait_seconds"] - before.stats["lock_wait_seconds"]
        result.lock_wait = waited / (window * len(roles))
    return result


def _gather_limit(obs: _Obs, timing: _Timing) -> _Result:
    """Copy ``BATCH`` random rows of every field into a preallocated batch, in this process.

    The source arrays sit in a shared-memory segment, mapped as the buffer's
    are (same page size), and are written first so every page exists.
    """
    specs = _env_dict(obs, ())
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
        indexes = itertools.cycle(list(np.random.default_rng(7).integers(0, obs.capacity, (_POOL, BATCH))))

        def gather() -> None:
            idx = next(indexes)
            for src, dst in pairs:
                # mode="raise" would gather into a temporary and copy that into
                # `out`; every index is valid, so "clip" gathers the same rows once.
                np.take(src, idx, axis=0, out=dst, mode="clip")

        marks = _marks(timing)
        _run_until(marks[:1], gather, 1)  # the warm-up
        busy_at_start = _machine_busy_seconds()
        trace = _run_until(marks, gather, 1)
        busy = _machine_busy_seconds()  # read at once: the loop ended at the last mark
        del sources, pairs, gather
    finally:
        memory.close()
    window = marks[-1] - marks[0]
    cores = trace.cpu / window
    return _Result(obs.label, "gather", "np.take limit", obs.capacity,
                   sampled=float(np.median(_slice_rates(trace.counts, marks, BATCH))), cpu=cores, learner_cpu=cores,
                   faults=trace.faults / window, others=_others_cores(busy_at_start, busy, window, cores))


def _cases(ctx: Any, contender: _Contender, obs: _Obs, timing: _Timing) -> list[_Result]:
    """Every case of one buffer and observation, on one buffer filled first."""
    with contender.make(obs, ctx) as buffer:
        _fill(buffer, obs, contender)
        results = [_run_case(ctx, buffer, contender, obs, 0, True, BATCH, timing)]
        for rows in ROWS_PER_ADD:
            for writers, learner in ((1, False), (2, False), (1, True), (2, True)):
                results.append(_run_case(ctx, buffer, contender, obs, writers, learner, rows, timing))
        return results


def _atari_scale(ctx: Any, contenders: Sequence[_Contender], obs: _Obs, timing: _Timing) -> list[_Result]:
    """8 writers (1 and 32 steps per add) beside a learner: mpreplay compressed at ``obs``'s capacity,
    cpprb uncompressed at the largest capacity that fits."""
    results = []
    for contender in contenders:
        shown = obs if contender is _MPREPLAY else obs.uncompressed(min(obs.capacity, _CPPRB_ATARI_CAPACITY))
        with contender.make(shown, ctx) as buffer:
            if not shown.lanes:
                _fill(buffer, shown, contender)
            for rows in ROWS_PER_ADD:
                results.append(_run_case(ctx, buffer, contender, shown, _ATARI_SCALE_WRITERS, True, rows, timing,
                                         reuse=contender is _MPREPLAY))
    return results


def _sweep(ctx: Any, capacities: Sequence[int], timing: _Timing) -> list[_Result]:
    results = []
    for capacity in capacities:
        obs = _SMALL.resized(capacity)
        with _MPREPLAY.make(obs, ctx) as buffer:
            _fill(buffer, obs, _MPREPLAY)
            results.append(_run_case(ctx, buffer, _MPREPLAY, obs, 0, True, BATCH, timing))
        results.append(_gather_limit(obs, timing))
    return results


# -- targets --------------------------------------------------------------------
@dataclass
class _Target:
    target: str
    case: str
    ratio: float | None
    goal: float
    per_cpu: float | None = None  # the same ratio of rows per CPU second of the processes doing them


def _inserts_per_cpu(r: _Result | None) -> float | None:
    return None if r is None or not r.writer_cpu else r.inserts / r.writer_cpu


def _sampled_per_cpu(r: _Result | None) -> float | None:
    return None if r is None or not r.learner_cpu else r.sampled / r.learner_cpu


def _find(results: Sequence[_Result], **match: Any) -> _Result | None:
    for r in results:
        if all(getattr(r, key) == value for key, value in match.items()):
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _compare_inserts(target: str, case: str, a: _Result, b: _Result | None, goal: float) -> _Target:
    return _Target(target, case, _ratio(a.inserts, b and b.inserts), goal,
                   _ratio(_inserts_per_cpu(a), _inserts_per_cpu(b)))


def _compare_samples(target: str, case: str, a: _Result, b: _Result | None, goal: float) -> _Target:
    return _Target(target, case, _ratio(a.sampled, b and b.sampled), goal,
                   _ratio(_sampled_per_cpu(a), _sampled_per_cpu(b)))


def _targets(results: Sequence[_Result], sweep: Sequence[_Result]) -> list[_Target]:
    out = []
    alone = {r.obs: r for r in results if r.buffer == "mpreplay" and r.case == "learner"}
    for r in results:
        if r.buffer != "mpreplay" or "writer" not in r.case or "learner" not in r.case:
            continue
        solo = _find(results, buffer="mpreplay", obs=r.obs, rows_per_add=r.rows_per_add,
                     case=r.case.replace(" + learner", ""))
        where = f"{r.obs}, {r.rows_per_add}/add, {r.case}"
        out.append(_compare_inserts("(a) inserts beside learner / alone", where, r, solo, 0.5))
        out.append(_compare_samples("(a) samples beside writers / alone", where, r, alone[r.obs], 0.5))
    for r in results:
        if r.buffer != "mpreplay" or r.obs != _SMALL.label or "learner" not in r.case:
            continue
        theirs = _find(results, buffer="cpprb", obs=r.obs, case=r.case, rows_per_add=r.rows_per_add)
        where = f"{r.obs}, {r.case}" + (f", {r.rows_per_add}/add" if r.rows_per_add else "")
        out.append(_compare_samples("(b) sampled rows/s / cpprb", where, r, theirs, 3.0))
        if r.rows_per_add:
            out.append(_compare_inserts("(b) inserts/s / cpprb", where, r, theirs, 10.0))
    limit = _find(results, buffer="gather", obs=_ATARI.label)
    if _ATARI.label in alone and limit is not None:
        out.append(_compare_samples("(c) learner / gather limit", f"{_ATARI.label}, learner alone",
                                    alone[_ATARI.label], limit, 0.9))
    learners = [r for r in sweep if r.buffer == "mpreplay"]
    limits = [r for r in sweep if r.buffer == "gather"]
    for learner, gather in list(zip(learners, limits))[1:]:
        where = f"capacity {learner.capacity:,} vs {learners[0].capacity:,}"
        out.append(_compare_samples("(d) learner sampled rows/s", where, learner, learners[0], 0.9))
        out.append(_compare_samples("(d) for scale: gather limit", where, gather, limits[0], 0.9))
    return out


# -- output -----------------------------------------------------------------------
_COLUMNS = ("obs", "buffer", "capacity", "processes", "rows/add", "inserts/s", "sampled rows/s", "updates/s",
            "stale dropped", "lock wait", "CPU cores", "page faults/s", "others' cores")
_TARGET_COLUMNS = ("target", "case", "ratio", "goal", "met", "ratio per CPU s")
_LEGEND = ("updates/s: priority updates applied (stale ones are dropped); lock wait: share of window x processes "
           "spent waiting for the buffer's lock;\nCPU cores: CPU seconds of the case's processes / window; "
           "page faults/s: their minor page faults (memory the kernel maps on first touch); "
           "others' cores: what the rest of the machine used meanwhile (/proc/stat);\n"
           "ratio per CPU s (targets): the same ratio of rows per CPU second of the processes doing them (writers "
           "for inserts, the learner for samples): other work on the machine does not skew it,\nbut neither does "
           "time spent asleep waiting for the lock (see lock wait).")


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _cores(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _cells(r: _Result) -> list[str]:
    return [r.obs, r.buffer, f"{r.capacity:,}", r.case, "" if r.rows_per_add is None else str(r.rows_per_add),
            _num(r.inserts), _num(r.sampled), _num(r.updates), _num(r.stale),
            "" if r.lock_wait is None else f"{100 * r.lock_wait:.1f}%", _cores(r.cpu), _num(r.faults),
            _cores(r.others)]


_ATARI_COLUMNS = ("buffer", "capacity", "rows/add", "inserts/s", "per writer CPU s", "sampled/s",
                  "per learner CPU s", "lock wait", "faults/sample", "cores", "others")


def _atari_cells(r: _Result) -> list[str]:
    compressed = ", compressed" if r.buffer == "mpreplay" else ", uncompressed"
    faults = "" if r.learner_faults is None else f"{r.learner_faults:.1f}"
    return [r.buffer + compressed, f"{r.capacity:,}", str(r.rows_per_add), _num(r.inserts),
            _num(_inserts_per_cpu(r)), _num(r.sampled), _num(_sampled_per_cpu(r)),
            "" if r.lock_wait is None else f"{100 * r.lock_wait:.1f}%", faults, _cores(r.cpu), _cores(r.others)]


def _target_cells(t: _Target) -> list[str]:
    per_cpu = "" if t.per_cpu is None else f"{t.per_cpu:.2f}"
    if t.ratio is None:
        return [t.target, t.case, "not measured", f">= {t.goal:g}", "", per_cpu]
    return [t.target, t.case, f"{t.ratio:.2f}", f">= {t.goal:g}", "yes" if t.ratio >= t.goal else "no", per_cpu]


# -- command line ---------------------------------------------------------------
def _mp_table(title: str, columns: Sequence[str], lines: Sequence[list[str]], group: int | None) -> None:
    # Case and buffer read as labels; a rule closes each group of rows agreeing up to column `group`.
    print_table(title, columns, lines, left=2, group=None if group is None else slice(0, group + 1), width=220)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mpreplay bench mp", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=_seconds, help="measured window of every case (default 3; --quick: 0.3)")
    parser.add_argument("--start-method", choices=multiprocessing.get_all_start_methods(), default="fork",
                        help="how writer and learner processes start (default fork)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: short windows, small capacities, cpprb skipped")
    parser.add_argument("--atari-scale", action="store_true",
                        help="run only the Atari-scale case: compressed (84, 84, 4) stacks, 8 writers + learner")
    parser.add_argument("--capacity", type=float, default=_ATARI_SCALE.capacity,
                        help="capacity of the --atari-scale buffer (default 1e6; --quick: 8000)")
    return parser.parse_args(list(argv))


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so the cleanup code runs as it does on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case and print the tables; returns the exit status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    seconds = args.seconds or (0.3 if args.quick else 3.0)
    timing = _Timing(seconds, warmup=min(1.0, seconds / 3), slices=3 if args.quick else 10)
    ctx = multiprocessing.get_context(args.start_method)
    contenders = [_MPREPLAY]
    if not args.quick and importlib.util.find_spec("cpprb") is not None:
        contenders.append(_CPPRB)
    observations = [_SMALL, _ATARI]
    if args.quick:
        observations = [o.resized(_QUICK_CAPACITY[o.label]) for o in observations]
    results: list[_Result] = []
    if args.atari_scale:
        capacity = 8_000 if args.quick else int(args.capacity)
        return _main_atari_scale(ctx, contenders, _ATARI_SCALE.resized(capacity), timing, args)
    try:
        with _sigterm_unwinds():
            for obs in observations:
                for contender in contenders:
                    results += _cases(ctx, contender, obs, timing)
                results.append(_gather_limit(obs, timing))
            sweep = _sweep(ctx, _QUICK_SWEEP if args.quick else _SWEEP, timing)
    except KeyboardInterrupt:
        print("interrupted: every process was stopped and every segment unlinked", file=sys.stderr)
        return 128 + signal.SIGINT
    _print_setting(timing, args, contenders, 3)
    print(_LEGEND)
    _mp_table(f"Shared prioritized buffer: writers add, the learner samples {BATCH} + updates {BATCH}",
              _COLUMNS, [_cells(r) for r in results], group=0)
    _mp_table("Sample cost vs capacity: learner alone, (4,) float32", _COLUMNS, [_cells(r) for r in sweep],
              group=2)
    _mp_table("Targets (ratios from this run)", _TARGET_COLUMNS,
              [_target_cells(t) for t in _targets(results, sweep)], group=0)
    return 0


def _print_setting(timing: _Timing, args: argparse.Namespace, contenders: Sequence[_Contender], processes: int) -> None:
    versions = [f"mpreplay {mpreplay.__version__}", f"numpy {np.__version__}"]
    if _CPPRB in contenders:
        from importlib.metadata import version

        versions.append(f"cpprb {version('cpprb')}")
    else:
        versions.append("cpprb " + ("skipped (--quick)" if args.quick else "not installed"))
    cores = len(os.sched_getaffinity(0))
    crowded = f" ({processes} processes per case oversubscribe them)" if cores < processes else ""
    print(f"{timing.seconds:g} s window per case after {timing.warmup:.2g} s warm-up, rates are medians of "
          f"{timing.slices} slices; start method {args.start_method}; {cores} cores{crowded}; {', '.join(versions)}")


def _main_atari_scale(ctx: Any, contenders: Sequence[_Contender], obs: _Obs, timing: _Timing,
                      args: argparse.Namespace) -> int:
    try:
        with _sigterm_unwinds():
            results = _atari_scale(ctx, contenders, obs, timing)
    except KeyboardInterrupt:
        print("interrupted: every process was stopped and every segment unlinked", file=sys.stderr)
        return 128 + signal.SIGINT
    _print_setting(timing, args, contenders, _ATARI_SCALE_WRITERS + 1)
    print("Writers add episodes of consecutive frame stacks; the learner samples 256 + updates 256. Per CPU s: rows "
          "per CPU second of the processes doing them;\nlock wait: share of window x processes spent waiting for "
          "the lock; faults/sample: the learner's minor page faults per sample call (mpreplay samples into its previous "
          "batch: out=).")
    _mp_table(f"Atari scale: (84, 84, 4) uint8, {_ATARI_SCALE_WRITERS} writers + learner", _ATARI_COLUMNS,
              [_atari_cells(r) for r in results], group=0)
    return 0
