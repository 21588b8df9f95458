"""A saved buffer's episodes: numbered in its file, loaded back each in a lane.

A compressed transition buffer (``next_of``, ``stack_compress``) and a sequence
buffer keep each episode's rows consecutive in one writer's lane, and a
compressed row is rebuilt from the rows around it in its episode.  Their files
(:mod:`mpreplay.fileformat`, ``"episodes": true``) so number each row's episode
and name its lane (:func:`number_episodes`, :func:`transition_episodes`), and
:func:`load_episodes` gives every episode back whole: each is checked and
planned first, changing nothing, then the lanes they go through are claimed,
then they are written -- a file that is bad or does not fit changes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from ._ext.schema import LANE_END, LANE_START
from .fileformat import TransitionFileError

__all__ = [
    "EpisodeStore",
    "SavedEpisode",
    "lanes_of",
    "load_episodes",
    "number_episodes",
    "split_episodes",
    "stack_age",
    "transition_episodes",
]

_MAX_DEPTH = np.iinfo(np.uint8).max  # a slot's depth (its earlier frames in its episode) stops counting there


class SavedEpisode(NamedTuple):
    """One episode of a saved buffer (or what its lane kept of it): rows ``start`` to ``stop - 1``
    of the file, saved from lane ``lane``; its first row is step ``first`` of the episode."""

    lane: int
    start: int
    stop: int
    first: int


class EpisodeStore(Protocol):
    """What loading needs of a buffer's store of episodes in lanes (a :class:`~mpreplay.frame_store.FrameStore`
    or a :class:`~mpreplay.sequences.SequenceStore`)."""

    @property
    def has_lane(self) -> bool:
        """Whether it holds a lane now."""

    def claim_lane(self) -> int:
        """Hold a lane from now on; returns its slots.  ValueError when every lane has a live writer."""

    def release_lane(self) -> None:
        """Give its lane back (its rows stay)."""

    def sibling(self) -> EpisodeStore:
        """Another writer of the same buffer in this process, holding no lane yet."""

    def episode_slots(self, k: int, rows: Mapping[str, np.ndarray], first: int) -> int:
        """The slots a saved episode of ``k`` converted rows, the first step ``first``, takes when
        loaded; raises the ValueError its write would.  Changes nothing."""

    def load_episode(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None, first: int) -> None:
        """End the episode in progress, then store a saved episode whose first row is step
        ``first``; it ends."""


# -- saving ---------------------------------------------------------------------------------------
def lanes_of(slots: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """The lane of each of ``slots`` (``lanes``: the buffer's lane table)."""
    return np.searchsorted(lanes[:, LANE_START], slots, side="right") - 1


def number_episodes(lane: np.ndarray, begins: np.ndarray) -> np.ndarray:
    """``episode.id`` of a snapshot's rows, listed lane by lane and oldest first (``lane``: each
    row's): an episode begins where a lane's rows do and at each row where ``begins`` is set."""
    first = np.asarray(begins, dtype=bool).copy()
    first[:1] = True
    first[1:] |= lane[1:] != lane[:-1]
    return np.cumsum(first) - 1


def transition_episodes(slots: np.ndarray, lanes: np.ndarray, depths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(episode.id, episode.lane)`` of a compressed transition buffer's snapshot: ``slots``
    listed lane by lane, oldest first (``lanes``: the buffer's lane table), ``depths`` each
    row's earlier frames in its episode (as the buffer stores them, at most 255).

    An episode's rows fill consecutive slots of its lane with depths counting up by one, so an
    episode begins after a slot that is not listed (an episode's last next frame or frames, the
    older frames of a loaded episode's first row, a row overwritten or waiting) and where the depth
    does not count on (a writer's step 0)."""
    lane = lanes_of(slots, lanes)
    width = (lanes[:, LANE_END] - lanes[:, LANE_START])[lane]
    depths = depths.astype(np.int64)
    begins = np.zeros(len(slots), dtype=bool)
    begins[1:] = ((slots[1:] - slots[:-1]) % width[1:] != 1) | (depths[1:] != np.minimum(depths[:-1] + 1, _MAX_DEPTH))
    return number_episodes(lane, begins), lane


# -- loading ----------------------------------------------------------------------------------------
def split_episodes(ids: np.ndarray, lanes: np.ndarray, first: Callable[[int], int]) -> list[SavedEpisode]:
    """The episodes of a file's rows (``ids``, ``lanes``: its ``episode.id`` and ``episode.lane``,
    checked by :mod:`mpreplay.fileformat`); ``first(row)``: which step of its episode ``row``, an
    episode's first row in the file, is."""
    bounds = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), len(ids)]
    return [SavedEpisode(int(lanes[a]), a, b, first(a)) for a, b in itertools.pairwise(bounds)]


def stack_age(rows: Mapping[str, np.ndarray], row: int, keys: Sequence[str]) -> int:
    """The fewest earlier steps of its episode from which the stacks of row ``row`` (``keys``: the
    stacked fields, stack axis last) rebuild exactly: a stack of ``s`` frames whose ``same`` oldest
    positions hold one frame rebuilds as step ``s - same`` (the episode's first frame repeated in
    the positions older than the episode).  0 where every stack holds one frame.

    A transition file records no step per row: each episode's first row is loaded as this step,
    from the older frames its stacks hold."""
    age = 0
    for key in keys:
        positions = np.moveaxis(rows[key][row], -1, 0)
        oldest = positions[0].tobytes()  # byte for byte, as the planner compares
        same = 1
        while same < len(positions) and positions[same].tobytes() == oldest:
            same += 1
        age = max(age, len(positions) - same)
    return age


def load_episodes(
    store: EpisodeStore,
    rows: Mapping[str, np.ndarray],
    priorities: np.ndarray | None,
    episodes: Sequence[SavedEpisode],
) -> list[int]:
    """Store a saved buffer's ``episodes`` (``rows``: the file's converted rows; ``priorities``:
    per row, or None) through ``store`` and stores claimed for the call, each episode ended;
    returns the episodes' indexes in the order they were stored.

    Every episode is planned first (TransitionFileError naming it for rows its write would
    refuse).  Then each saved lane goes through a lane of its own while lanes are free --
    ``store``'s first (its episode in progress ends), then lanes claimed for the call
    (``store.sibling()``) and given back after it -- its episodes one after another, as saved.
    An episode that finds no room left there goes to a newly claimed lane or, when none is free,
    to the first lane taken with room for it.  An episode is never split, and no loaded row
    overwrites another: when the episodes do not fit, ValueError is raised before anything is
    stored, every lane claimed given back.
    """
    slots = []
    for e, episode in enumerate(episodes):
        a, b = episode.start, episode.stop
        try:
            slots.append(store.episode_slots(b - a, _rows(rows, a, b), episode.first))
        except ValueError as exc:
            raise TransitionFileError(f"file: episode {e} (rows {a} to {b - 1}): {exc}") from exc
    placed = _place(store, episodes, slots)
    written = []
    try:
        for lane_store, taken in placed:
            for e in taken:
                a, b = episodes[e].start, episodes[e].stop
                lane_store.load_episode(
                    b - a, _rows(rows, a, b), None if priorities is None else priorities[a:b], episodes[e].first
                )
                written.append(e)
    finally:
        for lane_store, _ in placed[1:]:
            lane_store.release_lane()
    return written


def _rows(rows: Mapping[str, np.ndarray], a: int, b: int) -> dict[str, np.ndarray]:
    return {name: r[a:b] for name, r in rows.items()}


def _place(
    store: EpisodeStore, episodes: Sequence[SavedEpisode], slots: Sequence[int]
) -> list[tuple[EpisodeStore, list[int]]]:
    """Claim the lanes ``episodes`` go through (see :func:`load_episodes`); returns per lane its
    writer (``store`` first) and the episodes it takes.  Raises ValueError, every lane claimed
    here given back, when they do not fit."""
    placed: list[tuple[EpisodeStore, list[int]]] = []
    widths: list[int] = []
    rooms: list[int] = []  # per lane, the slots it has left for loaded rows
    had_lane, free, current = store.has_lane, True, -1
    try:
        for e, (episode, need) in enumerate(zip(episodes, slots, strict=True)):
            if e == 0 or episode.lane != episodes[e - 1].lane or rooms[current] < need:
                current = _take_lane(store, placed, widths, rooms) if free else -1
                free = current >= 0
                if current < 0 or rooms[current] < need:
                    current = next((i for i, room in enumerate(rooms) if room >= need), -1)
                if current < 0:
                    raise ValueError(
                        f"load_transitions: no room for the file's episode {e} (rows {episode.start} to "
                        f"{episode.stop - 1}, {need} slots): the {len(widths)} lane(s) of "
                        f"{', '.join(map(str, widths)) or 'no'} slots this buffer could give it have at most "
                        f"{max(rooms, default=0)} left; load into a buffer with more or longer lanes "
                        "(lanes=, size=), or with fewer writers holding lanes"
                    )
            rooms[current] -= need
            placed[current][1].append(e)
    except BaseException:
        for lane_store, _ in placed:
            if lane_store is not store or not had_lane:
                lane_store.release_lane()
        raise
    return placed


def _take_lane(
    store: EpisodeStore, placed: list[tuple[EpisodeStore, list[int]]], widths: list[int], rooms: list[int]
) -> int:
    """Claim one more lane for a load (``store``'s first); returns its index, or -1 when none is free."""
    lane_store = store if not placed else store.sibling()
    try:
        width = lane_store.claim_lane()
    except ValueError:  # every lane has a live writer
        return -1
    placed.append((lane_store, []))
    widths.append(width)
    rooms.append(width)
    return len(placed) - 1
