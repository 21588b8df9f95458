"""Sequences of recurrent replay (R2D2): how a writer cuts its episodes into sequences.

A sequence is a window of ``length`` consecutive steps of one episode.  Starts
are ``period`` steps apart (R2D2: length 80, period 40, so neighbours share 40
steps).  :class:`SequenceCutter` decides them as a writer stores an episode's
steps; :class:`SequenceStore` is the writing side of a sequence buffer (see
:mod:`mpreplay.sequence_buffer`): it stores steps in its lane and opens each
sequence once its last step is stored, and loads a saved buffer's episodes
back (through :func:`mpreplay.saved_episodes.load_episodes`);
:func:`sequence_priority` is R2D2's priority of a sequence from its TD errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from . import checks
from ._ext.schema import EPISODE_START_ARRAY, EPISODE_STEP_ARRAY
from .frame_store import FrameStore

__all__ = ["SequenceCutter", "SequenceSpec", "SequenceStore", "sequence_priority"]


@dataclass(frozen=True)
class SequenceSpec:
    """How a sequence buffer cuts episodes: ``length`` steps per sequence, one starting
    every ``period`` steps, a padded final one with ``pad_end``; ``eta`` weighs the
    largest per-step priority in a sequence's initial priority (R2D2's rule).

    What ``Table(..., sequence=)`` takes; the sequence classes build it from their own
    ``length``, ``period``, ``pad_end`` and ``eta``.

    Examples
    --------
    >>> from mpreplay import SequenceSpec, Table
    >>> spec = SequenceSpec.build(4, 2, True, 0.9)  # length, period, pad_end, eta
    >>> spec.length, spec.period
    (4, 2)
    >>> table = Table(64, {"obs": {}}, sequence=spec, selector="prioritized")
    >>> table.add(obs=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    0
    >>> table.sample(2)["obs"].shape  # two sequences of four steps
    (2, 4)
    >>> table.close()
    >>> SequenceSpec.build(0, None, True, 0.9)
    Traceback (most recent call last):
    ...
    ValueError: length: expected an integer >= 1, got 0
    """

    length: int
    period: int
    pad_end: bool
    eta: float

    @classmethod
    def build(cls, length: Any, period: Any, pad_end: Any, eta: Any) -> SequenceSpec:
        length = checks.integer("length", length, low=1)
        period = length if period is None else checks.integer("period", period, low=1)
        return cls(length, period, checks.flag("pad_end", pad_end), checks.number("eta", eta, low=0.0, high=1.0))


class SequenceCutter:
    """Cuts one stream of episodes into sequences as their steps arrive.

    A sequence is announced once its last step is stored, never before, and
    never spans two episodes.  At an episode's end, with ``pad_end=True``, one
    shorter sequence keeps the steps no full sequence covered (R2D2 keeps every
    step); its missing steps are masked.  With ``pad_end=False`` an episode
    keeps only its full sequences.

    Offsets count steps from the episode's first step.
    """

    def __init__(self, length: int, period: int, *, pad_end: bool = True, first: int = 0) -> None:
        self.length = checks.integer("length", length, low=1)
        self.period = checks.integer("period", period, low=1)
        self.pad_end = checks.flag("pad_end", pad_end)
        # An episode whose steps before offset `first` are gone (a saved buffer's oldest):
        # its sequences start where they started when it was whole.
        first = checks.integer("first", first, low=0)
        self._stored = first  # steps of the current episode
        self._next = -(-first // self.period) * self.period  # offset of the next sequence not announced yet

    def copy(self) -> SequenceCutter:
        """A cutter of its own in this one's state."""
        other = SequenceCutter.__new__(SequenceCutter)
        other.__dict__.update(self.__dict__)
        return other

    @property
    def stored(self) -> int:
        """Steps of the current episode stored so far."""
        return self._stored

    @property
    def next_start(self) -> int:
        """Offset of the next sequence not announced yet: no earlier step is needed any more."""
        return self._next

    def add(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Count ``steps`` more steps of the current episode.

        Returns the (offsets, valid step counts) of the sequences these steps
        completed, oldest first; every count is ``length``.
        """
        steps = checks.integer("steps", steps, low=0)
        self._stored += steps
        first = self._next
        # full sequences whose last step (offset + length - 1) is now stored
        count = max(0, (self._stored - self.length - first) // self.period + 1)
        self._next = first + count * self.period
        offsets = first + self.period * np.arange(count, dtype=np.int64)
        return offsets, np.full(count, self.length, dtype=np.int64)

    def end_episode(self) -> tuple[np.ndarray, np.ndarray]:
        """End the current episode; the next step starts a new one.

        Returns the (offsets, valid step counts) of the padded final sequence,
        if ``pad_end`` and some stored step is in no full sequence; else empty.
        """
        start, stored = self._next, self._stored
        self._stored = self._next = 0
        # The last full sequence (start - period) ends at start - period + length;
        # when that reaches the episode's end, every step is already covered.
        uncovered = start < stored and (start == 0 or start - self.period + self.length < stored)
        if not (self.pad_end and uncovered):
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.array([start], dtype=np.int64), np.array([stored - start], dtype=np.int64)


def sequence_priority(td_errors: ArrayLike, mask: ArrayLike | None = None, *, eta: float = 0.9) -> np.ndarray:
    """R2D2's priority of each sequence: ``eta * max|td| + (1 - eta) * mean|td|`` over its real steps.

    ``td_errors`` is ``(B, length)`` (an array, a tensor or nested lists);
    ``mask`` (``(B, length)`` bools, None: every step real) the sample's
    ``mask``.  Every sequence needs at least one real step.  Returns ``B``
    float64 priorities.
    """
    td = np.abs(checks.matrix("td_errors", td_errors, kind="f"))
    eta = checks.number("eta", eta, low=0.0, high=1.0)
    if mask is None:
        real = np.ones(td.shape, dtype=bool)
    else:
        real = checks.matrix("mask", mask, kind="b")
        if real.shape != td.shape:
            raise ValueError(f"mask: expected shape {td.shape} (that of td_errors), got {real.shape}")
    counts = real.sum(axis=1)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise ValueError(f"mask: expected at least one True per sequence, row {int(empty[0])} has none")
    kept = np.where(real, td, 0.0)  # |td| >= 0, so 0 never raises a maximum
    return eta * kept.max(axis=1) + (1.0 - eta) * kept.sum(axis=1) / counts


class _Episode:
    """The episode a :class:`SequenceStore` is storing: how it is cut, where this writer began
    storing it (``start``: 0, or a saved episode's oldest kept step), and each stored step from
    ``first`` (episode offset) on -- slot, generation, priority -- that a sequence not opened yet
    may start at or cover."""

    def __init__(self, spec: SequenceSpec, first: int):
        self.cutter = SequenceCutter(spec.length, spec.period, pad_end=spec.pad_end, first=first)
        self.start = first  # episode offset of the first step this writer stores (0, or a loaded one's)
        self.first = first
        self.slots: list[int] = []
        self.generations: list[int] = []
        self.priorities: list[float] = []

    def copy(self) -> _Episode:
        other = _Episode.__new__(_Episode)
        other.cutter, other.start, other.first = self.cutter.copy(), self.start, self.first
        other.slots, other.generations, other.priorities = self.slots[:], self.generations[:], self.priorities[:]
        return other


class SequenceStore:
    """The writing side of a sequence buffer, private to one writer (a buffer object
    or one of its episode writers).

    Steps go through the writer's :class:`~mpreplay.frame_store.FrameStore`, which
    keeps them consecutive in a lane of their own (and compresses frames); each
    step's index in its episode is stored with it.  Once a sequence's last step is
    stored -- complete: with ``next_of``, its next observation too -- the sequence is
    opened in the table with its initial priority: R2D2's rule over the per-step
    priorities given with its steps, or the largest stored.  A flagged step (done or
    truncated) ends its episode.  A write publishes its steps and the sequences they
    complete together, or (raising) nothing: the writer then stands where it stood.
    """

    def __init__(self, spec: SequenceSpec, frames: FrameStore, flags: list[str]):
        self._spec = spec
        self._frames = frames
        self._flags = flags
        self._episode = _Episode(spec, 0)

    def write(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
        start_priorities: bool = False,
        resume: int = 0,
        open_end: bool = False,
    ) -> int | None:
        """Store ``k`` converted steps (as :meth:`FrameStore.write`); returns the slot of the first.

        ``start_priorities``: ``priorities`` are those of the sequences starting at each
        step (a saved buffer's), not per-step ones to fold; ``resume``: the episode begun
        at that step keeps none of its older steps; ``open_end``: ``end_episode`` ends it
        where the steps stop (see :meth:`FrameStore.write_rows`)."""
        flagged = self._flagged(k, rows)
        ends = np.flatnonzero(flagged)
        later = ends[ends + 1 < k] + 1  # the rows starting an episode after a flagged one
        # Each step's index in its episode: counting on in the open episode, from 0 after a flag.
        episode_first = np.zeros(k, dtype=np.int64)
        episode_first[later] = later
        np.maximum.accumulate(episode_first, out=episode_first)
        steps = np.arange(k, dtype=np.int64) - episode_first
        stored = self._episode.first + len(self._episode.slots)
        steps[episode_first == 0] += stored
        # Where this writer stores an episode's first step, so that a snapshot tells two
        # episodes of a lane apart even where the later one's episode_step goes on from the other's.
        starts = np.zeros(k, dtype=np.uint8)
        starts[later] = 1
        starts[:1] = stored == self._episode.start
        prio = np.full(k, np.nan) if priorities is None else np.asarray(priorities, dtype=np.float64)
        after: list[_Episode] = []

        def opening(slots: np.ndarray, generations: np.ndarray, waiting: int) -> tuple | None:
            # The steps' slots are known, nothing is published yet: cut a copy of the episode.
            episode, opened = self._cut(
                self._episode.copy(), k, slots, generations, prio, flagged, ends, end_episode, waiting, start_priorities
            )
            after.append(episode)
            if not opened:
                return None
            columns = list(zip(*opened, strict=True))
            return (
                np.array(columns[0], dtype=np.int64),
                np.array(columns[1], dtype=np.uint64),
                np.array(columns[2], dtype=np.int64),
                np.array(columns[3], dtype=np.float64),
            )

        slots, _ = self._frames.write_rows(
            k,
            rows,
            priorities,
            timeout,
            end_episode,
            {EPISODE_STEP_ARRAY: steps, EPISODE_START_ARRAY: starts},
            resume=resume,
            opening=opening,
            open_end=open_end,
        )
        self._episode = after[0]
        return int(slots[0]) if len(slots) else None

    def _cut(
        self,
        episode: _Episode,
        k: int,
        slots: np.ndarray,
        generations: np.ndarray,
        prio: np.ndarray,
        flagged: np.ndarray,
        ends: np.ndarray,
        end_episode: bool,
        waiting: int,
        start_priorities: bool,
    ) -> tuple[_Episode, list[tuple[int, int, int, float]]]:
        """Move ``episode`` past ``k`` steps stored in ``slots`` (``flagged`` per step, ``ends``
        the flagged ones): the episode after them (the next one, if they end it) and the
        sequences they complete, to open."""
        opened: list[tuple[int, int, int, float]] = []
        bounds = sorted({*(ends + 1).tolist(), k})
        a = 0
        for b in bounds:
            # Steps a..b-1: one episode's, ended by a flag, by end_episode, or still open.
            episode.slots += slots[a:b].tolist()
            episode.generations += generations[a:b].tolist()
            episode.priorities += prio[a:b].tolist()
            ended = (b > a and flagged[b - 1]) or (b == k and end_episode)
            complete = episode.first + len(episode.slots) - (0 if ended else waiting)
            self._open(episode, *episode.cutter.add(complete - episode.cutter.stored), opened, start_priorities)
            if ended:
                self._open(episode, *episode.cutter.end_episode(), opened, start_priorities)
                episode = _Episode(self._spec, 0)
            a = b
        return episode, opened

    def _flagged(self, k: int, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per row, whether its done or truncated flag ends its episode."""
        flagged = np.zeros(k, dtype=bool)
        for flag in self._flags if k else ():
            flagged |= rows[flag].reshape(k) != 0
        return flagged

    def _open(
        self, episode: _Episode, offsets: np.ndarray, steps: np.ndarray, opened: list, start_priorities: bool
    ) -> None:
        """List the sequences at episode ``offsets`` for opening, then forget the steps
        no later sequence starts at or before."""
        for offset, n in zip(offsets.tolist(), steps.tolist(), strict=True):
            i = offset - episode.first
            step_priorities = np.array(episode.priorities[i : i + n])
            if start_priorities:
                p = step_priorities[0]
            elif np.isnan(step_priorities).any():
                p = np.nan
            else:
                p = float(sequence_priority(step_priorities[None, :], eta=self._spec.eta)[0])
            opened.append((episode.slots[i], episode.generations[i], n, p))
        drop = min(len(episode.slots), max(0, episode.cutter.next_start - episode.first))
        if drop:
            del episode.slots[:drop], episode.generations[:drop], episode.priorities[:drop]
            episode.first += drop

    # -- loading a saved buffer's episodes --------------------------------------------
    @property
    def has_lane(self) -> bool:
        """Whether this writer holds a lane now."""
        return self._frames.has_lane

    def episode_slots(self, k: int, rows: Mapping[str, np.ndarray], first: int) -> int:
        """The slots a saved episode of ``k`` converted rows, the first step ``first``, takes
        when loaded; raises the ValueError its write would, or one for a flag that ends it
        before its last row.  Changes nothing."""
        early = np.flatnonzero(self._flagged(k, rows)[:-1])
        if early.size:
            raise ValueError(
                f"row {int(early[0])} of {k}: its {' or '.join(self._flags)} flag ends the episode before its last row"
            )
        return self._frames.episode_slots(k, rows, first)

    def claim_lane(self) -> int:
        """Hold a lane from now on (see :meth:`FrameStore.claim_lane`); returns its slots."""
        return self._frames.claim_lane()

    def sibling(self) -> SequenceStore:
        """Another writer of the same buffer in this process, holding no lane yet."""
        return SequenceStore(self._spec, self._frames.sibling(), self._flags)

    def load_episode(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None, first: int) -> None:
        """End the episode in progress, then store a saved episode whose first row is step
        ``first``, with the sequences it had (``priorities``: per row, those of the sequences
        starting there, or None); it ends.  See :func:`mpreplay.saved_episodes.load_episodes`."""
        self.write(0, {}, None, None, end_episode=True)
        self._episode = _Episode(self._spec, first)
        self.write(
            k,
            rows,
            priorities,
            None,
            end_episode=True,
            start_priorities=priorities is not None,
            resume=first,
            open_end=True,
        )

    def reset(self) -> None:
        """Forget the episode in progress and give the lane back (after a fork or clear)."""
        self._frames.reset()
        self._episode = _Episode(self._spec, 0)

    def release_lane(self) -> None:
        """Give this writer's lane back, for another writer (its steps stay)."""
        self._frames.release_lane()
