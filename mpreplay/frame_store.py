"""The writing side of a compressed table (``next_of``, ``stack_compress``): a writer's
:class:`FrameStore`.

Each writer -- a process's table handle, or one of its episode writers
(``Table.episode_writer``) -- keeps its own store and fills its own lane, so consecutive
steps of an episode sit in consecutive slots (see :mod:`mpreplay.compression`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping

import numpy as np

from ._ext.episode import Episode
from ._ext.frame_planner import FramePlan, FramePlanner
from ._ext.gate import deadline
from ._ext.schema import DEPTH_ARRAY, LANE_END, LANE_START, LANES_ARRAY, NEXT_ARRAY, field_array, frames_array
from ._ext.table_handle import TableHandle
from .compression import MAX_NEXT, Compression
from .spec import FieldSpec
from .waiting_rows import WaitingRows

__all__ = ["FrameStore"]

# How long a keep-unread writer waits for the run at its cursor before it looks for room elsewhere
# again (it moves its episode there: see mpreplay/waiting_rows.py).
_LOOK_AGAIN = 0.05


class FrameStore:
    """The writing side of a compressed buffer, private to one process.

    Plans each batch in full first -- checking every stack and next
    observation, so a bad batch changes nothing -- then writes it through
    the ring in one reservation.
    """

    def __init__(
        self,
        compression: Compression,
        specs: Mapping[str, FieldSpec],
        handle: TableHandle,
        arrays: Mapping[str, np.ndarray],
    ):
        self._start(compression, specs, handle, arrays)

    def _start(
        self,
        compression: Compression,
        specs: Mapping[str, FieldSpec],
        handle: TableHandle,
        arrays: Mapping[str, np.ndarray],
    ) -> None:
        # What __init__ sets, and reset() sets again.
        self._c = compression
        self._specs = specs
        self._handle = handle
        self._arrays = arrays  # the buffer's memory: lanes, nxt, depth, frames and the stored fields
        self._release_lane: weakref.finalize | None = None
        self._keys = compression.keys
        self._next_keys = [(q, key) for q, key in enumerate(self._keys) if key in compression.next_of]
        self._stacked = [key in compression.stack for key in self._keys]
        # Per key, the axes of a batch with the stack axis moved right after the rows'.
        self._frames_first = [(0, len(specs[key].shape)) + tuple(range(1, len(specs[key].shape))) for key in self._keys]
        self._stored = compression.stored_fields(specs)
        self._flag_names = [name for name in (compression.done, compression.truncated) if name is not None]
        self._planner = FramePlanner(
            [
                (
                    key,
                    specs[key].row_nbytes,
                    specs[key].dtype.itemsize,
                    compression.stack_of(key, specs),
                    key in compression.next_of,
                )
                for key in self._keys
            ],
            MAX_NEXT,
        )
        # The episode in progress: what the next rows are checked against, copied.  The
        # table's add hands it to the kernel with the rows (ext/calls.pyx): read it each call.
        self.episode = self._new_episode()
        # A keep-unread table's writer moves its episode where the lane has room (see _reserve).
        self._waiting = WaitingRows() if handle.keeps_unread else None
        self._between: Episode | None = None  # a writer's state between episodes, for episode_slots

    def _new_episode(self) -> Episode:
        keys, arrays = self._keys, self._arrays
        return Episode(
            self._planner,
            [arrays[frames_array(key)] for key in keys],
            arrays[NEXT_ARRAY],
            arrays[DEPTH_ARRAY],
            tuple(self._specs[key].shape for key in keys),
            tuple(self._specs[key].dtype for key in keys),
            tuple(self._flag_names),
        )

    def sibling(self) -> FrameStore:
        """Another writer of the same buffer in this process: its own episode, and its own lane once it writes."""
        return FrameStore(self._c, self._specs, self._handle, self._arrays)

    # -- planning ---------------------------------------------------------------
    def _rows(self, k: int, rows: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        """Field ``name`` of the rows as one C-contiguous block (``rows`` may be empty when k == 0)."""
        if k == 0:
            return np.empty((0,) + self._specs[name].shape, dtype=self._specs[name].dtype)
        return np.ascontiguousarray(rows[name])

    def _observations(self, k: int, rows: Mapping[str, np.ndarray], name: str, q: int) -> tuple[np.ndarray, bool]:
        """Field ``name`` of the rows as ``(array, planar)`` for the kernel, copied only if it must be.

        A stack whose frames are each contiguous and follow one another (a channels-first stack
        seen through ``np.moveaxis``) is passed planar, as ``(k, stack, ...)``; otherwise in C order.
        """
        values = rows[name] if k else self._rows(k, rows, name)
        if self._stacked[q] and not values.flags.c_contiguous:
            planar = values.transpose(self._frames_first[q])
            if planar.flags.c_contiguous:
                return planar, True
        return np.ascontiguousarray(values), False

    def _flags(self, k: int, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per row, True if its done or truncated flag is set."""
        if not k or not self._flag_names:
            return np.zeros(k, dtype=bool)
        flags = rows[self._flag_names[0]].reshape(k) != 0
        for name in self._flag_names[1:]:
            flags |= rows[name].reshape(k) != 0
        return flags

    def plan(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        end_episode: bool,
        resume: int = 0,
        episode: Episode | None = None,
        open_end: bool = False,
    ) -> FramePlan:
        """Lay out ``k`` converted rows (and, with ``end_episode``, the end of their episode)
        after ``episode`` (None: the writer's).

        A flagged row (done or truncated) ends its episode, together with the
        flagged rows right after it that share its next observation.  ``resume`` > 0:
        the first row is that step of an episode none of whose older steps are stored;
        ``open_end``: ``end_episode`` ends it where the rows stop, which may be before it
        did (see :meth:`write_rows`).  Raises ValueError, changing nothing, when a stack or
        next observation cannot be rebuilt bit for bit (the checks run in
        ``ext/frame_planner.pyx``).
        """
        obs = [self._observations(k, rows, key, q) for q, key in enumerate(self._keys)]
        nexts: list[tuple[np.ndarray, bool] | None] = [None] * len(self._keys)
        for q, key in self._next_keys:
            nexts[q] = self._observations(k, rows, f"next_{key}", q)
        episode = self.episode if episode is None else episode
        return episode.plan(k, obs, nexts, self._flags(k, rows), end_episode, resume, open_end)

    def episode_slots(self, k: int, rows: Mapping[str, np.ndarray], resume: int = 0) -> int:
        """The slots ``k`` converted rows of one saved episode take when a writer between episodes
        writes them and ends the episode (as :meth:`load_episode`).  Raises its ValueError for rows
        it would refuse; changes nothing."""
        if self._between is None:
            self._between = self._new_episode()
        return self.plan(k, rows, True, resume, self._between, open_end=True).items

    # -- writing ----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """The newest rows written that wait for the frame of their next observation."""
        return self.episode.waiting

    def write(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
    ) -> int | None:
        """Store ``k`` converted rows; returns the slot of the first, or None."""
        slots, _ = self.write_rows(k, rows, priorities, timeout, end_episode)
        return int(slots[0]) if len(slots) else None

    def write_rows(
        self,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
        meta: Mapping[str, np.ndarray] | None = None,
        resume: int = 0,
        opening: Callable[[np.ndarray, np.ndarray, int], tuple | None] | None = None,
        open_end: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Store ``k`` converted rows; returns the slot of each row and the generation it
        was published with.  ``meta`` maps per-slot arrays of the buffer's memory to a
        value per row, written with the rows (before they are published).  ``opening``
        (a sequence table's writer) is called with those slots and generations and the
        rows left waiting for their next observation, before anything is published; the
        sequences it returns, as for :meth:`TableHandle.publish`, open with the rows.

        ``resume`` > 0 (a writer between episodes only): the first row is that step of an
        episode whose older steps are not stored (a saved buffer's oldest kept step); the
        older frames its stacks read are stored before it, in slots never sampled.
        ``open_end`` (with ``end_episode``): the episode ends where the rows stop, which may be
        before it did (a saved episode, open when saved); the frames of the steps its rows'
        next observations reach past its last row (n, folded n steps ahead) are stored after
        it, in slots never sampled.

        All or nothing: a call that raises (bad rows, TimeoutError, BufferClosed) leaves the
        episode as it was and stores nothing, so the same call can be made again."""
        plan = self.plan(k, rows, end_episode, resume, open_end=open_end)
        until = deadline(timeout)
        claimed = not self.has_lane
        self._claim(until)
        try:
            return self._write_plan(plan, k, rows, priorities, until, meta, opening, end_episode)
        except BaseException:
            if claimed:
                self.release_lane()  # as if never claimed
            raise

    def _write_plan(
        self,
        plan: FramePlan,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        until: float,
        meta: Mapping[str, np.ndarray] | None,
        opening: Callable[[np.ndarray, np.ndarray, int], tuple | None] | None,
        end_episode: bool,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reserve, copy and publish what ``plan`` laid out, then move the episode past it."""
        lane = self.episode.lane
        lo, hi = self._arrays[LANES_ARRAY][lane, [LANE_START, LANE_END]]
        if plan.items > hi - lo:
            raise ValueError(f"add: {plan.items} slots at once exceed the lane's {hi - lo}; add fewer rows per call")
        if priorities is not None:
            priorities = np.ascontiguousarray(priorities, dtype=np.float64)
        if self._waiting is None or meta is not None or opening is not None:
            episode, reservation = self.episode, self._handle.reserve(plan.items, until, True, lane)
        else:
            moved = self._reserve(plan, k, rows, priorities, until, end_episode)
            plan, episode, k, rows, priorities, reservation = moved
        if not plan.items:  # what the write completes, or the sequences it ends, only
            sequences = (
                None if opening is None else opening(np.empty(0, np.int64), np.empty(0, np.uint64), plan.waiting)
            )
            reservation.publish(deadline=until, sequences=sequences)
            self._advance(episode, plan, None, None, k, rows, priorities)
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        slots, reserved = reservation.slots, reservation.reserved
        try:
            episode.store.copy(
                plan,
                slots,
                [self._arrays[field_array(name)] for name in self._stored],
                [self._rows(k, rows, name) for name in self._stored],
            )
            row_items = plan.row_items
            row_slots, row_generations = slots[row_items], reserved[row_items] + np.uint64(1)
            for name, values in (meta or {}).items():
                self._arrays[name][row_slots] = values
            states, prio, complete, generations, complete_priorities = episode.publication(plan, slots, priorities)
            sequences = None if opening is None else opening(row_slots, row_generations, plan.waiting)
        except BaseException:
            reservation.abandon()
            raise
        # Rows published WAITING by earlier calls complete with this publication.
        reservation.publish(prio, states, until, complete, generations, complete_priorities, sequences)
        self._advance(episode, plan, slots, reserved, k, rows, priorities)
        return row_slots, row_generations

    def _reserve(
        self,
        plan: FramePlan,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
        until: float,
        end_episode: bool,
    ) -> tuple:
        """A keep-unread table's reservation: the run at the cursor for ``plan``, or -- while
        unread items hold that run and the lane has room elsewhere -- a run there for the
        episode moved (see mpreplay/waiting_rows.py).  Returns ``(plan, episode, k, rows,
        priorities, reservation)`` of the write to make."""
        assert self._waiting is not None
        handle, episode, moved = self._handle, self.episode, None
        while True:
            try:
                look_again = min(until, time.monotonic() + _LOOK_AGAIN)
                return plan, episode, k, rows, priorities, handle.reserve(plan.items, look_again, True, episode.lane)
            except TimeoutError:
                if moved is None:
                    moved_k, moved_rows, moved_priorities = self._waiting.after(k, rows, priorities)
                    elsewhere = self._new_episode()
                    elsewhere.lane = episode.lane
                    first = episode.t - episode.waiting  # the step of the first waiting row
                    moved_plan = self.plan(moved_k, moved_rows, end_episode, first, elsewhere)
                    moved = (moved_plan, elsewhere, moved_k, moved_rows, moved_priorities)
                reservation = handle.reserve_room(moved[0].items, until, episode.lane)
                if reservation is not None:
                    self._waiting.forget()
                    return (*moved, reservation)
                if time.monotonic() >= until:
                    raise

    def _advance(
        self,
        episode: Episode,
        plan: FramePlan,
        slots: np.ndarray | None,
        reserved: np.ndarray | None,
        k: int,
        rows: Mapping[str, np.ndarray],
        priorities: np.ndarray | None,
    ) -> None:
        """Move ``episode`` -- the writer's from now on -- past what ``plan`` wrote."""
        episode.advance(plan, slots, reserved, priorities)
        self.episode = episode
        if self._waiting is not None:
            self._waiting.keep(k, rows, priorities, episode.waiting)

    def _claim(self, until: float) -> int:
        """This writer's lane, claimed now if it has none (ValueError when every lane has a live writer)."""
        episode = self.episode
        if episode.lane < 0:
            episode.lane = self._handle.claim_lane(until)
            # No other writer of this process may take the lane while it is claimed: a
            # writer dropped without close() gives it back when it is collected.
            self._release_lane = weakref.finalize(self, self._handle.release_lane, episode.lane)
        return episode.lane

    @property
    def has_lane(self) -> bool:
        """Whether this writer holds a lane now."""
        return self.episode.lane >= 0

    def claim_lane(self, timeout: float | None = None) -> int:
        """Hold a lane from now on (one claimed now if this writer has none); returns its slots.
        Raises ValueError when every lane has a live writer."""
        lo, hi = self._arrays[LANES_ARRAY][self._claim(deadline(timeout)), [LANE_START, LANE_END]]
        return int(hi - lo)

    def load_episode(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None, first: int) -> None:
        """End the episode in progress, then store ``k`` converted rows of a saved episode whose
        first row is step ``first`` (resumed there, see :meth:`write_rows`); it ends where its rows
        stop (``open_end``: it may have been open when saved)."""
        self.write_rows(0, {}, None, None, end_episode=True)
        self.write_rows(k, rows, priorities, None, end_episode=True, resume=first, open_end=True)

    def reset(self) -> None:
        """Forget the episode in progress and give the lane back (after a fork or clear).

        In a forked child the lane is the parent's: giving it back changes nothing."""
        self.release_lane()
        self._start(self._c, self._specs, self._handle, self._arrays)

    def release_lane(self) -> None:
        """Give this writer's lane back, for another writer (its rows stay)."""
        if self._release_lane is not None:
            self._release_lane()
        self._release_lane = None
        self.episode.lane = -1
