"""What several test files share: the start methods and buffer classes tests run under, child
processes (run, crashed at a fault site, holding a lock) and the shared-memory segments they leave.

Import it as ``from helpers import ...``: pytest puts this folder on ``sys.path`` (the test files and
``conftest.py`` sit in it without an ``__init__.py``), from the repository's root or from a copy of
``tests/`` elsewhere, and a spawned child inherits that path.  Fixtures live in ``conftest.py``;
``damage.py`` holds what the damage tests share.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from mpreplay.inspect import arm_fault
from mpreplay.memory import SEGMENT_PREFIX

# -- what a test runs under ------------------------------------------------------------------------

# The start methods every multi-process test runs its children under.
START_METHODS = ("spawn", "fork")
# Runs the test once per start method, as its ``method`` argument.
EACH_START_METHOD = pytest.mark.parametrize("method", START_METHODS)


def uniform_and_prioritized(uniform: type, prioritized: type) -> pytest.MarkDecorator:
    """Runs the test with each class as its ``cls`` argument, ids ``uniform`` and ``prioritized``."""
    return pytest.mark.parametrize("cls", [uniform, prioritized], ids=["uniform", "prioritized"])


# Runs the test with each local buffer class as its ``cls`` argument.
EACH_BUFFER_CLASS = uniform_and_prioritized(ReplayBuffer, PrioritizedReplayBuffer)


# -- child processes -------------------------------------------------------------------------------


def run_in_child(method: str, target: Callable[..., object], *args: object, timeout: float = 30) -> int | None:
    """Runs ``target(*args)`` in a child started by ``method``; its exit code (None: still running
    after ``timeout`` s, and then killed)."""
    child = mp.get_context(method).Process(target=target, args=args)
    child.start()
    child.join(timeout)
    exitcode = child.exitcode
    if exitcode is None:  # a hung child fails its test, and is not left behind
        child.kill()
        child.join()
    return exitcode


def crash_at(site: str, action: Callable[..., object], *args: object, **kwargs: object) -> None:
    """A child's target: ``action(*args, **kwargs)`` with fault ``site`` armed, which SIGKILLs the
    child inside its critical section."""
    arm_fault(site)
    action(*args, **kwargs)
    os._exit(3)  # not reached: the armed site kills the process


def assert_child_dies_at(method: str, site: str, action: Callable[..., object], *args: object, timeout: float) -> None:
    """Runs ``action(*args)`` in a child started by ``method`` with fault ``site`` armed, and checks
    that the site killed it."""
    exitcode = run_in_child(method, crash_at, site, action, *args, timeout=timeout)
    assert exitcode == -signal.SIGKILL, f"the child did not die at {site!r}: exit code {exitcode}"


def hold_lock(buffer: Any, held: Any, seconds: float = 120) -> None:
    """A child's target: takes ``buffer``'s lock, sets the event ``held``, and keeps the lock for
    ``seconds`` s (the test stops or kills it first)."""
    with buffer.inspection().holding_lock():
        held.set()
        time.sleep(seconds)


def start_lock_holder(ctx: Any, buffer: Any, *, wait: float = 60, seconds: float = 120) -> BaseProcess:
    """A child of the context ``ctx`` running :func:`hold_lock`, once it holds the lock (within ``wait`` s)."""
    held = ctx.Event()
    holder = ctx.Process(target=hold_lock, args=(buffer, held, seconds))
    holder.start()
    assert held.wait(wait), "the child never took the lock"
    return holder


# -- shared-memory segments ------------------------------------------------------------------------


def segment_exists(name: str) -> bool:
    """Whether the shared-memory segment ``name`` is in /dev/shm."""
    return os.path.exists(f"/dev/shm/{name}")


def segments_of(pid: int) -> set[str]:
    """The /dev/shm entries of the segments process ``pid`` created (mpreplay names them after it)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"{SEGMENT_PREFIX}{pid}-")}


def own_a_buffer(queue: Any) -> MPReplayBuffer:
    """In a child: creates a shared buffer of one row and puts its name on ``queue``."""
    buffer = MPReplayBuffer(8, {"obs": {}})
    buffer.add(obs=1.0)
    queue.put(buffer.name)
    return buffer


def start_buffer_owner(method: str, target: Callable[..., object], *args: object) -> tuple[BaseProcess, str]:
    """Starts ``target(queue, *args)`` in a child started by ``method``; the child, with the name
    of the buffer it put on ``queue`` (see :func:`own_a_buffer`)."""
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(queue, *args))
    child.start()
    return child, queue.get(timeout=30)
