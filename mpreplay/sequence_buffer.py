"""Sequence replay (R2D2): buffers that store steps once and sample sequences of them.

A writer stores an episode's steps one at a time or in batches, consecutive in a
lane of its own; every ``period`` steps a sequence of ``length`` steps starts, and
it becomes sampleable once its last step is stored (with ``pad_end``, an
episode's end also keeps a shorter final sequence, padded).  ``sample`` returns
every field as ``(batch, length, ...)`` with a boolean ``mask`` (False on padding,
whose values are zeros), ``episode_step`` (each step's index in its episode: a
sequence whose first is 0 starts its episode, so its zero initial state is exact),
the sequences' ``indexes`` and, prioritized, their importance ``weights``.  Each sequence is one
item of the selector: prioritized buffers draw it in proportion to its priority ** alpha.

Recurrent state is a field like any other: store the state each step started
from (e.g. ``h`` and ``c``) and take the first step's, ``batch["h"][:, 0]``, as
the learner's initial state (burn-in then runs over the first steps).

The table is the transition buffers' one (see docs/architecture.md,
"Sequences"): the same slots, lanes, lock, rate limiter, frame compression and
crash handling, with ``ext/sequences.pyx`` naming which slots start a sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import fileformat
from ._ext.schema import EPISODE_START_ARRAY, EPISODE_STEP_ARRAY, SEQUENCE_STEPS_ARRAY
from .buffer import ReplayBuffer
from .fileformat import TransitionFileError
from .prioritized_buffer import PrioritizedReplayBuffer
from .saved_episodes import SavedEpisode, lanes_of, load_episodes, number_episodes, split_episodes
from .sequences import SequenceSpec, SequenceWriter
from .shared_buffer import SharedMemoryBuffer
from .spec import FieldSpec, convert_batch

__all__ = [
    "SequenceReplayBuffer",
    "PrioritizedSequenceReplayBuffer",
    "MPSequenceReplayBuffer",
    "MPPrioritizedSequenceReplayBuffer",
]

_EPISODE_STEP = "episode_step"  # what snapshots and files call each step's index in its episode
_EPISODE_START = "episode.start"  # in the rows a save copies: 1 where a writer stored an episode's first step


class SequenceReplayBuffer(ReplayBuffer):
    """Uniform sequence replay: steps stored once, sequences of them sampled uniformly.

    Parameters
    ----------
    size : int
        Capacity in steps; a lane's oldest steps (and the sequences that read them)
        are overwritten when it is full.
    env_dict : mapping
        Per-step fields, as for :class:`~mpreplay.ReplayBuffer`.  A ``done`` (and
        ``truncated``) field ends an episode at a step where it is set.
    length : int
        Steps per sequence (R2D2: 80).
    period : int, optional
        Steps between the starts of an episode's sequences (R2D2: 40, so neighbours
        share 40 steps); ``length`` when None (no overlap).
    pad_end : bool
        At an episode's end, keep a shorter final sequence with the steps no full one
        covered, padded (``mask`` False); else an episode keeps only full sequences.
    lanes : int
        Writers at once: every writer process, and every :meth:`episode_writer`, fills
        a lane of ``size // lanes`` steps of its own, so an episode's steps are consecutive.
    eta : float
        Prioritized buffers: the weight of the largest per-step priority in a sequence's
        initial priority (see :class:`PrioritizedSequenceReplayBuffer`).
    **options
        ``default_dtype``, ``seed``, ``rate_limiter``, ``next_of``, ``stack_compress``
        as for :class:`~mpreplay.ReplayBuffer` (``nstep`` is not: targets over n
        steps are the learner's, inside each sequence).

    Inserts count steps and samples count sequences (what a rate limiter compares);
    ``get_stored_size()`` counts stored steps, ``stats()["sequences"]`` the sampleable
    sequences; ``get_all_transitions()`` and ``read(indexes)`` return steps (for a sampled
    index, the sequence's first step).
    """

    _CONFIG = ReplayBuffer._CONFIG + ("_sequence",)

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        length: int,
        period: int | None = None,
        pad_end: bool = True,
        lanes: int = 1,
        eta: float = 0.9,
        **options: Any,
    ):
        if options.get("nstep") is not None:
            raise ValueError(
                "nstep: a sequence buffer stores single steps; compute n-step targets inside the sampled sequences"
            )
        if _EPISODE_STEP in env_dict:
            raise ValueError(
                f"env_dict: {_EPISODE_STEP!r} is the name a sequence buffer gives each step's "
                "index in its episode; call the field something else"
            )
        self._sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(size, env_dict, lanes=lanes, **options)
        compression = self._compression
        assert compression is not None  # a sequence buffer always stores its steps in lanes
        width = self._size // compression.lanes
        if width < self._sequence.length:
            raise ValueError(
                f"length: a sequence of {self._sequence.length} steps does not fit in a lane of "
                f"{width} steps (size {self._size}, lanes {compression.lanes})"
            )

    @property
    def sequence_length(self) -> int:
        """Steps per sampled sequence, padding included."""
        assert self._sequence is not None  # set by __init__, carried by every handle (_CONFIG)
        return self._sequence.length

    @property
    def period(self) -> int:
        """Steps between the starts of an episode's sequences."""
        assert self._sequence is not None  # set by __init__, carried by every handle (_CONFIG)
        return self._sequence.period

    def stats(self) -> dict[str, float | None]:
        """As for :meth:`ReplayBuffer.stats` (``stored`` counts steps, ``samples`` sequences),
        plus ``sequences``: how many are sampleable now."""
        out = super().stats()
        out["sequences"] = int(np.count_nonzero(self._memory.arrays[SEQUENCE_STEPS_ARRAY]))
        return out

    # -- snapshots and files: steps, with their index in the episode -------------
    def _copy_rows(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        rows = super()._copy_rows(slots)
        rows[_EPISODE_STEP] = self._memory.arrays[EPISODE_STEP_ARRAY][slots]
        return rows

    def _file_specs(self) -> dict[str, FieldSpec]:
        return {**self._specs, _EPISODE_STEP: FieldSpec(_EPISODE_STEP, (), np.dtype(np.int64))}

    def get_all_transitions(self, *, indexes: bool = False) -> dict[str, np.ndarray]:
        """Copies of every stored step, oldest first (lane by lane), with ``episode_step``,
        each step's index in its episode (safe while others write, as for transitions)."""
        return super().get_all_transitions(indexes=indexes)

    def save_transitions(self, file: Any, *, compress: bool = True, priorities: bool = False) -> None:
        """Write every stored step, lane by lane and oldest first, with its ``episode_step``, its
        episode and its lane (see :meth:`ReplayBuffer.save_transitions` and
        :mod:`mpreplay.fileformat`).  With ``priorities``, each step carries the priority of the
        sequence starting at it (0 where none starts)."""
        rows, raw = self._snapshot(
            priorities=self._saved_priorities(priorities), slots=True, copy=self._copy_saved_rows
        )
        slots, starts, steps = rows.pop("indexes"), rows.pop(_EPISODE_START), rows[_EPISODE_STEP]
        lanes = lanes_of(slots, self._lanes)
        # An episode begins where a lane does, where a writer stored an episode's first step, and
        # (never in a lane written whole) after a step that is not listed.
        begins = np.ones(len(slots), dtype=bool)
        begins[1:] = (starts[1:] != 0) | (steps[1:] != steps[:-1] + 1)
        fileformat.write_transitions(
            file,
            rows,
            self._file_specs(),
            nstep=self._nstep_settings(),
            priorities=raw,
            episodes=(number_episodes(lanes, begins), lanes),
            compress=compress,
        )

    def _copy_saved_rows(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        rows = self._copy_rows(slots)
        rows[_EPISODE_START] = self._memory.arrays[EPISODE_START_ARRAY][slots]
        return rows

    def load_transitions(self, file: Any) -> int:
        """Append the steps of a file written by :meth:`save_transitions`; returns how many.

        Every step comes back in its episode, with its ``episode_step``, and each episode
        (or what its lane kept of it: its first steps may have been overwritten) is cut into
        the sequences it had, then ends -- an episode still open when the file was saved may
        so gain a padded final sequence (``pad_end``).  Each lane of the file goes through a
        lane of its own while lanes are free (this object's first: its episode in progress
        ends), so a buffer of the same configuration gets back the same steps, episodes and
        sampleable sequences.  With fewer free lanes, or shorter ones, the episodes follow one
        another through the lanes there are, an episode never split; as with ``add``, a lane's
        oldest steps make room for loaded ones, but loaded steps never overwrite each other.

        The whole file is read and checked first: a bad file
        (:class:`~mpreplay.fileformat.TransitionFileError`, e.g. a stack that does not match
        its frames, or a file of format version 1, which records no episodes) or one that does
        not fit (ValueError) changes nothing.
        """
        self._check_open()
        rows, priorities = fileformat.read_transitions(file, self._file_specs(), nstep=None, episodes=True)
        if not self._PRIORITIZED:
            priorities = None
        ids, lanes = rows.pop(fileformat.EPISODE_ID), rows.pop(fileformat.EPISODE_LANE)
        episodes = _saved_episodes(ids, lanes, np.asarray(rows.pop(_EPISODE_STEP), dtype=np.int64))
        k, rows = convert_batch(self._specs, rows)
        writer = self._path.store
        assert isinstance(writer, SequenceWriter)  # what a sequence buffer writes its steps through
        load_episodes(writer, rows, priorities, episodes)
        return k


def _saved_episodes(ids: np.ndarray, lanes: np.ndarray, steps: np.ndarray) -> list[SavedEpisode]:
    """The episodes of a file's rows (``ids`` and ``lanes`` checked by :mod:`mpreplay.fileformat`);
    raises TransitionFileError unless each one's ``episode_step`` values count up by one from >= 0."""
    bad = np.flatnonzero(steps < 0)
    if bad.size:
        raise TransitionFileError(
            f"file: {_EPISODE_STEP!r}: expected values >= 0, row {int(bad[0])} has {steps[bad[0]]}"
        )
    bad = np.flatnonzero((ids[1:] == ids[:-1]) & (steps[1:] != steps[:-1] + 1)) + 1
    if bad.size:
        i = int(bad[0])
        raise TransitionFileError(
            f"file: {_EPISODE_STEP!r}: episode {ids[i]} has step {steps[i - 1]} then "
            f"{steps[i]} (rows {i - 1} and {i}); an episode's steps count up by one"
        )
    return split_episodes(ids, lanes, lambda row: int(steps[row]))


class PrioritizedSequenceReplayBuffer(SequenceReplayBuffer, PrioritizedReplayBuffer):
    """Prioritized sequence replay (R2D2): a sequence is drawn with probability
    ``(p + eps) ** alpha / sum (p_j + eps) ** alpha``.

    ``add(..., priorities=)`` takes one priority per step (e.g. the actor's ``|TD|`` errors):
    a sequence's initial priority is R2D2's ``eta * max + (1 - eta) * mean`` over its real
    steps (:func:`~mpreplay.sequence_priority`); without them, the largest
    stored.  ``update_priorities(indexes, p)`` sets a sequence's priority; an update of a
    sequence overwritten since it was sampled is dropped, as for transitions.

    Parameters as for :class:`SequenceReplayBuffer`, plus ``alpha``, ``eps`` (as for
    :class:`~mpreplay.PrioritizedReplayBuffer`) and ``eta`` (0.9).
    """

    _CONFIG = PrioritizedReplayBuffer._CONFIG + ("_sequence",)


class MPSequenceReplayBuffer(SharedMemoryBuffer, SequenceReplayBuffer):
    """:class:`SequenceReplayBuffer` in shared memory, written and sampled by many processes."""


class MPPrioritizedSequenceReplayBuffer(SharedMemoryBuffer, PrioritizedSequenceReplayBuffer):
    """:class:`PrioritizedSequenceReplayBuffer` in shared memory, written and sampled by many processes."""
