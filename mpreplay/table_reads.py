"""The read side of :class:`mpreplay.Table`: batches drawn ahead, copies of its rows
(snapshots, ``read``, files), priorities, counters and inspection.

Each function here is what a method of :class:`~mpreplay.Table` of the same name does, taking
the table; the method states the signature and takes its docstring from here; ``sample`` and
``update_priorities`` themselves are the compiled calls of every step (``ext/calls.pyx``).  Rows
are copied without the lock and checked after against the slots' generations: a row overwritten
meanwhile is never handed out (see docs/architecture.md, "Snapshots").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from . import checks, deprecated
from ._ext.schema import (
    EPISODE_STEP_ARRAY,
    INSERTS,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    NEXT_ARRAY,
    RESERVED,
    SAMPLES,
    SEQUENCE_STEPS_ARRAY,
    STALE,
    STORED,
    TORN,
    WAITERS,
)
from .checkpoint import Source as CheckpointSource
from .checkpoint import write as write_checkpoint
from .inspect import Inspection
from .prefetch import Prefetcher, as_drawn, as_tensors
from .spec import Batch, TensorBatch
from .table_config import EPISODE_STEP
from .table_files import save_table

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from .table import Table

__all__ = [
    "batches",
    "checkpoint",
    "copy_rows",
    "default_priority",
    "get_all_transitions",
    "get_max_priority",
    "inspection",
    "leaf_mass",
    "read",
    "sample_leaves",
    "save_transitions",
    "slot_tags",
    "snapshot",
    "stats",
    "verify",
]

# Times read() copies rows that writers keep overwriting before it gives up.
_READ_ATTEMPTS = 100


def batches(
    self: Table, batch_size: int, beta: float | None, prefetch: int, timeout: float | None, as_torch: bool
) -> Prefetcher[Batch] | Prefetcher[TensorBatch]:
    """An endless iterator of ``sample(batch_size, beta)`` batches drawn ``prefetch`` ahead
    on a background thread while the caller trains (see :mod:`mpreplay.prefetch`).

    Each batch's arrays are refilled once the next batch is asked for; priorities may be
    updated from the caller's thread meanwhile.  ``timeout`` bounds each wait for the rate
    limiter (then ``next()`` raises TimeoutError); ``as_torch`` hands out CPU tensors over
    the same memory.  Close it (or use ``with``) to stop the thread.
    """
    self._check_open()
    batch_size = checks.integer("batch_size", batch_size, low=1)
    if beta is not None:
        beta = checks.number("beta", beta, low=0.0, high=1.0)
    prefetch = checks.integer("prefetch", prefetch, low=1)
    timeout = checks.seconds("timeout", timeout)

    def draw(out: Batch | None, t: float | None) -> Batch:
        return self.sample(batch_size, beta, timeout=t, out=out)

    if checks.flag("as_torch", as_torch):
        return Prefetcher(draw, prefetch, timeout, as_tensors())
    return Prefetcher(draw, prefetch, timeout, as_drawn)


def get_all_transitions(self: Table, *, indexes: bool = False) -> Batch:
    """Copies of every stored transition (a sequence table's: step, with ``episode_step``),
    oldest first -- lane by lane, or in an ordered selector's order of insertion.

    Safe while other processes write: it holds every row that was complete when it started
    and was not overwritten before it finished, and never a row that is being written.
    With ``indexes``, also the slot of each row (``"indexes"``, as ``sample`` returns them).
    """
    return self._snapshot(slots=checks.flag("indexes", indexes))[0]


def read(self: Table, indexes: ArrayLike) -> Batch:
    """Copies of the rows in slots ``indexes`` (the ``indexes`` a sample returns).

    Each slot must hold a complete row (ValueError otherwise, naming the first that does
    not).  Like :meth:`get_all_transitions` it never returns a torn row: a row overwritten
    while it was copied is read again.
    """
    idx = checks.indexes("indexes", indexes)
    size = self._config.size
    bad = np.flatnonzero((idx < 0) | (idx >= size))
    if bad.size:
        raise ValueError(f"indexes: expected slots in [0, {size}), got {int(idx[bad[0]])} at position {int(bad[0])}")
    for _ in range(_READ_ATTEMPTS):
        slots, guards, _, _ = self._handle.snapshot(False)
        where = np.full(size, -1, dtype=np.int64)
        where[slots] = np.arange(len(slots))
        found = where[idx]
        missing = np.flatnonzero(found < 0)
        if missing.size:
            j = int(missing[0])
            raise ValueError(f"indexes: slot {int(idx[j])} (position {j}) holds no complete transition")
        rows = self._copy_rows(idx)
        if self._handle.unchanged(idx, (guards[0][found], guards[1][found])).all():
            return rows
    raise TimeoutError(f"read: the slots were overwritten while being copied {_READ_ATTEMPTS} times in a row")


def snapshot(
    self: Table,
    priorities: bool = False,
    slots: bool = False,
    copy: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None,
    arrivals: bool = False,
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """``(rows, raw priorities or None)`` of every complete row, oldest first; with ``slots``,
    ``rows["indexes"]`` holds their slots, with ``arrivals`` ``rows["arrivals"]`` their places
    in the selector's order of insertion.  ``copy`` copies the rows of slots (None:
    :meth:`_copy_rows`).  The set is taken under the lock, the rows copied without it, and
    rows overwritten meanwhile left out."""
    listed, guards, raw, order = self._handle.snapshot(priorities)
    rows = (self._copy_rows if copy is None else copy)(listed)
    keep = self._handle.unchanged(listed, guards)
    if not keep.all():
        rows = {name: r[keep] for name, r in rows.items()}
        raw = None if raw is None else raw[keep]
        listed, order = listed[keep], order[keep]
    if slots:
        rows["indexes"] = listed
    if arrivals:
        rows["arrivals"] = order
    return rows, raw


def copy_rows(self: Table, slots: np.ndarray) -> dict[str, np.ndarray]:
    """Copies of the rows in ``slots`` (compressed fields rebuilt), without the lock."""
    config, arrays = self._config, self._memory.arrays
    rows = {name: arr[slots] for name, arr in self._fields.items()}
    if config.compression is not None:
        for name, key, nxt, shape, dtype in config.compression.make_frames(config.specs, arrays)[1]:
            out = np.empty((len(slots),) + shape, dtype=dtype)
            self._frames.rebuild_into(key, arrays[NEXT_ARRAY][slots] if nxt else slots, out)
            rows[name] = out
        rows = {name: rows[name] for name in config.specs}
    if config.sequence is not None:
        rows[EPISODE_STEP] = arrays[EPISODE_STEP_ARRAY][slots]
    return rows


def get_max_priority(self: Table) -> float:
    """Largest priority stored now (1.0 when none is)."""
    m = self._selector.largest_priority()
    return 1.0 if m == -np.inf else float(m)


def default_priority(self: Table) -> float:
    """The priority an item added now without one gets (the selector's ``new_priority`` rule)."""
    return float(self._selector.new_item_priority)


def leaf_mass(self: Table) -> tuple[float, float]:
    """``(total, smallest)``: the sum of the drawable items' weights and the smallest positive
    one (inf when none)."""
    return float(self._selector.total_weight), float(self._selector.smallest_weight)


def sample_leaves(self: Table, batch_size: int, *, timeout: float | None = None) -> dict[str, np.ndarray]:
    """Draw as :meth:`sample` does, but give each row's ``leaf`` weight and slot ``tags``
    instead of importance weights: for a client that draws from several tables and weighs
    the rows across all of them (:mod:`mpreplay.sharded`).  A slot's tag changes whenever
    the slot is rewritten: :meth:`slot_tags` tells whether a sampled row is still there."""
    return self._handle.sample(
        checks.integer("batch_size", batch_size, low=1), True, -1.0, checks.seconds("timeout", timeout), None, True
    )


def slot_tags(self: Table, indexes: ArrayLike) -> np.ndarray:
    """The current tag of each slot in ``indexes`` (see :meth:`sample_leaves`); -1 while a
    writer holds the slot."""
    return self._handle.tags(checks.indexes("indexes", indexes))


def save_transitions(
    self: Table,
    file: str | os.PathLike[str] | IO[bytes],
    *,
    compress: bool = True,
    priorities: bool = False,
    safe: bool | None = None,
) -> None:
    """Write every stored row, oldest first, to ``file`` in mpreplay's file format
    (:mod:`mpreplay.fileformat`): a path (written atomically) or a binary file object;
    ``compress`` deflates the arrays; ``priorities`` also stores each item's priority (a
    table that draws by priority).  Other processes may keep writing meanwhile: as in
    :meth:`get_all_transitions`, the file holds every row complete when the call started
    and not overwritten before it was copied.  A compressed or sequence table's file also
    numbers each row's episode and names its lane (see :meth:`load_transitions`).
    ``safe`` is deprecated and changes nothing (files hold the plain layout)."""
    if safe is not None:
        deprecated.moved("save_transitions(safe=)", "save_transitions() without safe=: files hold the plain layout")
    save_table(
        file,
        self._config,
        self._memory.arrays,
        self._snapshot,
        self._copy_rows,
        self._lanes,
        compress=checks.flag("compress", compress),
        priorities=checks.flag("priorities", priorities),
    )


def stats(self: Table) -> dict[str, float | None]:
    """Counters since creation: stored, inserts, samples, stale updates dropped, torn rows
    resampled, lock wait seconds and acquisitions, and how many times a process died holding
    the lock and the next holder repaired the table (``lock_recoveries``; 0 for a local
    one); ``reserved``, the slots writers reserved (what a rate limiter counts as inserted),
    ``blocked_calls``, the calls waiting now; who holds the lock now (``lock_holder_pid``,
    ``lock_held_seconds``: None when free, and for a local table); a sequence table's
    ``sequences``, how many are sampleable now."""
    h = self._header
    holder = self._lock.holder() if self._lock is not None else None
    out: dict[str, float | None] = {
        "stored": int(h[STORED]),
        "inserts": int(h[INSERTS]),
        "reserved": int(h[RESERVED]),
        "samples": int(h[SAMPLES]),
        "stale_updates_dropped": int(h[STALE]),
        "torn_rows_resampled": int(h[TORN]),
        "blocked_calls": int(h[WAITERS]),
        "lock_wait_seconds": int(h[LOCK_WAIT_NS]) * 1e-9,
        "lock_acquisitions": int(h[LOCK_HOLDS]),
        "lock_recoveries": 0 if self._lock is None else self._lock.recoveries,
        "lock_holder_pid": None if holder is None else holder[0],
        "lock_held_seconds": None if holder is None else holder[1],
    }
    if self._config.sequence is not None:
        out["sequences"] = int(np.count_nonzero(self._memory.arrays[SEQUENCE_STEPS_ARRAY]))
    return out


def verify(self: Table, *, timeout: float | None = None) -> dict[str, object]:
    """Check that the table is consistent -- an fsck: under the lock (``timeout`` bounds the
    wait), every count, the selector's state, the lanes and the sequence index are checked
    against the slot states (see :mod:`mpreplay.consistency`).  Returns a report (slots,
    complete, waiting, being written, drawable, lanes); raises
    :class:`~mpreplay.errors.CorruptBufferError` listing every disagreement.  Safe at any
    time, other processes running; taking the lock first repairs what a holder that died
    left, as any call does."""
    return self.inspection().verify(checks.seconds("timeout", timeout))


def inspection(self: Table) -> Inspection:
    """The operator's and tester's view of this table's memory, selector and lock
    (:mod:`mpreplay.inspect`): what the public API does not show, without private names."""
    self._check_open()
    config = self._config
    return Inspection(
        self._memory,
        self._gate,
        self._handle,
        self._selector,
        capacity=config.size,
        sequence_length=self.sequence_length,
        one_lane=config.compression is None,
        selector_name=config.selector.name,
        lock=self._lock,
    )


def checkpoint(
    self: Table, path: str | os.PathLike[str], *, timeout: float | None = None, compress: bool = False
) -> dict[str, Any]:
    """Write the table's whole state to folder ``path`` in its own layout -- rows and
    frames as stored, priorities and the selector's state, counters, the rate limiter,
    lanes, and this handle's random stream -- replacing the checkpoint there atomically;
    :func:`mpreplay.restore` builds the table again (see docs/run-for-days.md).

    Other processes may write and sample meanwhile: the lock is held only while the
    per-slot state is copied (``timeout`` bounds the wait for it); rows and frames are
    copied after, and a row changed meanwhile is left out whole.  An episode open in a
    lane ends at the checkpoint.  ``path`` must not exist, or be a checkpoint or an empty
    folder (ValueError otherwise: nothing else is ever replaced).  ``compress``: each chunk
    of the checkpoint deflated (ISA-L's where the ``checkpoint`` extra is installed, zlib's,
    slower, otherwise; either restores what the other wrote) -- Atari frames take a tenth
    or less of the bytes, for CPU on a few threads while it is written and restored.
    Returns the checkpoint's manifest (its figures: ``stored``, ``rows_left_out``,
    ``data_nbytes``, ``cut_seconds``, ``compression``)."""
    self._check_open()
    compress = checks.flag("compress", compress)
    source = CheckpointSource(
        self._config,
        type(self).__name__,
        self._memory.layout,
        self._memory.arrays,
        self._gate.hold,
        self._gate.let_go,
        self._handle,
        (0, 0) if self._frames is None else (self._frames.max_stack - 1, self._frames.max_next),
    )
    return write_checkpoint(path, source, timeout=checks.seconds("timeout", timeout), compress=compress)
