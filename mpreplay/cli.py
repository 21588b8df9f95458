"""Command line: ``mpreplay bench NAME``, ``mpreplay demo``, ``mpreplay inspect FILE``."""
from __future__ import annotations

import argparse
import importlib
import sys

_BENCHMARKS = {
    "memory": "bytes per transition with next_of / stack_compress vs one frame per step; cost of rebuilding stacks",
    "learner": "a learner step (sample 256 Atari stacks, 5 ms of training) with and without prefetched batches",
    "io": "save_transitions/load_transitions of 100k Atari-like frames: MB/s and file size vs np.savez/np.load",
    "mp": "shared prioritized buffer: 1-2 writer processes and a learner vs cpprb and the memory gather limit",
    "per": "prioritized replay: add one, sample 32, update 32 per frame vs naive numpy, cpprb and the floor",
    "ray": "sharded replay over a 3-node loopback Ray cluster: sampled transitions/s vs the same client without Ray",
    "returns": "discounted cumulative sums and n-step folding vs lfilter, numba loops and np.cumsum",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="mpreplay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark", add_help=False)
    bench.add_argument("name", choices=sorted(_BENCHMARKS), help="; ".join(f"{k}: {v}" for k, v in _BENCHMARKS.items()))
    inspect_cmd = sub.add_parser("inspect", help="print a saved transitions file's metadata and a per-array summary")
    inspect_cmd.add_argument("file", help="a file written by save_transitions")
    sub.add_parser("demo", help="Ape-X DQN on CartPole with a live view (mpreplay demo --help)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import main as demo

        return demo(rest)
    if args.command == "inspect":
        from .fileformat import inspect as describe

        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            print(describe(args.file))
        except (OSError, ValueError) as exc:
            parser.exit(1, f"mpreplay inspect: {exc}\n")
        return 0
    if args.command == "bench":
        module = importlib.import_module(f"mpreplay.bench.{args.name}")
        return int(module.main(rest) or 0)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
