"""``mpreplay bench apex``: Ape-X on real Atari frames, the system measured in one run.

``mpreplay bench apex [--quick] [--capacity N] [--record-steps S] [--seconds W] [--writers 1,2,4,8]``

Real Breakout episodes are recorded once (``--record-steps`` env steps, random actions, an episode
per life, as ``mpreplay demo --env atari`` plays; the episodes' rows are the demo actors' rows:
3-step returns over 4-frame stacks).  Then, in this order:

1. **Memory**: a compressed buffer (``next_of`` + ``stack_compress``, 8 lanes) of capacity
   ``N`` (1e6) filled past capacity with those episodes, over and over: the segment's bytes per
   stored transition against one 84x84 frame.  Beside it, the plain layout (obs + next_obs),
   computed from its layout, and cpprb's ``next_of`` + ``stack_compress``, measured at a smaller
   capacity (the resident memory it grows by when filled with the same rows).
2. **Actor**: one demo actor (4 games, the Nature CNN on one thread, Q-values once a step) writing
   into the shared buffer: the CPU time of each part, and the share of the replay calls (the
   n-step fold, adds and episode ends) against env stepping and inference.
3. **Learner**: ``sample`` + ``update_priorities`` of 32, 64 and 256 rows from the full buffer, per
   second and per learner CPU second; then a learner on ``batches(256, prefetch=2)`` whose
   training step is a sleep of ``--train-ms`` (10: a GPU's step): how often a batch was ready.
4. **Lock**: 1, 2, 4, 8 writer processes adding a row per call (as the demo's actors do, each
   through a lane) beside a learner sampling 256 + updating, all for ``W`` seconds: inserts per
   second and per writer CPU second, lock wait, and the lock's hold time per insert and per
   sample + update (``inspection().time_lock_holds()``); the insert ceiling those hold times
   imply.

Other work on the machine slows every figure per second; the per CPU second figures and the hold
times are what it skews least.  The load average is printed before each table.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

import mpreplay
from mpreplay import MPPrioritizedReplayBuffer, ReplayBuffer
from mpreplay.bench._report import positive_int, positive_seconds
from mpreplay.bench._report import print_table as _print_table
from mpreplay.bench.apex_episodes import Episode, chunks, cycle_rows, record
from mpreplay.bench.mp_processes import run_until
from mpreplay.demo.apex_atari import replay_fields

FRAME_BYTES = 84 * 84
LANES = 8
BETA = 0.4
TARGETS = {"memory": 1.05, "actor": 0.03, "ready": 0.99}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    print(f"mpreplay {mpreplay.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; {_load()}")
    start = time.process_time()
    episodes = record(args.record_steps)
    lengths = np.array([len(e) for e in episodes])
    print(
        f"recorded {lengths.sum():,} env steps of real Breakout in {time.process_time() - start:.0f} CPU s: "
        f"{len(episodes)} episodes (lives), {lengths.mean():.1f} steps on average (shortest {lengths.min()}, "
        f"longest {lengths.max()})"
    )
    with compressed_buffer(args.capacity, LANES) as buffer:
        memory = _memory(buffer, episodes, args.cpprb_capacity)
        actor = _actor_share(buffer, args.actor_steps)
        learner = _learner(buffer, args.seconds, args.train_ms, args.prefetch_steps)
        locks = _locks(buffer, episodes, args.writers, args.seconds)
    _targets(memory, actor, learner, locks)
    return 0


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench apex", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and short windows: a smoke run")
    parser.add_argument("--capacity", type=float, default=None, help="transitions of the buffer (default 1e6)")
    parser.add_argument("--record-steps", type=positive_int, default=None, help="real env steps (default 16,000)")
    parser.add_argument("--seconds", type=positive_seconds, default=None, help="window of each timed case (default 3)")
    parser.add_argument("--train-ms", type=float, default=10.0, help="the simulated GPU training step")
    parser.add_argument("--writers", default="1,2,4,8", help="writer processes of the lock cases")
    args = parser.parse_args(list(argv))
    quick = args.quick
    args.capacity = int(args.capacity or (4_000 if quick else 1_000_000))
    args.record_steps = args.record_steps or (600 if quick else 16_000)
    args.seconds = args.seconds or (0.3 if quick else 3.0)
    args.cpprb_capacity = min(args.capacity, 1_000 if quick else 20_000)
    args.actor_steps = 20 if quick else 1_500  # vector steps of 4 games
    args.prefetch_steps = 20 if quick else 500
    try:
        args.writers = [positive_int(w) for w in args.writers.split(",")]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--writers: {exc}")
    if args.capacity < 1_000:
        parser.error(f"--capacity: expected at least 1,000 transitions, got {args.capacity}")
    return args


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


@contextmanager
def compressed_buffer(capacity: int, lanes: int, **options: Any) -> Iterator[MPPrioritizedReplayBuffer]:
    """The demo's replay: a shared prioritized buffer of the actors' rows, stacks stored as frames in ``lanes``."""
    with MPPrioritizedReplayBuffer(
        capacity, replay_fields(), next_of="obs", stack_compress="obs", lanes=lanes, alpha=0.6, **options
    ) as buffer:
        yield buffer


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    _print_table(title, columns, rows, width=200)  # wide: the columns are named in full


# ----------------------------------------------------------------------------- memory


@dataclass
class Memory:
    per_transition: float  # the compressed buffer's bytes per stored transition
    rows_added: int
    stored: int
    nbytes: int


def fill(buffer: Any, episodes: list[Episode], rows: int) -> None:
    """Add ``rows`` rows of the episodes through one writer per lane, an episode to each in turn,
    32 rows per add (the demo's actors add a row per call; the bytes are the same)."""
    writers = [buffer.episode_writer() for _ in range(LANES)]
    try:
        chunks = cycle_rows(episodes, 32)
        lane, added = 0, 0
        while added < rows:
            chunk, last = next(chunks)
            k = len(chunk["act"])
            writers[lane].add(**chunk, priorities=np.ones(k))
            added += k
            if last:  # the next episode goes to the next lane
                writers[lane].on_episode_end()
                lane = (lane + 1) % LANES
    finally:
        for w in writers:
            w.close()


def _memory(buffer: MPPrioritizedReplayBuffer, episodes: list[Episode], cpprb_capacity: int) -> Memory:
    capacity = buffer.get_buffer_size()
    added = capacity + capacity // 10
    start = time.monotonic()
    fill(buffer, episodes, added)
    fill_s = time.monotonic() - start
    nbytes, stored = buffer.inspection().nbytes, buffer.get_stored_size()
    ours = Memory(nbytes / stored, added, stored, nbytes)
    plain = _plain_bytes(capacity)
    rows = [
        [
            "mpreplay, next_of + stack_compress",
            "measured: filled",
            f"{capacity:,}",
            f"{stored:,}",
            f"{nbytes / 2**30:.2f}",
            f"{ours.per_transition:,.0f}",
            f"{ours.per_transition / FRAME_BYTES:.3f}",
        ],
        [
            "mpreplay, obs + next_obs",
            "computed: layout",
            f"{capacity:,}",
            f"{capacity:,}",
            f"{plain * capacity / 2**30:.2f}",
            f"{plain:,.0f}",
            f"{plain / FRAME_BYTES:.3f}",
        ],
    ]
    per = _cpprb_bytes(episodes, cpprb_capacity)
    if per is None:
        rows.append(["cpprb, next_of + stack_compress", "cpprb not installed", "", "", "", "", ""])
    else:
        rows.append(
            [
                "cpprb 11, next_of + stack_compress",
                "measured: resident growth, 1-step rows",
                f"{cpprb_capacity:,}",
                f"{cpprb_capacity:,}",
                f"{per * cpprb_capacity / 2**30:.2f}",
                f"{per:,.0f}",
                f"{per / FRAME_BYTES:.3f}",
            ]
        )
    print(_load())
    print_table(
        f"Memory: real Breakout episodes ({sum(len(e) for e in episodes):,} steps, {len(episodes)} lives, "
        f"repeated to fill), (84, 84, 4) uint8 stacks, 3-step rows; {added:,} rows added in {fill_s:.0f} s",
        ["layout", "how", "capacity", "transitions", "GiB", "bytes / transition", "÷ one 84x84 frame"],
        rows,
    )
    return ours


def _plain_bytes(capacity: int) -> float:
    """Bytes per slot of the uncompressed layout, from the layouts of two small buffers (a buffer of
    ``capacity`` uncompressed would need the memory this benchmark is about)."""
    sizes = []
    for n in (1_000, 2_000):
        buffer = ReplayBuffer(n, replay_fields())
        sizes.append(buffer.inspection().nbytes)
        buffer.close()
    per_slot = (sizes[1] - sizes[0]) / 1_000
    return (sizes[0] + per_slot * (capacity - 1_000)) / capacity


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpprb_bytes(episodes: list[Episode], capacity: int) -> float | None:
    """cpprb's bytes per transition: the resident memory its buffer grew by, filled past capacity
    with the same episodes.  One-step rows: cpprb's next_of takes a row's next_obs from the row after
    it, so rows folded n steps ahead in the actor cannot go through it (cpprb folds them itself)."""
    try:
        import cpprb
    except ImportError:
        return None
    fields = {name: {**spec, "shape": spec.get("shape", 1)} for name, spec in replay_fields().items()}
    before = _resident()
    rb = cpprb.ReplayBuffer(capacity, fields, next_of="obs", stack_compress="obs")
    added = 0
    chunks = cycle_rows(episodes, 32, nstep=1)
    while added < capacity + capacity // 10:
        chunk, last = next(chunks)
        rb.add(**chunk)
        added += len(chunk["act"])
        if last:
            rb.on_episode_end()
    grown = _resident() - before
    del rb
    return grown / capacity


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


def _actor_share(buffer: MPPrioritizedReplayBuffer, vector_steps: int) -> ActorShare:
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
    print(_load())
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


def _learner(buffer: MPPrioritizedReplayBuffer, seconds: float, train_ms: float, steps: int) -> Learner:
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
    print(_load())
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


def _locks(buffer: MPPrioritizedReplayBuffer, episodes: list[Episode], counts: list[int], seconds: float) -> list:
    ctx = multiprocessing.get_context("spawn")
    # Each writer cycles through episodes that end at a terminal step (a new episode follows at once).
    ended = [e for e in episodes if e.terminated]
    cases = []
    for writers in counts:
        cases.append(_lock_case(ctx, buffer, ended, writers, seconds))
    print(_load())
    print_table(
        f"Lock: writers adding a real row per call (the demo actor's add) beside a learner sampling 256 + "
        f"updating, {seconds:g} s each",
        [
            "writers",
            "inserts / s",
            "inserts / writer CPU s",
            "lock wait",
            "hold µs / insert",
            "holds / insert",
            "sample+update / s",
            "per learner CPU s",
            "hold µs / sample+update",
        ],
        [
            [
                str(c.writers),
                f"{c.inserts:,.0f}",
                f"{c.per_writer_cpu:,.0f}",
                f"{c.wait:.1%}",
                f"{1e6 * c.hold_insert:.2f}",
                f"{c.holds_insert:.2f}",
                f"{c.learner_calls:,.0f}",
                f"{c.per_learner_cpu:,.0f}",
                f"{1e6 * c.hold_sample:.1f}",
            ]
            for c in cases
        ],
    )
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


# ----------------------------------------------------------------------------- targets


def _targets(memory: Memory, actor: ActorShare, learner: Learner, locks: list[LockCase]) -> None:
    frames = memory.per_transition / FRAME_BYTES
    share = actor.replay / actor.total
    alone = min(locks, key=lambda c: c.writers)
    # Holds are wall-clock: a holder the scheduler preempts (more processes than cores, other work)
    # holds longer.  The smallest of the cases is the one least inflated by that.
    hold_insert = min(c.hold_insert for c in locks)
    hold_sample = min(c.hold_sample for c in locks)
    learner_busy = alone.per_learner_cpu * hold_sample  # the lock's share a learner on one core takes
    ceiling = (1.0 - learner_busy) / hold_insert
    actor_rate = actor.env_steps / actor.total  # env steps (= inserts) per actor CPU second
    rows = [
        ["memory: frames per stored transition at capacity", f"{frames:.3f}", "<= 1.05", _met(frames <= 1.05)],
        ["actor: replay calls' share of its CPU", f"{share:.1%}", "<= 3%", _met(share <= TARGETS["actor"])],
        ["learner: batch ready, 10 ms step, batch 256", f"{learner.ready:.1%}", ">= 99%", _met(learner.ready >= 0.99)],
        ["lock: hold per insert (the smallest of the cases)", f"{1e6 * hold_insert:.2f} µs", "measured", "yes"],
        ["lock: hold per sample 256 + update (smallest)", f"{1e6 * hold_sample:.1f} µs", "measured", "yes"],
    ]
    print_table("Targets (this run)", ["target", "figure", "goal", "met"], rows)
    print(
        f"Ceiling: a learner sampling 256 + updating flat out on one core ({alone.per_learner_cpu:,.0f} calls per "
        f"CPU s) holds the lock {learner_busy:.1%} of the time; the rest admits {ceiling:,.0f} inserts/s at "
        f"{1e6 * hold_insert:.2f} µs each: one learner's lock serves {ceiling / actor_rate:,.0f} actors at "
        f"{actor_rate:,.0f} env steps/s each (this run's actor per CPU second).  The lock alone: copies, "
        "cores and memory bandwidth bind far sooner."
    )


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


if __name__ == "__main__":
    raise SystemExit(main())
