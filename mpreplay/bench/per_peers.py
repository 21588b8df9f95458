"""The peers' tables of ``mpreplay bench per --peers DIR``: every library in a worker process of its own.

* **The loop at capacity** -- each buffer filled to its capacity (untimed, the library's own bulk
  way, random priorities), then the loop of :mod:`mpreplay.bench.per` (add 1, sample 32, perturb,
  update 32) for ``frames`` frames a round: mpreplay, the floor, cpprb, Tianshou, TorchRL,
  flashbax and a numba sum tree in turn, the order rotating each round; µs per frame are medians over rounds of each
  worker's CPU time (every thread of its process) divided by the frames.
* **Sampling throughput** -- 256 transitions of (84, 84, 4) uint8 ``obs`` and ``next_obs`` from a
  full prioritized buffer, each library in its layout that stores each frame once where it has
  one, and as plain rows; rows per CPU-second and per second, medians over rounds.

What each peer is (see :mod:`mpreplay.bench.peer_worker` and :mod:`mpreplay.bench.peer_frames`):
Tianshou's ``PrioritizedReplayBuffer``; TorchRL's ``PrioritizedReplayBuffer`` over a
``LazyTensorStorage``; flashbax's prioritised buffer on JAX's CPU backend, its state a Python
variable between jitted calls (``add``, ``set_priorities`` with the state donated, and ``sample``
with the weights' computation); cpprb's ``PrioritizedReplayBuffer``; ``numba`` -- a sum tree and a
min tree over numpy arrays, every loop over them one ``numba.njit`` function
(:mod:`mpreplay.bench.numba_tree`), the third contender of the Cython / numba / numpy comparison the
project started from.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from mpreplay.bench._report import print_table
from mpreplay.bench.peers import PeerError, PeerProcess, Unavailable, close_all, describe, launch

PER_CONTENDERS = ("mpreplay", "floor", "cpprb", "tianshou", "torchrl", "flashbax", "numba")
TPUT_CONTENDERS = (
    ("mpreplay", "compressed"),
    ("mpreplay", "plain"),
    ("floor", "plain"),
    ("cpprb", "compressed"),
    ("cpprb", "plain"),
    ("tianshou", "compressed"),
    ("tianshou", "plain"),
    ("torchrl", "plain"),
    ("flashbax", "plain"),
)
PEERS = ("cpprb", "tianshou", "torchrl", "flashbax", "numba")
MIN_CPU = 0.5  # CPU seconds of each contender's round in the loop at capacity


@dataclass
class Measured:
    """One table's figures: per row, per contender, the median (or why there is none)."""

    rows: list[dict] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # contender -> why it has no figures


def _rounds(live: dict[str, tuple[PeerProcess, dict]], rounds: int, measured: Measured) -> dict[str, list[dict]]:
    """Run every live contender's command once a round, the order rotating; a failure drops it."""
    runs: dict[str, list[dict]] = {name: [] for name in live}
    order = list(live)
    for r in range(rounds):
        shift = r % max(1, len(order))
        for name in order[shift:] + order[:shift]:
            if name not in live:
                continue
            worker, command = live[name]
            try:
                runs[name].append(worker.request(**command))
            except PeerError as exc:
                measured.reasons[name] = f"failed: {exc}"
                del live[name]
    return {name: r for name, r in runs.items() if name in live}


def loop_at_capacity(
    directory: str | None, sizes: Sequence[int], frames: int, rounds: int, seed: int, min_cpu: float = MIN_CPU
) -> Measured:
    """The loop at each capacity, every contender in the same run: each round, each contender runs
    ``frames`` frames at a time until they took ``min_cpu`` CPU seconds."""
    measured = Measured()
    workers = launch(PER_CONTENDERS, directory)
    try:
        measured.versions = [describe(w) for w in workers.values()]
        for capacity in sizes:
            live = {}
            for name, worker in workers.items():
                if isinstance(worker, Unavailable):
                    measured.reasons[name] = f"unavailable: {worker.reason}"
                    continue
                try:
                    worker.request("per_build", capacity=capacity, seed=seed)
                except PeerError as exc:
                    measured.reasons[name] = f"failed at capacity {capacity:,}: {exc}"
                    continue
                live[name] = (worker, {"cmd": "per_run", "frames": frames, "min_cpu": min_cpu})
            runs = _rounds(live, rounds, measured)
            measured.rows.append(
                {
                    "capacity": capacity,
                    "rounds": rounds,
                    "us": {
                        name: statistics.median(r["cpu"] / r["frames"] for r in rs) * 1e6 for name, rs in runs.items()
                    },
                    "frames": {name: int(statistics.median(r["frames"] for r in rs)) for name, rs in runs.items()},
                }
            )
    finally:
        close_all(workers.values())
    return measured


def throughput(directory: str | None, capacity: int, calls: int, rounds: int, seed: int) -> Measured:
    """sample(256) of Atari transitions from every contender's full buffer, in the same run."""
    measured = Measured()
    workers: list[PeerProcess | Unavailable] = []
    live, notes = {}, {}
    try:
        for name, layout in TPUT_CONTENDERS:
            label = f"{name} {layout}"
            worker = launch([name], directory)[name]
            workers.append(worker)
            if isinstance(worker, Unavailable):
                measured.reasons[label] = f"unavailable: {worker.reason}"
                continue
            if not any(v.startswith((name + " ", name + ":")) for v in measured.versions):
                measured.versions.append(describe(worker))
            try:
                built = worker.request("tput_build", capacity=capacity, layout=layout, seed=seed)
            except PeerError as exc:
                measured.reasons[label] = f"failed: {exc}"
                continue
            for variant in built["variants"]:
                contender = label + (", out=" if variant == "out" else "")
                live[contender] = (worker, {"cmd": "tput_run", "calls": calls, "variant": variant})
                notes[contender] = built["note"]
        for contender, rs in _rounds(live, rounds, measured).items():
            measured.rows.append(
                {
                    "contender": contender,
                    "note": notes[contender],
                    "rows": rs[0]["rows"] // calls,
                    "cpu_ms": statistics.median(r["cpu"] for r in rs) / calls * 1e3,
                    "wall_ms": statistics.median(r["wall"] for r in rs) / calls * 1e3,
                }
            )
    finally:
        close_all(workers)
    return measured


# -- output -------------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None else f"{a / b:.2f}"


def print_loop(measured: Measured) -> None:
    cells = []
    for row in measured.rows:
        us = row["us"]
        for name in PER_CONTENDERS:
            if name in us:
                cells.append(
                    [
                        name,
                        f"{row['capacity']:,}",
                        f"{row['frames'][name]:,} x {row['rounds']}",
                        f"{us[name]:.2f}",
                        _ratio(us[name], us.get("floor")),
                        _ratio(us[name], us.get("mpreplay")),
                    ]
                )
    print_table(
        "The loop at capacity (add 1, sample 32, perturb, update 32; each buffer full): median CPU µs a frame "
        f"of each worker process, rounds of >= {MIN_CPU:g} CPU s",
        ["buffer", "capacity", "frames x rounds", "µs/frame", "÷ floor", "÷ mpreplay"],
        cells,
        group=slice(1, 2),
    )
    _print_footer(measured)


def print_throughput(measured: Measured, capacity: int) -> None:
    base = {r["contender"]: r["cpu_ms"] for r in measured.rows}
    cells, layouts = [], {}
    for row in measured.rows:
        ms = row["cpu_ms"]
        cells.append(
            [
                row["contender"],
                f"{ms:.2f}",
                f"{row['rows'] / ms * 1e3:,.0f}",
                f"{row['rows'] / row['wall_ms'] * 1e3:,.0f}",
                _ratio(ms, base.get("mpreplay compressed")),
                _ratio(ms, base.get("mpreplay plain")),
            ]
        )
        layouts[row["contender"].split(",")[0]] = row["note"]
    print_table(
        f"Sampling 256 transitions, obs and next_obs (84, 84, 4) uint8, from a full buffer of {capacity:,}: "
        "median CPU ms a call of each worker process (out=: into the previous batch; else new arrays)",
        ["buffer", "CPU ms / sample", "rows / CPU s", "rows / s", "÷ mpreplay compressed", "÷ mpreplay plain"],
        cells,
    )
    for name, note in layouts.items():
        print(f"  {name}: {note}")
    _print_footer(measured)


def _print_footer(measured: Measured) -> None:
    for line in measured.versions:
        print(f"  {line}")
    for name, reason in measured.reasons.items():
        if not any(line.startswith(f"{name}: unavailable") for line in measured.versions):
            print(f"  {name}: {reason}")
    print()


def targets(loop: Measured | None, tput: Measured | None) -> None:
    """One line per row of each table: the closest peer against mpreplay; met when mpreplay is
    ahead of every peer measured.  Samples are compared layout with layout: a peer storing each
    frame once against mpreplay compressed, a peer storing stacks whole against mpreplay plain."""
    cells = []
    for row in loop.rows if loop else []:
        us = row["us"]
        if "mpreplay" in us:
            ratios = {p: us[p] / us["mpreplay"] for p in PEERS if p in us}
            cells.append([f"loop at {row['capacity']:,}", *_judge(ratios)])
    if tput:
        ms = {r["contender"]: r["cpu_ms"] for r in tput.rows}
        for layout in ("compressed", "plain"):
            mine = ms.get(f"mpreplay {layout}")
            peers = {
                f"{name} {lay}": ms[f"{name} {lay}"] / mine
                for name, lay in TPUT_CONTENDERS
                if mine and name in PEERS and lay == layout and f"{name} {lay}" in ms
            }
            cells.append([f"sample(256), {layout}", *_judge(peers)])
    print_table(
        "Targets (this run): mpreplay ahead of every peer (the peer's CPU time ÷ mpreplay's > 1)",
        ["row", "closest peer", "÷ mpreplay", "met", "every peer ÷ mpreplay"],
        cells,
    )


def _judge(ratios: dict[str, float]) -> list[str]:
    if not ratios:
        return ["no peer measured", "", "not judged", ""]
    closest = min(ratios, key=ratios.__getitem__)  # every key is present; get() would type as Optional
    return [
        closest,
        f"{ratios[closest]:.2f}",
        "yes" if ratios[closest] > 1 else "no",
        ", ".join(f"{p.split()[0]} {r:.1f}" for p, r in ratios.items()),
    ]


def plot(loop: Measured, path: str) -> None:
    """µs per frame against capacity, one line per contender (log-log)."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    labels = {line.split(" (")[0].split()[0]: line.split(" (")[0] for line in loop.versions}
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in PER_CONTENDERS:
        points = [(r["capacity"], r["us"][name]) for r in loop.rows if name in r["us"]]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=labels.get(name, name))
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="capacity (buffer full)",
        ylabel="median CPU µs per frame",
        title="add 1, sample 32, perturb, update 32 per frame",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def dump(path: str, **tables: Measured | None) -> None:
    with open(path, "w") as f:
        json.dump({name: asdict(t) for name, t in tables.items() if t is not None}, f, indent=1)
