"""``mpreplay bench mp``'s processes: one case's writers and learner run for the same window of the
monotonic clock (:mod:`mpreplay.bench.case_clock`) and report what they did; :func:`summarize` makes a
table's line of what any case's processes reported, mpreplay's or a peer's; and the memory limit, a
gather of the same rows in one process."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from mpreplay.bench.case_clock import (
    REPLY_TIMEOUT,
    Timing,
    Trace,
    Window,
    machine_busy_seconds,
    marks,
    others_cores,
    run_until,
    run_window,
    serve_window,
    slice_rates,
)
from mpreplay.bench.mp_workloads import BATCH, BETA, POOL, Contender, Obs, adds, env_dict
from mpreplay.memory import Layout, SharedMemory

__all__ = ["Result", "Timing", "Trace", "gather_limit", "run_case", "summarize"]


@dataclass(frozen=True)
class Role:
    """One process of a case: a writer adding ``rows`` per call, or the learner (``rows`` = batch size)."""

    kind: str  # "writer" | "learner"
    rows: int
    obs: Obs
    scalar_shape: tuple[int, ...]
    seed: int
    reuse: bool = False  # the learner samples into its previous batch (mpreplay's out=)


def role_operation(role: Role, buffer: Any) -> tuple[Callable[[], None], int]:
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


def role_child(role: Role, buffer: Any, conn: Connection) -> None:
    """Process body: get ready (a writer after one lap of its ring), run to the marks, report."""

    def build() -> tuple[Callable[[], None], int]:
        op, stride = role_operation(role, buffer)
        if role.kind == "writer":
            # A process faults on the first write to every page of the
            # segment, a cost a long-running actor pays once: one lap of the
            # ring (of its lane, compressed) before the window leaves only the steady state in it.
            for _ in range(-(-role.obs.capacity // (max(1, role.obs.lanes) * role.rows))):
                op()
        return op, stride

    serve_window(conn, build)


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
    cpu: float | None = None  # cores busy (CPU seconds / window), every process of the case
    writer_cpu: float | None = None  # the writers' share of `cpu`
    learner_cpu: float | None = None  # the learner's (or the gather's) share of `cpu`
    faults: float | None = None  # minor page faults per second, all processes of the case
    others: float | None = None  # cores busy with other work meanwhile
    learner_faults: float | None = None  # the learner's minor page faults per sample call
    server_cpu: float | None = None  # a server process's share of `cpu` (Reverb's)
    steps: float | None = None  # learner steps (sample + update) per second, median over slices


def case_label(writers: int, learner: bool) -> str:
    parts = [f"{writers} writer{'s' if writers > 1 else ''}"] if writers else []
    return " + ".join(parts + ["learner"] * learner)


def _stats(buffer: Any) -> dict[str, float] | None:
    return buffer.stats() if hasattr(buffer, "stats") else None  # mpreplay's counters; cpprb has none


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
    window = run_window(
        ctx,
        [(f"{role.kind} {i}", role_child, (role, buffer)) for i, role in enumerate(roles)],
        timing,
        # Getting ready includes a writer's lap of its ring: allow 1 ms per slot of the buffer.
        ready_timeout=max(REPLY_TIMEOUT, obs.capacity * 1e-3),
        snapshot=lambda: _stats(buffer),
    )
    return summarize(window, obs.label, contender.name, obs.capacity, writers, learner, rows)


def summarize(
    window: Window,
    obs: str,
    buffer: str,
    capacity: int,
    writers: int,
    learner: bool,
    rows: int,
    batch: int = BATCH,
) -> Result:
    """A table's line of a case's window: the writers' reports first, then the learner's; a watched
    process (a server) counts in the CPU; snapshots, when there are, are mpreplay's ``stats()``."""
    at, reports = window.marks, window.reports
    span = at[-1] - at[0]
    server_cpu = server_faults = 0.0
    first, last = window.watched
    if first is not None and last is not None:
        server_cpu, server_faults = (last[0] - first[0]) / span, (last[1] - first[1]) / span
    cores = sum(r.cpu for r in reports) / span + server_cpu
    result = Result(
        obs,
        buffer,
        case_label(writers, learner),
        capacity,
        rows if writers else None,
        cpu=cores,
        faults=sum(r.faults for r in reports) / span + server_faults,
        others=others_cores(*window.busy, span, cores),
        server_cpu=server_cpu if first is not None else None,
    )
    if writers:
        rates = sum(slice_rates(r.counts, at, rows) for r in reports[:writers])
        result.inserts = float(np.median(rates))
        result.writer_cpu = sum(r.cpu for r in reports[:writers]) / span
    before, after = window.snapshots
    if learner:
        result.learner_cpu = reports[-1].cpu / span
        counts = reports[-1].counts
        result.learner_faults = reports[-1].faults / max(1, counts[-1] - counts[0])
        result.steps = float(np.median(slice_rates(counts, at, 1)))
        result.sampled = result.steps * batch
        submitted = (counts[-1] - counts[0]) * batch
        if before is not None and after is not None:  # the same buffer's: both or neither
            result.stale = int(after["stale_updates_dropped"] - before["stale_updates_dropped"])
            result.updates = (submitted - result.stale) / span
        else:
            result.updates = submitted / span
    if before is not None and after is not None:
        waited = after["lock_wait_seconds"] - before["lock_wait_seconds"]
        result.lock_wait = waited / (span * len(reports))
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

        at = marks(timing)
        run_until(at[:1], gather, 1)  # the warm-up
        busy_at_start = machine_busy_seconds()
        trace = run_until(at, gather, 1)
        busy = machine_busy_seconds()  # read at once: the loop ended at the last mark
        pairs.clear()
        del sources, gather
    finally:
        memory.close()
    window = at[-1] - at[0]
    cores = trace.cpu / window
    return Result(
        obs.label,
        "gather",
        "np.take limit",
        obs.capacity,
        sampled=float(np.median(slice_rates(trace.counts, at, BATCH))),
        cpu=cores,
        learner_cpu=cores,
        faults=trace.faults / window,
        others=others_cores(busy_at_start, busy, window, cores),
    )
