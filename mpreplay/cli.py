"""Command line: ``mpreplay bench NAME``, ``demo``, ``inspect FILE``, and ``ls``, ``top``, ``rm``
(the buffers of this machine, seen from outside: :mod:`mpreplay.monitor`), ``attach NAME`` (what
a process joining a table gets), ``verify NAME`` (one buffer checked under its lock:
:func:`mpreplay.consistency.verify_segment`)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ._version import __version__

# What ``mpreplay --help`` says above the commands: plain text (the module docstring is reST for
# the reference).
_DESCRIPTION = (
    "Replay buffers in shared memory: run a benchmark or the demo, read a saved file, and watch, "
    "check or remove the buffers of this machine from outside their processes."
)

if TYPE_CHECKING:
    from rich.table import Table

_BENCHMARKS = {
    "apex": "Ape-X on real Breakout frames: memory at 1e6, an actor's CPU by part, the learner, the lock's hold times",
    "checkpoint": "checkpoint and restore of a table of real Breakout frames vs the disk's sequential write/read "
    "of the same bytes; the waits of a writer and a learner meanwhile; save_transitions beside it",
    "memory": "bytes per transition with next_of / stack_compress vs one frame per step; cost of rebuilding stacks",
    "learner": "a learner step (sample 256 Atari stacks, 5 ms of training) with and without prefetched batches",
    "io": "save_transitions/load_transitions of 100k Atari-like frames: MB/s and file size vs np.savez/np.load",
    "mp": "shared prioritized buffer: 1-2 writer processes and a learner vs cpprb and the memory gather limit "
    "(--peers DIR: also Reverb's server and TorchRL's multi-process buffer)",
    "queue": "on-policy trajectory queue: writers push 128-step rollouts into Queue(size), one learner takes each "
    "once (--peers DIR: against Reverb's Queue table)",
    "per": "prioritized replay: add one, sample 32, update 32 per frame vs naive numpy, cpprb and the floor "
    "(--peers DIR: also Tianshou, TorchRL, flashbax and a numba sum tree, from the venv "
    "`python -m mpreplay.bench.peers --setup DIR` makes)",
    "ray": "sharded replay over a 3-node loopback Ray cluster: sampled transitions/s vs the same client without Ray",
    "sharded": "the learner across machines: mpreplay.sharded over a loopback Ray cluster vs the local buffer "
    "(--peers DIR: and vs Reverb's clients over gRPC), 1 and 2 shards, per CPU-second",
    "seq": "R2D2 sequences (64 x 80 compressed Atari stacks): sampled steps/s vs TorchRL's slice sampler; bytes/step",
    "returns": "discounted cumulative sums and n-step folding vs lfilter, numba loops and np.cumsum",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="mpreplay", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark", add_help=False)
    bench.add_argument("name", choices=sorted(_BENCHMARKS), help="; ".join(f"{k}: {v}" for k, v in _BENCHMARKS.items()))
    inspect_cmd = sub.add_parser(
        "inspect", help="print a saved transitions file's or a checkpoint's metadata and a per-array summary"
    )
    inspect_cmd.add_argument("file", help="a file written by save_transitions, or a folder written by checkpoint")
    sub.add_parser(
        "demo",
        help="Ape-X DQN (default) or R2D2 (--agent r2d2) on CartPole, or Ape-X on Atari (--env atari), "
        "with a live view (mpreplay demo --help)",
        add_help=False,
    )
    ls = sub.add_parser("ls", help="one line per replay buffer segment on this machine")
    ls.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    top = sub.add_parser("top", help="live figures of one buffer, read-only (never takes its lock)")
    top.add_argument("name", nargs="?", help="the segment (default: the newest buffer whose owner is alive)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    top.add_argument("--plain", action="store_true", help="plain text even when rich is installed")
    verify = sub.add_parser(
        "verify",
        help="check one buffer's counts, selector and lanes against its slot "
        "states, under its lock (exit 1 naming each disagreement)",
    )
    verify.add_argument("name", help="the segment")
    verify.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the lock (default 10)")
    attach = sub.add_parser(
        "attach", help="print what a process joining a table gets: its class, lifetime and constructor arguments"
    )
    attach.add_argument("name", help="the table's name (or its segment's, as ls prints it)")
    rm = sub.add_parser("rm", help="unlink segments whose owner is gone (--dead), or the ones named")
    rm.add_argument("names", nargs="*", help="segments (or tables' names) to unlink")
    rm.add_argument(
        "--dead", action="store_true", help="every segment whose owner process is gone, persistent tables aside"
    )
    rm.add_argument("--force", action="store_true", help="also segments whose owner is alive")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import main as demo

        return demo(rest)
    if args.command == "inspect":
        from .checkpoint import describe as describe_checkpoint
        from .fileformat import inspect as describe

        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            print(describe_checkpoint(args.file) if os.path.isdir(args.file) else describe(args.file))
        except (OSError, ValueError) as exc:
            parser.exit(1, f"mpreplay inspect: {exc}\n")
        return 0
    if args.command == "bench":
        try:
            module = importlib.import_module(f"mpreplay.bench.{args.name}")
        except ModuleNotFoundError as exc:
            if (exc.name or "mpreplay").partition(".")[0] == "mpreplay":
                raise
            parser.exit(
                1,
                f"mpreplay bench {args.name} needs the Python package {exc.name!r}, which is not "
                f"installed here (the 'bench' extra brings the libraries it compares against)\n",
            )
        return int(module.main(rest) or 0)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "ls":
        return _ls(args.json)
    if args.command == "top":
        if not args.interval > 0:
            parser.error(f"--interval: expected seconds > 0, got {args.interval}")
        return _top(args.name, args.once, args.interval, args.plain)
    if args.command == "verify":
        if not args.timeout >= 0:
            parser.error(f"--timeout: expected seconds >= 0, got {args.timeout}")
        return _verify(args.name, args.timeout)
    if args.command == "attach":
        return _attach(args.name)
    if args.command == "rm":
        if bool(args.names) == args.dead:
            parser.error("rm: name segments, or give --dead (not both)")
        return _rm(args.names, args.dead, args.force)
    parser.error(f"unknown command {args.command!r}")
    return 2


def _ls(as_json: bool) -> int:
    from .monitor import list_segments, summary

    rows = [row for row in map(summary, list_segments()) if row is not None]
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no mpreplay segment in /dev/shm")
        return 0
    _print_columns(
        ["name", "owner", "lifetime", "size", "kind", "fill", "attached", "writers", "created"],
        [
            [
                r["name"],
                "–" if r["owner_pid"] is None else f"{r['owner_pid']} ({'alive' if r['owner_alive'] else 'gone'})",
                "–" if r["persistent"] is None else ("persistent" if r["persistent"] else "creator's"),
                _mib(r["bytes"]),
                r["kind"],
                "–" if r["capacity"] is None else f"{r['stored']:,} / {r['capacity']:,}",
                "–" if r["attached"] is None else str(r["attached"]),
                "–" if r["writers_alive"] is None else str(r["writers_alive"]),
                "–" if r["created"] is None else f"{datetime.fromtimestamp(r['created']):%Y-%m-%d %H:%M:%S}",
            ]
            for r in rows
        ],
    )
    # Listed all the same, with why: damaged, or made by an mpreplay of another manifest format.
    for r in rows:
        if r["problem"] is not None:
            print(f"{r['name']}: unreadable: {r['problem']}")
    return 0


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _print_columns(header: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> None:
    lines = rows if header is None else [header, *rows]
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(lines[0]))]
    for cells in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())


def _top(name: str | None, once: bool, interval: float, plain: bool) -> int:
    from .monitor import BufferView, frame, list_segments

    if name is None:
        live = [s for s in list_segments() if s.document is not None and s.owner_alive]
        if not live:
            print("mpreplay top: no replay buffer whose owner is alive (mpreplay ls lists them all)", file=sys.stderr)
            return 1
        name = live[-1].name
    try:
        view = BufferView(name)
    except (OSError, ValueError) as exc:
        print(f"mpreplay top: {exc}", file=sys.stderr)
        return 1
    rich = None if plain else _rich()
    with view:
        before = view.read()
        try:
            while True:
                time.sleep(interval)
                after = view.read()
                rows = frame(view, before, after)
                if rich is None:
                    print(f"mpreplay top  {datetime.now():%H:%M:%S}")
                    _print_columns(None, rows)
                    print(flush=True)
                else:
                    rich.print(_rich_table(rows))
                if once:
                    return 0
                before = after
        except KeyboardInterrupt:
            return 0


def _rich():
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def _rich_table(rows: Sequence[tuple[str, str]]) -> Table:
    from rich.table import Table

    table = Table(title=f"mpreplay top  {datetime.now():%H:%M:%S}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for label, value in rows:
        table.add_row(label, value)
    return table


def _verify(name: str, timeout: float) -> int:
    from .consistency import verify_segment
    from .errors import CorruptBufferError

    try:
        report = verify_segment(name, timeout)
    except CorruptBufferError as exc:
        print(f"{name}: inconsistent")
        for problem in exc.problems:
            print(f"  {problem}")
        return 1
    except (OSError, ValueError, RuntimeError) as exc:  # TimeoutError is an OSError
        print(f"mpreplay verify: {exc}", file=sys.stderr)
        return 1
    print(f"{name}: consistent: " + ", ".join(f"{key} {value:,}" for key, value in report.items()))
    return 0


def _attach(name: str) -> int:
    from .memory import segment_name
    from .monitor import BufferView, creator, lifetime

    try:
        with BufferView(segment_name(name)) as view:
            doc = view.document
    except (OSError, ValueError) as exc:
        print(f"mpreplay attach: {exc}", file=sys.stderr)
        return 1
    _print_columns(
        None,
        [
            ["table", f"{view.name}  {doc['class']}, mpreplay {doc['mpreplay_version']}"],
            ["creator", creator(doc)],
            ["lifetime", lifetime(doc)],
            *[[key, json.dumps(value)] for key, value in doc["build"].items()],
        ],
    )
    print(f"join it with mpreplay.attach({name!r}) (readonly=True: sample and read only)")
    return 0


def _rm(names: list[str], dead: bool, force: bool) -> int:
    from .memory import segment_name
    from .monitor import remove_segments

    # A table's name or its segment's: `mpreplay rm learner` removes mpreplay-learner.
    done = remove_segments([segment_name(name) for name in names], dead=dead, force=force)
    freed = sum(r.nbytes for r in done if r.removed)
    for r in done:
        print(f"removed {r.name} ({_mib(r.nbytes)})" if r.removed else f"kept {r.name}: {r.reason}")
    print(f"{sum(r.removed for r in done)} removed, {_mib(freed)} returned")
    return 0 if all(r.removed for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
