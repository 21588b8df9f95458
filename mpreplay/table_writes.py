"""The write side of :class:`mpreplay.Table`: the store its rows go to, episodes' ends, a
writer's pending steps, ``clear`` and loading files.

Each function here is what a method of :class:`~mpreplay.Table` of the same name does, taking
the table; the method states the signature and takes its docstring from here.
``add`` itself is the compiled call of every step (``ext/calls.pyx``): what it cannot store in
one kernel call it hands to ``_add``, the table's write path (:mod:`mpreplay.write_path`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from . import checks
from .errors import read_only
from .frame_store import FrameStore
from .nstep_stage import NstepStage
from .saved_episodes import EpisodeStore
from .sequences import SequenceStore
from .table_files import load_table
from .write_path import RowStore, Store

if TYPE_CHECKING:
    from .table import Table

__all__ = [
    "add_rows",
    "clear",
    "load_transitions",
    "load_writer_state_dict",
    "make_store",
    "on_episode_end",
    "writer_stage",
    "writer_state_dict",
]


def make_store(self: Table, arrays: Mapping[str, np.ndarray]) -> tuple[Store, EpisodeStore | None]:
    """The store this handle's rows go to -- rows, frames (compression) or sequences -- and,
    where it keeps episodes in lanes, the same store as the writer a file's episodes load through."""
    config, c = self._config, self._config.compression
    if c is None:
        return RowStore(self._handle, self._fields), None
    frames = FrameStore(c, config.specs, self._handle, arrays)
    if config.sequence is None:
        return frames, frames
    # A sequence table's steps are always compressed into lanes (Compression.build's in_lanes).
    steps = SequenceStore(config.sequence, frames, [flag for flag in (c.done, c.truncated) if flag is not None])
    return steps, steps


def add_rows(self: Table, fields: dict[str, Any], priorities: Any, timeout: float | None) -> int:
    if self._readonly:
        raise read_only("add")
    if timeout is not None:
        timeout = checks.seconds("timeout", timeout)
    return self._path.add(fields, priorities, timeout)


def on_episode_end(self: Table, *, timeout: float | None = None) -> None:
    """End the current episode (cpprb API): with ``nstep``, store its pending steps, folded
    as if the last one was truncated (they bootstrap); with ``next_of``, store the episode's
    last next observation.  ``timeout`` bounds the waits as in :meth:`add`; on TimeoutError
    the episode has not ended and nothing changed: call again."""
    if self._readonly:
        raise read_only("on_episode_end")
    self._path.end_episode(checks.seconds("timeout", timeout))


def writer_state_dict(self: Table) -> dict[str, np.ndarray]:
    """What this handle's writer holds between adds -- an n-step folder's pending steps --
    as copies of plain arrays by name (empty without ``nstep``): an actor saves them beside
    the table's checkpoint (``np.savez(file, **state)``) and, restarted, gives them to
    :meth:`load_writer_state_dict` so that no step is lost or stored twice.  A compressed
    table's writer keeps its episode's frames in its lane, and an episode open when its
    writer stops ends there: TypeError (start a new episode)."""
    stage = writer_stage(self, "writer_state_dict")
    return {} if stage is None else stage.state_dict()


def load_writer_state_dict(self: Table, state_dict: Mapping[str, np.ndarray]) -> None:
    """Take the pending steps of ``state_dict`` (from :meth:`writer_state_dict` of a table of
    the same configuration) as this handle's writer's, dropping the ones it holds;
    ValueError naming the first entry that differs, changing nothing."""
    stage = writer_stage(self, "load_writer_state_dict")
    if stage is None:
        checks.state_arrays("state_dict", state_dict, {})
    else:
        stage.load_state_dict(state_dict)


def writer_stage(self: Table, call: str) -> NstepStage | None:
    self._check_open()
    if self._config.compression is not None:
        raise TypeError(
            f"{call}: a compressed or sequence table's open episode ends when its writer stops "
            "(its frames are in its lane); a restarted writer starts a new episode"
        )
    return self._path.nstep


def clear(self: Table) -> None:
    """Forget every item, the steps an n-step folder holds and what the selector keeps of
    the priorities ever set (the capacity stays)."""
    if self._readonly:
        raise read_only("clear")
    self._handle.clear()
    self._selector.forget_history()
    self._path.forget()


def load_transitions(self: Table, file: str | os.PathLike[str] | IO[bytes]) -> int:
    """Append the rows of a file written by :meth:`save_transitions` (or cpprb's); returns
    how many.  The whole file is read and checked first: a bad one
    (:class:`~mpreplay.fileformat.TransitionFileError`) or one that does not fit
    (ValueError) changes nothing.  A compressed or sequence table gives back each saved
    episode whole, in its lane and in the order saved (see docs/files.md)."""
    self._check_open()
    if self._readonly:
        raise read_only("load_transitions")
    return load_table(file, self._config, self._path)
