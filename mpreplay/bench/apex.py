"""``mpreplay bench apex``: Ape-X on real Atari frames, the system measured in one run.

``mpreplay bench apex [--quick] [--capacity N] [--record-steps S] [--seconds W] [--writers 1,2,4,8] [--peers DIR]``

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
   n-step fold, adds and episode ends) against env stepping and inference.  Then the same actor
   loop over the recorded steps through each library's actor-side path, the CPU time per env
   step (:mod:`mpreplay.bench.apex_peers`): the floor (the step's new bytes copied by numpy into
   a shared-memory segment), mpreplay, cpprb's ``NstepBuffer`` + ``MPPrioritizedReplayBuffer``,
   Reverb's ``TrajectoryWriter`` as Acme's n-step adder writes, TorchRL's ``MultiStep`` + its
   shared buffer (Reverb and TorchRL from the peers' venvs: ``--peers DIR`` or ``MPREPLAY_PEERS``).
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
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

import mpreplay
from mpreplay import MPPrioritizedReplayBuffer, ReplayBuffer
from mpreplay.bench import peers
from mpreplay.bench._report import positive_int, positive_seconds
from mpreplay.bench.apex_episodes import Episode, cycle_rows, record
from mpreplay.bench.apex_measures import (
    TARGETS,
    ActorShare,
    Learner,
    LockCase,
    actor_share,
    learner,
    load_average,
    locks,
    print_table,
)
from mpreplay.bench.apex_peers import ActorPeers, actor_peers
from mpreplay.bench.apex_peers import targets as actor_targets
from mpreplay.demo.apex_atari import replay_fields

FRAME_BYTES = 84 * 84
LANES = 8


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    print(f"mpreplay {mpreplay.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; {load_average()}")
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
        actor = actor_share(buffer, args.actor_steps)
        compared = actor_peers(episodes, args.peers, args.peer_capacity, args.actor_steps, args.peer_rounds)
        learned = learner(buffer, args.seconds, args.train_ms, args.prefetch_steps)
        lock_cases = locks(buffer, episodes, args.writers, args.seconds)
        _print_locks(lock_cases, args.seconds)
    _targets(memory, actor, compared, learned, lock_cases)
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
    parser.add_argument(
        "--peers", metavar="DIR", default=None, help=f"the peers' venvs for the actor's comparison ({peers.SETUP_HINT})"
    )
    args = parser.parse_args(list(argv))
    quick = args.quick
    args.capacity = int(args.capacity or (4_000 if quick else 1_000_000))
    args.record_steps = args.record_steps or (600 if quick else 16_000)
    args.seconds = args.seconds or (0.3 if quick else 3.0)
    args.cpprb_capacity = min(args.capacity, 1_000 if quick else 20_000)
    args.actor_steps = 20 if quick else 1_500  # vector steps of 4 games
    args.peer_capacity = min(args.capacity, 4_000 if quick else 100_000)
    args.peer_rounds = 1 if quick else 5
    args.peers = peers.peers_directory(args.peers)
    args.prefetch_steps = 20 if quick else 500
    try:
        args.writers = [positive_int(w) for w in args.writers.split(",")]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--writers: {exc}")
    if args.capacity < 1_000:
        parser.error(f"--capacity: expected at least 1,000 transitions, got {args.capacity}")
    return args


@contextmanager
def compressed_buffer(capacity: int, lanes: int, **options: Any) -> Iterator[MPPrioritizedReplayBuffer]:
    """The demo's replay: a shared prioritized buffer of the actors' rows, stacks stored as frames in ``lanes``."""
    with MPPrioritizedReplayBuffer(
        capacity, replay_fields(), next_of="obs", stack_compress="obs", lanes=lanes, alpha=0.6, **options
    ) as buffer:
        yield buffer


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
    print(load_average())
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


def _print_locks(cases: list[LockCase], seconds: float) -> None:
    print(load_average())
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


# ----------------------------------------------------------------------------- targets


def _targets(memory: Memory, actor: ActorShare, compared: ActorPeers, learner: Learner, locks: list[LockCase]) -> None:
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
        *actor_targets(compared),
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
