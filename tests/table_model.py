"""A reference model of a table, in plain Python, for the grid of tests/test_table.py: the scenario of
writes every combination runs, which rows (or sequences) the table must hold after it, and in which
order an ordered selector must draw them.

The model keeps, per lane, which slot holds what (a step's row or frame, or the last next
observation of an episode, which ``next_of`` stores in a slot of its own), so the removers' rules
are written here once, as docs/architecture.md ("Removers") states them:

* ``fifo``: a write of ``k`` takes the ``k`` slots from the lane's cursor (the ring);
* ``lifo`` (rows only): it takes the free slots from the cursor first, and replaces the newest rows,
  just behind the cursor, for the rest;
* ``keep_unread``: it never replaces an unread item (the scenario never fills such a table: the
  model refuses a write that would).

An item (a row, or a sequence) is gone once a slot it reads is written again: its own, the frames
of its stack (``stack_compress``), the slot of its next observation (``next_of``).  A row becomes
drawable when it is stored and, with ``next_of``, its next observation is; it enters the selector
then, the rows one call completes in the order of their steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# Each ordered selector's key of an item (priority, insertion number): the smallest is drawn first;
# ties go to the item inserted first (mpreplay.selectors).
ORDER_KEYS: dict[str, Callable[[float, int], tuple[float, ...]]] = {
    "fifo": lambda priority, number: (number,),
    "lifo": lambda priority, number: (-number,),
    "max_heap": lambda priority, number: (-priority,),
    "min_heap": lambda priority, number: (priority,),
}

STACK = 3  # frames in a stacked observation
STACKED = (2, STACK)  # a stacked observation's shape: frames of 2 values
NSTEP = 3  # steps a folded row spans
GAMMA = 0.5
# The episodes each writer writes, in calls: (steps of each add, how it ends). "done": its last step
# is a done step; "end": on_episode_end(); "open": left open mid-write.  The second adds three steps
# in one call, so one call completes several rows.
EPISODES: tuple[tuple[tuple[int, ...], str], ...] = (
    ((1,) * 10, "done"),
    ((1,) * 6 + (3,) + (1,) * 3, "end"),
    ((1,) * 15, "open"),
)


def step_id(writer: int, episode: int, t: int) -> int:
    """The ``act`` of a step: its writer, episode and step, readable in a failure."""
    return 1000 * writer + 100 * episode + t


def priority_of(item: int) -> float:
    """A step's initial priority; few values, so heaps meet ties."""
    return float(item % 3)


def frame(writer: int, episode: int, t: int) -> np.ndarray:
    """The frame of step ``t``: it names its episode and step."""
    return np.array([3 * writer + episode, t], dtype=np.uint8)


@functools.cache
def stack(writer: int, episode: int, t: int) -> np.ndarray:
    """The stacked observation of step ``t`` (last axis: the stack, the first frame repeated), read-only."""
    stacked = np.stack([frame(writer, episode, max(0, t - STACK + 1 + j)) for j in range(STACK)], axis=-1)
    stacked.flags.writeable = False
    return stacked


@dataclass
class Storage:
    """How a table stores its steps: what its grid case passes as ``next_of``, ``stack_compress``, ``nstep``."""

    next_of: bool = False
    stack_compress: bool = False
    nstep: bool = False

    @property
    def compressed(self) -> bool:
        return self.next_of or self.stack_compress

    @property
    def span(self) -> int:
        return NSTEP if self.nstep else 1

    def options(self) -> dict[str, object]:
        options: dict[str, object] = {}
        if self.next_of:
            options["next_of"] = "obs"
        if self.stack_compress:
            options["stack_compress"] = "obs"
        if self.nstep:
            options["nstep"] = {"size": NSTEP, "gamma": GAMMA, "rew": "rew", "done": "done", "next": "next_obs"}
        return options

    def fields(self) -> dict[str, dict[str, object]]:
        fields: dict[str, dict[str, object]] = {
            "obs": {"shape": STACKED, "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {},
            "done": {},
        }
        if self.next_of or self.nstep:
            fields["next_obs"] = fields["obs"]
        return fields


STORAGES: dict[str, Storage] = {
    "plain": Storage(),
    "next_of": Storage(next_of=True),
    "stack_compress": Storage(stack_compress=True),
    "next_of+stack_compress": Storage(next_of=True, stack_compress=True),
    "nstep": Storage(nstep=True),
    "nstep+next_of": Storage(next_of=True, nstep=True),
    "nstep+stack_compress": Storage(stack_compress=True, nstep=True),
    "nstep+next_of+stack_compress": Storage(next_of=True, stack_compress=True, nstep=True),
}

Slot = tuple[int, int, int]  # (writer, episode, step); step -1: an episode's last next observation


@dataclass
class Item:
    priority: float
    number: int  # insertion order
    steps: list[int]  # the ids of its steps (a row: one)
    reads: set[Slot]  # the slots it reads: gone once one of them is written again
    times_sampled: int = 0


@dataclass
class _Episode:
    writer: int
    episode: int
    added: int = 0  # steps added
    stored: int = 0  # steps whose slot is written
    ended: bool = False
    length: int | None = None  # steps, once ended


@dataclass
class Lane:
    """One lane's slots and cursor."""

    width: int
    remover: str
    slots: list[Slot | None] = field(default_factory=list)
    cursor: int = 0

    def __post_init__(self) -> None:
        self.slots = [None] * self.width

    def write(self, users: list[Slot], holds_item: Callable[[Slot], bool]) -> list[Slot]:
        """Writes ``users`` in one reservation; the slot users it replaced."""
        k = len(users)
        start = self.cursor
        if self.remover == "lifo":
            free = next((j for j in range(k) if self._holds(self.cursor + j, holds_item)), k)
            start = self.cursor - (k - free)
        replaced = []
        for j, user in enumerate(users):
            s = (start + j) % self.width
            old = self.slots[s]
            if old is not None:
                if self.remover == "keep_unread" and holds_item(old):
                    raise AssertionError("the scenario filled a keep_unread table: give it more slots")
                replaced.append(old)
            self.slots[s] = user
        self.cursor = (start + k) % self.width
        return replaced

    def _holds(self, j: int, holds_item: Callable[[Slot], bool]) -> bool:
        old = self.slots[j % self.width]
        return old is not None and holds_item(old)


class TableModel:
    """What a table must hold: items keyed by the id of their (first) step."""

    def __init__(self, storage: Storage, lanes: int, width: int, remover: str, sequence: tuple[int, int] | None):
        self.storage, self.sequence = storage, sequence
        self.lanes = [Lane(width, remover) for _ in range(lanes)]
        self.items: dict[int, Item] = {}
        self.inserts = 0
        self.episodes: dict[int, _Episode] = {}  # each writer's current episode
        self.history: dict[tuple[int, int], _Episode] = {}  # every episode, by writer and episode
        self.inserted: set[int] = set()  # items once inserted (they may be gone since): never inserted twice
        self.readers: dict[Slot, set[int]] = {}  # the items reading each slot

    # -- writing ------------------------------------------------------------------------------
    def begin(self, writer: int, episode: int) -> None:
        self.episodes[writer] = self.history[writer, episode] = _Episode(writer, episode)

    def add(self, writer: int, steps: int, done: bool) -> None:
        ep = self.episodes[writer]
        ep.added += steps
        if done:
            ep.ended, ep.length = True, ep.added
        self._store(ep)

    def end(self, writer: int) -> None:
        ep = self.episodes[writer]
        if not ep.ended and ep.added:
            ep.ended, ep.length = True, ep.added
            self._store(ep)

    def _store(self, ep: _Episode) -> None:
        # Rows are stored once folded (n steps, or at the episode's end); the last next observation once it ends.
        upto = ep.added if ep.ended else max(ep.stored, ep.added - self.storage.span + 1)
        users: list[Slot] = [(ep.writer, ep.episode, t) for t in range(ep.stored, upto)]
        if ep.ended and self.storage.next_of:
            users.append((ep.writer, ep.episode, -1))
        ep.stored = upto
        if users:
            for slot in self.lanes[ep.writer].write(users, self._holds_item):
                for item in list(self.readers.get(slot, ())):
                    self._remove(item)
        self._insert_completed(ep)

    def _holds_item(self, slot: Slot) -> bool:
        return bool(self.readers.get(slot))

    def _remove(self, item: int) -> None:
        for slot in self.items.pop(item).reads:
            self.readers[slot].discard(item)

    def _reads(self, ep: _Episode, first: int, last: int) -> set[Slot] | None:
        """The slots an item of steps ``first``..``last`` reads; None while one is not written yet."""
        w, e = ep.writer, ep.episode
        low = max(0, first - STACK + 1) if self.storage.stack_compress else first
        reads: set[Slot] = {(w, e, t) for t in range(low, last + 1)}
        if self.storage.next_of:
            for t in range(first, last + 1):
                nxt = t + self.storage.span
                reads.add((w, e, -1) if ep.length is not None and nxt >= ep.length else (w, e, nxt))
        written = all(t < ep.stored if t >= 0 else ep.ended for _, _, t in reads)
        return reads if written else None

    def _insert_completed(self, ep: _Episode) -> None:
        rows = [(t, t, t) for t in range(ep.stored)]
        for item_step, first, last in rows if self.sequence is None else self._sequences_completed(ep):
            item = step_id(ep.writer, ep.episode, item_step)
            reads = None if item in self.inserted else self._reads(ep, first, last)
            if reads is None:
                continue
            steps = [step_id(ep.writer, ep.episode, t) for t in range(first, last + 1)]
            # A sequence's priority from its steps' (eta=1: the largest, exactly).
            self.items[item] = Item(max(map(priority_of, steps)), self.inserts, steps, reads)
            for slot in reads:
                self.readers.setdefault(slot, set()).add(item)
            self.inserted.add(item)
            self.inserts += 1

    def _sequences_completed(self, ep: _Episode) -> list[tuple[int, int, int]]:
        """(start, first, last step) of each sequence whose steps are all stored, in offset order:
        full ones every ``period`` steps, a padded last one when the episode ends (SequenceCutter)."""
        assert self.sequence is not None
        length, period = self.sequence
        out = []
        start = 0
        while start + length <= ep.stored:
            out.append((start, start, start + length - 1))
            start += period
        if ep.ended and ep.length is not None:
            covered = start - period + length if start else 0
            if start < ep.length and (start == 0 or covered < ep.length):
                out.append((start, start, ep.length - 1))
        return out

    def stored_steps(self) -> list[int]:
        """A sequence table's steps (what get_all_transitions lists): those whose slots, and the slots
        they read, are not written again."""
        present = {slot for lane in self.lanes for slot in lane.slots if slot is not None}
        steps = []
        for w, e, t in present:
            reads = self._reads(self.history[w, e], t, t) if t >= 0 else None
            if reads is not None and reads <= present:
                steps.append(step_id(w, e, t))
        return sorted(steps)

    # -- sampling -----------------------------------------------------------------------------
    def listed(self, *, by_lane: bool) -> list[int]:
        """The items in the order they were inserted (``by_lane``: the first writer's lane, then the next...)."""
        return sorted(self.items, key=lambda i: (i // 1000 if by_lane else 0, self.items[i].number))  # step_id's writer

    def order(self, selector: str) -> list[int]:
        key = ORDER_KEYS[selector]
        items = self.items
        return sorted(items, key=lambda i: (*key(items[i].priority, items[i].number), items[i].number))

    def ordered_batch(self, selector: str, k: int) -> list[int]:
        order = self.order(selector)
        return (order * (k // max(1, len(order)) + 1))[:k]

    def draw(self, drawn: list[int], max_times_sampled: int | None) -> None:
        """Counts the draws of a batch, in order (each item drawn must be stored when drawn), retiring
        an item at its ``max_times_sampled``-th draw."""
        for item in drawn:
            assert item in self.items, f"drew {item}, which the table must not hold; it holds {sorted(self.items)}"
            self.items[item].times_sampled += 1
            if max_times_sampled is not None and self.items[item].times_sampled >= max_times_sampled:
                self._remove(item)

    def update(self, item: int, priority: float) -> None:
        if item in self.items:
            self.items[item].priority = priority
