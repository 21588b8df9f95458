"""What several test files share, so that no test file holds a copy of another's helper: the start
methods and buffer classes tests run under; child processes (run, crashed at a fault site, holding
the lock) and the shared-memory segments they leave; the common fields and the rows that fill them;
files saved and reloaded; selectors alone; the cells of the tables the commands print; the
modules docs/stability.md calls public or internal.

Import it as ``from helpers import ...``: pytest puts this folder on ``sys.path`` (the test files and
``conftest.py`` sit in it without an ``__init__.py``), from the repository's root or from a copy of
``tests/`` elsewhere, and a spawned child inherits that path.  Fixtures live in ``conftest.py``;
``damage.py`` holds what the damage tests share.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import re
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
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

# The repository's root (or the folder a copy of tests/ sits in).
REPO_ROOT = Path(__file__).resolve().parent.parent


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


def put_sampled_ids(buffer: Any, k: int, queue: Any) -> None:
    """A child's target: puts the ids of a sample of ``k`` rows on ``queue``."""
    queue.put(buffer.sample(k)["id"].tolist())


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


def retry_after_timeouts(call: Callable[[], object], make_room: Callable[[], object] | None = None) -> int:
    """Calls ``call()`` again while it raises TimeoutError, calling ``make_room()`` (if given) after
    each; how many times it timed out."""
    timeouts = 0
    while True:
        try:
            call()
            return timeouts
        except TimeoutError:
            timeouts += 1
            if make_room is not None:
                make_room()


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


# -- fields and the rows that fill them ------------------------------------------------------------

# One observation of 4 numbers.
OBS_OF_4 = {"obs": {"shape": (4,)}}
# An item's number, alone.
ID_FIELD = {"id": {"dtype": np.int64}}
# Steps of episodes: an observation of 2 numbers and the episode's end.
EPISODE_STEP_FIELDS = {"obs": {"shape": (2,)}, "done": {}}
# Steps tagged (writer, episode, step), with stacks of 4 frames of 3x3.
TAGGED_STACK_FIELDS = {
    "tag": {"shape": (3,), "dtype": np.int64},
    "obs": {"shape": (3, 3, 4), "dtype": np.uint8},
    "next_obs": {"shape": (3, 3, 4), "dtype": np.uint8},
    "done": {},
}
# The fields of the cpprb files the tests write and damage.
CPPRB_FILE_FIELDS = {"obs": {"shape": (2, 3)}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}


def transition_fields(obs_shape: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """The fields of a one-step transition: obs and next_obs of ``obs_shape``, act (int64), rew, done."""
    return {
        "obs": {"shape": obs_shape},
        "act": {"dtype": np.int64},
        "rew": {},
        "next_obs": {"shape": obs_shape},
        "done": {},
    }


def rows_of(fields: dict[str, dict[str, Any]], ids: Any) -> dict[str, np.ndarray]:
    """Rows numbered ``ids``: every element of every field holds its row's number, in the field's
    shape and dtype (float32 where it names none), so a row mixed from two writes shows."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = {}
    for name, spec in fields.items():
        shape = spec.get("shape", ())
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        rows[name] = np.empty((len(ids), *shape), spec.get("dtype", np.float32))
        rows[name][...] = ids.reshape((-1,) + (1,) * len(shape))
    return rows


# -- numbered transitions: every field encodes the transition's number -----------------------------

# obs (3 numbers), act (int64), rew, done (uint8).
NUMBERED_FIELDS = {"obs": {"shape": (3,)}, "act": {"dtype": np.int64}, "rew": {}, "done": {"dtype": np.uint8}}


def numbered_transitions(numbers: Any) -> dict[str, np.ndarray]:
    """The transitions with these ``numbers``, as a batch of :data:`NUMBERED_FIELDS`."""
    i = np.asarray(numbers, dtype=np.int64)
    return {"obs": i[:, None] * np.array([1.0, 10.0, 100.0]), "act": i, "rew": i / 2, "done": i % 2}


def numbered_row(i: int) -> dict[str, object]:
    """Transition number ``i`` as plain Python values."""
    return {"obs": [float(i), 10.0 * i, 100.0 * i], "act": i, "rew": i / 2, "done": i % 2}


def assert_numbered(rows: dict[str, np.ndarray], numbers: Any) -> None:
    """Checks that ``rows`` are, field by field, the transitions with these ``numbers``."""
    expected = numbered_transitions(list(numbers))
    for name in NUMBERED_FIELDS:
        np.testing.assert_array_equal(rows[name], expected[name], err_msg=name)


def numbered_buffer(cls: type, size: int, numbers: Any, **options: Any) -> Any:
    """A ``cls`` buffer of capacity ``size`` that was given the transitions ``numbers``, in order
    (in batches of at most ``size``: a larger one would warn of the rows it drops)."""
    buffer = cls(size, NUMBERED_FIELDS, **options)
    numbers = list(numbers)
    for start in range(0, len(numbers), size):
        buffer.add(**numbered_transitions(numbers[start : start + size]))
    return buffer


def wrapped_buffer(cls: type) -> Any:
    """A ``cls`` buffer of 8 slots that has wrapped (slot s holds transition s + 8 for s < 3, s
    otherwise), holds distinct priorities where it has any, and has been sampled from."""
    buffer = numbered_buffer(cls, 8, range(11), seed=0)
    if cls is PrioritizedReplayBuffer:
        buffer.update_priorities(np.arange(8), np.linspace(0.5, 4.0, 8))
    buffer.sample(4)
    return buffer


def slot_priorities(buffer: Any) -> np.ndarray:
    """The raw priority stored for every slot in use, by slot."""
    return buffer.inspection().priorities(np.arange(buffer.get_stored_size()))[1]


# -- files -----------------------------------------------------------------------------------------


def saved_file(buffer: Any, **options: Any) -> io.BytesIO:
    """``buffer.save_transitions(file, **options)`` into memory, rewound to be read."""
    file = io.BytesIO()
    buffer.save_transitions(file, **options)
    file.seek(0)
    return file


def reloaded(buffer: Any, make: Callable[[], Any], file: Any = None) -> Any:
    """A new buffer, ``make()``, that loaded ``buffer``'s file (saved to ``file``, or into memory)."""
    if file is None:
        file = saved_file(buffer)
    else:
        buffer.save_transitions(file)
    fresh = make()
    fresh.load_transitions(file)
    return fresh


def cpprb_buffer(
    cpprb: Any,
    options: dict[str, Any],
    history: list[int | str],
    *,
    size: int = 8,
    cls: str = "ReplayBuffer",
    seed: int = 0,
    **kwargs: Any,
) -> Any:
    """A buffer of the real cpprb, of :data:`CPPRB_FILE_FIELDS` and ``options``, that went through
    ``history``: k random steps added, or "end" (on_episode_end)."""
    buffer = getattr(cpprb, cls)(
        size, {name: dict(spec) for name, spec in CPPRB_FILE_FIELDS.items()}, **options, **kwargs
    )
    rng = np.random.default_rng(seed)
    for operation in history:
        if operation == "end":
            buffer.on_episode_end()
            continue
        k = int(operation)
        steps = {
            "obs": rng.normal(size=(k, 2, 3)),
            "act": rng.integers(0, 9, k),
            "rew": rng.normal(size=k),
            "done": np.zeros(k),
        }
        if "next_of" in options:
            steps["next_obs"] = rng.normal(size=(k, 2, 3))
        buffer.add(**steps)
    return buffer


def tagged_episode(writer: int, episode: int, n: int, *, ended: bool = True, rng: Any = None) -> dict[str, np.ndarray]:
    """n steps of one episode of :data:`TAGGED_STACK_FIELDS`; ``tag`` says (writer, episode, step),
    ``done`` ends the episode when ``ended``.  With ``rng``, also stacked frames drawn from it: each
    step's stack the previous one shifted by a new frame, the first frame repeated at the start;
    ``next_obs`` is the next stack."""
    s = np.arange(n)
    out = {
        "tag": np.stack([np.full(n, writer), np.full(n, episode), s], axis=1),
        "done": ((s == n - 1) & ended).astype(np.float32),
    }
    if rng is not None:
        frames = rng.integers(0, 256, size=(n + 1, 3, 3), dtype=np.uint8)
        stacks = np.moveaxis(frames[np.maximum(0, np.arange(n + 1)[:, None] - 3 + np.arange(4))], 1, -1)
        out["obs"], out["next_obs"] = np.ascontiguousarray(stacks[:n]), np.ascontiguousarray(stacks[1:])
    return out


# -- selectors, alone ------------------------------------------------------------------------------
# The selectors' registry is imported where it is used: a test file that makes no selector of its
# own does not depend on it.


def selector_state(name: str, capacity: int) -> np.ndarray:
    """A fresh state array for the registered selector ``name`` over ``capacity`` slots."""
    from mpreplay import selectors

    _, length, dtype = selectors.state_array(name, capacity)
    return np.zeros(length, dtype)


def registered_selector(
    name: str, capacity: int, items: Any = (), state: np.ndarray | None = None, reset: bool = True
) -> Any:
    """The registered selector ``name`` over ``state`` (a fresh one when None), holding ``items`` too."""
    from mpreplay import selectors
    from mpreplay.selectors import SelectorSpec

    state = selector_state(name, capacity) if state is None else state
    selector = selectors.make(SelectorSpec(name), state, capacity, reset)
    for item in items:
        selector.insert(item, 1.0)
    return selector


def drawn_items(selector: Any, k: int, seed: int = 0) -> list[int]:
    """The ``k`` items ``selector`` draws with a generator seeded ``seed``."""
    return selector.sample_items(k, np.random.default_rng(seed)).tolist()


# -- what the commands print -----------------------------------------------------------------------


def table_cells(text: str) -> list[list[str]]:
    """The cells of every line of ``text``, a table as rich draws it or as plain text: cells sit
    between rules or at least two spaces apart (no cell holds two spaces in a row)."""
    return [[c.strip() for c in re.split(r"[│┃]|\s{2,}", line) if c.strip()] for line in text.splitlines()]


# -- what the documentation promises ---------------------------------------------------------------


def stability_modules(kind: str) -> list[str]:
    """The modules docs/stability.md lists under its heading "<kind> modules" (Public, Internal)."""
    text = (REPO_ROOT / "docs" / "stability.md").read_text(encoding="utf-8")
    section = re.search(rf"^### {kind} modules\n(.*?)(?=^#|\Z)", text, flags=re.DOTALL | re.MULTILINE)
    assert section, f"docs/stability.md has no '### {kind} modules' heading"
    return re.findall(r"^- `(mpreplay[\w.]*)`", section.group(1), flags=re.MULTILINE)
