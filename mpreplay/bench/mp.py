"""``mpreplay bench mp``: a shared prioritized buffer under writers and a learner.

Every case runs its processes for the same wall window after a warm-up, on a
buffer filled to capacity beforehand: the learner alone, 1 and 2 writers
alone, and 1 and 2 writers beside a learner, writers adding 1 or 32
transitions per call.  A writer adds prebuilt transitions as fast as it can;
the learner loops ``sample(256)`` + ``update_priorities``.  The cases run for
two observations, each stored with its next_obs: (4,) float32 at capacity
100k and Atari-like (84, 84, 4) uint8 at capacity 20k.

* ``mpreplay`` -- :class:`mpreplay.MPPrioritizedReplayBuffer`;
* ``cpprb`` -- cpprb's MPPrioritizedReplayBuffer, when cpprb is installed;
* ``gather`` -- the memory limit: one process copying the same number of
  random rows with ``np.take`` into a preallocated batch, from arrays in a
  shared-memory segment like the buffer's.

A final sweep runs the learner alone over capacities 1e4, 1e5 and 1e6.

``--atari-scale`` runs instead the case of a user at Atari scale: (84, 84, 4)
uint8 stacks stored compressed (``next_of`` + ``stack_compress``), capacity
1e6 (6.65 GiB), 8 writers adding episodes of consecutive frame stacks (1 or
32 steps per add) beside a learner; reported per CPU second, with the share
of time spent waiting for the lock and the learner's page faults per sample,
beside cpprb's uncompressed buffer at the largest capacity that fits in memory.
Rates are medians over slices of the window; stale updates, lock waits
(mpreplay's ``stats()``) and CPU are totals over the window.  The targets
table compares figures of this same run.  Other work on the machine skews
every figure: the "others' cores" column shows how much there was.

``--peers DIR`` runs every case also for Reverb (its server in a process of
its own) and TorchRL's multi-process buffer, each in its venv
(``python -m mpreplay.bench.peers --setup DIR``), and prints every buffer's
rows per CPU-second of every process of the case (:mod:`mpreplay.bench.mp_peers`).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

import mpreplay
from mpreplay.bench import mp_peers
from mpreplay.bench._report import positive_seconds, print_table
from mpreplay.bench.mp_processes import Result, Timing, gather_limit, run_case
from mpreplay.bench.mp_workloads import (
    ATARI,
    ATARI_SCALE,
    ATARI_SCALE_WRITERS,
    BATCH,
    CPPRB,
    CPPRB_ATARI_CAPACITY,
    MPREPLAY,
    QUICK_CAPACITY,
    QUICK_SWEEP,
    ROWS_PER_ADD,
    SMALL,
    SWEEP,
    Contender,
    Obs,
    fill,
)
from mpreplay.bench.peers import ENV_VAR, peers_directory


def _cases(ctx: Any, contender: Contender, obs: Obs, timing: Timing) -> list[Result]:
    """Every case of one buffer and observation, on one buffer filled first."""
    with contender.make(obs, ctx) as buffer:
        fill(buffer, obs, contender)
        results = [run_case(ctx, buffer, contender, obs, 0, True, BATCH, timing)]
        for rows in ROWS_PER_ADD:
            for writers, learner in ((1, False), (2, False), (1, True), (2, True)):
                results.append(run_case(ctx, buffer, contender, obs, writers, learner, rows, timing))
        return results


def _atari_scale(ctx: Any, contenders: Sequence[Contender], obs: Obs, timing: Timing) -> list[Result]:
    """8 writers (1 and 32 steps per add) beside a learner: mpreplay compressed at ``obs``'s capacity,
    cpprb uncompressed at the largest capacity that fits."""
    results = []
    for contender in contenders:
        shown = obs if contender is MPREPLAY else obs.uncompressed(min(obs.capacity, CPPRB_ATARI_CAPACITY))
        with contender.make(shown, ctx) as buffer:
            if not shown.lanes:
                fill(buffer, shown, contender)
            for rows in ROWS_PER_ADD:
                results.append(
                    run_case(
                        ctx,
                        buffer,
                        contender,
                        shown,
                        ATARI_SCALE_WRITERS,
                        True,
                        rows,
                        timing,
                        reuse=contender is MPREPLAY,
                    )
                )
    return results


def _sweep(ctx: Any, capacities: Sequence[int], timing: Timing) -> list[Result]:
    results = []
    for capacity in capacities:
        obs = SMALL.resized(capacity)
        with MPREPLAY.make(obs, ctx) as buffer:
            fill(buffer, obs, MPREPLAY)
            results.append(run_case(ctx, buffer, MPREPLAY, obs, 0, True, BATCH, timing))
        results.append(gather_limit(obs, timing))
    return results


# -- targets --------------------------------------------------------------------
@dataclass
class _Target:
    target: str
    case: str
    ratio: float | None
    goal: float
    per_cpu: float | None = None  # the same ratio of rows per CPU second of the processes doing them


def _inserts_per_cpu(r: Result | None) -> float | None:
    return None if r is None or not r.writer_cpu or r.inserts is None else r.inserts / r.writer_cpu


def _sampled_per_cpu(r: Result | None) -> float | None:
    return None if r is None or not r.learner_cpu or r.sampled is None else r.sampled / r.learner_cpu


def _find(results: Sequence[Result], **match: Any) -> Result | None:
    for r in results:
        if all(getattr(r, key) == value for key, value in match.items()):
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _compare_inserts(target: str, case: str, a: Result, b: Result | None, goal: float) -> _Target:
    return _Target(
        target,
        case,
        _ratio(a.inserts, None if b is None else b.inserts),
        goal,
        _ratio(_inserts_per_cpu(a), _inserts_per_cpu(b)),
    )


def _compare_samples(target: str, case: str, a: Result, b: Result | None, goal: float) -> _Target:
    return _Target(
        target,
        case,
        _ratio(a.sampled, None if b is None else b.sampled),
        goal,
        _ratio(_sampled_per_cpu(a), _sampled_per_cpu(b)),
    )


def _targets(results: Sequence[Result], sweep: Sequence[Result]) -> list[_Target]:
    out = []
    alone = {r.obs: r for r in results if r.buffer == "mpreplay" and r.case == "learner"}
    for r in results:
        if r.buffer != "mpreplay" or "writer" not in r.case or "learner" not in r.case:
            continue
        solo = _find(
            results, buffer="mpreplay", obs=r.obs, rows_per_add=r.rows_per_add, case=r.case.replace(" + learner", "")
        )
        where = f"{r.obs}, {r.rows_per_add}/add, {r.case}"
        out.append(_compare_inserts("(a) inserts beside learner / alone", where, r, solo, 0.5))
        out.append(_compare_samples("(a) samples beside writers / alone", where, r, alone[r.obs], 0.5))
    for r in results:
        if r.buffer != "mpreplay" or r.obs != SMALL.label or "learner" not in r.case:
            continue
        theirs = _find(results, buffer="cpprb", obs=r.obs, case=r.case, rows_per_add=r.rows_per_add)
        where = f"{r.obs}, {r.case}" + (f", {r.rows_per_add}/add" if r.rows_per_add else "")
        out.append(_compare_samples("(b) sampled rows/s / cpprb", where, r, theirs, 3.0))
        if r.rows_per_add:
            out.append(_compare_inserts("(b) inserts/s / cpprb", where, r, theirs, 10.0))
    limit = _find(results, buffer="gather", obs=ATARI.label)
    if ATARI.label in alone and limit is not None:
        out.append(
            _compare_samples(
                "(c) learner / gather limit", f"{ATARI.label}, learner alone", alone[ATARI.label], limit, 0.9
            )
        )
    learners = [r for r in sweep if r.buffer == "mpreplay"]
    limits = [r for r in sweep if r.buffer == "gather"]
    for learner, gather in list(zip(learners, limits, strict=False))[1:]:
        where = f"capacity {learner.capacity:,} vs {learners[0].capacity:,}"
        out.append(_compare_samples("(d) learner sampled rows/s", where, learner, learners[0], 0.9))
        out.append(_compare_samples("(d) for scale: gather limit", where, gather, limits[0], 0.9))
    return out


# -- output -----------------------------------------------------------------------
_COLUMNS = (
    "obs",
    "buffer",
    "capacity",
    "processes",
    "rows/add",
    "inserts/s",
    "sampled rows/s",
    "updates/s",
    "stale dropped",
    "lock wait",
    "CPU cores",
    "page faults/s",
    "others' cores",
)
_TARGET_COLUMNS = ("target", "case", "ratio", "goal", "met", "ratio per CPU s")
_LEGEND = (
    "updates/s: priority updates applied (stale ones are dropped); lock wait: share of window x processes "
    "spent waiting for the buffer's lock;\nCPU cores: CPU seconds of the case's processes / window; "
    "page faults/s: their minor page faults (memory the kernel maps on first touch); "
    "others' cores: what the rest of the machine used meanwhile (/proc/stat);\n"
    "ratio per CPU s (targets): the same ratio of rows per CPU second of the processes doing them (writers "
    "for inserts, the learner for samples): other work on the machine does not skew it,\nbut neither does "
    "time spent asleep waiting for the lock (see lock wait)."
)


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _cores(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _cells(r: Result) -> list[str]:
    return [
        r.obs,
        r.buffer,
        f"{r.capacity:,}",
        r.case,
        "" if r.rows_per_add is None else str(r.rows_per_add),
        _num(r.inserts),
        _num(r.sampled),
        _num(r.updates),
        _num(r.stale),
        "" if r.lock_wait is None else f"{100 * r.lock_wait:.1f}%",
        _cores(r.cpu),
        _num(r.faults),
        _cores(r.others),
    ]


_ATARI_COLUMNS = (
    "buffer",
    "capacity",
    "rows/add",
    "inserts/s",
    "per writer CPU s",
    "sampled/s",
    "per learner CPU s",
    "lock wait",
    "faults/sample",
    "cores",
    "others",
)


def _atari_cells(r: Result) -> list[str]:
    compressed = ", compressed" if r.buffer == "mpreplay" else ", uncompressed"
    faults = "" if r.learner_faults is None else f"{r.learner_faults:.1f}"
    return [
        r.buffer + compressed,
        f"{r.capacity:,}",
        str(r.rows_per_add),
        _num(r.inserts),
        _num(_inserts_per_cpu(r)),
        _num(r.sampled),
        _num(_sampled_per_cpu(r)),
        "" if r.lock_wait is None else f"{100 * r.lock_wait:.1f}%",
        faults,
        _cores(r.cpu),
        _cores(r.others),
    ]


def _target_cells(t: _Target) -> list[str]:
    per_cpu = "" if t.per_cpu is None else f"{t.per_cpu:.2f}"
    if t.ratio is None:
        return [t.target, t.case, "not measured", f">= {t.goal:g}", "", per_cpu]
    return [t.target, t.case, f"{t.ratio:.2f}", f">= {t.goal:g}", "yes" if t.ratio >= t.goal else "no", per_cpu]


# -- command line ---------------------------------------------------------------
def _mp_table(title: str, columns: Sequence[str], lines: Sequence[list[str]], group: int | None) -> None:
    # Case and buffer read as labels; a rule closes each group of rows agreeing up to column `group`.
    print_table(title, columns, lines, left=2, group=None if group is None else slice(0, group + 1), width=220)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mpreplay bench mp",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds", type=positive_seconds, help="measured window of every case (default 3; --quick: 0.3)"
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default="fork",
        help="how writer and learner processes start (default fork)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: short windows, small capacities, cpprb skipped"
    )
    parser.add_argument(
        "--atari-scale",
        action="store_true",
        help="run only the Atari-scale case: compressed (84, 84, 4) stacks, 8 writers + learner",
    )
    parser.add_argument(
        "--capacity",
        type=float,
        default=ATARI_SCALE.capacity,
        help="capacity of the --atari-scale buffer (default 1e6; --quick: 8000)",
    )
    peers = parser.add_argument_group("peers", "Reverb and TorchRL on every case (mpreplay.bench.mp_peers)")
    peers.add_argument(
        "--peers",
        metavar="DIR",
        help=f"the peers' venvs, made by `python -m mpreplay.bench.peers --setup DIR` (default: ${ENV_VAR})",
    )
    peers.add_argument(
        "--with-cpprb", action="store_true", help="with --quick: run cpprb too (a quick run skips it otherwise)"
    )
    peers.add_argument("--json", metavar="FILE", help="with peers: write every buffer's lines and the targets as JSON")
    peers.add_argument("--plot", metavar="FILE.png", help="with peers: draw rows per CPU-second of every buffer")
    args = parser.parse_args(list(argv))
    if (args.json or args.plot) and peers_directory(args.peers) is None:
        parser.error(f"--json and --plot draw the peers' table: give --peers DIR (or set {ENV_VAR})")
    if args.atari_scale and args.peers:
        parser.error("--atari-scale runs mpreplay and cpprb only; --peers runs the cases of the default run")
    return args


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so the cleanup code runs as it does on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case and print the tables; returns the exit status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    seconds = args.seconds or (0.3 if args.quick else 3.0)
    timing = Timing(seconds, warmup=min(1.0, seconds / 3), slices=3 if args.quick else 10)
    ctx = multiprocessing.get_context(args.start_method)
    contenders = [MPREPLAY]
    if (not args.quick or args.with_cpprb) and importlib.util.find_spec("cpprb") is not None:
        contenders.append(CPPRB)
    directory = None if args.atari_scale else peers_directory(args.peers)
    observations = [SMALL, ATARI]
    if args.quick:
        observations = [o.resized(QUICK_CAPACITY[o.label]) for o in observations]
    results: list[Result] = []
    if args.atari_scale:
        capacity = 8_000 if args.quick else int(args.capacity)
        return _main_atari_scale(ctx, contenders, ATARI_SCALE.resized(capacity), timing, args)
    try:
        with _sigterm_unwinds():
            for obs in observations:
                for contender in contenders:
                    results += _cases(ctx, contender, obs, timing)
                results.append(gather_limit(obs, timing))
            sweep = _sweep(ctx, QUICK_SWEEP if args.quick else SWEEP, timing)
            peers = None if directory is None else mp_peers.run_peers(directory, observations, timing)
    except KeyboardInterrupt:
        print("interrupted: every process was stopped and every segment unlinked", file=sys.stderr)
        return 128 + signal.SIGINT
    _print_setting(timing, args, contenders, 3)
    print(_LEGEND)
    _mp_table(
        f"Shared prioritized buffer: writers add, the learner samples {BATCH} + updates {BATCH}",
        _COLUMNS,
        [_cells(r) for r in results],
        group=0,
    )
    _mp_table("Sample cost vs capacity: learner alone, (4,) float32", _COLUMNS, [_cells(r) for r in sweep], group=2)
    _mp_table(
        "Targets (ratios from this run)", _TARGET_COLUMNS, [_target_cells(t) for t in _targets(results, sweep)], group=0
    )
    if peers is None:
        print(
            f"Reverb and TorchRL not run: give --peers DIR (or set {ENV_VAR}), DIR made by "
            "`python -m mpreplay.bench.peers --setup DIR`."
        )
        return 0
    mp_peers.print_report(results, peers)
    if args.json:
        mp_peers.dump(args.json, results, peers)
    if args.plot:
        mp_peers.plot(results, peers, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _print_setting(timing: Timing, args: argparse.Namespace, contenders: Sequence[Contender], processes: int) -> None:
    versions = [f"mpreplay {mpreplay.__version__}", f"numpy {np.__version__}"]
    if CPPRB in contenders:
        from importlib.metadata import version

        versions.append(f"cpprb {version('cpprb')}")
    else:
        versions.append("cpprb " + ("skipped (--quick)" if args.quick else "not installed"))
    cores = len(os.sched_getaffinity(0))
    crowded = f" ({processes} processes per case oversubscribe them)" if cores < processes else ""
    print(
        f"{timing.seconds:g} s window per case after {timing.warmup:.2g} s warm-up, rates are medians of "
        f"{timing.slices} slices; start method {args.start_method}; {cores} cores{crowded}; {', '.join(versions)}"
    )


def _main_atari_scale(
    ctx: Any, contenders: Sequence[Contender], obs: Obs, timing: Timing, args: argparse.Namespace
) -> int:
    try:
        with _sigterm_unwinds():
            results = _atari_scale(ctx, contenders, obs, timing)
    except KeyboardInterrupt:
        print("interrupted: every process was stopped and every segment unlinked", file=sys.stderr)
        return 128 + signal.SIGINT
    _print_setting(timing, args, contenders, ATARI_SCALE_WRITERS + 1)
    print(
        "Writers add episodes of consecutive frame stacks; the learner samples 256 + updates 256. Per CPU s: rows "
        "per CPU second of the processes doing them;\nlock wait: share of window x processes spent waiting for "
        "the lock; faults/sample: the learner's minor page faults per sample call (mpreplay samples into its "
        "previous batch: out=)."
    )
    _mp_table(
        f"Atari scale: (84, 84, 4) uint8, {ATARI_SCALE_WRITERS} writers + learner",
        _ATARI_COLUMNS,
        [_atari_cells(r) for r in results],
        group=0,
    )
    return 0
