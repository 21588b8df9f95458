"""``mpreplay bench sharded``: the learner across machines -- mpreplay's shards over Ray against the local
buffer and against Reverb's clients reaching their servers over gRPC, on the same work.

The work: (4,) float32 transitions; per shard a buffer of ``--capacity`` (filled first) and one
writer process adding one transition a call; a learner sampling 256 and updating their priorities;
1 and 2 shards, every process running for the same window (:mod:`mpreplay.bench.case_clock`); rates
are over the whole window:

* ``local`` -- one ``MPPrioritizedReplayBuffer`` holding every shard's capacity, the writers adding
  to it, the learner (this process) sampling it directly: the baseline;
* ``sharded`` -- a Ray cluster on loopback (:class:`mpreplay.testing.LoopbackRayCluster`) of one node
  per shard, a buffer per node served by a :class:`~mpreplay.sharded.ShardServer` actor; each writer
  adds to its node's buffer (shared memory: Ray is not on the write path); the learner (this process)
  samples through :class:`~mpreplay.sharded.ShardedReplay` (``prefetch`` 2 calls in flight per
  shard, each fetching ``--batches-per-call`` batches, 32 by default as in ``bench ray``);
* ``reverb`` (``--peers DIR``) -- a Reverb server process per shard (a ``Prioritized(0.6)`` table),
  one writer client per server, a learner client process taking 256 / shards items from each
  server's ``TrajectoryDataset`` and sending each its ``mutate_priorities``
  (:func:`mpreplay.bench.reverb_roles.sharded_learner`).

On a real cluster the shards' servers run on other machines and the learner's machine pays only its
own process: so the learner's steps are given per CPU-second of the learner's process (Ray's or
gRPC's threads in it included), and, for reference, per CPU-second of the learner and the servers
(the shard servers' Ray worker processes; not Ray's raylets and control plane).  Inserts are per
CPU-second of the writers (and Reverb's servers, which do the inserting).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench._report import positive_int, print_table
from mpreplay.bench.case_clock import Timing, Window, run_window
from mpreplay.bench.mp_peers import window_of
from mpreplay.bench.mp_processes import Result, Role, role_child, role_operation, summarize
from mpreplay.bench.mp_workloads import ALPHA, BATCH, EPS, MPREPLAY, SMALL, Obs, env_dict, fill
from mpreplay.bench.peers import ENV_VAR, PeerError, Unavailable, describe, launch, peers_directory

SHARDS = (1, 2)
LEARNER_GOAL = 0.5  # sharded ÷ local learner steps per learner CPU-second, at least


def _whole_window(result: Result, window: Window, writers: int) -> Result:
    """Rates over the whole window rather than medians of its slices: the sharded learner's steps
    arrive in bursts of a call's batches, so a slice may hold none."""
    at, reports = window.marks, window.reports
    span = at[-1] - at[0]
    result.inserts = sum(r.counts[-1] - r.counts[0] for r in reports[:writers]) / span
    result.steps = (reports[-1].counts[-1] - reports[-1].counts[0]) / span
    result.sampled = result.steps * BATCH
    return result


def _writers(obs: Obs, buffers: Sequence[Any]) -> list[tuple[str, Callable[..., None], tuple[Any, ...]]]:
    return [
        (f"writer {i}", role_child, (Role("writer", 1, obs, (), seed=10 + i), buffer))
        for i, buffer in enumerate(buffers)
    ]


def _local(ctx: Any, obs: Obs, shards: int, timing: Timing) -> Result:
    whole = obs.resized(obs.capacity * shards)
    with MPREPLAY.make(whole, ctx) as buffer:
        fill(buffer, whole, MPREPLAY)
        learn, _ = role_operation(Role("learner", BATCH, whole, (), seed=99), buffer)
        window = run_window(ctx, _writers(obs, [buffer] * shards), timing, local=(learn, 1))
    return _whole_window(summarize(window, obs.label, "local", whole.capacity, shards, True, 1), window, shards)


@contextmanager
def _shard_buffers(ctx: Any, obs: Obs, shards: int) -> Iterator[list[Any]]:
    buffers = []
    try:
        for _ in range(shards):
            buffers.append(mpreplay.MPPrioritizedReplayBuffer(obs.capacity, env_dict(obs, ()), alpha=ALPHA, eps=EPS))
            fill(buffers[-1], obs, MPREPLAY)
        yield buffers
    finally:
        for buffer in buffers:
            buffer.close()


def _sharded(ctx: Any, obs: Obs, shards: int, timing: Timing, batches_per_call: int) -> Result:
    import ray

    from mpreplay.sharded import ShardedReplay, start_shard_servers
    from mpreplay.testing import LoopbackRayCluster

    with _shard_buffers(ctx, obs, shards) as buffers, LoopbackRayCluster(shards) as cluster:
        servers = list(start_shard_servers(dict(zip(cluster.node_ids, buffers, strict=True)), num_cpus=0).values())
        pids = ray.get([server.__ray_call__.remote(lambda _: os.getpid()) for server in servers])
        client = ShardedReplay(servers, prefetch=2, batches_per_call=batches_per_call, seed=0)
        priorities = np.random.default_rng(99).uniform(0.01, 2.0, (8, BATCH))
        steps = iter(range(1 << 62))

        def learn() -> None:
            batch = client.sample(BATCH)
            client.update_priorities(batch["indexes"], priorities[next(steps) % 8])

        for _ in range(3):  # the prefetch pipeline fills outside the window
            learn()
        try:
            window = run_window(ctx, _writers(obs, buffers), timing, local=(learn, 1), watch=pids)
        finally:
            client.flush()
            ray.get([server.close.remote() for server in servers])
    return _whole_window(
        summarize(window, obs.label, "sharded", obs.capacity * shards, shards, True, 1), window, shards
    )


def _reverb(directory: str | None, obs: Obs, shards: Sequence[int], timing: Timing) -> tuple[list[Result], list[str]]:
    worker = launch(["reverb"], directory)["reverb"]
    notes = [describe(worker)]
    if isinstance(worker, Unavailable):
        return [], notes
    results = []
    try:
        for k in shards:
            answer = worker.request(
                "sharded_case",
                shards=k,
                obs={"label": obs.label, "shape": list(obs.shape), "dtype": obs.dtype, "capacity": obs.capacity},
                batch=BATCH,
                timing=asdict(timing),
            )
            window = window_of(answer)
            results.append(
                _whole_window(summarize(window, obs.label, "reverb", obs.capacity * k, k, True, 1), window, k)
            )
    except PeerError as exc:
        notes.append(f"reverb: failed: {exc}")
    finally:
        worker.close()
    return results, notes


def _per(rate: float | None, cores: float | None) -> float | None:
    return None if rate is None or not cores else rate / cores


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _cells(results: Sequence[Result]) -> list[list[str]]:
    cells = []
    for r in results:
        server = r.server_cpu or 0.0
        cells.append(
            [
                r.case.split(" writer")[0],
                r.buffer,
                _num(r.inserts),
                _num(_per(r.inserts, (r.writer_cpu or 0.0) + (server if r.buffer == "reverb" else 0.0))),
                _num(r.steps),
                _num(_per(r.steps, r.learner_cpu)),
                _num(_per(r.steps, (r.learner_cpu or 0.0) + server)),
                f"{r.writer_cpu or 0:.2f}",
                f"{r.learner_cpu or 0:.2f}",
                "" if r.server_cpu is None else f"{r.server_cpu:.2f}",
                "" if r.others is None else f"{r.others:.2f}",
            ]
        )
    return cells


def targets(results: Sequence[Result]) -> list[list[str]]:
    """Per shard count: sharded ÷ local and sharded ÷ Reverb, learner steps per learner CPU-second."""
    cells = []
    for shards in sorted({int(r.case.split()[0]) for r in results}):
        found = {r.buffer: _per(r.steps, r.learner_cpu) for r in results if r.case.startswith(f"{shards} ")}
        mine = found.get("sharded")
        for base, goal in (("local", LEARNER_GOAL), ("reverb", 1.0)):
            theirs = found.get(base)
            if mine is None or not theirs:
                cells.append([str(shards), f"sharded ÷ {base}", "not measured", f">= {goal:g}", ""])
                continue
            ratio = mine / theirs
            met = ratio >= goal if base == "local" else ratio > goal
            cells.append(
                [
                    str(shards),
                    f"sharded ÷ {base}",
                    f"{ratio:,.2f}",
                    f">= {goal:g}" if base == "local" else "> 1",
                    "yes" if met else "no",
                ]
            )
    return cells


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench sharded",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--shards", nargs="+", type=positive_int, default=list(SHARDS), help="shard counts (default 1 2)"
    )
    parser.add_argument(
        "--capacity", type=positive_int, default=20_000, help="transitions per shard (default 20000; --quick 2000)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window of every case (default 3)")
    parser.add_argument(
        "--batches-per-call", type=positive_int, default=32, help="batches each shard call fetches (default 32)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s windows, 3 slices, capacity 2000")
    parser.add_argument(
        "--peers", metavar="DIR", help=f"the peers' venvs (default ${ENV_VAR}): runs Reverb's servers and clients"
    )
    args = parser.parse_args(list(argv))
    if not args.seconds > 0:
        parser.error(f"--seconds: expected a number of seconds > 0, got {args.seconds}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case and print the tables; returns the exit status."""
    import ray

    args = _parse(sys.argv[1:] if argv is None else argv)
    seconds = 1.0 if args.quick else args.seconds
    timing = Timing(seconds, warmup=min(1.0, seconds / 3), slices=3 if args.quick else 10)
    obs = SMALL.resized(2_000 if args.quick else args.capacity)
    # Ray's threads live in this process from the first cluster on: a forked child would inherit them.
    ctx = multiprocessing.get_context("spawn")
    results = []
    for shards in args.shards:
        results.append(_local(ctx, obs, shards, timing))
        results.append(_sharded(ctx, obs, shards, timing, args.batches_per_call))
    directory = peers_directory(args.peers)
    notes = [f"reverb: not run: give --peers DIR (or set {ENV_VAR})"] if directory is None else []
    if directory is not None:
        found, notes = _reverb(directory, obs, args.shards, timing)
        results += found
    results.sort(key=lambda r: (int(r.case.split()[0]), ("local", "sharded", "reverb").index(r.buffer)))
    print_table(
        f"(4,) float32, {obs.capacity:,} per shard, a writer per shard (1 per call), a learner sampling {BATCH} + "
        f"updating; {timing.seconds:g} s windows, medians of {timing.slices} slices; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}; mpreplay {mpreplay.__version__}, ray {ray.__version__}",
        (
            "shards",
            "path",
            "inserts/s",
            "per writer CPU-s",
            "learner steps/s",
            "per learner CPU-s",
            "per learner + servers CPU-s",
            "writers' cores",
            "learner's",
            "servers'",
            "others'",
        ),
        _cells(results),
        left=2,
        group=slice(0, 1),
        width=220,
    )
    for line in notes:
        print(f"  {line}")
    print()
    print_table(
        "Targets (this run): learner steps per learner CPU-second",
        ("shards", "ratio of", "value", "goal", "met"),
        targets(results),
    )
    return 0
