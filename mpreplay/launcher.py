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

import ctypes
import math
import multiprocessing
import multiprocessing.forkserver
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing import connection, resource_tracker
from typing import Any, NamedTuple

import cloudpickle

from . import checks
from .memory import guard_termination_signals

__all__ = ["launch", "Context", "RunResult", "ChildFailed", "StopFlag"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL = 0.05  # seconds between checks of the stop flag and signals while waiting on the children
_FLAG_POLL = 0.005  # seconds between checks of StopFlag.wait (it cannot block on a plain byte)
_TERMINATE_WAIT = 1.0  # seconds a terminated (SIGTERM) process has before it is killed
_KILL_WAIT = 1.0  # seconds to reap a killed (SIGKILL) process
_PR_SET_PDEATHSIG = 1


class StopFlag:
    """The run's stop request, shared by every process (Event-like).

    A plain byte of shared memory, read and written without a lock, so a
    process killed while checking it cannot block the others (as it could
    with ``multiprocessing.Event``).
    """

    def __init__(self, mp_context: Any):
        self._flag = mp_context.RawValue(ctypes.c_bool, False)

    def is_set(self) -> bool:
        """Whether the run is ending."""
        return bool(self._flag.value)

    def set(self) -> None:
        """Ask every process to stop: the run ends."""
        self._flag.value = True

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the flag is set or ``timeout`` seconds pass (None: no limit, 0: do not
        wait); return whether it is set."""
        timeout = checks.seconds("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_FLAG_POLL)
        return True


@dataclass(frozen=True)
class Context:
    """What a process started by :func:`launch` is given.

    Attributes
    ----------
    role : "actor" or "learner"
    rank : int
        0 .. num_actors-1 for actors (kept across restarts); 0 for the learner.
    num_actors : int
    buffer : the ``buffer`` given to :func:`launch`, attached in this process
    params : the ``params`` given to :func:`launch` (None if none), attached in this process
    stop : StopFlag
        Set when the run is ending: return soon after ``stop.is_set()``.
        Any process may ``stop.set()`` to end the run.
    restarts : int
        How many times this actor rank was restarted before this start.
    """

    role: str
    rank: int
    num_actors: int
    buffer: Any
    params: Any
    stop: StopFlag
    restarts: int = 0


@dataclass(frozen=True)
class RunResult:
    """How a run ended.

    Attributes
    ----------
    value : what the learner returned (None without a learner, or if it did not return)
    reason : why the run ended: "learner" (it returned), "actors" (no learner,
        all actors returned), "timeout", "stopped" (a process set ``ctx.stop``)
        or "signal" (a SIGINT/SIGTERM whose previous handler returned)
    restarts : actor rank -> how many times it was restarted
    """

    value: Any
    reason: str
    restarts: dict[int, int] = field(default_factory=dict)


class ChildFailed(ChildProcessError):
    """A process started by :func:`launch` raised an exception or died.

    Attributes: ``role``, ``rank``, ``pid``, ``exitcode`` (None if it was
    still running) and ``remote_traceback`` (the formatted traceback, or None
    if it died without an exception).
    """

    def __init__(self, message: str, *, role: str, rank: int, pid: int | None,
                 exitcode: int | None, remote_traceback: str | None):
        super().__init__(message)
        self.role = role
        self.rank = rank
        self.pid = pid
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode} without reporting an exception (anything it printed is on its stderr)"


# ---------------------------------------------------------------- child side

def _detach_signals() -> None:
    """Leave signal handling to the parent (the child starts with SIGINT/SIGTERM blocked)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked child inherits the parent's handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    if sys.platform.startswith("linux"):
        # Die with the parent even if it is killed before it can clean up.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Job(NamedTuple):
    """Who a child is; travels with the Process object."""

    role: str
    rank: int
    num_actors: int
    restarts: int


def _child_main(function: bytes, shared: bytes, job: _Job, stop: StopFlag, conn: connection.Connection) -> None:
    """Entry point of every child: run the user function and send one reply to the parent."""
    _detach_signals()
    failed = False
    try:
        fn = cloudpickle.loads(function)
        buffer, params, args = cloudpickle.loads(shared)
        ctx = Context(job.role, job.rank, job.num_actors, buffer, params, stop, job.restarts)
        value = fn(ctx, *args)
        reply = cloudpickle.dumps(("ok", value if job.role == "learner" else None))
    except Exception as exc:
        failed = True
        # The first frame is this wrapper: start the traceback at the user's code.
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        reply = cloudpickle.dumps(("error", text))
    conn.send_bytes(reply)
    conn.close()
    if failed:
        sys.exit(1)


# --------------------------------------------------------------- parent side

class _SignalGuard:
    """Turns SIGINT/SIGTERM into a stop request while the run lasts.

    On exit the previous handlers come back and the first signal caught is
    delivered to them.  Signals that were ignored stay ignored; outside the
    main thread nothing is installed (Python allows handlers only there).
    """

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                previous = signal.getsignal(sig)
                if previous not in (signal.SIG_IGN, None):  # None: set outside Python, cannot restore
                    self._previous[sig] = signal.signal(sig, self._catch)
        return self

    def _catch(self, signum: int, frame: Any) -> None:
        self.caught.append(signum)

    def __exit__(self, *exc_info: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        guard_termination_signals()  # where the handler put back is the one that unlinks segments
        if self.caught:
            signal.raise_signal(self.caught[0])


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Start children with SIGINT/SIGTERM blocked; the child unblocks them once it ignores SIGINT.

    The mask survives fork and exec, so a Ctrl-C cannot hit a spawned child's
    imports, nor run the parent's handlers in a forked child before it resets
    them; in the parent the signals just wait.  (A forkserver child gets the
    server's mask instead: a Ctrl-C while it unpickles its task can reach it.)
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@dataclass
class _Child:
    job: _Job
    process: Any
    conn: connection.Connection | None  # None once its one reply (or EOF) has been read
    reply: tuple[str, Any] | None = None

    @property
    def name(self) -> str:
        return "learner" if self.job.role == "learner" else f"actor {self.job.rank}"


class _Run:
    """The children of one launch, and what has been heard from them."""

    def __init__(self, mp_context: Any, actor_fns: list[bytes], learner_fn: bytes | None, shared: bytes,
                 max_restarts: int, grace: float, signals: _SignalGuard):
        self._mp = mp_context
        self._actor_fns = actor_fns
        self._learner_fn = learner_fn
        self._shared = shared
        self._max_restarts = max_restarts
        self._grace = grace
        self._signals = signals
        self.stop = StopFlag(mp_context)
        self.children: list[_Child] = []  # every child ever started
        self._active: list[_Child] = []  # those whose end has not been handled yet
        self.learner: _Child | None = None
        self.error: ChildFailed | None = None
        self.restarts: dict[int, int] = {}

    def start(self, role: str, rank: int, restarts: int = 0) -> None:
        function = self._learner_fn if role == "learner" else self._actor_fns[rank]
        job = _Job(role, rank, len(self._actor_fns), restarts)
        reader, writer = self._mp.Pipe(duplex=False)
        # Not daemonic: an actor may start processes of its own (vectorised environments).
        process = self._mp.Process(target=_child_main, args=(function, self._shared, job, self.stop, writer),
                                   name=f"mpreplay-{role}-{rank}")
        with _signals_blocked():
            process.start()
        writer.close()  # the child holds the only write end: its death reads as EOF
        child = _Child(job, process, reader)
        self.children.append(child)
        self._active.append(child)
        if role == "learner":
            self.learner = child

    @property
    def value(self) -> Any:
        """What the learner returned, if it did."""
        reply = None if self.learner is None else self.learner.reply
        return reply[1] if reply is not None and reply[0] == "ok" else None

    def supervise(self, deadline: float) -> str:
        """Wait until the run should end; return why ("error" when self.error is set)."""
        while True:
            # Replies first: a learner that returned because stop was set must
            # be seen after the stop, so the run counts as stopped.
            for child in list(self._active):
                self._receive(child)
            if self.error is not None:
                return "error"
            if self._signals.caught:
                return "signal"
            if self.stop.is_set():
                return "stopped"
            if self.learner is not None and self.learner.reply is not None:
                return "learner"
            for child in list(self._active):
                if child.process.exitcode is not None:
                    reason = self._ended(child)
                    if reason is not None:
                        return reason
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            connection.wait(_waitables(self._active), timeout=min(remaining, _POLL))

    def _ended(self, child: _Child) -> str | None:
        """Handle a child that exited; return a reason if the run ends with it."""
        self._receive(child)  # a reply sent just before exiting
        self._active.remove(child)
        if self.error is not None:
            return "error"
        role, rank, restarts = child.job.role, child.job.rank, child.job.restarts
        exitcode = child.process.exitcode
        if exitcode == 0:
            if role == "learner":
                return "learner"  # returned, or left with sys.exit(0)
            return "actors" if self.learner is None and not self._active else None
        if role == "actor" and restarts < self._max_restarts:
            self.restarts[rank] = restarts + 1
            self.start("actor", rank, restarts + 1)
            return None
        if role == "learner":
            hint = ""
        elif self._max_restarts:
            hint = f"; it had been restarted {restarts} times (max_restarts={self._max_restarts})"
        else:
            hint = "; pass max_restarts=N to restart dead actors"
        self._fail(child, f"{child.name} (pid {child.process.pid}) {_describe_exit(exitcode)}{hint}")
        return "error"

    def _receive(self, child: _Child) -> None:
        """Read the child's one reply if it has arrived (or note that it never will)."""
        if child.conn is None or not child.conn.poll():
            return
        try:
            child.reply = cloudpickle.loads(child.conn.recv_bytes())
        except EOFError:
            pass  # it died without replying; its exit code tells the rest
        child.conn.close()
        child.conn = None
        if child.reply is not None and child.reply[0] == "error":
            text = child.reply[1].rstrip()
            self._fail(child, f"{child.name} (pid {child.process.pid}) raised an exception:\n\n{text}", text)

    def _fail(self, child: _Child, message: str, remote_traceback: str | None = None) -> None:
        if self.error is None:  # the first failure is the story; later ones are often its echo
            self.error = ChildFailed(message, role=child.job.role, rank=child.job.rank, pid=child.process.pid,
                                     exitcode=child.process.exitcode, remote_traceback=remote_traceback)

    def shutdown(self) -> None:
        """Set stop, give the children the grace period, then terminate, kill and reap the rest.

        Replies keep being read all along: the learner's value after a
        timeout or a stop still counts, and so does an exception.
        """
        self.stop.set()
        deadline = time.monotonic() + self._grace
        live = self._live()
        while live and time.monotonic() < deadline and len(self._signals.caught) < 2:  # a 2nd signal: no grace
            connection.wait(_waitables(live), timeout=min(_POLL, max(0.0, deadline - time.monotonic())))
            for child in live:
                self._receive(child)
            live = self._live()
        for end, wait in (("terminate", _TERMINATE_WAIT), ("kill", _KILL_WAIT)):
            for child in live:
                getattr(child.process, end)()
            deadline = time.monotonic() + wait
            for child in live:
                child.process.join(max(0.0, deadline - time.monotonic()))
            live = self._live()
        for child in self.children:
            self._receive(child)
            if child.conn is not None:  # still running: could not be killed (uninterruptible sleep)
                child.conn.close()
            if child.process.exitcode is not None:
                child.process.close()

    def _live(self) -> list[_Child]:
        return [c for c in self.children if c.process.exitcode is None]


def _waitables(children: list[_Child]) -> list[Any]:
    return [c.conn for c in children if c.conn is not None] + [c.process.sentinel for c in children]


def _actor_functions(actors: Any) -> list[Callable[..., Any]]:
    if actors is None:
        return []
    if callable(actors):
        return [actors]
    if (isinstance(actors, tuple) and len(actors) == 2 and callable(actors[0])
            and isinstance(actors[1], int) and not isinstance(actors[1], bool)):
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


def launch(buffer: Any, actors: Any = None, learner: Callable[..., Any] | None = None, *,
           params: Any = None, args: tuple = (), start_method: str | None = None,
           max_restarts: int = 0, timeout: float | None = None, grace: float = 5.0,
           close: bool = True) -> RunResult:
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
        raise ValueError(f"start_method: expected one of {multiprocessing.get_all_start_methods()} "
                         f"or None, got {start_method!r}") from None
    pickled: dict[int, bytes] = {}  # each distinct function once
    for fn in actor_functions:
        pickled.setdefault(id(fn), _dumps(fn, "actors"))
    actor_payloads = [pickled[id(fn)] for fn in actor_functions]
    learner_payload = None if learner is None else _dumps(learner, "learner")
    shared = _dumps((buffer, params, args), "buffer, params, args")

    deadline = math.inf if timeout is None else time.monotonic() + timeout
    if mp_context.get_start_method() != "fork":
        # Start the helper processes before any _signals_blocked: the resource
        # tracker's start unblocks SIGINT/SIGTERM, and a forkserver would keep
        # the blocked mask for every child it forks, ours or not.
        resource_tracker.ensure_running()
        if mp_context.get_start_method() == "forkserver":
            multiprocessing.forkserver.ensure_running()
    with ExitStack() as stack:  # unwinds in reverse: stop the children, close, restore signals
        signals = stack.enter_context(_SignalGuard())
        if close:
            for resource in _closeables(buffer, params):
                stack.callback(resource.close)
        run = _Run(mp_context, actor_payloads, learner_payload, shared, max_restarts, grace, signals)
        stack.callback(run.shutdown)
        for rank in range(len(actor_payloads)):
            run.start("actor", rank)
        if learner_payload is not None:
            run.start("learner", 0)
        reason = run.supervise(deadline)
    if run.error is not None:
        raise run.error
    return RunResult(run.value, reason, dict(run.restarts))
