"""A buffer's rows in files: what ``save_transitions`` and ``load_transitions`` do.

:class:`BufferFiles` writes every stored transition through :mod:`mpreplay.fileformat` (a
compressed buffer's with its episodes, :mod:`mpreplay.saved_episodes`) and loads a file's
back through the buffer's write path.  A sequence buffer (:mod:`mpreplay.sequence_buffer`)
adds what it saves beside the rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import checks, fileformat
from ._ext.schema import DEPTH_ARRAY
from .buffer_core import BufferCore
from .compression import FrameWriter
from .saved_episodes import load_episodes, split_episodes, stack_age, transition_episodes
from .spec import FieldSpec, convert_batch

__all__ = ["BufferFiles"]

_DEPTH = "frames.depth"  # in the rows a compressed buffer's save copies: each slot's depth (no field's name)


class BufferFiles(BufferCore):
    """:class:`~mpreplay.buffer_core.BufferCore` with its rows saved to and loaded from files."""

    def save_transitions(self, file: Any, *, compress: bool = True, priorities: bool = False) -> None:
        """Write every stored transition, oldest first, to ``file`` in mpreplay's file format
        (:mod:`mpreplay.fileformat`).

        Parameters
        ----------
        file : path or binary file object
            A path is written atomically: the archive goes to a temporary file in
            the same folder, is flushed to disk, then renamed over ``file`` (no
            ``.npz`` suffix is added).  A file object is written in place.
        compress : bool
            Deflate the arrays (as ``np.savez_compressed``); else store them (as ``np.savez``).
        priorities : bool
            Also store each transition's priority (prioritized buffers only).

        Other processes may keep writing a shared buffer meanwhile: as in
        ``get_all_transitions``, the file holds every transition complete when the
        call started and not overwritten before its rows were copied, oldest first
        (lane by lane), with the priority each had when the call started.  A
        compressed buffer's file also numbers each transition's episode and names
        its lane (see :meth:`load_transitions`).
        """
        priorities = self._saved_priorities(priorities)
        if self._compression is None:
            rows, raw = self._snapshot(priorities=priorities)
            episodes = None
        else:
            rows, raw = self._snapshot(priorities=priorities, slots=True, copy=self._copy_rows_and_depths)
            slots, depths = rows.pop("indexes"), rows.pop(_DEPTH)
            episodes = transition_episodes(slots, self._lanes, depths)
        fileformat.write_transitions(
            file,
            rows,
            self._file_specs(),
            nstep=self._nstep_settings(),
            priorities=raw,
            episodes=episodes,
            compress=compress,
        )

    def _copy_rows_and_depths(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`_copy_rows`, and in ``rows[_DEPTH]`` each slot's earlier frames in its episode."""
        rows = self._copy_rows(slots)
        rows[_DEPTH] = self._memory.arrays[DEPTH_ARRAY][slots]
        return rows

    def _saved_priorities(self, priorities: Any) -> bool:
        """``save_transitions``'s ``priorities`` flag, checked (prioritized buffers only)."""
        priorities = checks.flag("priorities", priorities)
        if priorities and not self._PRIORITIZED:
            raise ValueError(f"priorities: a {type(self).__name__} has no priorities to save; pass priorities=False")
        return priorities

    def load_transitions(self, file: Any) -> int:
        """Append the transitions of a file written by :meth:`save_transitions`; returns how many.

        The whole file is read and checked first; if anything is wrong the buffer
        is left exactly as it was and :class:`~mpreplay.fileformat.TransitionFileError`
        (a ValueError) is raised.  Saved priorities are restored into a prioritized
        buffer and ignored by a uniform one; a prioritized buffer gives the
        transitions its default priority when the file has none.  Transitions saved
        by a buffer that folds n steps load, as they are, into one with the same
        ``size`` and ``gamma`` only.

        A compressed buffer (``next_of``, ``stack_compress``) ends its episode in progress
        and gives back each episode of a compressed buffer's file whole, in its lane and in
        the order saved: each saved lane goes through a lane of its own while lanes are free
        (this object's first, then lanes claimed for the call and given back after it); with
        fewer free lanes, or shorter ones, the episodes follow one another through the lanes
        there are, an episode never split.  A lane's oldest rows make room for loaded ones,
        but loaded rows never overwrite each other: a file the free lanes cannot hold raises
        ValueError, changing nothing.  Loaded episodes end.  A file without episodes (an
        uncompressed buffer's, or of format version 1) is stored as consecutive steps
        after the episode in progress, which then ends; ValueError, changing nothing, if it
        cannot be (a stack whose older frames were not saved, more slots than a lane holds).
        """
        self._check_open()
        rows, priorities = fileformat.read_transitions(
            file, self._specs, nstep=self._nstep_settings(), episodes=None if self._compression is not None else False
        )
        if not self._PRIORITIZED:
            priorities = None
        ids, lanes = rows.pop(fileformat.EPISODE_ID, None), rows.pop(fileformat.EPISODE_LANE, None)
        k, rows = convert_batch(self._specs, rows)
        if k == 0:
            return 0
        if ids is not None:
            # The file records no step per row: an episode whose oldest rows were overwritten
            # before the save resumes from the older frames its first row's stacks hold.
            compression, writer = self._compression, self._path.store
            # Episodes are read only for a compressed buffer (episodes=None above), each with its lane.
            assert compression is not None and isinstance(writer, FrameWriter) and lanes is not None
            episodes = split_episodes(ids, lanes, lambda row: stack_age(rows, row, compression.stack))
            load_episodes(writer, rows, priorities, episodes)
            return k
        # What add() does, minus two things: n-step rows were folded before they
        # were saved and must not be folded again, and the rows end an episode so
        # that a compressed buffer publishes the last one rather than waiting for
        # a successor that is not in the file.
        self._path.load(k, rows, priorities)
        return k

    def _file_specs(self) -> dict[str, FieldSpec]:
        """The fields a file of this buffer's rows holds."""
        return self._specs

    def _nstep_settings(self) -> tuple[int, float] | None:
        """``(size, gamma)`` of the n-step folding of the stored rows, or None."""
        return None if self._nstep is None else self._nstep.settings
