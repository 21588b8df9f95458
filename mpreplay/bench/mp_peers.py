"""``mpreplay bench mp --peers DIR``: every case of ``bench mp`` also for Reverb and TorchRL, each run by a
worker in its own venv (:mod:`mpreplay.bench.peer_mp`), beside mpreplay's and cpprb's lines of the same run.

* **Reverb** -- its server in a process of its own (one prioritized table), writers through
  ``TrajectoryWriter``, the learner through ``TrajectoryDataset`` and ``mutate_priorities``
  (:mod:`mpreplay.bench.reverb_roles`);
* **TorchRL** -- ``TensorDictPrioritizedReplayBuffer(sync=False, shared=True)`` over a memory-mapped
  storage: its prioritized sampler cannot be shared between processes, so the writers write through a
  uniform sampler and the learner, the process that made the buffer, keeps the priority tree
  (:mod:`mpreplay.bench.torchrl_roles`).

A case's figure per CPU-second divides its rows (inserted, or learner steps) by the CPU seconds of
every process of the case -- writers, learner and Reverb's server -- over the window: what the
whole service pays, whatever the machine's other load did to the wall clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from mpreplay.bench._report import print_table
from mpreplay.bench.case_clock import Timing, Trace, Window
from mpreplay.bench.mp_processes import Result, summarize
from mpreplay.bench.mp_workloads import BATCH, ROWS_PER_ADD, Obs
from mpreplay.bench.peers import PeerError, PeerProcess, Unavailable, describe, launch

MP_PEERS = ("reverb", "torchrl")
CASES = ((0, True), (1, False), (2, False), (1, True), (2, True))  # (writers, learner)
GOALS = {"reverb": 50.0, "torchrl": 1.0, "cpprb": 1.0}  # mpreplay per CPU-second ÷ the peer's, at least


@dataclass
class PeerRuns:
    """The peers' lines of ``bench mp``, their versions, and why a peer has none."""

    results: list[Result] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def window_of(answer: dict) -> Window:
    """A worker's answer to ``mp_case`` or ``queue_case`` (:func:`mpreplay.bench.peer_mp.window_json`)."""
    watched = answer["watched"]
    return Window(
        answer["marks"],
        [Trace(r["counts"], r["cpu"], r["faults"]) for r in answer["reports"]],
        (answer["busy"][0], answer["busy"][1]),
        (None if watched[0] is None else tuple(watched[0]), None if watched[1] is None else tuple(watched[1])),
        (None, None),
    )


def case_plan() -> list[tuple[int, bool, int]]:
    """(writers, learner, rows per call) of every case, in ``bench mp``'s order."""
    plan = [(0, True, BATCH)]
    for rows in ROWS_PER_ADD:
        plan += [(writers, learner, rows) for writers, learner in CASES if writers]
    return plan


def _run_peer(worker: PeerProcess, obs: Obs, timing: Timing, runs: PeerRuns) -> None:
    opened = worker.request(
        "mp_open",
        obs={"label": obs.label, "shape": list(obs.shape), "dtype": obs.dtype, "capacity": obs.capacity},
        batch=BATCH,
    )
    runs.notes[worker.name] = opened["note"]
    try:
        for writers, learner, rows in case_plan():
            answer = worker.request("mp_case", writers=writers, learner=learner, rows=rows, timing=asdict(timing))
            runs.results.append(
                summarize(window_of(answer), obs.label, worker.name, obs.capacity, writers, learner, rows)
            )
    finally:
        worker.request("mp_close")


def run_peers(directory: str | None, observations: Sequence[Obs], timing: Timing) -> PeerRuns:
    """Every case of every observation for each of :data:`MP_PEERS` that loads; why not for the others."""
    runs = PeerRuns()
    for name in MP_PEERS:  # one at a time: a worker waiting its turn would hold its library's memory
        worker = launch([name], directory)[name]
        runs.versions.append(describe(worker))
        if isinstance(worker, Unavailable):
            runs.reasons[name] = f"unavailable: {worker.reason}"
            continue
        try:
            for obs in observations:
                _run_peer(worker, obs, timing, runs)
        except PeerError as exc:
            runs.reasons[name] = f"failed: {exc}"
        finally:
            worker.close()
    return runs


# -- output ---------------------------------------------------------------------------------------
def per_cpu(rate: float | None, r: Result) -> float | None:
    """Rows per CPU-second of every process of the case."""
    return None if rate is None or not r.cpu else rate / r.cpu


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _cores(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _lines(results: Sequence[Result], peers: PeerRuns) -> list[Result]:
    """Every contender's line of each case, the cases in ``bench mp``'s order."""
    mine = [r for r in results if r.buffer in ("mpreplay", "cpprb")]
    order = {"mpreplay": 0, "cpprb": 1, "reverb": 2, "torchrl": 3}
    key = {(r.obs, r.case, r.rows_per_add): i for i, r in enumerate(mine + peers.results)}
    return sorted(mine + peers.results, key=lambda r: (key[(r.obs, r.case, r.rows_per_add)], order[r.buffer]))


def table(results: Sequence[Result], peers: PeerRuns) -> list[list[str]]:
    cells = []
    for r in _lines(results, peers):
        cells.append(
            [
                r.obs,
                r.case,
                "" if r.rows_per_add is None else str(r.rows_per_add),
                r.buffer,
                _num(r.inserts),
                _num(per_cpu(r.inserts, r)),
                _num(r.steps),
                _num(per_cpu(r.steps, r)),
                _cores(r.writer_cpu),
                _cores(r.learner_cpu),
                _cores(r.server_cpu),
                _cores(r.others),
            ]
        )
    return cells


_COLUMNS = (
    "obs",
    "case",
    "rows/call",
    "buffer",
    "inserts/s",
    "inserts/CPU-s",
    "learner steps/s",
    "steps/CPU-s",
    "writers' cores",
    "learner's",
    "server's",
    "others' cores",
)


@dataclass
class PeerTarget:
    obs: str
    case: str
    rows: int | None
    measure: str  # "inserts" | "steps"
    mine: float | None  # mpreplay's rows per CPU-second
    ratios: dict[str, float | None]  # peer -> mpreplay's per CPU-second ÷ the peer's


def targets(results: Sequence[Result], peers: PeerRuns) -> list[PeerTarget]:
    """Per case and measure: mpreplay's rows per CPU-second ÷ each peer's, all from this run."""
    lines = _lines(results, peers)
    out = []
    for r in lines:
        if r.buffer != "mpreplay":
            continue
        for measure, rate in (("inserts", "inserts"), ("steps", "steps")):
            mine = per_cpu(getattr(r, rate), r)
            if mine is None:
                continue
            ratios: dict[str, float | None] = {}
            for peer in ("reverb", "torchrl", "cpprb"):
                theirs = next(
                    (
                        per_cpu(getattr(p, rate), p)
                        for p in lines
                        if p.buffer == peer and (p.obs, p.case, p.rows_per_add) == (r.obs, r.case, r.rows_per_add)
                    ),
                    None,
                )
                # A peer whose line shows no rows (writers starved by its learner) is behind by any ratio.
                ratios[peer] = None if theirs is None else float("inf") if theirs == 0 else mine / theirs
            out.append(PeerTarget(r.obs, r.case, r.rows_per_add, measure, mine, ratios))
    return out


def _ratio(x: float | None, goal: float) -> str:
    if x is None:
        return "not measured"
    if x == float("inf"):
        return "peer: 0 rows"
    return f"{x:,.1f}" + ("" if x >= goal else " (missed)")


def target_cells(found: Sequence[PeerTarget]) -> list[list[str]]:
    return [
        [
            t.obs,
            t.case,
            "" if t.rows is None else str(t.rows),
            t.measure,
            _num(t.mine),
            *(_ratio(t.ratios[p], GOALS[p]) for p in ("reverb", "torchrl", "cpprb")),
        ]
        for t in found
    ]


def print_report(results: Sequence[Result], peers: PeerRuns) -> None:
    print_table(
        "Every buffer, every case (rows per CPU-second: of every process of the case, Reverb's server included)",
        _COLUMNS,
        table(results, peers),
        left=4,
        group=slice(0, 3),
        width=220,
    )
    for line in peers.versions:
        print(f"  {line}")
    for name, note in peers.notes.items():
        print(f"  {name}: {note}")
    for name, reason in peers.reasons.items():
        if not reason.startswith("unavailable"):
            print(f"  {name}: {reason}")
    print()
    print_table(
        "Targets (this run): mpreplay's rows per CPU-second ÷ the peer's; goals: Reverb >= 50, TorchRL and cpprb > 1",
        ("obs", "case", "rows/call", "measure", "mpreplay /CPU-s", "÷ Reverb", "÷ TorchRL", "÷ cpprb"),
        target_cells(targets(results, peers)),
        left=4,
        group=slice(0, 3),
        width=220,
    )


def dump(path: str, results: Sequence[Result], peers: PeerRuns) -> None:
    """The table's lines and the targets as JSON (for the docs' table and plot)."""
    with open(path, "w") as f:
        json.dump(
            {
                "lines": [asdict(r) for r in _lines(results, peers)],
                "versions": peers.versions,
                "notes": peers.notes,
                "reasons": peers.reasons,
                "targets": [asdict(t) for t in targets(results, peers)],
            },
            f,
            indent=1,
        )


def plot(results: Sequence[Result], peers: PeerRuns, path: str) -> None:
    """Inserts and learner steps per CPU-second of each buffer, every case of the (4,) observation (log scale)."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    lines = _lines(results, peers)
    cases = []
    for r in lines:
        key = (r.obs, r.case, r.rows_per_add)
        if key not in cases:
            cases.append(key)
    buffers = [b for b in ("mpreplay", "cpprb", "reverb", "torchrl") if any(r.buffer == b for r in lines)]
    fig, axes = plt.subplots(1, 2, figsize=(15, 7))
    for ax, measure in zip(axes, ("inserts", "steps"), strict=True):
        shown = [c for c in cases if any(getattr(r, measure) for r in lines if (r.obs, r.case, r.rows_per_add) == c)]
        width = 0.8 / max(1, len(buffers))
        for i, name in enumerate(buffers):
            values = []
            for c in shown:
                line = next((r for r in lines if r.buffer == name and (r.obs, r.case, r.rows_per_add) == c), None)
                values.append((per_cpu(getattr(line, measure), line) if line is not None else None) or 0.0)
            ax.barh([k + i * width for k in range(len(shown))], values, height=width, label=name)
        ax.set_yticks([k + 0.4 - width / 2 for k in range(len(shown))])
        ax.set_yticklabels(
            [f"{o.rsplit(' ', 1)[0]} {case}" + (f", {rows}/call" if rows else "") for o, case, rows in shown]
        )
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel(("rows inserted" if measure == "inserts" else "learner steps") + " per CPU-second")
        ax.grid(True, axis="x", which="both", alpha=0.3)
    axes[1].legend(loc="lower right")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.suptitle(
        f"bench mp: every process of a case counted (Reverb's server included); learner step = sample {BATCH} + update"
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
