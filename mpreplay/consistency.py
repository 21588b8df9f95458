"""The consistency check of a table's memory (``buffer.verify()``): an fsck.

The slot states are the truth, as crash recovery holds them (docs/architecture.md,
"Crash handling"); everything else the table keeps is derived from them and is
checked against them here: the stored count, the selector's state (a priority
tree's inner nodes recomputed from its leaves; a uniform selector's packed members
against each slot's place), which items may be drawn, the sequence index, the lanes
and the counters.  Run it with the table's lock held (``Inspection.verify`` does),
so that no call is half way through a change.  The checks read the arrays by their
segment schema names only, in numpy: O(capacity), no Python loop over slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import selectors
from ._ext.lock import SharedLock, read_holder
from ._ext.processes import describe_process
from ._ext.schema import (
    CLOSED,
    COMPLETE,
    DEPTH_ARRAY,
    EMPTY,
    EPOCH,
    GENERATION_ARRAY,
    HEADER_ARRAY,
    INSERTS,
    LANE_CURSOR,
    LANE_END,
    LANE_START,
    LANES_ARRAY,
    LIMIT_MAX_DIFF,
    LIMIT_MIN_DIFF,
    LIMIT_MIN_SIZE,
    LIMIT_ON,
    LIMIT_SPI,
    LIMITS_ARRAY,
    LOCK_ARRAY,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    NEXT_ARRAY,
    OWNER_ARRAY,
    PENDING_COUNT,
    PENDING_LANE,
    PENDING_START,
    RESERVED,
    SAMPLES,
    SEQUENCE_STEPS_ARRAY,
    STALE,
    STATE_ARRAY,
    STORED,
    TORN,
    WAITERS,
    WAITING,
    WRITER_INSERTS,
    WRITERS_ARRAY,
)
from .errors import CorruptBufferError
from .monitor import SHM_DIR, BufferView

__all__ = ["check_arrays", "verify_segment"]

# The header's counters by name (what mpreplay.inspect shows), and those that only ever grow or
# count what is under way, so never go negative.
COUNTERS = {
    "stored": STORED,
    "inserts": INSERTS,
    "samples": SAMPLES,
    "stale": STALE,
    "torn": TORN,
    "lock_wait_ns": LOCK_WAIT_NS,
    "lock_holds": LOCK_HOLDS,
    "closed": CLOSED,
    "reserved": RESERVED,
    "epoch": EPOCH,
    "waiters": WAITERS,
}
_NEVER_NEGATIVE = ("inserts", "samples", "stale", "torn", "lock_wait_ns", "lock_holds", "reserved", "waiters")
_SHOWN = 5  # slots named per problem


def check_arrays(
    arrays: Mapping[str, np.ndarray], capacity: int, sequence_length: int | None, selector: str
) -> dict[str, Any]:
    """Check a table's arrays (by schema name) against its slot states.

    Returns a report (``slots``, ``complete``, ``waiting``, ``being_written``, ``drawable``,
    ``lanes``) when everything agrees; else raises CorruptBufferError listing every
    disagreement found.
    """
    problems: list[str] = []
    state, generation, owner = arrays[STATE_ARRAY], arrays[GENERATION_ARRAY], arrays[OWNER_ARRAY]
    header = arrays[HEADER_ARRAY]
    odd = (generation & 1).astype(bool)
    _where(
        problems, (state != EMPTY) & (state != COMPLETE) & (state != WAITING), "state: not EMPTY, COMPLETE or WAITING"
    )
    _where(problems, odd & (state != EMPTY), "state: a slot being written (odd generation) is not EMPTY")
    _where(problems, (owner != 0) & ~odd, "owner: a published slot (even generation) names a writer")
    complete = int(np.count_nonzero(state == COMPLETE))
    if header[STORED] != complete:
        problems.append(f"header STORED: {int(header[STORED])}, but {complete} slots are COMPLETE")
    for name in _NEVER_NEGATIVE:
        at = COUNTERS[name]
        if header[at] < 0:
            problems.append(f"header {name.upper()}: negative ({int(header[at])})")
    if header[INSERTS] > header[RESERVED]:
        problems.append(
            f"header INSERTS: {int(header[INSERTS])} published, more than the {int(header[RESERVED])} RESERVED"
        )
    if header[PENDING_COUNT] != 0:
        # Only a reservation under way writes it, and the lock is held here: its holder died
        # and the repair that ends the reservation (Slots.recover) never ran, so the lane's
        # cursor may have passed rows that were to be overwritten -- the ring's age order broken.
        problems.append(
            f"header PENDING_COUNT: a reservation of {int(header[PENDING_COUNT])} slots from slot "
            f"{int(header[PENDING_START])} of lane {int(header[PENDING_LANE])} was left half made"
        )
    _check_writers(problems, arrays[WRITERS_ARRAY], int(header[INSERTS]))
    _check_limits(problems, arrays[LIMITS_ARRAY])
    lanes_sound = _check_lanes(problems, arrays[LANES_ARRAY], capacity)

    drawable = (state == COMPLETE) & ~odd
    if NEXT_ARRAY in arrays and lanes_sound:
        _check_frames(problems, arrays[NEXT_ARRAY], arrays[DEPTH_ARRAY], drawable, odd, arrays[LANES_ARRAY])
    if sequence_length is not None:
        steps = arrays[SEQUENCE_STEPS_ARRAY]
        _where(problems, (steps < 0) | (steps > sequence_length), f"sequence_steps: outside 0..{sequence_length}")
        _where(problems, (steps > 0) & ~drawable, "sequence_steps: a sequence starts at a slot not COMPLETE")
        if lanes_sound:  # a sequence's window is walked in its lane
            _check_sequence_steps(problems, steps, drawable, arrays[LANES_ARRAY])
        drawable &= steps > 0
    # Each selector checks its own state (its kernel's check_state, found through the registry).
    problems += selectors.check_state(selector, arrays[selectors.entry(selector).array_name], capacity, drawable)
    if problems:
        raise CorruptBufferError(problems)
    return {
        "slots": capacity,
        "complete": complete,
        "waiting": int(np.count_nonzero(state == WAITING)),
        "being_written": int(np.count_nonzero(odd)),
        "drawable": int(np.count_nonzero(drawable)),
        "lanes": len(arrays[LANES_ARRAY]),
    }


def verify_segment(name: str, timeout: float | None = None, shm_dir: str = SHM_DIR) -> dict[str, Any]:
    """:func:`check_arrays` of the buffer segment ``name``, from outside the programs that use it
    (``mpreplay verify NAME``): mapped by its checked manifest, under its lock, taken within
    ``timeout`` seconds (None: no limit; TimeoutError naming the holder).  Changes nothing: a
    segment whose last lock holder died waits for its buffer's next call to repair it, so this
    raises RuntimeError saying so (the lock counts the death all the same)."""
    with BufferView(name, shm_dir, writable=True) as view:
        sequence = view.document["sequence"]
        if LOCK_ARRAY not in view.arrays:
            raise ValueError(f"{name}: the segment has no lock to check it under")
        lock = SharedLock(view.arrays[LOCK_ARRAY], False, on_recover=_refuse_repair)
        try:
            if not lock.acquire(timeout):
                holder = read_holder(view.arrays[LOCK_ARRAY])
                who = "another process" if holder is None else f"{describe_process(holder[0])}, for {holder[1]:.1f} s"
                raise TimeoutError(f"{name}: timed out waiting for the lock, held by {who}")
            try:
                return check_arrays(
                    view.arrays,
                    view.capacity,
                    None if sequence is None else sequence["length"],
                    view.document["selector"],
                )
            finally:
                lock.release()
        finally:
            del lock  # before the mapping goes: the lock holds a view of it


def _refuse_repair() -> None:
    raise RuntimeError(
        "a process died holding the lock; the buffer's next call repairs what it left (this "
        "check changes nothing): verify again after it"
    )


def _where(problems: list[str], bad: np.ndarray, what: str) -> None:
    """Note ``what`` with the first slots where ``bad`` holds, if any."""
    slots = np.flatnonzero(bad)
    if slots.size:
        more = f" and {slots.size - _SHOWN} more" if slots.size > _SHOWN else ""
        problems.append(f"{what} at slots {slots[:_SHOWN].tolist()}{more}")


def _check_writers(problems: list[str], writers: np.ndarray, inserts: int) -> None:
    counted = writers[:, WRITER_INSERTS]
    if (counted < 0).any():
        problems.append(f"writers: negative inserts in rows {np.flatnonzero(counted < 0).tolist()}")
    elif counted.sum() > inserts:
        problems.append(f"writers: {int(counted.sum())} inserts counted per writer, more than the {inserts} INSERTS")


def _check_limits(problems: list[str], limits: np.ndarray) -> None:
    # The diffs may be infinite (MinSize has no error buffer); nothing may be NaN.
    if np.isnan(limits).any() or not np.isfinite(limits[[LIMIT_ON, LIMIT_SPI, LIMIT_MIN_SIZE]]).all():
        problems.append(f"limits: not numbers ({limits.tolist()})")
    elif limits[LIMIT_ON] and limits[LIMIT_MIN_DIFF] > limits[LIMIT_MAX_DIFF]:
        problems.append(f"limits: min_diff {limits[LIMIT_MIN_DIFF]} above max_diff {limits[LIMIT_MAX_DIFF]}")


def _check_lanes(problems: list[str], lanes: np.ndarray, capacity: int) -> bool:
    """The lanes split the slots into consecutive rings, each cursor inside its ring; True when
    they do."""
    found = len(problems)
    end = 0
    for i, lane in enumerate(lanes):
        start, stop, cursor = (int(v) for v in lane[[LANE_START, LANE_END, LANE_CURSOR]])
        if start != end or not start < stop <= capacity:
            problems.append(
                f"lanes: lane {i} spans [{start}, {stop}), expected to start at {end} and end by {capacity}"
            )
        elif not start <= cursor < stop:
            problems.append(f"lanes: lane {i}'s cursor {cursor} is outside its slots [{start}, {stop})")
        end = stop
    if end != capacity:
        problems.append(f"lanes: the last lane ends at {end}, expected {capacity}")
    return len(problems) == found


def _lane_of(slots: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    return np.searchsorted(lanes[:, LANE_START], slots, side="right") - 1


def _back(slots: np.ndarray, j: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """The slots ``j`` before ``slots`` in their lanes (rings): where earlier frames lie."""
    lane = _lane_of(slots, lanes)
    low, high = lanes[lane, LANE_START][:, None], lanes[lane, LANE_END][:, None]
    return low + (slots[:, None] - low - j) % (high - low)


def _check_frames(
    problems: list[str], nxt: np.ndarray, depth: np.ndarray, complete: np.ndarray, odd: np.ndarray, lanes: np.ndarray
) -> None:
    """A complete row of a compressed table reads only frames that are stored: its own slot and the
    ``depth`` before it in its lane, and its next observation's (``nxt``, in the same lane), none
    of them being written (a write retires the rows that read its slots; ext/frames.pyx)."""
    rows = np.flatnonzero(complete)
    if not rows.size:
        return
    size = len(nxt)
    following = nxt[rows]
    has_next = following >= 0
    stray = has_next & (
        (following >= size) | (_lane_of(np.clip(following, 0, size - 1), lanes) != _lane_of(rows, lanes))
    )
    _where(problems, np.isin(np.arange(size), rows[stray]), "nxt: a row's next observation lies outside its lane")
    if stray.any():
        return
    broken = np.zeros(len(rows), dtype=bool)
    for readers, where in ((rows, np.ones(len(rows), dtype=bool)), (following, has_next)):
        at = readers[where]
        reach = np.arange(int(depth[at].max()) + 1 if at.size else 1)
        frames = _back(at, reach, lanes)
        unread = reach > depth[at][:, None]
        broken[np.flatnonzero(where)] |= (odd[frames] & ~unread).any(axis=1)
    _where(problems, np.isin(np.arange(size), rows[broken]), "frames: a complete row reads a slot being written")


def _check_sequence_steps(problems: list[str], steps: np.ndarray, complete: np.ndarray, lanes: np.ndarray) -> None:
    """Every step of an open sequence is stored: its window in its lane (a ring) holds
    ``steps`` complete slots from its first (docs/architecture.md, "Sequences")."""
    starts = np.flatnonzero(steps > 0)
    if not starts.size:
        return
    lane = np.searchsorted(lanes[:, LANE_START], starts, side="right") - 1
    low, high = lanes[lane, LANE_START], lanes[lane, LANE_END]
    offsets = np.arange(int(steps.max()))
    window = low[:, None] + (starts[:, None] - low[:, None] + offsets) % (high - low)[:, None]
    real = offsets < steps[starts][:, None]
    broken = (real & ~complete[window]).any(axis=1)
    _where(
        problems,
        np.isin(np.arange(len(steps)), starts[broken]),
        "sequence_steps: a sequence holds a step that is not stored",
    )
