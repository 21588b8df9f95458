"""Sequences of recurrent replay (R2D2): where an episode's sequences start, their steps, their priorities.

A sequence is a window of ``length`` consecutive steps of one episode.  Starts
are ``period`` steps apart (R2D2: length 80, period 40, so neighbours share 40
steps).  :class:`SequenceCutter` decides them as a writer stores an episode's
steps; :func:`sequence_steps` turns a sequence's first slot into the slots of
its steps inside the writer's lane; :func:`sequence_priority` is R2D2's
priority of a sequence from its TD errors.

These are the parts a sequence buffer is built from; no buffer class uses them yet.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import checks

__all__ = ["SequenceCutter", "sequence_priority", "sequence_steps"]


class SequenceCutter:
    """Cuts one stream of episodes into sequences as their steps arrive.

    A sequence is announced once its last step is stored, never before, and
    never spans two episodes.  At an episode's end, with ``pad_end=True``, one
    shorter sequence keeps the steps no full sequence covered (R2D2 keeps every
    step); its missing steps are masked.  With ``pad_end=False`` an episode
    keeps only its full sequences.

    Offsets count steps from the episode's first step.
    """

    def __init__(self, length: int, period: int, *, pad_end: bool = True) -> None:
        self.length = checks.integer("length", length, low=1)
        self.period = checks.integer("period", period, low=1)
        self.pad_end = checks.flag("pad_end", pad_end)
        self._stored = 0  # steps of the current episode
        self._next = 0  # offset of the next sequence not announced yet

    @property
    def stored(self) -> int:
        """Steps of the current episode stored so far."""
        return self._stored

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


def sequence_steps(first: Any, valid: Any, length: int, *, lane_start: int, lane_end: int) -> tuple[np.ndarray, np.ndarray]:
    """The slots of each sequence's steps, and which of them are real.

    ``first[i]`` is the slot of sequence i's first step inside the lane
    ``[lane_start, lane_end)``, where an episode's steps are consecutive and
    wrap around at the lane's end; ``valid[i]`` its number of real steps.
    Returns ``slots`` and ``mask``, both ``(len(first), length)``.  A padded
    step (``mask`` False) repeats the slot of its sequence's last real step,
    so a gather reads only the sequence's own rows; its values are the
    caller's to blank.
    """
    length = checks.integer("length", length, low=1)
    lane_start = checks.integer("lane_start", lane_start, low=0)
    lane_end = checks.integer("lane_end", lane_end, low=lane_start + 1)
    first = checks.indexes("first", first)
    valid = checks.indexes("valid", valid)
    if len(valid) != len(first):
        raise ValueError(f"valid: expected {len(first)} values (one per sequence), got {len(valid)}")
    outside = np.flatnonzero((first < lane_start) | (first >= lane_end))
    if outside.size:
        j = int(outside[0])
        raise ValueError(f"first: expected slots in [{lane_start}, {lane_end}), got {int(first[j])} at position {j}")
    top = min(length, lane_end - lane_start)  # a sequence never holds more steps than its lane
    wrong = np.flatnonzero((valid < 1) | (valid > top))
    if wrong.size:
        j = int(wrong[0])
        raise ValueError(f"valid: expected counts in [1, {top}], got {int(valid[j])} at position {j}")
    step = np.arange(length, dtype=np.int64)
    mask = step[None, :] < valid[:, None]
    held = np.minimum(step[None, :], valid[:, None] - 1)
    slots = lane_start + (first[:, None] - lane_start + held) % (lane_end - lane_start)
    return slots, mask


def sequence_priority(td_errors: Any, mask: Any = None, *, eta: float = 0.9) -> np.ndarray:
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
