"""A compressed writer's waiting rows, kept so that its episode can move within its lane.

In a table whose remover keeps unread items (a compressed Queue or Stack), the run at a writer's
cursor may hold items that nobody will read soon -- a Stack draws its newest first, so its oldest
stay -- while the rest of the lane is free.  An episode's frames lie consecutive, and the rows
waiting for their next frame read the frames just behind the cursor, so the writer cannot skip
ahead alone: it moves the episode.  It writes its waiting rows again, as an episode resumed at the
first one's step (their stacks hold the older frames they read, which take slots of their own),
then the new rows, into the first run of its lane past the cursor that no unread item needs
(``TableHandle.reserve_room``).  The rows it leaves behind were never items -- their next frame
never came -- and are replaced like any other slot that holds none.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["WaitingRows"]


class WaitingRows:
    """Copies of the rows a compressed writer's episode has waiting for their next frame, and
    their priorities (NaN: none given, the stored maximum)."""

    def __init__(self) -> None:
        self._rows: dict[str, np.ndarray] = {}
        self._priorities = np.empty(0)

    def forget(self) -> None:
        """Keep nothing: the episode ended, moved or started over."""
        self._rows, self._priorities = {}, np.empty(0)

    def __len__(self) -> int:
        return len(self._priorities)

    def after(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None) -> tuple:
        """``(k, rows, priorities)`` of the waiting rows followed by ``k`` new ones: what a moved
        episode writes."""
        given = np.full(k, np.nan) if priorities is None else priorities
        joined_priorities = np.concatenate([self._priorities, given])
        if not len(self):
            joined = dict(rows)
        elif not k:
            joined = dict(self._rows)
        else:
            joined = {name: np.concatenate([self._rows[name], np.asarray(rows[name])]) for name in self._rows}
        return len(self) + k, joined, None if np.isnan(joined_priorities).all() else joined_priorities

    def keep(self, k: int, rows: Mapping[str, np.ndarray], priorities: np.ndarray | None, waiting: int) -> None:
        """After a write of ``k`` rows that leaves ``waiting`` rows waiting, keep the newest of the
        rows kept before followed by these."""
        k, rows, priorities = self.after(k, rows, priorities)
        self._priorities = np.array(priorities[k - waiting :] if priorities is not None else np.full(waiting, np.nan))
        self._rows = {name: np.array(values[k - waiting :]) for name, values in rows.items()} if waiting else {}
