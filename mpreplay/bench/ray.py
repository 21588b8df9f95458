"""``mpreplay bench ray``: sampled transitions/s of ShardedReplay over Ray vs the same client without Ray.

Each shard is a shared buffer of Atari-like transitions ((84, 84) uint8
``obs`` and ``next_obs``, 14 KB a transition) with random priorities.  A
learner loop samples a batch and sends its priorities back, for a fixed time;
the figure is sampled transitions per second.  Contenders, for 1..3 shards:

* ``local`` -- :class:`~mpreplay.sharded.ShardedReplay` over in-process
  :class:`~mpreplay.sharded.ShardServer` objects: what the learner's machine
  does alone, the baseline;
* ``ray`` -- the same client over shard servers on the nodes of a Ray cluster
  on loopback (one server per node, each attached to its buffer);
* ``ray-tuned`` -- the same with replies sent inside the RPC instead of through
  the object store, and the object store's memory touched up front.

Every figure is the median over repeats; each repeat runs local and Ray
back to back, so slow drift of the machine hits both alike.  All processes
share this machine's cores, whereas on a real cluster the shard servers' work
runs on other machines: so the table also gives the learner process's own
CPU time per sampled transition (Ray's threads in it included), the cost
that stays on the learner's machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench._report import positive_int, print_table
from mpreplay.sharded import ShardedReplay, ShardServer, start_shard_servers
from mpreplay.testing import LoopbackRayCluster

OBS_SHAPE = (84, 84)
ENV: dict[str, dict[str, Any]] = {
    "obs": {"shape": OBS_SHAPE, "dtype": np.uint8},
    "next_obs": {"shape": OBS_SHAPE, "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "done": {"dtype": np.float32},
}
MAX_SHARDS = 3
TARGET = 0.5  # ray / local
_TUNED = {
    "max_direct_call_object_size": 256 << 20,
    "task_rpc_inlined_bytes_limit": 512 << 20,
    "preallocate_plasma_memory": True,
}
_CONFIGS = {"ray": None, "ray-tuned": _TUNED}


def _fill(capacity: int, seed: int) -> mpreplay.MPPrioritizedReplayBuffer:
    buffer = mpreplay.MPPrioritizedReplayBuffer(capacity, ENV, seed=seed)
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (capacity + 1, *OBS_SHAPE), dtype=np.uint8)
    buffer.add(
        obs=frames[:-1],
        next_obs=frames[1:],
        act=rng.integers(0, 18, capacity),
        rew=rng.standard_normal(capacity).astype(np.float32),
        done=np.zeros(capacity, np.float32),
        priorities=rng.random(capacity),
    )
    return buffer


def _run(client: ShardedReplay, batch: int, seconds: float, update: bool) -> tuple[float, float]:
    """A learner loop running for ``seconds``: (sampled transitions per second,
    CPU seconds of this process per sampled transition)."""
    client.sample(batch)  # fills the prefetch pipeline outside the timing
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        out = client.sample(batch)
        if update:
            client.update_priorities(out["indexes"], out["weights"])
        n += 1
    client.flush()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return n * batch / wall, cpu / (n * batch)


_Figures = dict[int, dict[str, tuple[float, float]]]  # shards -> transport -> (rate, CPU s per transition)


def _measure(config: str, buffers: list[Any], args: argparse.Namespace) -> _Figures:
    """Medians per shard count and transport ("local", "ray") under one Ray configuration."""
    options = {"prefetch": args.prefetch, "batches_per_call": args.batches_per_call, "seed": args.seed}
    with LoopbackRayCluster(
        MAX_SHARDS, object_store_mb=args.object_store_mb, system_config=_CONFIGS[config]
    ) as cluster:
        remote = list(start_shard_servers(dict(zip(cluster.node_ids, buffers, strict=False)), num_cpus=0).values())
        local = [ShardServer(b) for b in buffers]
        runs: dict[int, dict[str, list[tuple[float, float]]]] = {k: {"local": [], "ray": []} for k in args.shards}
        for _ in range(args.repeats):
            for k in args.shards:
                for transport, servers in (("local", local), ("ray", remote)):
                    runs[k][transport].append(
                        _run(ShardedReplay(servers[:k], **options), args.batch, args.seconds, not args.no_update)
                    )
        return {
            k: {t: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v)) for t, v in by.items()}
            for k, by in runs.items()
        }


_COLUMNS = [
    "contender",
    "shards",
    "local transitions/s",
    "ray transitions/s",
    "ray ÷ local",
    "learner CPU µs/t local",
    "ray",
    "local ÷ ray",
]


def _row(config: str, shards: int, figures: dict[str, tuple[float, float]]) -> list[str]:
    (local, local_cpu), (remote, remote_cpu) = figures["local"], figures["ray"]
    return [
        config,
        str(shards),
        f"{local:,.0f}",
        f"{remote:,.0f}",
        f"{remote / local:.2f}",
        f"{local_cpu * 1e6:.1f}",
        f"{remote_cpu * 1e6:.1f}",
        f"{local_cpu / remote_cpu:.2f}",
    ]


def _shard_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_SHARDS} shards, got {text!r}")
    return value


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench ray",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shards", nargs="+", type=_shard_count, default=[1, 2, 3], help="shard counts to run")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=sorted(_CONFIGS),
        default=sorted(_CONFIGS),
        help="Ray configurations to run (each starts its own cluster)",
    )
    parser.add_argument("--batch", type=positive_int, default=32, help="transitions per sample (default 32)")
    parser.add_argument("--prefetch", type=int, default=2, help="calls in flight per shard (default 2)")
    parser.add_argument(
        "--batches-per-call", type=positive_int, default=32, help="batches each call fetches (default 32)"
    )
    parser.add_argument("--capacity", type=positive_int, default=4096, help="transitions per shard (default 4096)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one timed run (default 2)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--object-store-mb", type=positive_int, default=256, help="Ray object store per node")
    parser.add_argument("--no-update", action="store_true", help="sample only, send no priorities back")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repeat of 0.5 s, default Ray only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(list(argv))
    if args.quick:
        args.repeats, args.seconds, args.configs = 1, 0.5, ["ray"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table; returns the exit status."""
    import ray

    args = _parse(sys.argv[1:] if argv is None else argv)
    buffers = [_fill(args.capacity, args.seed + i) for i in range(MAX_SHARDS)]
    try:
        rows = []
        for config in args.configs:
            rows += [_row(config, k, figures) for k, figures in _measure(config, buffers, args).items()]
    finally:
        for b in buffers:
            b.close()
    print_table(
        f"sample {args.batch}{'' if args.no_update else ' + update'} per step, (84, 84) uint8 obs "
        f"and next_obs; prefetch {args.prefetch} x {args.batches_per_call} batches per call; "
        f"median of {args.repeats} x {args.seconds:g} s\n"
        f"mpreplay {mpreplay.__version__}, ray {ray.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        _COLUMNS,
        rows,
    )
    print(
        f"target (reported, not asserted): ray >= {TARGET:.0%} of local transitions/s; "
        "'local ÷ ray' CPU > 1 means the learner spends less CPU per transition with Ray"
    )
    return 0
