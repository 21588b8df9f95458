"""``mpreplay demo``: the command line, the agents it can run, and the run itself."""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

from ..attach import attach
from ..buffers import MPReplayBuffer
from ..errors import IncompatibleSegmentError
from ..launcher import launch
from ..memory import SharedMemoryError
from ..params import ParameterStore
from .processes import Agent, import_torch
from .report import EPISODE_FIELDS, Episodes, Monitor, live_view, plot, print_summary, summary, watch
from .task import GREEDY_EPSILON, Config, env_title, epsilon

__all__ = ["AGENTS", "load_agent", "main"]

# The agents `--agent` chooses from: the module defining each, and the Agent's name there.  Each is
# imported only when chosen (an agent's module imports what it needs, torch among it).
AGENTS = {"apex": ("mpreplay.demo.apex", "APEX"), "r2d2": ("mpreplay.demo.r2d2", "R2D2")}
# The tasks `--env` chooses from: CartPole plays each agent's own settings; another task has a
# settings class of its own, imported only when chosen (the Atari task imports gymnasium).
ENVS: dict[str, tuple[str, str] | None] = {"cartpole": None, "atari": ("mpreplay.demo.atari", "AtariConfig")}
_ATARI_EXTRA = "mpreplay demo --env atari needs ale-py and opencv-python-headless (the 'atari' extra)"
_EPISODE_LOG_SIZE = 1 << 14  # rows; far more episodes than can end between two reads of the log


def load_agent(name: str) -> Agent:
    """The agent registered as ``name`` in :data:`AGENTS`."""
    module, attribute = AGENTS[name]
    return getattr(importlib.import_module(module), attribute)


def _settings(chosen: Agent, env: str) -> type[Config]:
    """The settings class of ``chosen`` playing ``env``."""
    where = ENVS[env]
    if where is None:
        return chosen.config
    module, attribute = where
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError as exc:
        print(f"{_ATARI_EXTRA}, and gymnasium: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _parse(argv: Sequence[str] | None) -> tuple[Agent, Config]:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--agent", choices=tuple(AGENTS), default="apex")
    first.add_argument("--env", choices=tuple(ENVS), default="cartpole")
    known = first.parse_known_args(argv)[0]
    chosen = load_agent(known.agent)
    if known.env not in chosen.envs:
        first.error(f"--env {known.env}: --agent {known.agent} plays {' or '.join(chosen.envs)}")
    settings = _settings(chosen, known.env)
    d = settings()
    p = argparse.ArgumentParser(
        prog="mpreplay demo", description=chosen.description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--agent",
        choices=tuple(AGENTS),
        default="apex",
        help="apex: Ape-X DQN (feed-forward); r2d2: R2D2 (LSTM, sequence replay) with the velocities "
        "hidden; `--agent r2d2 --help` lists its flags",
    )
    p.add_argument(
        "--env",
        choices=tuple(ENVS),
        default="cartpole",
        help="cartpole: CartPole-v1; atari: an ALE game on pixels, Ape-X only (the 'atari' extra; "
        "`--env atari --help` lists its flags and defaults)",
    )
    p.add_argument("--actors", type=int, default=d.actors, help="actor processes")
    p.add_argument("--seconds", type=float, default=d.seconds, help="stop after this long if not solved")
    p.add_argument("--capacity", type=int, default=d.capacity, help="replay buffer size (transitions or steps)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="learner batch size (transitions or sequences)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="folder for summary.json and learning_curve.png")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=d.gamma, help="discount factor")
    p.add_argument("--nstep", type=int, default=d.nstep, help="steps of reward in a target")
    p.add_argument("--hidden", type=int, default=d.hidden, help="units in each hidden layer (CartPole's networks)")
    p.add_argument("--target-update", type=int, default=d.target_update, help="learner steps between target syncs")
    p.add_argument("--publish-every", type=int, default=d.publish_every, help="learner steps between publishes")
    p.add_argument("--learning-starts", type=int, default=d.learning_starts, help="rows stored before sampling")
    p.add_argument(
        "--samples-per-insert",
        type=float,
        default=d.samples_per_insert,
        help="sampled rows per inserted row, kept by the rate limiter",
    )
    p.add_argument("--alpha", type=float, default=d.alpha, help="priority exponent")
    p.add_argument("--beta", type=float, default=d.beta, help="importance-sampling exponent")
    p.add_argument("--actor-batch", type=int, default=d.actor_batch, help="rows an actor adds at once")
    p.add_argument(
        "--envs-per-actor",
        type=int,
        default=d.envs_per_actor,
        help="sub-environments each actor steps as one vector env",
    )
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient norm limit")
    p.add_argument(
        "--prefetch", type=int, default=d.prefetch, help="batches the learner samples ahead on a thread (0: in turn)"
    )
    p.add_argument("--plain", action="store_true", help="print one line per second instead of a rich table")
    p.add_argument(
        "--table",
        metavar="NAME",
        help="keep the replay in the persistent table NAME: joined if it exists (a run started again after a "
        "crash goes on with its replay), made otherwise; mpreplay rm NAME removes it",
    )
    chosen.arguments(p, d)
    settings.arguments(p, d)
    args = vars(p.parse_args(argv))
    del args["agent"], args["env"]
    for name in (
        "actors",
        "capacity",
        "batch_size",
        "nstep",
        "hidden",
        "target_update",
        "publish_every",
        "learning_starts",
        "actor_batch",
        "envs_per_actor",
        *chosen.positive,
    ):
        if args[name] < 1:
            p.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {args[name]}")
    if args["prefetch"] < 0:
        p.error(f"--prefetch: expected an integer >= 0, got {args['prefetch']}")
    if not args["seconds"] > 0:
        p.error(f"--seconds: expected a positive number, got {args['seconds']}")
    if args["learning_starts"] > args["capacity"]:
        p.error(f"--learning-starts ({args['learning_starts']}) exceeds --capacity ({args['capacity']})")
    try:
        return chosen, settings(**args)
    except ValueError as exc:  # a check across an agent's own settings
        p.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit status (0, or 130 after Ctrl-C)."""
    chosen, config = _parse(argv)
    try:
        import gymnasium  # noqa: F401  (checked here: a child would only fail later)

        import_torch()
    except ImportError as exc:
        print(f"mpreplay demo needs PyTorch and gymnasium (the 'examples' extra): {exc}", file=sys.stderr)
        return 1
    try:
        for module in config.preload:
            if not module.startswith("mpreplay."):  # the libraries the task needs, not its own modules
                importlib.import_module(module)
    except ImportError as exc:
        print(f"{_ATARI_EXTRA}: {exc}", file=sys.stderr)
        return 1
    ladder = config.actors * config.envs_per_actor
    if epsilon(ladder - 1, ladder) > GREEDY_EPSILON:
        print(
            f"note: no sub-environment explores with ε ≤ {GREEDY_EPSILON:g} (that takes 2 or more, over all "
            "actors), so the run cannot be judged solved; it ends at --seconds",
            file=sys.stderr,
        )
    os.makedirs(config.out, exist_ok=True)
    baseline = _random_baseline(config)
    report, episodes = _run(chosen, config)
    if baseline is not None:
        report["random_policy"] = baseline
    with open(os.path.join(config.out, "summary.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(config.out, "episodes.json"), "w") as f:
        json.dump(asdict(episodes), f)
    plot(episodes, report, os.path.join(config.out, "learning_curve.png"))
    print_summary(report, config.plain)
    print(f"wrote {config.out}/summary.json, episodes.json and learning_curve.png")
    return 130 if report["reason"] == "interrupted" else 0


def _random_baseline(config: Config) -> dict[str, Any] | None:
    """``--random-games`` games of a uniformly random policy on the run's task, before the run."""
    games = getattr(config, "random_games", 0)
    if not games:
        return None
    from .atari import mean_and_error, random_returns

    start = time.monotonic()
    returns = random_returns(config, games, seed=config.seed)  # type: ignore[arg-type]
    mean, error = mean_and_error(returns)
    seconds = time.monotonic() - start
    print(f"random policy: {mean:.2f} ± {error:.2f} (standard error) over {games} games, {seconds:.0f} s")
    return {"games": games, "mean_return": round(mean, 3), "standard_error": round(error, 3)}


def _replay(agent: Agent, config: Config) -> Any:
    """The run's replay buffer: the agent's own, or with ``--table NAME`` the persistent table of
    that name -- joined when it exists (with the settings it was made with), made otherwise."""
    if config.table is None:
        return agent.replay(config)
    try:
        replay = attach(config.table, timeout=0)
    except IncompatibleSegmentError:
        raise
    except SharedMemoryError:  # none of that name yet
        replay = agent.replay(config)
        print(f"made the persistent table {config.table!r} (mpreplay rm {config.table} removes it)")
        return replay
    print(f"joined the table {config.table!r}, which holds {replay.get_stored_size():,} rows")
    return replay


def _run(agent: Agent, config: Config) -> tuple[dict[str, Any], Episodes]:
    """Create the shared buffers and the parameter store, run the processes, watch them."""
    import_torch().manual_seed(config.seed)  # the initial weights, published as version 0
    # The processes fork from a server that has imported torch and gymnasium
    # once, instead of importing them each (seconds apiece on a busy machine).
    # The server only imports torch; forking after torch has run is what can deadlock.
    multiprocessing.set_forkserver_preload(["torch", *config.preload, agent.module])
    reason, learner = "interrupted", None
    with ExitStack() as resources:
        replay = resources.enter_context(_replay(agent, config))
        log = resources.enter_context(MPReplayBuffer(_EPISODE_LOG_SIZE, EPISODE_FIELDS))
        params = resources.enter_context(ParameterStore(agent.network(config).state_dict()))
        monitor = Monitor(replay, log, params, time.time(), agent.goal(config))
        done = threading.Event()
        with live_view(config.plain, f"{agent.name} on {env_title(config)}") as show:
            watcher = threading.Thread(target=watch, args=(monitor, show, done), daemon=True)
            watcher.start()
            try:
                result = launch(
                    {"replay": replay, "episodes": log},
                    actors=(agent.actor, config.actors),
                    learner=agent.learner,
                    params=params,
                    args=(config,),
                    start_method="forkserver",
                    timeout=config.seconds,
                    close=False,
                )
                learner = result.value
                reason = "solved" if learner and learner["solved"] else result.reason
            except KeyboardInterrupt:
                pass  # launch has stopped the processes; the summary still gets written
            finally:
                done.set()
                watcher.join()  # before the buffers close under it
            snapshot = monitor.poll()
            show(snapshot)
    return summary(config, agent, snapshot, learner, monitor.episodes, reason), monitor.episodes
