"""The processes of a :func:`~mpreplay.launch` run: what a child gets (its :class:`Context`) and runs,
and how the parent starts, watches, restarts and stops them.  See :mod:`mpreplay.launcher`."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import connection
from typing import Any, NamedTuple

import cloudpickle

from . import checks
from .memory import guard_termination_signals

__all__ = ["ChildFailed", "Context", "Run", "RunResult", "SignalGuard", "StopFlag", "signals_blocked"]

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
    role : str
        ``"actor"`` or ``"learner"``.
    rank : int
        0 .. num_actors-1 for actors (kept across restarts); 0 for the learner.
    num_actors : int
    buffer
        The ``buffer`` given to :func:`launch`, attached in this process.
    params
        The ``params`` given to :func:`launch` (None if none), attached in this process.
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
    value
        What the learner returned (None without a learner, or if it did not return).
    reason : str
        Why the run ended: ``"learner"`` (it returned), ``"actors"`` (no learner,
        all actors returned), ``"timeout"``, ``"stopped"`` (a process set ``ctx.stop``)
        or ``"signal"`` (a SIGINT/SIGTERM whose previous handler returned).
    restarts : dict
        Actor rank -> how many times it was restarted.
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

    def __init__(
        self, message: str, *, role: str, rank: int, pid: int | None, exitcode: int | None, remote_traceback: str | None
    ):
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
        frames = exc.__traceback__
        text = "".join(traceback.format_exception(type(exc), exc, frames.tb_next if frames else None))
        reply = cloudpickle.dumps(("error", text))
    conn.send_bytes(reply)
    conn.close()
    if failed:
        sys.exit(1)


class SignalGuard:
    """Turns SIGINT/SIGTERM into a stop request while the run lasts.

    On exit the previous handlers come back and the first signal caught is
    delivered to them.  Signals that were ignored stay ignored; outside the
    main thread nothing is installed (Python allows handlers only there).
    """

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalGuard:
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
def signals_blocked() -> Iterator[None]:
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


class Run:
    """The children of one launch, and what has been heard from them."""

    def __init__(
        self,
        mp_context: Any,
        actor_fns: list[bytes],
        learner_fn: bytes | None,
        shared: bytes,
        max_restarts: int,
        grace: float,
        signals: SignalGuard,
    ):
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
        process = self._mp.Process(
            target=_child_main, args=(function, self._shared, job, self.stop, writer), name=f"mpreplay-{role}-{rank}"
        )
        with signals_blocked():
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
        with contextlib.suppress(EOFError):  # it died without replying; its exit code tells the rest
            child.reply = cloudpickle.loads(child.conn.recv_bytes())
        child.conn.close()
        child.conn = None
        if child.reply is not None and child.reply[0] == "error":
            text = child.reply[1].rstrip()
            self._fail(child, f"{child.name} (pid {child.process.pid}) raised an exception:\n\n{text}", text)

    def _fail(self, child: _Child, message: str, remote_traceback: str | None = None) -> None:
        if self.error is None:  # the first failure is the story; later ones are often its echo
            self.error = ChildFailed(
                message,
                role=child.job.role,
                rank=child.job.rank,
                pid=child.process.pid,
                exitcode=child.process.exitcode,
                remote_traceback=remote_traceback,
            )

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
