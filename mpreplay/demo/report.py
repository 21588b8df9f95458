"""What the parent shows of a run: the episodes read from the log, the live view, the summary and the plot."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..buffers import MPPrioritizedReplayBuffer, MPReplayBuffer
from ..params import ParameterStore
from .processes import Agent
from .task import GREEDY_EPSILON, WINDOW, Config, env_title, recent_mean, running_mean, solve_point

__all__ = [
    "EPISODE_FIELDS",
    "Episodes",
    "Monitor",
    "Progress",
    "live_view",
    "plot",
    "print_summary",
    "summary",
    "watch",
]

EPISODE_FIELDS: dict[str, dict[str, Any]] = {
    "rank": {"dtype": np.int64},
    "episode": {"dtype": np.int64},
    "eps": {"dtype": np.float64},
    "ret": {"dtype": np.float64},
    "steps": {"dtype": np.int64},
    "time": {"dtype": np.float64},
}
_RATE_SPAN = 5.0  # seconds the live rates average over (env steps arrive an episode at a time)


@dataclass
class Episodes:
    """Every finished episode, in the order the log holds them."""

    time: list[float]  # seconds since the run started
    env_steps: list[int]  # env steps of all actors so far
    ret: list[float]
    rank: list[int]
    eps: list[float]

    def arrays(self) -> dict[str, np.ndarray]:
        return {key: np.asarray(values) for key, values in asdict(self).items()}


@dataclass(frozen=True)
class Progress:
    """Where a run stood at a checkpoint, from which a resumed run goes on: its episodes (the
    curve), its running time, env steps and weights published."""

    episodes: Episodes
    elapsed: float
    env_steps: int
    weights_published: int


_NOTHING_YET = Progress(Episodes([], [], [], [], []), 0.0, 0, 0)


class Monitor:
    """Reads the buffers' counters and the episode log; computes rates over the last few seconds.

    A resumed run's monitor goes on from ``earlier``: its curve continues the earlier runs'
    episodes, its clock and counters start where theirs stopped.  ``poll`` and ``progress``
    may be called from two threads.
    """

    def __init__(
        self,
        replay: MPPrioritizedReplayBuffer,
        log: MPReplayBuffer,
        params: ParameterStore,
        start: float,
        goal: float | None,
        earlier: Progress = _NOTHING_YET,
    ):
        self._replay, self._log, self._params, self.goal = replay, log, params, goal
        self.start = start - earlier.elapsed  # the time the curve's clock reads 0
        self.episodes = Episodes(*(list(values) for values in asdict(earlier.episodes).values()))
        self._earlier = earlier
        self._seen: dict[int, int] = {}  # rank -> last episode number read
        self._steps: dict[int, int] = {}  # rank -> env steps at its last episode
        self._lock = threading.Lock()
        stats = replay.stats()  # a restored table's counters go on from the checkpoint's
        first = (start, earlier.env_steps, int(stats["inserts"] or 0), int(stats["samples"] or 0))
        # (time, env steps, inserts, samples) of the recent reads: rates span _RATE_SPAN seconds
        self._history: collections.deque[tuple[float, int, int, int]] = collections.deque([first])

    def _drain(self) -> None:
        rows = self._log.get_all_transitions()
        for rank, episode, eps, ret, steps, when in zip(*(rows[k].tolist() for k in EPISODE_FIELDS), strict=True):
            if episode <= self._seen.get(rank, -1):  # read before: the log keeps its rows
                continue
            self._seen[rank], self._steps[rank] = episode, steps
            self.episodes.time.append(when - self.start)
            self.episodes.env_steps.append(self._env_steps())
            self.episodes.ret.append(ret)
            self.episodes.rank.append(rank)
            self.episodes.eps.append(eps)

    def _env_steps(self) -> int:
        return self._earlier.env_steps + sum(self._steps.values())

    def poll(self) -> dict[str, Any]:
        """A snapshot of the run: totals, recent rates, recent returns."""
        with self._lock:
            return self._poll()

    def progress(self) -> tuple[dict[str, Any], Progress]:
        """A snapshot (:meth:`poll`) and the run's :class:`Progress` at that moment, taken together."""
        with self._lock:
            snapshot = self._poll()
            episodes = Episodes(*(list(values) for values in asdict(self.episodes).values()))
            return snapshot, Progress(episodes, snapshot["elapsed"], snapshot["env_steps"], snapshot["weights_version"])

    def _poll(self) -> dict[str, Any]:
        self._drain()
        stats = self._replay.stats()
        now = time.time()
        env_steps = self._env_steps()
        inserts, samples = stats["inserts"], stats["samples"]
        assert inserts is not None and samples is not None  # counters: only the lock holder's entries are None
        current = (now, env_steps, int(inserts), int(samples))
        while len(self._history) > 1 and now - self._history[1][0] >= _RATE_SPAN:
            self._history.popleft()
        previous = self._history[0]
        self._history.append(current)
        dt = max(now - previous[0], 1e-9)
        rates = [(c - p) / dt for c, p in zip(current[1:], previous[1:], strict=True)]
        episodes = self.episodes.arrays()
        return {
            "elapsed": now - self.start,
            "env_steps": env_steps,
            "env_steps_per_s": rates[0],
            "inserts": stats["inserts"],
            "inserts_per_s": rates[1],
            "samples": stats["samples"],
            "samples_per_s": rates[2],
            "stored": stats["stored"],
            "capacity": self._replay.get_buffer_size(),
            "episodes": len(episodes["ret"]),
            "mean_return_greedy": recent_mean(episodes),
            "mean_return_all": float(episodes["ret"][-WINDOW:].mean()) if len(episodes["ret"]) else -math.inf,
            "stale_updates_dropped": stats["stale_updates_dropped"],
            "torn_rows_resampled": stats["torn_rows_resampled"],
            "weights_version": self._earlier.weights_published + self._params.version,
            "goal": self.goal,
        }


def _number(value: float) -> str:
    return "-" if value == -math.inf else f"{value:.1f}"


def _goal(goal: float | None) -> str:
    return "no goal: ends at --seconds" if goal is None else f"solved at {goal:g}"


def _live_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        ("elapsed", f"{s['elapsed']:.0f} s"),
        ("env steps/s", f"{s['env_steps_per_s']:,.0f}  ({s['env_steps']:,} in {s['episodes']:,} episodes)"),
        ("inserts/s", f"{s['inserts_per_s']:,.0f}"),
        ("samples/s", f"{s['samples_per_s']:,.0f}"),
        ("buffer fill", f"{s['stored']:,} / {s['capacity']:,}"),
        (
            f"return, last {WINDOW} episodes",
            (
                f"{_number(s['mean_return_all'])} (all actors)  "
                f"{_number(s['mean_return_greedy'])} (ε ≤ {GREEDY_EPSILON:g}; {_goal(s['goal'])})"
            ),
        ),
        ("stale updates dropped", f"{s['stale_updates_dropped']:,}"),
        ("weights published", f"{s['weights_version']:,}"),
    ]


def _plain_line(s: Mapping[str, Any]) -> str:
    return " | ".join(f"{name} {value}" for name, value in _live_rows(s))


def _use_rich(plain: bool) -> bool:
    if plain:
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def live_view(plain: bool, title: str) -> Iterator[Any]:
    """A function that shows a snapshot: a rich Live table, or one printed line per call."""
    if not _use_rich(plain):
        yield lambda s: print(_plain_line(s), flush=True)
        return
    from rich.live import Live
    from rich.table import Table

    def table(s: Mapping[str, Any]) -> Table:
        t = Table(title=f"mpreplay demo: {title}", show_header=False)
        for name, value in _live_rows(s):
            t.add_row(name, value)
        return t

    with Live(refresh_per_second=4, transient=False) as live:
        yield lambda s: live.update(table(s))


def watch(monitor: Monitor, show: Any, done: threading.Event) -> None:
    while not done.wait(1.0):
        show(monitor.poll())


def _rounded(value: float) -> float | None:
    return None if value == -math.inf else round(value, 1)


def summary(
    config: Config,
    agent: Agent,
    snapshot: Mapping[str, Any],
    learner: Mapping[str, Any] | None,
    episodes: Episodes,
    reason: str,
) -> dict[str, Any]:
    goal = agent.goal(config)
    solved = None if goal is None else solve_point(episodes.arrays(), goal)
    learner = learner or {}
    return {
        "agent": agent.name,
        "env": env_title(config),
        "solved_at": goal,
        "reason": reason,
        "solved": solved is not None,
        "seconds_to_solve": None if solved is None else round(solved[0], 1),
        "env_steps_to_solve": None if solved is None else solved[1],
        "elapsed_seconds": round(snapshot["elapsed"], 1),
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "mean_return_last_20_greedy": _rounded(snapshot["mean_return_greedy"]),
        "mean_return_last_20_all": _rounded(snapshot["mean_return_all"]),
        "inserts": snapshot["inserts"],
        "samples": snapshot["samples"],
        "learner_steps": learner.get("learner_steps"),
        "priority_updates": learner.get("priority_updates"),
        "weights_published": snapshot["weights_version"],
        "stale_updates_dropped": snapshot["stale_updates_dropped"],
        "torn_rows_resampled": snapshot["torn_rows_resampled"],
        "config": asdict(config),
    }


def print_summary(summary: Mapping[str, Any], plain: bool) -> None:
    rows = [
        (
            key,
            "-"
            if value is None
            else f"{value:,}"
            if isinstance(value, int) and not isinstance(value, bool)
            else str(value),
        )
        for key, value in summary.items()
        if key != "config"
    ]
    if not _use_rich(plain):
        width = max(len(key) for key, _ in rows)
        print("\n".join(f"{key:<{width}}  {value}" for key, value in rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="summary", show_header=False)
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def plot(episodes: Episodes, summary: Mapping[str, Any], path: str) -> None:
    """Returns against wall time and against env steps, with running means and the goal."""
    import matplotlib as mpl

    mpl.use("Agg")
    from matplotlib import pyplot as plt

    ep = episodes.arrays()
    goal, baseline = summary["solved_at"], summary.get("random_policy")
    greedy = ep["eps"] <= GREEDY_EPSILON
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, label in ((axes[0], "time", "wall time (s)"), (axes[1], "env_steps", "env steps")):
        ax.scatter(ep[key], ep["ret"], s=4, alpha=0.3, c=ep["rank"], cmap="viridis", label="episodes (colour: actor)")
        ax.plot(ep[key], running_mean(ep["ret"]), color="C0", linewidth=1, label=f"mean of the last {WINDOW}")
        ax.plot(
            ep[key][greedy],
            running_mean(ep["ret"][greedy]),
            color="C3",
            label=f"mean of the last {WINDOW} with ε ≤ {GREEDY_EPSILON:g}",
        )
        if goal is not None:
            ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"solved ({goal:g})")
        for n, mark in enumerate(summary.get("restarts", [])):
            where = mark["elapsed_seconds" if key == "time" else "env_steps"]
            ax.axvline(where, color="C2", linewidth=1, label="resumed from a checkpoint" if n == 0 else None)
        if baseline is not None:
            ax.axhline(
                baseline["mean_return"],
                color="black",
                linestyle=":",
                linewidth=1,
                label=f"random policy ({baseline['mean_return']:.2f}, {baseline['games']} games)",
            )
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    axes[0].legend(loc="upper left", fontsize=7)
    if summary["solved"]:
        solved = f"solved in {summary['seconds_to_solve']:.0f} s, {summary['env_steps_to_solve']:,} env steps"
    elif goal is None:
        solved = f"{summary['elapsed_seconds']:.0f} s, {summary['env_steps']:,} env steps"
    else:
        solved = "not solved"
    fig.suptitle(f"{summary['agent']} on {summary['env']}, {summary['config']['actors']} actors: {solved}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
