"""Start actor processes and a learner around shared resources, supervise them, clean up.

::

    def actor(ctx):
        env = make_env(seed=ctx.rank)
        while not ctx.stop.is_set():
            ctx.buffer.add(**step(env, ctx.params))

    def learner(ctx):
        for _ in range(10_000):
            batch = ctx.buffer.sample(256)
            ...
            ctx.params.publish(weights)
        return stats

    result = launch(buffer, actors=(actor, 4), learner=learner, params=store)
    result.value  # what learner returned

Every user function is called as ``fn(ctx, *args)`` with a :class:`Context`.
Functions travel with cloudpickle, so lambdas and closures work under every
start method; ``buffer`` and ``params`` travel as pickles too, so they must be
handles that attach on unpickling (the shared buffers and
:class:`mpreplay.params.ParameterStore` are).

The run ends when the learner returns, when ``timeout`` passes, when a process
sets ``ctx.stop``, when there is no learner and every actor has returned, on
SIGINT/SIGTERM, or on a failure.  Then ``stop`` is set, the processes get
``grace`` seconds to return, stragglers are terminated and then killed, and
every process is reaped before :func:`launch` returns or raises.  With
``close=True`` the resources are closed (their segments unlinked) on every one
of those paths.

Failures: an exception in any process is raised in the parent as
:class:`ChildFailed`, with the process's role, rank and formatted traceback.
An actor that dies without an exception (killed by a signal, or a non-zero
exit: the OOM killer, a segfault in an environment's C code) is started again
with the same rank if ``max_restarts`` allows, otherwise it is a failure too.
A Python exception is never retried: it is a bug to see, not a crash to ride out.

Signals: while :func:`launch` runs in the main thread it turns SIGINT and
SIGTERM into a clean shutdown (a second signal skips the grace period); then it
restores the previous handlers and delivers the signal to them, so Ctrl-C
still ends in ``KeyboardInterrupt`` and ``kill`` still ends the program.
Children ignore SIGINT: a Ctrl-C in a terminal reaches the whole process
group, and only the parent should react.  On Linux, children are also killed
if the parent dies without cleaning up (``kill -9``).
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.forkserver
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from multiprocessing import resource_tracker
from typing import Any

import cloudpickle

from . import checks
from .supervision import ChildFailed, Context, Run, RunResult, SignalGuard, StopFlag

__all__ = ["launch", "Context", "RunResult", "ChildFailed", "StopFlag"]


def _actor_functions(actors: Any) -> list[Callable[..., Any]]:
    if actors is None:
        return []
    if callable(actors):
        return [actors]
    if (
        isinstance(actors, tuple)
        and len(actors) == 2
        and callable(actors[0])
        and isinstance(actors[1], int)
        and not isinstance(actors[1], bool)
    ):
        fn, count = actors
        if count < 0:
            raise ValueError(f"actors: the count in (function, count) must be >= 0, got {count}")
        return [fn] * count
    if isinstance(actors, Sequence) and not isinstance(actors, str) and all(callable(fn) for fn in actors):
        return list(actors)
    raise TypeError(f"actors: expected a function, (function, count) or a sequence of functions, got {actors!r}")


def _dumps(obj: Any, what: str) -> bytes:
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:
        raise TypeError(f"{what}: cannot be pickled for the child processes: {exc}") from exc


def _closeables(buffer: Any, params: Any) -> list[Any]:
    if isinstance(buffer, dict):
        resources = list(buffer.values())
    elif isinstance(buffer, (tuple, list)):
        resources = list(buffer)
    else:
        resources = [buffer]
    return [r for r in resources + [params] if callable(getattr(r, "close", None))]


def launch(
    buffer: Any,
    actors: Any = None,
    learner: Callable[..., Any] | None = None,
    *,
    params: Any = None,
    args: tuple = (),
    start_method: str | None = None,
    max_restarts: int = 0,
    timeout: float | None = None,
    grace: float = 5.0,
    close: bool = True,
) -> RunResult:
    """Run actors and a learner around shared resources; return when the run ends.

    Parameters
    ----------
    buffer : picklable
        The shared resource every process gets as ``ctx.buffer`` (a shared
        replay buffer, or a tuple/list/dict of handles).
    actors : function, (function, count), or sequence of functions
        The i-th actor gets rank i.
    learner : function, optional
        When it returns, the run ends; its return value is ``RunResult.value``.
    params : picklable, optional
        A :class:`mpreplay.params.ParameterStore` (or any handle), given as ``ctx.params``.
    args : tuple
        Extra positional arguments: every function is called as ``fn(ctx, *args)``.
    start_method : "spawn", "fork", "forkserver", or None for multiprocessing's default
    max_restarts : int
        How many times each actor rank may be started again after dying
        without an exception (killed by a signal, non-zero exit).
    timeout : float, optional
        Seconds after which the run is stopped (``RunResult.reason == "timeout"``);
        None: no limit, 0: stop at once (the processes started get ``grace``).
    grace : float
        Seconds the processes have to return once ``stop`` is set, before
        they are terminated (SIGTERM) and, a second later, killed (SIGKILL).
    close : bool
        Close ``buffer`` and ``params`` (each element of a tuple/list/dict
        ``buffer``) when the run ends, however it ends.  Arguments are checked
        before anything starts; a call rejected for its arguments closes nothing.

    Raises
    ------
    ChildFailed
        A process raised (its traceback is in the message), or a process died
        and could not be restarted.  All the other processes were stopped.
    KeyboardInterrupt
        On SIGINT, once everything was stopped and closed (given Python's
        default SIGINT handler; SIGTERM's default handler ends the process).
    """
    actor_functions = _actor_functions(actors)
    if learner is not None and not callable(learner):
        raise TypeError(f"learner: expected a function or None, got {learner!r}")
    if not actor_functions and learner is None:
        raise ValueError("actors, learner: nothing to run; give at least one actor or a learner")
    max_restarts = checks.integer("max_restarts", max_restarts, low=0)
    timeout = checks.seconds("timeout", timeout)
    grace = checks.seconds("grace", grace, allow_none=False)
    if not isinstance(args, tuple):
        raise TypeError(f"args: expected a tuple, got {type(args).__name__}")
    try:
        mp_context = multiprocessing.get_context(start_method)
    except ValueError:
        raise ValueError(
            f"start_method: expected one of {multiprocessing.get_all_start_methods()} or None, got {start_method!r}"
        ) from None
    pickled: dict[int, bytes] = {}  # each distinct function once
    for fn in actor_functions:
        pickled.setdefault(id(fn), _dumps(fn, "actors"))
    actor_payloads = [pickled[id(fn)] for fn in actor_functions]
    learner_payload = None if learner is None else _dumps(learner, "learner")
    shared = _dumps((buffer, params, args), "buffer, params, args")

    deadline = math.inf if timeout is None else time.monotonic() + timeout
    if mp_context.get_start_method() != "fork":
        # Start the helper processes before any signals_blocked: the resource
        # tracker's start unblocks SIGINT/SIGTERM, and a forkserver would keep
        # the blocked mask for every child it forks, ours or not.
        resource_tracker.ensure_running()
        if mp_context.get_start_method() == "forkserver":
            multiprocessing.forkserver.ensure_running()
    with ExitStack() as stack:  # unwinds in reverse: stop the children, close, restore signals
        signals = stack.enter_context(SignalGuard())
        if close:
            for resource in _closeables(buffer, params):
                stack.callback(resource.close)
        run = Run(mp_context, actor_payloads, learner_payload, shared, max_restarts, grace, signals)
        stack.callback(run.shutdown)
        for rank in range(len(actor_payloads)):
            run.start("actor", rank)
        if learner_payload is not None:
            run.start("learner", 0)
        reason = run.supervise(deadline)
    if run.error is not None:
        raise run.error
    return RunResult(run.value, reason, dict(run.restarts))
