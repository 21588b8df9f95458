"""``mpreplay bench per``: the classic prioritized-replay loop.

Every frame adds one transition and, once more than 32 are stored, samples
32, perturbs their importance weights by uniform(-0.5, 0.5), clips them to
[0.01, 1] and writes them back as the new priorities.  The same loop runs
against every contender:

* ``mpreplay`` -- :class:`mpreplay.PrioritizedReplayBuffer`;
* ``compat`` -- with ``--api compat``: ``mpreplay.compat.cpprb.PrioritizedReplayBuffer``,
  cpprb's API over the same buffer, fed the same transitions (what it costs over
  the native API);
* ``numpy`` -- the textbook buffer that samples with ``choice(p=...)``,
  O(N) per sample, so it only runs up to a capacity;
* ``cpprb`` -- cpprb's PrioritizedReplayBuffer, when cpprb is installed;
* ``floor`` -- a buffer whose methods only return preallocated arrays: what
  the loop itself costs, the bound no buffer can beat.

Only the loop is timed (buffer construction is not), in CPU seconds of this
process: every contender runs on one thread, so on an idle machine this is
the wall time, and on a busy one it leaves out the time other processes held
the core.  Each figure is the median over repeats, and the repeats interleave
the contenders so slow drift of the machine hits all of them alike.

With ``--peers DIR`` (or ``$MPREPLAY_PEERS``), two more tables compare mpreplay with
Tianshou, TorchRL, flashbax, cpprb and a numba sum tree (the loop only), each in a worker process
of its own, the peers
with the interpreter of the venv ``python -m mpreplay.bench.peers --setup DIR`` makes:
the same loop on full buffers of each capacity, and ``sample(256)`` of Atari
transitions (:mod:`mpreplay.bench.per_peers`).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench import per_peers
from mpreplay.bench._report import positive_int, print_table
from mpreplay.bench.peer_worker import CONTENDERS
from mpreplay.bench.peers import ENV_VAR, peers_directory
from mpreplay.bench.per_loop import ALPHA, BATCH, BETA, EPS, Floor, as_cpprb, env_dict, timed_drive, workload

_DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
_QUICK_SIZES = (1_000, 3_000)
_NAIVE_MAX_CAPACITY = 10_000
_SKIPPED = "skipped (O(N) per sample)"
_PEER_FRAMES, _PEER_ROUNDS = 3_000, 5
_QUICK_PEERS = ((1_000, 3_000), 300, 1, 0.05)  # sizes, frames, rounds, CPU seconds a round
_TPUT = (20_000, 10, 5)  # capacity, calls, rounds
_QUICK_TPUT = (2_000, 2, 1)


def _repeats_for(frames: int) -> int:
    # A run of 2e6 frames takes a minute or more per contender: fewer repeats where runs are long.
    if frames <= 20_000:
        return 5
    if frames <= 200_000:
        return 3
    return 2


# -- contenders ---------------------------------------------------------------
class _NumpyPER:
    """Proportional replay the textbook way: normalise every priority and
    call ``choice(p=...)`` on each sample, O(N) per sample."""

    def __init__(self, size: int, seed: int):
        self._fields = {
            name: np.zeros((size,) + tuple(spec.get("shape", ())), spec["dtype"])
            for name, spec in env_dict(None).items()
        }
        self._weight = np.zeros(size)
        self._size, self._next, self._stored = size, 0, 0
        self._max_priority = 1.0
        self._rng = np.random.default_rng(seed)

    def add(self, **fields: np.ndarray) -> None:
        i = self._next
        for name, value in fields.items():
            self._fields[name][i] = value
        self._weight[i] = (self._max_priority + EPS) ** ALPHA
        self._next = (i + 1) % self._size
        self._stored = min(self._stored + 1, self._size)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        w = self._weight[: self._stored]
        p = w / w.sum()
        idx = self._rng.choice(self._stored, batch_size, p=p)
        out = {name: arr[idx] for name, arr in self._fields.items()}
        out["indexes"] = idx
        out["weights"] = (p[idx] / p.min()) ** -BETA
        return out

    def update_priorities(self, indexes: np.ndarray, priorities: np.ndarray) -> None:
        self._weight[indexes] = (priorities + EPS) ** ALPHA
        self._max_priority = max(self._max_priority, float(priorities.max()))


def _make_compat(size: int, seed: int) -> Any:
    from mpreplay.compat import cpprb

    # cpprb's constructor takes no seed, and neither does its compat layer.
    return cpprb.PrioritizedReplayBuffer(size, env_dict((1,)), alpha=ALPHA, eps=EPS)


def _same(transition: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return transition


@dataclass(frozen=True)
class _Contender:
    """A buffer with cpprb's add/sample/update_priorities, made fresh for each run."""

    name: str
    make: Callable[[int, int], Any]  # (capacity, seed) -> buffer
    convert: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = _same
    max_capacity: int | None = None


def _contenders(api: str = "native") -> list[_Contender]:
    found = [_Contender("mpreplay", CONTENDERS["mpreplay"].make)]
    if api == "compat":
        found.append(_Contender("compat", _make_compat))
    found.append(_Contender("numpy", _NumpyPER, max_capacity=_NAIVE_MAX_CAPACITY))
    if importlib.util.find_spec("cpprb") is not None:
        found.append(_Contender("cpprb", CONTENDERS["cpprb"].make, as_cpprb))
    found.append(_Contender("floor", Floor))
    return found


# -- the loop -----------------------------------------------------------------
def _run_once(
    contender: _Contender,
    capacity: int,
    frames: int,
    seed: int,
    pool: Sequence[dict[str, np.ndarray]],
    noise: Sequence[np.ndarray],
) -> float:
    buffer = contender.make(capacity, seed)
    return timed_drive(buffer, frames, [contender.convert(t) for t in pool], noise)


@dataclass
class _Row:
    capacity: int
    frames: int
    repeats: int
    seconds: dict[str, float | None]  # median per contender; None = skipped


def _measure(contenders: Sequence[_Contender], capacity: int, frames: int, repeats: int, seed: int) -> _Row:
    pool, noise = workload(seed)
    runs: dict[str, list[float]] = {c.name: [] for c in contenders}
    active = [c for c in contenders if c.max_capacity is None or capacity <= c.max_capacity]
    for r in range(repeats):
        # Rotate the order so no contender always runs first (cold caches) or last.
        shift = r % len(active)
        for c in active[shift:] + active[:shift]:
            runs[c.name].append(_run_once(c, capacity, frames, seed + r, pool, noise))
    medians = {name: statistics.median(t) if t else None for name, t in runs.items()}
    return _Row(capacity, frames, repeats, medians)


# -- output -------------------------------------------------------------------
_COLUMNS = ("buffer", "capacity", "frames", "repeats", "median CPU s", "µs/frame", "÷ floor", "÷ mpreplay", "÷ compat")


def _ratio(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None else f"{a / b:.2f}"


def _cells(row: _Row) -> list[list[str]]:
    out = []
    for name, s in row.seconds.items():
        timing = [_SKIPPED, ""] if s is None else [f"{s:.3f}", f"{s / row.frames * 1e6:.2f}"]
        ratios = [_ratio(s, row.seconds.get(base)) for base in ("floor", "mpreplay", "compat")]
        out.append([name, f"{row.capacity:,}", f"{row.frames:,}", str(row.repeats), *timing, *ratios])
    return out


def _plot(rows: Sequence[_Row], path: str) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for name in rows[0].seconds:
        points = sorted((r.frames, r.seconds[name]) for r in rows if r.seconds[name] is not None)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="frames (capacity = frames or frames / 2)",
        ylabel="median CPU seconds",
        title=f"add 1, sample {BATCH}, update {BATCH} per frame",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# -- command line -------------------------------------------------------------
def _capacity(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 10000 or 1e4, got {text!r}") from None
    if not value.is_integer() or value <= BATCH:
        raise argparse.ArgumentTypeError(f"expected an integer capacity > {BATCH}, got {text!r}")
    return int(value)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench per",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=_capacity,
        metavar="CAPACITY",
        help="capacities to run, each with frames = capacity and 2 x capacity "
        f"(default {' '.join(f'{s:.0e}' for s in _DEFAULT_SIZES)})",
    )
    parser.add_argument(
        "--repeats", type=positive_int, help="runs per size, the median is reported (default 5, 3 or 2 by run length)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: capacities {' '.join(f'{s:.0e}' for s in _QUICK_SIZES)}, 1 repeat",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw time vs frames (log-log; needs matplotlib)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the noise and the buffers")
    parser.add_argument(
        "--api",
        choices=("native", "compat"),
        default="native",
        help="compat: also run mpreplay.compat.cpprb's PrioritizedReplayBuffer, cpprb's API "
        "over mpreplay (default: native only)",
    )
    peers = parser.add_argument_group(
        "peers",
        "the same loop at full capacity and sample(256) of Atari transitions, against Tianshou, TorchRL, "
        "flashbax, cpprb and a numba sum tree, each in a worker process (mpreplay.bench.per_peers)",
    )
    peers.add_argument(
        "--peers",
        metavar="DIR",
        help="the peers' venv, made by `python -m mpreplay.bench.peers "
        f"--setup DIR` (default: ${ENV_VAR}); runs the peers' tables",
    )
    peers.add_argument(
        "--peer-sizes",
        nargs="+",
        type=_capacity,
        metavar="CAPACITY",
        help=f"capacities of the loop at capacity (default {' '.join(f'{s:.0e}' for s in _DEFAULT_SIZES)})",
    )
    peers.add_argument(
        "--peer-frames",
        type=positive_int,
        help=f"frames a round, repeated while under {per_peers.MIN_CPU:g} CPU s (default {_PEER_FRAMES:,})",
    )
    peers.add_argument("--peer-rounds", type=positive_int, help=f"rounds, medians reported (default {_PEER_ROUNDS})")
    peers.add_argument(
        "--tput-capacity", type=_capacity, help=f"transitions stored for sample(256) (default {_TPUT[0]:,})"
    )
    peers.add_argument("--tput-calls", type=positive_int, help=f"sample calls a round (default {_TPUT[1]})")
    peers.add_argument(
        "--only-peers", action="store_true", help="skip the table above (frames = capacity, 2 x capacity)"
    )
    peers.add_argument(
        "--peer-tables",
        nargs="+",
        choices=("loop", "tput"),
        default=("loop", "tput"),
        help="which peers' tables to run (default both)",
    )
    peers.add_argument("--plot-peers", metavar="FILE.png", help="draw µs per frame vs capacity, every contender")
    peers.add_argument("--json", metavar="FILE", help="write the peers' tables' figures as JSON")
    args = parser.parse_args(list(argv))
    if args.only_peers and peers_directory(args.peers) is None:
        parser.error(f"--only-peers: give --peers DIR (or set {ENV_VAR})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables; returns the exit status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    if not args.only_peers:
        _ramp(args)
    directory = peers_directory(args.peers)
    if directory is None:
        print(
            f"Peers (Tianshou, TorchRL, flashbax, numba) not run: give --peers DIR (or set {ENV_VAR}), DIR made by "
            "`python -m mpreplay.bench.peers --setup DIR`."
        )
        return 0
    loop = tput = None
    if "loop" in args.peer_tables:
        sizes, frames, rounds, min_cpu = (
            _QUICK_PEERS if args.quick else (_DEFAULT_SIZES, _PEER_FRAMES, _PEER_ROUNDS, per_peers.MIN_CPU)
        )
        loop = per_peers.loop_at_capacity(
            directory,
            args.peer_sizes or sizes,
            args.peer_frames or frames,
            args.peer_rounds or rounds,
            args.seed,
            min_cpu,
        )
        per_peers.print_loop(loop)
    if "tput" in args.peer_tables:
        capacity, calls, rounds = _QUICK_TPUT if args.quick else _TPUT
        capacity, calls = args.tput_capacity or capacity, args.tput_calls or calls
        tput = per_peers.throughput(directory, capacity, calls, args.peer_rounds or rounds, args.seed)
        per_peers.print_throughput(tput, capacity)
    per_peers.targets(loop, tput)
    if args.plot_peers and loop is not None:
        per_peers.plot(loop, args.plot_peers)
        print(f"plot written to {args.plot_peers}")
    if args.json:
        per_peers.dump(args.json, loop=loop, throughput=tput)
    return 0


def _ramp(args: argparse.Namespace) -> None:
    """The table of frames = capacity and 2 x capacity, from empty: mpreplay, numpy, cpprb, floor."""
    sizes = args.sizes or (_QUICK_SIZES if args.quick else _DEFAULT_SIZES)
    contenders = _contenders(args.api)
    rows = []
    for capacity in sizes:
        for frames in (capacity, 2 * capacity):
            repeats = args.repeats or (1 if args.quick else _repeats_for(frames))
            rows.append(_measure(contenders, capacity, frames, repeats, args.seed))
    versions = [f"mpreplay {mpreplay.__version__}", f"numpy {np.__version__}"]
    if any(c.name == "cpprb" for c in contenders):
        from importlib.metadata import version

        versions.append(f"cpprb {version('cpprb')} (its sampler cannot be seeded)")
    else:
        versions.append("cpprb not installed")
    print_table(
        f"add 1, sample {BATCH}, update {BATCH} per frame; median CPU seconds of the timed loop\n"
        + ", ".join(versions),
        _COLUMNS,
        [cells for row in rows for cells in _cells(row)],
        group=slice(1, 3),
    )  # a rule after each size's rows
    if args.plot:
        _plot(rows, args.plot)
        print(f"plot written to {args.plot}")
