"""One write path for every buffer: steps in, through the stages the buffer is built with, into its store.

::

    add(steps) ─► [NstepStage: n-step rows and their priorities] ─► rows converted and checked ─► store
    on_episode_end ─► [NstepStage: the pending steps' rows] ──────────────────────────────────► store (end)
    load_transitions (rows already folded) ────────────────────────────────────────────────────► store (end)

The store is one of three parts with one interface (:class:`Store`): :class:`RowStore`
(fields side by side, one lane), :class:`~mpreplay.frame_store.FrameStore` (``next_of``,
``stack_compress``: frames once, in a lane per writer) or
:class:`~mpreplay.sequences.SequenceStore` (a frame writer that also opens the sequences
the steps complete).  The buffer names its parts; this module puts them in a line.

Every write is all or nothing: the stages only preview, the store raises before it
publishes anything, and the stages commit once the store returns -- so an add that raises
(bad input, TimeoutError, BufferClosed) can be made again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from . import checks
from ._ext.gate import deadline
from ._ext.selector import Selector
from ._ext.table_handle import TableHandle
from .errors import warn_rows_dropped
from .frame_store import FrameStore
from .nstep_stage import NstepStage
from .saved_episodes import EpisodeStore, SavedEpisode, load_episodes
from .spec import FieldSpec, convert_batch

__all__ = ["RowStore", "Store", "WritePath"]


class Store(Protocol):
    """Where a write path puts converted rows (see the module's docstring)."""

    def write(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
    ) -> int | None:
        """Store ``k`` converted rows (``end_episode``: and end their episode); returns the
        slot of the first, or None when none was stored yet.  All or nothing."""

    def reset(self) -> None:
        """Forget the episode in progress and give the lane back (after a fork or clear)."""

    def release_lane(self) -> None:
        """Give this writer's lane back, for another writer (its rows stay)."""


class RowStore:
    """The store of a buffer without compression: rows, fields side by side, copied in one
    reservation into the next slots of its one lane -- or, in a Queue or a Stack, into
    whichever slots hold no unread row."""

    def __init__(self, handle: TableHandle, fields: Mapping[str, np.ndarray]):
        self._handle = handle
        self._fields = fields

    def write(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
    ) -> int | None:
        """Store ``k`` converted rows (an episode's end needs nothing here: no row waits)."""
        if not k and end_episode:
            return None
        size = self._handle.size
        skip = 0
        if k > size:
            # Only the newest `size` rows would survive: skip the others, in the
            # same reservation (of every slot) that takes the newest.
            skip = k - size
            rows = {n: r[skip:] for n, r in rows.items()}
            priorities = None if priorities is None else priorities[skip:]
            k = size
        until = deadline(timeout)
        reservation = self._handle.reserve(k, until, skip=skip, scatter=True)
        try:
            if reservation.scattered:  # a queue's rows: into whichever slots were free
                for name, dst in self._fields.items():
                    dst[reservation.slots] = rows[name]
            else:
                start = reservation.start
                head = min(k, size - start)
                for name, dst in self._fields.items():
                    src = rows[name]
                    dst[start : start + head] = src[:head]
                    dst[: k - head] = src[head:]
        except BaseException:
            reservation.abandon()
            raise
        reservation.publish(priorities, deadline=until)
        if skip:  # said once the rows are stored: a write that raised dropped nothing
            warn_rows_dropped(size + skip, size)
        # The slot of the first row: where a skipped one would have gone.
        return reservation.start if reservation.scattered else (reservation.start - skip) % size

    def reset(self) -> None:
        """Nothing to forget: a row store keeps no episode."""

    def release_lane(self) -> None:
        """Nothing to give back: every writer shares the one lane."""


class WritePath:
    """A writer's path from steps to its store: an optional :class:`NstepStage`, the
    conversion and checks of rows and priorities, the store (see the module's docstring)."""

    def __init__(
        self,
        specs: Mapping[str, FieldSpec],
        store: Store,
        handle: TableHandle,
        nstep: NstepStage | None,
        selector: Selector,
        episodes: EpisodeStore | None = None,
    ):
        """``selector``: the table's, which gives a folded row that got NaN its priority when
        stored (``new_item_priority``: the largest stored now).  ``episodes``: the store, where
        it keeps episodes in lanes (a compressed or sequence table's), through which a file's
        episodes load."""
        self.store = store
        self.nstep = nstep
        self._specs = specs
        self._handle = handle
        self._selector = selector
        self._episodes = episodes

    def add(self, fields: dict[str, Any], priorities: Any, timeout: float | None) -> int:
        """What ``add`` stores: the rows ``fields``' steps complete, with ``priorities``
        (None: the largest stored; one float for all, or one per step).  Returns the slot
        of the first row stored, or -1 when the steps completed none."""
        if self.nstep is not None:
            rows, folded, commit = self.nstep.preview_add(fields, priorities, self._handle.check_priorities)
            slot = self._store_converted(rows, folded, timeout, False)
            commit()
            return -1 if slot is None else slot
        # Rows the kernel stores as they are never get here (TableHandle.add_rows, called by
        # the table's add): these need numpy's conversions, or raise.
        if type(priorities) is float:
            # One number for all rows: named as a number, not as a position of an array.
            checks.number("priorities", priorities, low=0.0, high=self._handle.max_priority)
        k, rows = convert_batch(self._specs, fields)
        if priorities is not None:
            # Checked before anything is written (TableHandle.update checks its own input).
            priorities = checks.priorities("priorities", priorities, k, max_priority=None)
            self._handle.check_priorities(priorities)
        slot = self.store.write(k, rows, priorities, timeout)
        return -1 if slot is None else slot

    def end_episode(self, timeout: float | None) -> None:
        """What ``on_episode_end`` stores: the rows of the pending steps (n-step), the last
        next observation (compressed), and the end of the episode."""
        if self.nstep is None:
            self.store.write(0, {}, None, timeout, end_episode=True)
            return
        rows, folded, commit = self.nstep.preview_episode_end()
        self._store_converted(rows, folded, timeout, True)
        commit()

    def load_episodes(
        self,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        episodes: Sequence[SavedEpisode],
        order: np.ndarray | None = None,
    ) -> None:
        """Store a saved table's ``episodes`` of converted ``rows`` (already folded), each whole,
        in lanes of their own while lanes are free (see :func:`~mpreplay.saved_episodes.load_episodes`).

        ``order``: each row's place in the order the saving table's selector was given them (a
        permutation), which an ordered selector then draws by.  (Rows other writers insert while
        a file loads may take places among the file's.)"""
        if self._episodes is None:
            raise ValueError("load_transitions: this table keeps no episodes in lanes; its files hold none")
        written = load_episodes(self._episodes, rows, priorities, episodes)
        if order is not None:
            loaded = order[np.concatenate([np.arange(episodes[e].start, episodes[e].stop) for e in written])]
            ranks = np.empty(len(loaded), dtype=np.int64)
            ranks[np.argsort(loaded, kind="stable")] = np.arange(len(loaded))
            self._handle.reorder_last(ranks)

    def load(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None) -> None:
        """Store ``k`` converted rows of a saved buffer: already folded, and ending an episode
        (so that a compressed store publishes the last row rather than wait for its successor)."""
        self.store.write(k, rows, priorities, None, end_episode=True)

    def _store_converted(
        self, rows: dict[str, np.ndarray], priorities: np.ndarray | None, timeout: float | None, end_episode: bool
    ) -> int | None:
        """Store what the n-step stage emitted; None when it emitted nothing."""
        k, converted = convert_batch(self._specs, rows)
        if priorities is not None and np.isnan(priorities).any():
            priorities = np.where(np.isnan(priorities), float(self._selector.new_item_priority), priorities)
        return self.store.write(k, converted, priorities, timeout, end_episode) if k or end_episode else None

    @property
    def plain(self) -> bool:
        """Whether steps go to the kernel as they are: no stage before a :class:`RowStore`.  A
        path that is not keeps state between the steps of an episode, its writer's own."""
        return self.nstep is None and isinstance(self.store, RowStore)

    @property
    def frames(self) -> FrameStore | None:
        """The frame store steps go to as they are (no stage before it, no sequences), whose
        episode the kernel plans them after; else None."""
        return self.store if self.nstep is None and type(self.store) is FrameStore else None

    def forget(self) -> None:
        """Drop the pending steps and the episode in progress (after a fork or clear)."""
        if self.nstep is not None:
            self.nstep.clear()
        self.store.reset()
