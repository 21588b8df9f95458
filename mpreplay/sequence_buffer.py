"""Sequence replay (R2D2): buffers that store steps once and sample sequences of them.

A writer stores an episode's steps one at a time or in batches, consecutive in a
lane of its own; every ``period`` steps a sequence of ``length`` steps starts, and
it becomes sampleable once its last step is stored (with ``pad_end``, an
episode's end also keeps a shorter final sequence, padded).  ``sample`` returns
every field as ``(batch, length, ...)`` with a boolean ``mask`` (False on padding,
whose values are zeros), ``episode_step`` (each step's index in its episode: a
sequence whose first is 0 starts its episode, so its zero initial state is exact),
the sequences' ``indexes`` and, prioritized, their importance ``weights``.  Each sequence is one item of the selector: prioritized
buffers draw it in proportion to its priority ** alpha.

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
from ._ext.schema import EPISODE_STEP_ARRAY, SEQUENCE_STEPS_ARRAY
from .buffer import PrioritizedReplayBuffer, ReplayBuffer, SharedMemoryBuffer
from .sequences import SequenceSpec
from .spec import FieldSpec, convert_batch

__all__ = ["SequenceReplayBuffer", "PrioritizedSequenceReplayBuffer", "MPSequenceReplayBuffer",
           "MPPrioritizedSequenceReplayBuffer"]

_EPISODE_STEP = "episode_step"  # what snapshots and files call each step's index in its episode


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

    def __init__(self, size: int, env_dict: Mapping[str, Mapping[str, Any]], *, length: int,
                 period: int | None = None, pad_end: bool = True, lanes: int = 1, eta: float = 0.9,
                 **options: Any):
        for option in ("nstep", "Nstep"):
            if options.get(option) is not None:
                raise ValueError(f"{option}: a sequence buffer stores single steps; compute n-step "
                                 "targets inside the sampled sequences")
        if _EPISODE_STEP in env_dict:
            raise ValueError(f"env_dict: {_EPISODE_STEP!r} is the name a sequence buffer gives each step's "
                             "index in its episode; call the field something else")
        self._sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(size, env_dict, lanes=lanes, **options)
        width = self._size // self._compression.lanes
        if width < self._sequence.length:
            raise ValueError(f"length: a sequence of {self._sequence.length} steps does not fit in a lane of "
                             f"{width} steps (size {self._size}, lanes {self._compression.lanes})")

    @property
    def sequence_length(self) -> int:
        """Steps per sampled sequence, padding included."""
        return self._sequence.length

    @property
    def period(self) -> int:
        """Steps between the starts of an episode's sequences."""
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

    def save_transitions(self, file: Any, *, safe: bool = True, compress: bool = True,
                         priorities: bool = False) -> None:
        """Write every stored step, oldest first, with its ``episode_step`` (see
        :meth:`ReplayBuffer.save_transitions`).  With ``priorities``, each step carries the
        priority of the sequence starting at it (0 where none starts)."""
        super().save_transitions(file, safe=safe, compress=compress, priorities=priorities)

    def load_transitions(self, file: Any) -> int:
        """Append the steps of a file written by :meth:`save_transitions`; returns how many.

        Consecutive ``episode_step`` values are one episode (what was kept of it): its
        sequences are cut where they were, and it ends.  The file is checked whole
        first (a bad file changes nothing).  A stack-compressed buffer cannot take an
        episode whose older frames were not saved (ValueError); the steps of episodes
        before it stay stored.
        """
        self._check_open()
        rows, priorities = fileformat.read_transitions(file, self._file_specs(), nstep=None)
        if not isinstance(self, PrioritizedReplayBuffer):
            priorities = None
        episode_steps = np.asarray(rows.pop(_EPISODE_STEP), dtype=np.int64)
        k, rows = convert_batch(self._specs, rows)
        if k:
            self._writer.load(k, rows, priorities, episode_steps)
        return k


class PrioritizedSequenceReplayBuffer(SequenceReplayBuffer, PrioritizedReplayBuffer):
    """Prioritized sequence replay (R2D2): a sequence is drawn with probability
    ``(p + eps) ** alpha / sum (p_j + eps) ** alpha``.

    ``add(..., priorities=)`` takes one priority per step (e.g. the actor's |TD| errors):
    a sequence's initial priority is R2D2's ``eta * max + (1 - eta) * mean`` over its real
    steps (:func:`~mpreplay.sequences.sequence_priority`); without them, the largest
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
