"""A learner and actors started as separate commands, that find each other by the table's name.

Start them in any order, in two shells or from a job script; nothing is passed between them but
the name::

    python examples/replay_by_name.py actor --table demo-replay --steps 2000 &   # waits for the table
    python examples/replay_by_name.py actor --table demo-replay --steps 2000 &
    python examples/replay_by_name.py learner --table demo-replay --updates 200
    python examples/replay_by_name.py watch --table demo-replay                # read-only
    python examples/replay_by_name.py learner --table demo-replay --updates 200 --remove

The learner makes the table if it does not exist (``persist=True``: it outlives the learner), or
joins it if it does -- a learner killed and started again goes on with every row the actors
stored, and actors still running keep adding meanwhile.  Actors wait up to ``--wait`` seconds for
the table, then add transitions of a toy environment (a random walk; no gym needed).  ``watch``
attaches read-only: it samples and reads, and could never change the table.  ``--remove`` makes
the learner remove the table when it is done (as ``mpreplay rm demo-replay`` would).
``mpreplay ls`` lists the table meanwhile; ``mpreplay attach demo-replay`` prints its settings.
"""

from __future__ import annotations

import argparse

import numpy as np

import mpreplay

FIELDS = {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": (4,)}, "done": {}}


def learner(args: argparse.Namespace) -> None:
    try:
        table = mpreplay.MPPrioritizedReplayBuffer(
            args.capacity,
            FIELDS,
            name=args.table,
            persist=True,
            rate_limiter=mpreplay.MinSize(args.batch_size),
        )
        print(f"learner: made table {args.table!r}")
    except mpreplay.SharedMemoryError:  # a table of that name exists: join it
        table = mpreplay.attach(args.table, timeout=0)
        print(f"learner: joined table {args.table!r} holding {table.get_stored_size()} rows")
    rng = np.random.default_rng(args.seed)
    for _ in range(args.updates):
        batch = table.sample(args.batch_size, timeout=args.wait)  # waits for the actors' first rows
        # A real learner trains here; its TD errors become the new priorities.
        td = np.abs(batch["rew"] + 0.99 * batch["next_obs"].sum(axis=1) - batch["obs"].sum(axis=1))
        table.update_priorities(batch["indexes"], td + rng.uniform(0.0, 1e-3, len(td)))
    print(f"learner: {args.updates} updates; the table holds {table.get_stored_size()} rows")
    table.close(unlink=args.remove)  # persistent: only --remove ends it
    if args.remove:
        print(f"learner: removed table {args.table!r}")


def actor(args: argparse.Namespace) -> None:
    table = mpreplay.attach(args.table, timeout=args.wait)  # the learner may start later
    rng = np.random.default_rng(args.seed)
    obs, added = np.zeros(4), 0
    try:
        while added < args.steps:
            act = int(rng.integers(2))
            next_obs = obs + rng.normal(0.0, 0.1, 4) + (0.05 if act else -0.05)
            done = bool(np.abs(next_obs).max() > 1.0)
            table.add(obs=obs, act=act, rew=1.0, next_obs=next_obs, done=float(done), timeout=args.wait)
            added += 1
            obs = np.zeros(4) if done else next_obs
    except mpreplay.TableGone as exc:  # removed under it (mpreplay rm, or a learner's --remove)
        print(f"actor: the table ended after {added} steps: {exc}")
    else:
        print(f"actor: added {added} transitions")
    table.close()


def watch(args: argparse.Namespace) -> None:
    table = mpreplay.attach(args.table, readonly=True, timeout=args.wait)
    rows = table.get_all_transitions()
    stats = table.stats()
    print(
        f"watch: {len(rows['rew'])} rows, {stats['inserts']} inserted and {stats['samples']} sampled in all, "
        f"largest priority {table.get_max_priority():.3g}; consistent: {table.verify()['complete']} complete rows"
    )
    table.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("learner", "actor", "watch"))
    parser.add_argument("--table", default="demo-replay", help="the table's name (default demo-replay)")
    parser.add_argument("--capacity", type=int, default=10_000, help="the table's size, when the learner makes it")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--updates", type=int, default=200, help="learner: batches to sample and update")
    parser.add_argument("--steps", type=int, default=2_000, help="actor: transitions to add")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the table or the limiter")
    parser.add_argument("--remove", action="store_true", help="learner: remove the table at the end")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    {"learner": learner, "actor": actor, "watch": watch}[args.role](args)


if __name__ == "__main__":
    main()
