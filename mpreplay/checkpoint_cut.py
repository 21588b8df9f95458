"""A checkpoint's cut: a table's per-slot state and counters, copied under its lock in short holds.

Where the selector's state divides into entries per item and the rest (``selectors.cut_parts``:
a priority tree's leaves, and its header), the per-slot arrays -- generations, slot states,
times sampled, the frames' links, the sequences' -- and the selector's entries are copied a
block of slots at a time, each block in a hold of the lock of its own (:data:`HOLD_BYTES`:
tens of microseconds), writers and samplers going on between two.  The counters, lanes,
writers' rows, the rate limiter's settings, the rest of the selector's state and the handle's
random stream are copied last, in one more short hold.  The selector then derives the rest of
its copy from the parts copied (``selectors.derive``: a tree's inner entries, recomputed from
its leaves as every update recomputes them, so an unchanged tree is copied bit for bit).

A block's slots are as they were at its hold.  The checkpoint then finds (``TableHandle.
changed_since``, once the rows are copied) the slots whose generation is no longer the one
copied: written after their block's hold.  Those are left out with every row that may read
their frames (:mod:`mpreplay.checkpoint`), so a row kept is one no writer touched from its
block's hold to the end of the checkpoint's copy: the row the last hold's lanes and counters
see, whole and in its place in every order.  A row may read frames of slots in a later block
(the next slot's, a lane wrapping round): with its block, the generations of those slots are
read too, and a slot written between the two holds counts as changed (``Cut.moved``).  A kept
row's priority, slot state and times sampled are those of its block's hold: a priority update
or a draw made while the cut is taken may be in the checkpoint or not, as if made just before
or just after it.  A selector whose state does not divide so (an order over its items, a packed
list) is copied with everything else in one hold: the whole cut at once, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import selectors
from ._ext.gate import deadline
from ._ext.schema import (
    DEPTH_ARRAY,
    EPISODE_START_ARRAY,
    EPISODE_STEP_ARRAY,
    GENERATION_ARRAY,
    LANE_END,
    LANE_START,
    LANES_ARRAY,
    NEXT_ARRAY,
    SEQUENCE_STEPS_ARRAY,
    STATE_ARRAY,
    TIMES_SAMPLED_ARRAY,
)

if TYPE_CHECKING:
    from .checkpoint import Source

__all__ = ["HOLD_BYTES", "PER_SLOT", "Cut", "stepper", "take"]

# Bytes of per-slot state copied in one hold of the lock: some 20-40 us of copying, so that a
# writer or sampler waiting for the lock waits about as long as for one of its peers' calls.
HOLD_BYTES = 128 * 2**10
# The arrays of an entry per slot (first axis), copied a block of slots at a time.
PER_SLOT = (
    GENERATION_ARRAY,
    STATE_ARRAY,
    TIMES_SAMPLED_ARRAY,
    NEXT_ARRAY,
    DEPTH_ARRAY,
    SEQUENCE_STEPS_ARRAY,
    EPISODE_STEP_ARRAY,
    EPISODE_START_ARRAY,
)


@dataclass(frozen=True)
class Cut:
    """What a cut took: ``arrays``, the copies (by name); ``rng``, the handle's random stream at
    the last hold; ``moved``, per slot, whether it was written between the hold of a block
    whose rows may read its frames and its own block's hold; ``longest``, the longest hold of
    the lock (seconds), and ``holds``, how many."""

    arrays: dict[str, np.ndarray]
    rng: dict[str, Any]
    moved: np.ndarray
    longest: float
    holds: int


def stepper(lanes: np.ndarray, slots: np.ndarray) -> Callable[[Any], np.ndarray]:
    """``step(k)``: the slot ``k`` places after each of ``slots`` in its lane (``k`` may be an array)."""
    lane = np.searchsorted(lanes[:, LANE_END], slots, side="right")
    lo = lanes[lane, LANE_START]
    width = lanes[lane, LANE_END] - lo
    return lambda k: lo + (slots - lo + k) % width


def take(source: Source, names: list[str], timeout: float | None, reach: tuple[int, int]) -> Cut:
    """Copy arrays ``names`` of the table ``source`` describes, as the module says; ``timeout``
    bounds the waits for its lock, all told (TimeoutError, nothing kept, once it is over);
    ``reach``: how many slots before and after its own a row may read in its lane (its frames,
    a sequence's steps)."""
    arrays, size = source.arrays, source.config.size
    # The copies' pages are made before the lock is taken (a first touch costs a page fault):
    # under it, only the bytes are copied.
    cut = {name: np.ones_like(arrays[name]) for name in names}
    blocked = [(arrays[name], cut[name]) for name in PER_SLOT if name in cut]
    selector = source.config.selector.name
    tree = selectors.entry(selector).array_name
    parts = selectors.cut_parts(selector, arrays[tree], size)
    if parts is None:
        blocked, whole = [], [(arrays[name], cut[name]) for name in names]
    else:
        # Entries of the selector's copy in no part are derived from them, or never change
        # (past the last item): copied once, without the lock.
        np.copyto(cut[tree], arrays[tree])
        mine = selectors.cut_parts(selector, cut[tree], size)
        assert mine is not None
        blocked += zip(parts[0], mine[0], strict=True)
        whole = [(arrays[name], cut[name]) for name in names if name not in PER_SLOT and name != tree]
        whole += zip(parts[1], mine[1], strict=True)
    step = max(1, HOLD_BYTES // max(1, sum(a.nbytes for a, _ in blocked) // size))
    starts = range(0, size, step) if blocked else range(0)
    live_gen = arrays[GENERATION_ARRAY]
    halos = _halos(arrays[LANES_ARRAY], size, step, reach) if blocked else {}
    early = {k: np.empty(len(halo), dtype=np.uint64) for k, halo in halos.items()}
    until = deadline(timeout)
    held = []
    for k, a in enumerate(starts):
        b = min(size, a + step)
        source.hold(until)
        started = time.monotonic()
        try:
            for live, copy in blocked:
                np.copyto(copy[a:b], live[a:b])
            if k in halos:
                np.take(live_gen, halos[k], out=early[k])
            held.append(time.monotonic() - started)
        finally:
            source.let_go()
    source.hold(until)
    started = time.monotonic()
    try:
        for live, copy in whole:
            np.copyto(copy, live)
        rng = source.handle.rng_state()
        # Timed before the lock is given back: giving it back wakes a waiter, which may run
        # before this thread does again, the lock free meanwhile.
        held.append(time.monotonic() - started)
    finally:
        source.let_go()
    if parts is not None:
        selectors.derive(selector, cut[tree], size)
    moved = np.zeros(size, dtype=bool)
    for k, halo in halos.items():
        moved[halo] = early[k] != cut[GENERATION_ARRAY][halo]
    return Cut(cut, rng, moved, max(held), len(held))


def _halos(lanes: np.ndarray, size: int, step: int, reach: tuple[int, int]) -> dict[int, np.ndarray]:
    """Per block of ``step`` slots (by its number): the slots of later blocks that a row of the
    block may read (``reach`` before and after it in its lane), each with the first such block."""
    back, ahead = reach
    # Only a slot near a block's end or a lane's ends reads past its block: those are looked at.
    near = max(back, ahead)
    edges = np.concatenate([np.arange(step, size, step), lanes[:, LANE_START], lanes[:, LANE_END]])
    slots = np.unique((edges[:, None] + np.arange(-near, near + 1)).ravel())
    slots = slots[(slots >= 0) & (slots < size)]
    at = stepper(lanes, slots)
    found = [np.stack([slots // step, at(k)]) for k in range(-back, ahead + 1)]
    block, read = np.concatenate(found, axis=1)
    later = read // step > block
    first = np.full(size, np.iinfo(np.int64).max)
    np.minimum.at(first, read[later], block[later])
    read = np.flatnonzero(first < np.iinfo(np.int64).max)
    block = first[read]
    order = np.argsort(block, kind="stable")
    block, read = block[order], read[order]
    bounds = np.flatnonzero(np.diff(block)) + 1
    return {int(b[0]): r for b, r in zip(np.split(block, bounds), np.split(read, bounds), strict=True) if len(b)}
