"""A table's memory layout and its rows in files: what ``save_transitions`` and
``load_transitions`` do.

The layout is the segment schema's arrays for a configuration (:func:`table_layout`).  Saving
writes every stored row through :mod:`mpreplay.fileformat` -- a compressed or sequence table's
with its episodes (:mod:`mpreplay.saved_episodes`), a sequence table's with each step's index in
its episode -- and loading gives a file's rows back through the table's write path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import fileformat, selectors
from ._ext.lock import LOCK_NBYTES
from ._ext.schema import DEPTH_ARRAY, EPISODE_START_ARRAY, ROWS_ARRAY, field_array, row_layout, segment_arrays
from .fileformat import TransitionFileError
from .memory import Layout
from .saved_episodes import SavedEpisode, lanes_of, number_episodes, split_episodes, stack_age, transition_episodes
from .spec import FieldSpec, convert_batch
from .table_config import EPISODE_STEP, TableConfig
from .write_path import WritePath

__all__ = ["load_table", "save_table", "table_layout"]

_DEPTH = "frames.depth"  # in the rows a compressed table's save copies: each slot's depth (no field's name)
_EPISODE_START = "episode.start"  # in the rows a sequence table's save copies: 1 where an episode's first step is

Snapshot = Callable[..., tuple[dict[str, np.ndarray], np.ndarray | None]]


def table_layout(config: TableConfig) -> Layout:
    """The arrays of a table of ``config``, in the segment schema's order (see ``schema.segment_arrays``)."""
    c = config.compression
    stored = config.specs if c is None else c.stored_fields(config.specs)
    fields = [(name, config.specs[name].shape, config.specs[name].dtype) for name in stored]
    # Fields side by side in one row per slot, except in files of their own (cpprb's mmap_prefix).
    rows = config.mmap_prefix is None
    layout = Layout()
    for name, shape, dtype in segment_arrays(
        config.size,
        1 if c is None else c.lanes,
        selectors.state_array(config.selector.name, config.size),
        fields,
        None if c is None else [(key, c.frame_shape(key, config.specs), config.specs[key].dtype) for key in c.keys],
        LOCK_NBYTES if config.shared else 0,  # a local table's threads take a lock of its memory's
        config.sequence is not None,
        rows,
        config.max_times_sampled is not None,
    ):
        layout.add(name, shape, dtype)
    if rows and fields:
        layout.add_row_views(
            ROWS_ARRAY, [(field_array(name), shape, dtype) for name, shape, dtype in fields], row_layout(fields)[1]
        )
    return layout


def file_specs(config: TableConfig) -> dict[str, FieldSpec]:
    """The fields a file of a table's rows holds (a sequence table's: each step's index in its episode too)."""
    if config.sequence is None:
        return config.specs
    return {**config.specs, EPISODE_STEP: FieldSpec(EPISODE_STEP, (), np.dtype(np.int64))}


def nstep_settings(config: TableConfig) -> tuple[int, float] | None:
    """``(size, gamma)`` of the n-step folding of the stored rows, or None."""
    if config.nstep is None:
        return None
    settings = config.nstep[2]
    return int(settings["size"]), float(settings["gamma"])


def save_table(
    file: Any,
    config: TableConfig,
    arrays: dict[str, np.ndarray],
    snapshot: Snapshot,
    copy_rows: Callable[[np.ndarray], dict[str, np.ndarray]],
    lanes: np.ndarray,
    *,
    compress: bool,
    priorities: bool,
) -> None:
    """Write every stored row of a table (``snapshot``: its snapshot, ``copy_rows``: its rows'
    copier, ``arrays``: its memory's arrays) to ``file``, oldest first (see ``Table.save_transitions``)."""
    if priorities and not config.by_priority:
        raise ValueError(
            f"priorities: selector {config.selector.name!r} keeps no priorities to save; pass priorities=False"
        )
    episodes = order = None
    if config.sequence is not None:

        def copy(slots: np.ndarray) -> dict[str, np.ndarray]:
            return {**copy_rows(slots), _EPISODE_START: arrays[EPISODE_START_ARRAY][slots]}

        rows, raw = snapshot(priorities=priorities, slots=True, copy=copy)
        slots, starts, steps = rows.pop("indexes"), rows.pop(_EPISODE_START), rows[EPISODE_STEP]
        lane = lanes_of(slots, lanes)
        # An episode begins where a lane does, where a writer stored an episode's first step, and
        # (never in a lane written whole) after a step that is not listed.
        begins = np.ones(len(slots), dtype=bool)
        begins[1:] = (starts[1:] != 0) | (steps[1:] != steps[:-1] + 1)
        episodes = (number_episodes(lane, begins), lane)
    elif config.compression is not None:

        def copy(slots: np.ndarray) -> dict[str, np.ndarray]:
            return {**copy_rows(slots), _DEPTH: arrays[DEPTH_ARRAY][slots]}

        ordered = selectors.entry(config.selector.name).ordered
        rows, raw = snapshot(priorities=priorities, slots=True, copy=copy, arrivals=ordered)
        slots, depths = rows.pop("indexes"), rows.pop(_DEPTH)
        episodes = transition_episodes(slots, lanes, depths)
        if ordered:
            # The rows are listed by episode, lane by lane: the file says the order they were given
            # the selector in, which an ordered selector draws by and a load gives back.
            arrivals = rows.pop("arrivals")
            order = np.empty(len(arrivals), dtype=np.int64)
            order[np.argsort(arrivals, kind="stable")] = np.arange(len(arrivals))
    else:
        rows, raw = snapshot(priorities=priorities)
    fileformat.write_transitions(
        file,
        rows,
        file_specs(config),
        nstep=nstep_settings(config),
        priorities=raw,
        episodes=episodes,
        order=order,
        compress=compress,
    )


def load_table(file: Any, config: TableConfig, path: WritePath) -> int:
    """Append the rows of ``file`` to a table through its write path; returns how many (see
    ``Table.load_transitions``).  The whole file is read and checked before anything is stored."""
    sequence = config.sequence is not None
    rows, priorities = fileformat.read_transitions(
        file,
        file_specs(config),
        nstep=None if sequence else nstep_settings(config),
        episodes=True if sequence else (None if config.compression is not None else False),
        order=True,
    )
    if not config.by_priority:
        priorities = None
    ids, lanes = rows.pop(fileformat.EPISODE_ID, None), rows.pop(fileformat.EPISODE_LANE, None)
    order = rows.pop(fileformat.INSERTION_ORDER, None)
    if order is not None and ids is None:
        # Rows that stand alone are stored in the order the saving table was given them.
        oldest_first = np.argsort(order)
        rows = {name: r[oldest_first] for name, r in rows.items()}
        priorities, order = None if priorities is None else priorities[oldest_first], None
    steps = np.asarray(rows.pop(EPISODE_STEP), dtype=np.int64) if sequence else None
    k, rows = convert_batch(config.specs, rows)
    if k == 0:
        return 0
    if ids is not None:
        assert lanes is not None  # read with each row's episode
        if steps is not None:
            episodes = _sequence_episodes(ids, lanes, steps)
        else:
            # The file records no step per row: an episode whose oldest rows were overwritten
            # before the save resumes from the older frames its first row's stacks hold.
            keys = config.compression.stack if config.compression is not None else ()
            episodes = split_episodes(ids, lanes, lambda row: stack_age(rows, row, keys))
        path.load_episodes(rows, priorities, episodes, order)
        return k
    # What add() does, minus two things: n-step rows were folded before they were saved and
    # must not be folded again, and the rows end an episode so that a compressed table
    # publishes the last one rather than waiting for a successor that is not in the file.
    path.load(k, rows, priorities)
    return k


def _sequence_episodes(ids: np.ndarray, lanes: np.ndarray, steps: np.ndarray) -> list[SavedEpisode]:
    """The episodes of a sequence table's file (``ids`` and ``lanes`` checked by
    :mod:`mpreplay.fileformat`); TransitionFileError unless each one's ``episode_step`` values
    count up by one from >= 0."""
    bad = np.flatnonzero(steps < 0)
    if bad.size:
        raise TransitionFileError(
            f"file: {EPISODE_STEP!r}: expected values >= 0, row {int(bad[0])} has {steps[bad[0]]}"
        )
    bad = np.flatnonzero((ids[1:] == ids[:-1]) & (steps[1:] != steps[:-1] + 1)) + 1
    if bad.size:
        i = int(bad[0])
        raise TransitionFileError(
            f"file: {EPISODE_STEP!r}: episode {ids[i]} has step {steps[i - 1]} then "
            f"{steps[i]} (rows {i - 1} and {i}); an episode's steps count up by one"
        )
    return split_episodes(ids, lanes, lambda row: int(steps[row]))
