"""``mpreplay bench apex``'s actor beside its floor and its peers: the same recorded steps of 4
Breakout games through each replay library's actor-side path, the CPU time per env step.

The recorded episodes become a script (:mod:`mpreplay.bench.peer_actor`): each game plays
episodes in turn, NextStep autoreset between them, with the Q-values an actor's network would
give (random: no library's time depends on them) and a priority per row.  Each contender runs in
a worker of its own (:mod:`mpreplay.bench.peers`): ``floor``, ``mpreplay`` and ``cpprb`` with this
interpreter, Reverb and TorchRL with their venvs (``--peers DIR``); one that cannot run is
reported unavailable with the reason.  Rounds take turns over the contenders (the machine's drift
weighs on each alike); the first round warms up and is not counted; the figure is the median.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mpreplay.bench import peers
from mpreplay.bench.apex_episodes import Episode
from mpreplay.bench.apex_measures import load_average, print_table
from mpreplay.bench.peer_actor import save_script

CONTENDERS = ("floor", "mpreplay", "cpprb", "reverb", "torchrl")
WHAT = {
    "floor": "numpy copies the step's new bytes into a shared-memory segment: a frame, action, reward, done, priority",
    "mpreplay": "VectorTransitions (3-step fold) + PendingRows (merge, priorities) + VectorWriter.add, a lane a game",
    "cpprb": "NstepBuffer per game + MPPrioritizedReplayBuffer(next_of, stack_compress): an add per episode",
    "reverb": "TrajectoryWriter per game as Acme's NStepTransitionAdder: 3-step items, server in its own process",
    "torchrl": "collector batch [4, 8] + MultiStep(3) + extend into the shared LazyMemmapStorage buffer",
}


@dataclass
class ActorPeers:
    """Median CPU µs per env step of each contender that ran; why the others did not."""

    micros: dict[str, float] = field(default_factory=dict)
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)  # mpreplay's parts, µs per env step
    unavailable: dict[str, str] = field(default_factory=dict)
    env_steps: int = 0
    rounds: int = 0


def script(episodes: Sequence[Episode], games: int, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``steps`` vector steps (after the reset at step 0) of ``games`` games, each playing the
    episodes in turn (game ``g`` takes ``g``, ``g + games``, ...), a reset step between episodes."""
    if not episodes:
        raise ValueError("episodes: expected at least one recorded episode, got none")
    rng = np.random.default_rng(seed)
    lanes = []
    for g in range(games):
        columns: dict[str, list[np.ndarray]] = {k: [] for k in ("frames", "act", "rew", "ended", "terminated")}
        length, turn = 0, g
        while length < steps + 1:
            e = episodes[turn % len(episodes)]
            turn += games
            n = len(e)
            columns["frames"].append(e.frames)  # the reset's frame, then one a step
            columns["act"].append(np.concatenate([[0], e.act]))
            columns["rew"].append(np.concatenate([[0.0], e.rew]).astype(np.float32))
            ended = np.zeros(n + 1, bool)
            ended[-1] = True
            columns["ended"].append(ended)
            columns["terminated"].append(ended & e.terminated)
            length += n + 1
        lane = {k: np.concatenate(v)[: steps + 1] for k, v in columns.items()}
        lane["restart"] = np.concatenate([[True], lane["ended"][:-1]])
        lanes.append(lane)
    out = {k: np.stack([lane[k] for lane in lanes], axis=1) for k in lanes[0]}
    out["act"] = out["act"].astype(np.int64)
    out["q"] = rng.standard_normal((steps + 1, games, 4)).astype(np.float32)
    out["priority"] = rng.uniform(0.1, 2.0, (steps + 1, games)).astype(np.float32)
    return out


def actor_peers(
    episodes: Sequence[Episode], directory: str | None, capacity: int, steps: int, rounds: int, games: int = 4
) -> ActorPeers:
    """Each contender's replay path through the same script, ``rounds`` counted rounds after one of
    warm-up, each into a buffer of ``capacity`` rows; printed as a table."""
    result = ActorPeers(rounds=rounds)
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="mpreplay-apex-script-") as folder:
        save_script(folder, script(episodes, games, steps))
        workers = peers.launch(CONTENDERS, directory)
        try:
            for name, worker in list(workers.items()):
                if isinstance(worker, peers.PeerProcess):
                    try:
                        worker.request("actor_build", script=folder, capacity=capacity)
                    except peers.PeerError as exc:
                        worker.close()
                        workers[name] = peers.Unavailable(name, f"does not run the actor: {exc}")
            for _ in range(rounds + 1):
                for name, worker in list(workers.items()):
                    if not isinstance(worker, peers.PeerProcess):
                        continue
                    try:
                        runs[name].append(worker.request("actor_run"))
                    except peers.PeerError as exc:
                        worker.close()
                        workers[name] = peers.Unavailable(name, f"failed in its actor loop: {exc}")
            versions = {name: peers.describe(w) for name, w in workers.items()}
        finally:
            peers.close_all(workers.values())
    for name, worker in workers.items():
        if isinstance(worker, peers.Unavailable):
            result.unavailable[name] = worker.reason
            continue
        counted = runs[name][1:]
        micros = [1e6 * r["cpu"] / r["env_steps"] for r in counted]
        result.micros[name] = statistics.median(micros)
        result.spread[name] = (min(micros), max(micros))
        result.env_steps = counted[0]["env_steps"]
        if name == "mpreplay":
            for part in counted[0]["parts"]:
                result.parts[part] = statistics.median(1e6 * r["parts"][part] / r["env_steps"] for r in counted)
    _print(result, versions, capacity, games)
    return result


def _print(result: ActorPeers, versions: dict[str, str], capacity: int, games: int) -> None:
    floor, ours = result.micros.get("floor"), result.micros.get("mpreplay")
    rows = []
    for name in CONTENDERS:
        if name in result.unavailable:
            rows.append([name, "unavailable", "", "", ""])
            continue
        us = result.micros[name]
        low, high = result.spread[name]
        rows.append(
            [
                name,
                f"{us:,.1f}",
                f"{low:,.1f}-{high:,.1f}",
                f"{us / floor:,.1f}x" if floor else "",
                f"{us / ours:,.2f}x" if ours else "",
            ]
        )
    print(load_average())
    print_table(
        f"Actor's replay path beside the floor and the peers: {games} Breakout games replayed from the recording, "
        f"{result.env_steps:,} env steps a round, buffers of {capacity:,} rows, medians of {result.rounds} rounds "
        "(CPU time of the actor's thread; stacking frames, env and inference not timed)",
        ["contender", "CPU µs / env step", "range", "÷ floor", "÷ mpreplay"],
        rows,
    )
    for name in CONTENDERS:
        said = f"unavailable: {result.unavailable[name]}" if name in result.unavailable else versions[name]
        print(f"  {name}: {WHAT[name]}; {said}")
    if result.parts:
        print(
            "mpreplay's parts (µs / env step): "
            + ", ".join(f"{part} {us:,.1f}" for part, us in sorted(result.parts.items(), key=lambda kv: -kv[1]))
        )
    print()


def targets(result: ActorPeers) -> list[list[str]]:
    """The issue's targets for the actor's replay path, as rows of ``bench apex``'s targets table."""
    ours = result.micros.get("mpreplay")
    if ours is None:
        return [["actor: replay path (recorded steps)", "unavailable", "<= 25 µs", "no"]]
    rows = [["actor: replay path per env step (recorded steps)", f"{ours:,.1f} µs", "<= 25 µs", _met(ours <= 25.0)]]
    floor = result.micros.get("floor")
    if floor:
        rows.append(
            ["actor: replay path ÷ the floor (same run)", f"{ours / floor:,.1f}x", "<= 10x", _met(ours <= 10 * floor)]
        )
    for name in ("cpprb", "reverb", "torchrl"):
        if name in result.micros:
            ratio = result.micros[name] / ours
            rows.append([f"actor: {name}'s path ÷ mpreplay's", f"{ratio:,.1f}x", ">= 10x", _met(ratio >= 10.0)])
        else:
            rows.append([f"actor: {name}'s path ÷ mpreplay's", "unavailable", ">= 10x", "not measured"])
    return rows


def _met(ok: bool) -> str:
    return "yes" if ok else "no"
