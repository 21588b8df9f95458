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
from typing import Any, NamedTuple

from ..attach import attach
from ..buffers import MPReplayBuffer
from ..errors import CheckpointError, IncompatibleSegmentError
from ..launcher import launch
from ..memory import SharedMemoryError
from ..params import ParameterStore
from .processes import Agent, import_torch
from .report import EPISODE_FIELDS, Episodes, Monitor, live_view, plot, print_summary, summary, watch
from .resume import (
    Checkpointer,
    FolderInUse,
    Saved,
    hold_folder,
    learner_template,
    read_checkpoint,
    read_state,
    record_segments,
    restored_replay,
    sweep_segments,
)
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
_UNSET = object()  # a flag not given on the command line
# What a resumed run may set anew: its own length, its checkpoints' period and its view (the agent,
# the task and every setting of learning are the checkpoint's).
_RESUMED_MAY_CHANGE = ("seconds", "checkpoint_every", "plain")


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


class _Parsed(NamedTuple):
    agent: Agent
    key: str  # the agent's name in AGENTS
    config: Config
    saved: Saved | None  # the checkpoint a resumed run goes on from


def _parse(argv: Sequence[str] | None) -> _Parsed:
    first = argparse.ArgumentParser(prog="mpreplay demo", add_help=False)
    first.add_argument("--agent", choices=tuple(AGENTS))
    first.add_argument("--env", choices=tuple(ENVS))
    first.add_argument("--resume", metavar="DIR")
    known = first.parse_known_args(argv)[0]
    saved = None if known.resume is None else _saved(first, known.resume)
    chosen_from = {"agent": "apex", "env": "cartpole"} if saved is None else saved.state
    for flag in ("agent", "env"):
        given = getattr(known, flag)
        if given is not None and saved is not None and given != saved.state[flag]:
            first.error(
                f"--{flag} {given}: the run in {known.resume} is --{flag} {saved.state[flag]} "
                f"(a resumed run keeps its settings)"
            )
        setattr(known, flag, given or chosen_from[flag])
    chosen = load_agent(known.agent)
    if known.env not in chosen.envs:
        first.error(f"--env {known.env}: --agent {known.agent} plays {' or '.join(chosen.envs)}")
    settings = _settings(chosen, known.env)
    try:
        d = settings() if saved is None else settings(**saved.state["config"])
    except (TypeError, ValueError) as exc:
        first.error(f"--resume {known.resume}: its settings are not ones this mpreplay runs ({exc})")
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
    p.add_argument(
        "--checkpoint-every",
        type=float,
        metavar="SECONDS",
        default=d.checkpoint_every,
        help="write a checkpoint (replay, networks, optimizer, counters, the curve) into --out's "
        "checkpoints/ this often, and once more at the end",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="go on with the run whose --out is DIR from its latest checkpoint, with its settings "
        "(--seconds: this run's own length; --checkpoint-every and --plain may change too)",
    )
    chosen.arguments(p, d)
    settings.arguments(p, d)
    args = vars(p.parse_args(argv))
    given = vars(p.parse_args(argv, argparse.Namespace(**dict.fromkeys(args, _UNSET))))
    del args["agent"], args["env"], args["resume"]
    if saved is not None:
        _keep_settings(p, known.resume, saved, given)
        args.update(out=known.resume, resumes=saved.state["config"].get("resumes", 0) + 1)
    if args["checkpoint_every"] is not None and not args["checkpoint_every"] > 0:
        p.error(f"--checkpoint-every: expected a positive number of seconds, got {args['checkpoint_every']}")
    if args["checkpoint_every"] is not None and args["table"] is not None:
        p.error(
            "--checkpoint-every: not with --table (the persistent table outlives the run by itself; "
            "a checkpoint restores the replay into a table of its own)"
        )
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
        return _Parsed(chosen, known.agent, settings(**args), saved)
    except ValueError as exc:  # a check across an agent's own settings
        p.error(str(exc))


def _saved(parser: argparse.ArgumentParser, folder: str) -> Saved:
    """The latest checkpoint of the run in ``folder``; the parser's error if there is none to resume."""
    try:
        return read_checkpoint(*read_state(folder))
    except CheckpointError as exc:
        parser.error(f"--resume {folder}: {exc}")


def _keep_settings(p: argparse.ArgumentParser, folder: str, saved: Saved, given: dict[str, Any]) -> None:
    """Refuse a flag that would change a resumed run's settings, naming it."""
    for name, value in given.items():
        if value is _UNSET or name in _RESUMED_MAY_CHANGE or name in ("agent", "env", "resume"):
            continue
        if name == "out":
            if os.path.realpath(value) != os.path.realpath(folder):
                p.error(f"--out {value}: a resumed run writes into the folder it resumes ({folder})")
        elif value != saved.state["config"].get(name):
            p.error(
                f"--{name.replace('_', '-')} {value}: the run in {folder} has {saved.state['config'].get(name)} "
                f"(a resumed run keeps its settings; only {', '.join(_flags(_RESUMED_MAY_CHANGE))} may change)"
            )


def _flags(names: Sequence[str]) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit status (0, or 130 after Ctrl-C)."""
    chosen, key, config, saved = _parse(argv)
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
    with ExitStack() as held:
        if saved is not None or config.checkpoint_every is not None:
            try:
                held.enter_context(hold_folder(config.out))
            except FolderInUse as exc:
                print(f"mpreplay demo: --out {exc}", file=sys.stderr)
                return 1
        baseline = _random_baseline(config) if saved is None else saved.state.get("random_policy")
        try:
            report, episodes = _run(chosen, key, config, saved, baseline)
        except CheckpointError as exc:  # a checkpoint whose replay is damaged: found as it is restored
            print(f"mpreplay demo: --resume {config.out}: {exc}", file=sys.stderr)
            return 1
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


def _run(
    agent: Agent, key: str, config: Config, saved: Saved | None, baseline: dict[str, Any] | None
) -> tuple[dict[str, Any], Episodes]:
    """Create the shared buffers and the parameter store, run the processes, watch them."""
    torch = import_torch()
    torch.manual_seed(config.seed)  # the initial weights, published as version 0
    # The processes fork from a server that has imported torch and gymnasium
    # once, instead of importing them each (seconds apiece on a busy machine).
    # The server only imports torch; forking after torch has run is what can deadlock.
    multiprocessing.set_forkserver_preload(["torch", *config.preload, agent.module])
    reason, learner = "interrupted", None
    restarts: list[dict[str, Any]] = [] if saved is None else list(saved.state["restarts"])
    with ExitStack() as resources:
        if saved is None:
            replay = resources.enter_context(_replay(agent, config))
            weights = agent.network(config).state_dict()
        else:
            for name in sweep_segments(config.out):
                print(f"removed {name}, left in shared memory by the run stopped in {config.out}")
            replay = resources.enter_context(restored_replay(saved))
            weights = {name: torch.from_numpy(value) for name, value in saved.online.items()}
            mark = saved.mark(replay.get_stored_size())
            restarts.append(mark)
            print(f"resumed {saved.folder}: {mark['stored']:,} rows, learner step {mark['learner_steps']:,}")
        log = resources.enter_context(MPReplayBuffer(_EPISODE_LOG_SIZE, EPISODE_FIELDS))
        params = resources.enter_context(ParameterStore(weights))
        shared = {"replay": replay, "episodes": log}
        earlier = {} if saved is None else {"earlier": saved.progress}
        monitor = Monitor(replay, log, params, time.time(), agent.goal(config), **earlier)
        checkpoints = None
        if config.checkpoint_every is not None:
            state = learner_template(agent, config) if saved is None else saved.learner
            shared["learner"] = resources.enter_context(ParameterStore(state))
            extra = {"restarts": restarts, "random_policy": baseline}
            checkpoints = Checkpointer(key, config, replay, shared["learner"], monitor, extra, saved)
        record_segments(config.out, [handle.name for handle in shared.values()] + [params.name])
        done = threading.Event()
        with live_view(config.plain, f"{agent.name} on {env_title(config)}") as show:
            threads = [threading.Thread(target=watch, args=(monitor, show, done), daemon=True)]
            if checkpoints is not None:
                threads.append(threading.Thread(target=checkpoints.every, args=(done,), daemon=True))
            for thread in threads:
                thread.start()
            try:
                result = launch(
                    shared,
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
                for thread in threads:
                    thread.join()  # before the buffers close under them
            if checkpoints is not None:
                checkpoints.write()  # the learner's last state: a finished run can go on too
                if learner is None:  # stopped before it returned: what it last published
                    learner = checkpoints.learner_counters()
            snapshot = monitor.poll()
            show(snapshot)
    report = summary(config, agent, snapshot, learner, monitor.episodes, reason)
    report["restarts"] = restarts
    if checkpoints is not None:
        report["checkpoints"] = {"every_seconds": config.checkpoint_every, "written": len(checkpoints.written)}
        report["checkpoints"].update(
            failed=checkpoints.failed, latest=checkpoints.written[-1] if checkpoints.written else None
        )
    return report, monitor.episodes
