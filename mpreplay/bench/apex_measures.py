"""``mpreplay bench apex``'s measures under load, each on the full compressed buffer: the actor's
share of its CPU time spent in replay calls, the learner's sample + update rate and how often a
prefetched batch was ready, and the lock with 1-8 writer processes beside a learner (see
:mod:`mpreplay.bench.apex` for the run and its targets).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpreplay import MPPrioritizedReplayBuffer
from mpreplay.bench._report import print_table as _print_table
from mpreplay.bench.apex_episodes import Episode, chunks
from mpreplay.bench.mp_processes import run_until

__all__ = [
    "BETA",
    "TARGETS",
    "ActorShare",
    "Learner",
    "LockCase",
    "actor_share",
    "learner",
    "learner_op",
    "load_average",
    "locks",
    "print_table",
    "writer_op",
]

BETA = 0.4
TARGETS = {"memory": 1.05, "actor": 0.03, "ready": 0.99}


def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    _print_table(title, columns, rows, width=200)  # wide: the columns are named in full


# ----------------------------------------------------------------------------- actor


@dataclass
class ActorShare:
    seconds: dict[str, float]  # CPU seconds by part
    env_steps: int

    @property
    def replay(self) -> float:
        return self.seconds["n-step fold"] + self.seconds["add + episode ends"]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class _CpuClock:
    """CPU seconds of this thread, summed by part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] = self.seconds.get(part, 0.0) + time.thread_time() - start

        return call


class _TimedEnv:
    """A vector env whose ``step`` is timed; everything else passes through."""

    def __init__(self, env: Any, clock: _CpuClock):
        self._env, self.step = env, clock.timed("env step (ALE + preprocessing)", env.step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _TimedFolder:
    def __init__(self, folder: Any, clock: _CpuClock):
        self._folder, self.step = folder, clock.timed("n-step fold", folder.step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._folder, name)


def actor_share(buffer: MPPrioritizedReplayBuffer, vector_steps: int) -> ActorShare:
    """One demo actor (4 games, ε = 0.4, Q-values from the Nature CNN once a step) writing for
    ``vector_steps`` steps into ``buffer``, the CPU time of each of its parts."""
    import torch

    from mpreplay.demo.apex_atari import PendingRows, StackedSteps, atari_network
    from mpreplay.demo.atari import AtariConfig, vector_env
    from mpreplay.vector_env import VectorWriter

    torch.set_num_threads(1)
    config = AtariConfig(envs_per_actor=4)
    clock = _CpuClock()
    env = vector_env(config)
    net = atari_network(config, int(env.single_action_space.n))

    def q_values(stacks: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(stacks)).numpy()

    steps = StackedSteps(_TimedEnv(env, clock), clock.timed("inference (Nature CNN)", q_values), 3, 0.99)
    steps.transitions = _TimedFolder(steps.transitions, clock)  # type: ignore[assignment]
    step = clock.timed("whole step", steps.step)
    rng = np.random.default_rng(0)
    env_steps = 0
    pending = PendingRows()
    take = clock.timed("rows merged, initial priorities", pending.take)
    with VectorWriter(buffer, env.num_envs) as writer:
        add = clock.timed("add + episode ends", writer.add)
        steps.reset(0)
        for _ in range(vector_steps):
            act = np.where(rng.random(4) < 0.4, rng.integers(4, size=4), steps.q.argmax(1))
            env_steps += int(4 - steps.resetting.sum())
            batch, *_ = step(act)
            pending.append(batch)
            if pending.due(config.actor_batch):
                add(*take())
    env.close()
    seconds = dict(clock.seconds)
    whole = seconds.pop("whole step")
    seconds["frame stacking (the actor's own)"] = (
        whole - seconds["env step (ALE + preprocessing)"] - seconds["inference (Nature CNN)"] - seconds["n-step fold"]
    )
    share = ActorShare(seconds, env_steps)
    print(load_average())
    rows = [
        [part, f"{s:.2f}", f"{s / share.total:.1%}", f"{1e6 * s / env_steps:,.0f}"]
        for part, s in sorted(seconds.items(), key=lambda kv: -kv[1])
    ]
    rows.append(
        [
            "replay calls (fold + add + episode ends)",
            f"{share.replay:.2f}",
            f"{share.replay / share.total:.1%}",
            f"{1e6 * share.replay / env_steps:,.0f}",
        ]
    )
    print_table(
        f"Actor: 4 Breakout games, the Nature CNN on one thread, {env_steps:,} env steps into the shared "
        f"buffer ({env_steps / share.total:,.0f} env steps per actor CPU s)",
        ["part", "CPU s", "share of the actor's CPU", "µs / env step"],
        rows,
    )
    return share


# ----------------------------------------------------------------------------- learner


@dataclass
class Learner:
    rates: dict[int, tuple[float, float]]  # batch -> (calls per wall s, calls per CPU s)
    ready: float  # share of prefetched train steps that found their batch ready
    wait_ms: float  # median wait of next() when not ready


def learner(buffer: MPPrioritizedReplayBuffer, seconds: float, train_ms: float, steps: int) -> Learner:
    rng = np.random.default_rng(1)
    rates: dict[int, list[tuple[float, float]]] = {32: [], 64: [], 256: []}
    outs: dict[int, Any] = dict.fromkeys(rates)
    for _ in range(3):  # rounds: the batch sizes take turns, so the machine's drift weighs on each alike
        for b in rates:
            calls, wall, cpu = 0, time.monotonic(), time.thread_time()
            end = wall + seconds / 3
            while time.monotonic() < end:
                batch = buffer.sample(b, BETA, out=outs[b])
                buffer.update_priorities(batch["indexes"], rng.random(b) + 0.1)
                outs[b] = {k: v for k, v in batch.items() if k not in ("indexes", "weights")}
                calls += 1
            rates[b].append((calls / (time.monotonic() - wall), calls / max(time.thread_time() - cpu, 1e-9)))
    medians = {b: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for b, rs in rates.items()}
    ready, waits = 0, []
    with buffer.batches(256, BETA, prefetch=2) as batches:
        next(batches)  # the thread's start is not a step
        for _ in range(steps):
            time.sleep(train_ms / 1e3)  # the GPU's step: this thread waits, as on a device
            was_ready = batches.ready > 0
            start = time.perf_counter()
            batch = next(batches)
            waited = time.perf_counter() - start
            buffer.update_priorities(batch["indexes"], rng.random(256) + 0.1)
            ready += was_ready
            if not was_ready:
                waits.append(waited)
    result = Learner(medians, ready / steps, 1e3 * statistics.median(waits) if waits else 0.0)
    print(load_average())
    print_table(
        f"Learner: sample + update_priorities from the full buffer ({buffer.get_stored_size():,} real "
        "transitions), stacks rebuilt into the previous batch (out=); medians of 3 rounds",
        ["batch", "calls / s", "rows / s", "calls / learner CPU s", "rows / learner CPU s"],
        [[str(b), f"{w:,.0f}", f"{w * b:,.0f}", f"{c:,.0f}", f"{c * b:,.0f}"] for b, (w, c) in medians.items()],
    )
    print(
        f"prefetched (batches(256, prefetch=2)), a train step of {train_ms:g} ms (a sleep: the GPU computes): "
        f"{result.ready:.1%} of {steps} steps found their batch ready (target >= {TARGETS['ready']:.0%}); "
        f"the others waited {result.wait_ms:.2f} ms (median)\n"
    )
    return result


# ----------------------------------------------------------------------------- lock


@dataclass(frozen=True)
class _Report:
    calls: int
    cpu: float
    held: float  # seconds this process held the lock in the window
    holds: int


def _process(role: str, buffer: Any, episodes: list[Episode], conn: Any) -> None:
    """A writer adding a row per call (its own lane), or the learner sampling 256 + updating: ready,
    then the window's marks, a warm-up to the first, the holds timed to the last."""
    try:
        op = writer_op(buffer, episodes) if role == "writer" else learner_op(buffer)
        conn.send("ready")
        marks = conn.recv()
        run_until(marks[:1], op, 1)
        inspection = buffer.inspection()
        inspection.time_lock_holds()
        trace = run_until(marks, op, 1)
        held, holds = inspection.lock_holds()
        conn.send(_Report(trace.counts[-1] - trace.counts[0], trace.cpu, held, holds))
    except BaseException as exc:  # the parent raises it
        conn.send(exc)
        raise


def writer_op(buffer: Any, episodes: list[Episode]) -> Callable[[], None]:
    """Each episode's rows as the demo's actor adds them: a row per call, as its folder completes
    them, then the last 3 together (the terminal step completes them all)."""
    adds = []
    for episode in episodes:
        rows = episode.rows()
        for start, stop in chunks(len(episode), 1):
            if stop - start == 1:
                adds.append({k: (v[start] if v.ndim > 1 else v[start].item()) for k, v in rows.items()})
            else:
                adds.append({k: v[start:stop] for k, v in rows.items()})
    each = itertools.cycle(adds)
    add = buffer.add

    def write() -> None:
        rows = next(each)
        add(**rows, priorities=np.ones(len(rows["act"])) if isinstance(rows["act"], np.ndarray) else 1.0)

    return write


def learner_op(buffer: Any) -> Callable[[], None]:
    """The learner's call: sample 256 rows (into the arrays of the previous batch) and update their priorities."""
    rng = np.random.default_rng(2)
    priorities = [rng.random(256) + 0.1 for _ in range(8)]
    last: list[Any] = [None, 0]

    def learn() -> None:
        batch = buffer.sample(256, BETA, out=last[0])
        buffer.update_priorities(batch["indexes"], priorities[last[1] % 8])
        last[0] = {k: v for k, v in batch.items() if k not in ("indexes", "weights")}
        last[1] += 1

    return learn


@dataclass
class LockCase:
    writers: int
    inserts: float  # per wall second, all writers
    per_writer_cpu: float  # inserts per writer CPU second
    wait: float  # share of the window x processes spent waiting for the lock
    hold_insert: float  # seconds held per insert
    holds_insert: float
    learner_calls: float  # sample + updates per wall second
    per_learner_cpu: float
    hold_sample: float  # seconds held per sample + update


def locks(
    buffer: MPPrioritizedReplayBuffer, episodes: list[Episode], counts: list[int], seconds: float
) -> list[LockCase]:
    """The lock with each count of writer processes beside a learner (printed by :mod:`mpreplay.bench.apex`)."""
    ctx = multiprocessing.get_context("spawn")
    # Each writer cycles through episodes that end at a terminal step (a new episode follows at once).
    ended = [e for e in episodes if e.terminated]
    cases = []
    for writers in counts:
        cases.append(_lock_case(ctx, buffer, ended, writers, seconds))
    return cases


def _lock_case(ctx: Any, buffer: Any, episodes: list[Episode], writers: int, seconds: float) -> LockCase:
    roles = ["writer"] * writers + ["learner"]
    procs: list[Any] = []
    conns: list[Any] = []

    def receive(i: int, timeout: float) -> Any:
        if not conns[i].poll(timeout):
            raise TimeoutError(f"the {roles[i]} process {i} did not answer within {timeout:.0f} s")
        message = conns[i].recv()
        if isinstance(message, BaseException):
            raise RuntimeError(f"the {roles[i]} process {i} failed") from message
        return message

    try:
        for i, role in enumerate(roles):
            mine, theirs = ctx.Pipe()
            share = [episodes[(i + j) % len(episodes)] for j in range(3)]
            proc = ctx.Process(target=_process, args=(role, buffer, share, theirs), daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        for i in range(len(roles)):
            receive(i, 120.0)
        start = time.monotonic() + 1.0  # a second of warm-up, every process running
        marks = [start, start + seconds]
        for conn in conns:
            conn.send(marks)
        time.sleep(max(0.0, marks[0] - time.monotonic()))
        before = buffer.stats()
        time.sleep(max(0.0, marks[1] - time.monotonic()))
        after = buffer.stats()
        reports = [receive(i, 60.0) for i in range(len(roles))]
    finally:
        for proc in procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in conns:
            conn.close()
    written, learner = reports[:-1], reports[-1]
    inserts = sum(r.calls for r in written)
    waited = float(after["lock_wait_seconds"] or 0.0) - float(before["lock_wait_seconds"] or 0.0)
    return LockCase(
        writers,
        inserts / seconds,
        inserts / max(sum(r.cpu for r in written), 1e-9),
        waited / (seconds * len(roles)),
        sum(r.held for r in written) / max(inserts, 1),
        sum(r.holds for r in written) / max(inserts, 1),
        learner.calls / seconds,
        learner.calls / max(learner.cpu, 1e-9),
        learner.held / max(learner.calls, 1),
    )
