"""``mpreplay bench queue``: the on-policy trajectory queue -- writers push rollouts, one learner takes each once.

A rollout is ``--steps`` steps (default 128) of an (84, 84) uint8 frame plus ``act``, ``rew`` and
``done``, and the writer's id and the rollout's number.  Writer processes push rollouts as fast as
the queue lets them; one learner process takes one rollout a call, for the same window of the
monotonic clock (:mod:`mpreplay.bench.case_clock`), with 1 and 2 writers:

* ``mpreplay`` -- ``MPReplayBuffer(size, env_dict, rate_limiter=Queue(size))``, one item a rollout:
  a writer's ``add`` waits while ``size`` rollouts are unread, the learner's ``sample(1)`` while
  none is;
* ``reverb`` (with ``--peers DIR``) -- Reverb's ``Table.queue(name, size)`` in a server process of its
  own; a writer appends the rollout's steps to a ``TrajectoryWriter``, inserts them as one item and
  waits for the server's confirmation (``end_episode``); the learner reads a ``TrajectoryDataset``
  one rollout at a time (:mod:`mpreplay.bench.reverb_roles`).

Rollouts per second are the learner's, medians over slices of the window; per CPU-second they are
divided by the CPU time of every process (writers, learner, Reverb's server) over the window.  The
learner counts rollouts it was handed twice (the queue's promise is none).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench._report import positive_int, positive_seconds, print_table
from mpreplay.bench.case_clock import Timing, Window, run_window, serve_window, slice_rates
from mpreplay.bench.mp_peers import window_of
from mpreplay.bench.peers import ENV_VAR, PeerError, Unavailable, describe, launch, peers_directory

FRAME = (84, 84)
WRITERS = (1, 2)
GOAL = 10.0  # mpreplay's rollouts per CPU-second ÷ Reverb's, at least
_TIMEOUT = 5.0  # a writer (queue full) or the learner (queue empty) gives its call up after this long


def env_dict(steps: int) -> dict[str, dict[str, Any]]:
    return {
        "obs": {"shape": (steps, *FRAME), "dtype": np.uint8},
        "act": {"shape": (steps,), "dtype": np.int64},
        "rew": {"shape": (steps,), "dtype": np.float32},
        "done": {"shape": (steps,), "dtype": np.float32},
        "writer": {"dtype": np.int64},
        "number": {"dtype": np.int64},
    }


def _writer(buffer: Any, steps: int, writer_id: int, conn: Connection) -> None:
    def build() -> tuple[Callable[[], None], int]:
        rng = np.random.default_rng(writer_id)
        rollout = {
            "obs": rng.integers(0, 256, (1, steps, *FRAME), dtype=np.uint8),
            "act": rng.integers(0, 6, (1, steps)).astype(np.int64),
            "rew": rng.standard_normal((1, steps)).astype(np.float32),
            "done": np.zeros((1, steps), np.float32),
        }
        numbers = itertools.count()
        add = buffer.add

        def push() -> None:
            with contextlib.suppress(TimeoutError):  # the queue stayed full: the learner has stopped
                add(**rollout, writer=writer_id, number=next(numbers), timeout=_TIMEOUT)

        return push, 1

    serve_window(conn, build)


def _learner(buffer: Any, duplicates: Any, conn: Connection) -> None:
    def build() -> tuple[Callable[[], None], int]:
        taken: set[tuple[int, int]] = set()
        sample = buffer.sample

        def take() -> None:
            try:
                rollout = sample(1, timeout=_TIMEOUT)
            except TimeoutError:  # the queue stayed empty: the writers have stopped
                return
            ident = (int(rollout["writer"][0]), int(rollout["number"][0]))
            if ident in taken:
                duplicates.value += 1
            taken.add(ident)

        return take, 1

    serve_window(conn, build)


def _mpreplay_case(ctx: Any, writers: int, steps: int, size: int, timing: Timing) -> tuple[Window, int]:
    duplicates = ctx.Value("l", 0)
    with mpreplay.MPReplayBuffer(size, env_dict(steps), rate_limiter=mpreplay.Queue(size)) as buffer:
        children: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
            (f"writer {i}", _writer, (buffer, steps, i)) for i in range(writers)
        ]
        children.append(("learner", _learner, (buffer, duplicates)))
        window = run_window(ctx, children, timing)
    return window, int(duplicates.value)


@dataclass
class Line:
    queue: str
    writers: int
    rollouts: float  # the learner's rollouts per second, median over slices
    cpu: float  # cores: CPU seconds of every process of the case / window
    writer_cpu: float
    learner_cpu: float
    server_cpu: float | None
    duplicates: int

    @property
    def per_cpu(self) -> float:
        return self.rollouts / self.cpu if self.cpu else 0.0


def line_of(queue: str, writers: int, window: Window, duplicates: int) -> Line:
    at, reports = window.marks, window.reports
    span = at[-1] - at[0]
    server = None
    first, last = window.watched
    if first is not None and last is not None:
        server = (last[0] - first[0]) / span
    writer_cpu = sum(r.cpu for r in reports[:writers]) / span
    learner_cpu = reports[-1].cpu / span
    return Line(
        queue,
        writers,
        float(np.median(slice_rates(reports[-1].counts, at, 1))),
        writer_cpu + learner_cpu + (server or 0.0),
        writer_cpu,
        learner_cpu,
        server,
        duplicates,
    )


def _cells(lines: Sequence[Line]) -> list[list[str]]:
    return [
        [
            line.queue,
            str(line.writers),
            f"{line.rollouts:,.1f}",
            f"{line.per_cpu:,.1f}",
            f"{1e3 / line.per_cpu:,.2f}" if line.per_cpu else "",
            f"{line.writer_cpu:.2f}",
            f"{line.learner_cpu:.2f}",
            "" if line.server_cpu is None else f"{line.server_cpu:.2f}",
            str(line.duplicates),
        ]
        for line in lines
    ]


def _targets(lines: Sequence[Line]) -> list[list[str]]:
    cells = []
    for writers in sorted({line.writers for line in lines}):
        mine = next((x for x in lines if x.queue == "mpreplay" and x.writers == writers), None)
        theirs = next((x for x in lines if x.queue == "reverb" and x.writers == writers), None)
        if mine is None or theirs is None or not theirs.per_cpu:
            cells.append([str(writers), "not measured", f">= {GOAL:g}", ""])
            continue
        ratio = mine.per_cpu / theirs.per_cpu
        cells.append([str(writers), f"{ratio:,.1f}", f">= {GOAL:g}", "yes" if ratio >= GOAL else "no"])
    return cells


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench queue",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds", type=positive_seconds, help="measured window of every case (default 5; --quick: 1)"
    )
    parser.add_argument("--steps", type=positive_int, default=128, help="steps per rollout (default 128)")
    parser.add_argument("--size", type=positive_int, default=8, help="unread rollouts the queue holds (default 8)")
    parser.add_argument(
        "--writers", nargs="+", type=positive_int, default=list(WRITERS), help="writer counts to run (default 1 2)"
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default="fork",
        help="how mpreplay's writer and learner processes start (default fork; Reverb's always spawn)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s windows, 3 slices")
    parser.add_argument(
        "--peers",
        metavar="DIR",
        help=f"the peers' venvs (`python -m mpreplay.bench.peers --setup DIR`; default ${ENV_VAR}): runs Reverb",
    )
    parser.add_argument("--json", metavar="FILE", help="write the lines as JSON")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case and print the table; returns the exit status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    timing = Timing(seconds, warmup=min(1.0, seconds / 3), slices=3 if args.quick else 10)
    ctx = multiprocessing.get_context(args.start_method)
    lines = []
    for writers in args.writers:
        window, duplicates = _mpreplay_case(ctx, writers, args.steps, args.size, timing)
        lines.append(line_of("mpreplay", writers, window, duplicates))
    directory = peers_directory(args.peers)
    versions, reasons = [f"mpreplay {mpreplay.__version__} (numpy {np.__version__})"], []
    if directory is None:
        reasons.append(f"reverb: not run: give --peers DIR (or set {ENV_VAR})")
    else:
        worker = launch(["reverb"], directory)["reverb"]
        versions.append(describe(worker))
        if not isinstance(worker, Unavailable):
            try:
                for writers in args.writers:
                    answer = worker.request(
                        "queue_case",
                        writers=writers,
                        steps=args.steps,
                        frame=list(FRAME),
                        size=args.size,
                        timing=asdict(timing),
                    )
                    lines.append(line_of("reverb", writers, window_of(answer), answer["duplicates"]))
            except PeerError as exc:
                reasons.append(f"reverb: failed: {exc}")
            finally:
                worker.close()
    print_table(
        f"Rollouts of {args.steps} steps ((84, 84) uint8 frame, act, rew, done) through a Queue({args.size}): "
        f"{timing.seconds:g} s windows, medians of {timing.slices} slices; {len(os.sched_getaffinity(0))} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        (
            "queue",
            "writer processes",
            "rollouts/s",
            "rollouts/CPU-s",
            "CPU ms/rollout",
            "writers' cores",
            "learner's",
            "server's",
            "handed twice",
        ),
        _cells(lines),
        width=200,
    )
    for line in versions + reasons:
        print(f"  {line}")
    print()
    print_table(
        "Target (this run): mpreplay's rollouts per CPU-second ÷ Reverb's",
        ("writer processes", "ratio", "goal", "met"),
        _targets(lines),
    )
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"lines": [asdict(x) for x in lines], "versions": versions, "reasons": reasons}, f, indent=1)
    return 0
