"""Replay buffers with cpprb's API: one implementation over any memory.

Every buffer keeps its state in the arrays of a :mod:`mpreplay.memory`
block: a header of counters, one generation per slot, the priority trees and
the fields.  A local buffer puts the block on the heap and uses a no-op lock;
the shared twins put it in a shared-memory segment behind a process-shared
lock.  The protocol (see docs/architecture.md) is the same for both:

* **add** -- convert the whole batch first; under the lock reserve slots,
  make their generation odd and their leaves zero; copy the rows unlocked;
  under the lock make the generations even and publish the priorities.
* **sample** -- under the lock draw slots and note their generations; gather
  unlocked; a row whose generation moved meanwhile is torn and drawn again.
* **update_priorities** -- applied only where the slot still holds what was
  sampled; stale updates are dropped and counted.
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import checks, fileformat, manifest, selectors
from ._ext.calls import BufferCalls, PrioritizedCalls
from ._ext.gate import Gate, deadline
from ._ext.lock import LOCK_NBYTES, SharedLock, ThreadLock
from ._ext.processes import process_token
from ._ext.ring import Ring
from ._ext.schema import (
    EPISODE_STEP_ARRAY,
    INSERTS,
    LANE_CURSOR,
    LANE_END,
    LANE_START,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    MANIFEST_ARRAY,
    RESERVED,
    ROWS_ARRAY,
    SAMPLES,
    SEQUENCE_STEPS_ARRAY,
    STALE,
    STORED,
    TIMES_SAMPLED_ARRAY,
    TORN,
    WAITERS,
    WRITERS_ARRAY,
    field_array,
    row_layout,
    segment_arrays,
)
from ._ext.selector import Selector
from ._ext.sequences import Sequences
from ._ext.slots import Slots, recover
from ._ext.sumtree import PriorityTree
from .compression import Compression, FrameWriter, with_next_fields
from .errors import BufferClosed
from .inspect import Inspection
from .limiter import ExactlyOnce, RateLimiter
from .memory import FileMemory, HeapMemory, Layout, SharedMemory
from .nstep import NstepBuffer
from .prefetch import Prefetcher
from .saved_episodes import load_episodes, split_episodes, stack_age, transition_episodes
from .selectors import SelectorSpec
from .sequences import SequenceWriter
from .spec import convert_batch, parse_env_dict

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer", "MPPrioritizedReplayBuffer", "BufferClosed"]


# Times read() copies rows that writers keep overwriting before it gives up.
_READ_ATTEMPTS = 100
_DEPTH = "frames.depth"  # in the rows a compressed buffer's save copies: each slot's depth (no field's name)

# Attributes that view a buffer's memory: close() replaces them with _CLOSED.
_VIEWS = (
    "_header",
    "_generation",
    "_tree",
    "_selector",
    "_fields",
    "_ring",
    "_lock",
    "_frames",
    "_writer",
    "_lanes",
    "_sequences",
    "_gate",
)


class _Closed:
    """What a closed buffer holds in place of each view of its memory: any use of it
    raises BufferClosed.  (A class-level ``__getattr__`` on the buffer would do the
    same, but it would slow every attribute lookup of the hot methods.)"""

    __slots__ = ()

    def _closed(self, *args: Any, **kwargs: Any) -> Any:
        raise BufferClosed("the replay buffer is closed")

    __getattr__ = __getitem__ = __setitem__ = __iter__ = __len__ = __call__ = _closed


_CLOSED = _Closed()


class ReplayBuffer(BufferCalls):
    """Experience replay, uniform unless another selector is given.

    Parameters
    ----------
    size : int
        Capacity in transitions; the oldest are overwritten when full.
    env_dict : mapping
        cpprb-style field specs, e.g. ``{"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}``.
        A missing shape means a scalar; a missing dtype means ``default_dtype``.
    selector : str or SelectorSpec, optional
        What ``sample`` draws (see :mod:`mpreplay.selectors`): ``"uniform"`` (the default; every stored
        transition equally likely), ``"fifo"`` (oldest first), ``"lifo"`` (newest first), or any
        other registered selector that draws by no priority (those that do take a
        :class:`PrioritizedReplayBuffer`).
    max_times_sampled : int, optional
        Retire a transition once it has been sampled this many times (Reverb's option): it is
        no longer drawn, stored or listed, counted in the table's memory, so across processes
        and through crash recovery.  A sample of ``k`` then needs ``k`` stored transitions
        (it waits for the rate limiter's say, or raises ValueError without one).  Not for
        sequence buffers.
    default_dtype : numpy dtype, optional
        dtype of fields that do not name one (float32 when None).
    seed : int, optional
        Seed of the sampling generator.
    rate_limiter : RateLimiter, optional
        :class:`~mpreplay.MinSize` or :class:`~mpreplay.SampleToInsertRatio`: ``sample`` and
        ``add`` then wait (``timeout`` seconds at most) until the limiter lets them through.
        :class:`~mpreplay.Queue` or :class:`~mpreplay.Stack` (``size`` items, each sampled
        exactly once) also choose the selector and ``max_times_sampled=1``.
    nstep : mapping, optional
        Fold rewards over n steps before storing, with an :class:`~mpreplay.NstepBuffer`:
        ``{"size": n, "gamma": 0.99, "rew": "rew", "next": "next_obs", "done": "done",
        "truncated": None}``.  Stored transitions then carry a ``discount`` field, gamma ** m;
        each process folds its own steps.  (cpprb's spelling ``Nstep=`` raises TypeError:
        ``mpreplay.compat.cpprb`` takes it, with cpprb's timing.)
    next_of : str or list of str, optional
        Store each of these observations once: ``next_<key>`` is rebuilt from the slot of
        the observation it equals (cpprb's option).  ``next_<key>`` is added to the fields
        when ``env_dict`` does not name it; ``add`` still takes it.
    stack_compress : str or list of str, optional
        Stacked observations (last axis = stack) stored as single frames and rebuilt on
        sample, repeating an episode's first frame at its start.
    lanes : int
        Compressed buffers only: how many processes may write at once (each fills its own
        lane of ``size // lanes`` slots, so an episode's steps stay consecutive).
    mmap_prefix : str, optional
        Local buffers only: keep every array in a file mapped into memory, field ``<name>``
        in ``<prefix>_<name>.dat`` (cpprb's names) and the buffer's own arrays in
        ``<prefix>.<array>.dat``: a buffer larger than RAM, paged by the operating system.
        Existing files are overwritten; the files stay after ``close()``.

    Episodes end at a step whose ``done`` (or ``truncated``) field is set, and at
    :meth:`on_episode_end`.

    A buffer object is meant for one thread at a time; the shared twins are
    safe across processes (one object per process).
    """

    _CONFIG: tuple[str, ...] = (  # what a handle carries
        "_size",
        "_specs",
        "_nstep_args",
        "_compression",
        "_mmap_prefix",
        "_thread_lock",
        "_selector_spec",
        "_max_times_sampled",
    )
    _LOCK_NBYTES = 0  # a local buffer has no lock in its memory: its threads take a ThreadLock
    _sequence: Any = None  # a sequence buffer's SequenceSpec (mpreplay.sequence_buffer)

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        default_dtype: Any = None,
        seed: int | None = None,
        rate_limiter: RateLimiter | None = None,
        nstep: Mapping[str, Any] | None = None,
        Nstep: None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        mmap_prefix: str | os.PathLike | None = None,
        selector: str | SelectorSpec | None = None,
        max_times_sampled: int | None = None,
    ):
        size = checks.capacity("size", size)
        if isinstance(rate_limiter, ExactlyOnce):
            selector, max_times_sampled = rate_limiter.buffer_options(selector, max_times_sampled)
        self._selector_spec = self._check_selector(SelectorSpec.of("uniform" if selector is None else selector))
        self._max_times_sampled = (
            None if max_times_sampled is None else checks.integer("max_times_sampled", max_times_sampled, low=1)
        )
        if self._max_times_sampled is not None and self._sequence is not None:
            raise ValueError("max_times_sampled: a sequence buffer's items are sequences; it does not retire them")
        if mmap_prefix is not None and not isinstance(mmap_prefix, (str, os.PathLike)):
            raise TypeError(f"mmap_prefix: expected a path prefix (str) or None, got {type(mmap_prefix).__name__}")
        self._mmap_prefix = None if mmap_prefix is None else os.fspath(mmap_prefix)
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise TypeError(
                    f"rate_limiter: expected MinSize, SampleToInsertRatio or RateLimiter, "
                    f"got {type(rate_limiter).__name__}"
                )
            rate_limiter.check(size)
        self._size = size
        self._nstep_args = _nstep_args(env_dict, default_dtype, nstep, Nstep)
        self._make_folders()
        self._specs = parse_env_dict(self._nstep.output_env_dict() if self._nstep else env_dict, default_dtype)
        self._specs = with_next_fields(self._specs, next_of)
        self._compression = Compression.build(
            self._specs,
            next_of,
            stack_compress,
            lanes,
            "done" if "done" in self._specs else None,
            "truncated" if "truncated" in self._specs else None,
            in_lanes=self._sequence is not None,
        )
        self._memory = self._allocate(self._layout())
        if rate_limiter is not None:
            self._memory.arrays["limits"][:] = rate_limiter.to_array()
        self._bind(create=True, rng=np.random.default_rng(seed))

    # -- memory -------------------------------------------------------------
    def _layout(self) -> Layout:
        c = self._compression
        stored = self._specs if c is None else c.stored_fields(self._specs)
        fields = [(name, self._specs[name].shape, self._specs[name].dtype) for name in stored]
        # Fields side by side in one row per slot, except in files of their own (cpprb's mmap_prefix).
        rows = self._mmap_prefix is None
        layout = Layout()
        for name, shape, dtype in segment_arrays(
            self._size,
            1 if c is None else c.lanes,
            self._selector_array(),
            fields,
            None if c is None else [(key, c.frame_shape(key, self._specs), self._specs[key].dtype) for key in c.keys],
            self._LOCK_NBYTES,
            self._sequence is not None,
            rows,
            self._max_times_sampled is not None,
        ):
            layout.add(name, shape, dtype)
        if rows and fields:
            layout.add_row_views(
                ROWS_ARRAY, [(field_array(name), shape, dtype) for name, shape, dtype in fields], row_layout(fields)[1]
            )
        return layout

    def _check_selector(self, spec: SelectorSpec) -> SelectorSpec:
        """``spec``, if this class's API drives it (priorities given and updated: a prioritized buffer)."""
        prioritized = isinstance(self, PrioritizedReplayBuffer)
        if spec.entry.by_priority != prioritized:
            raise ValueError(
                f"selector: {spec.name!r} draws by {'no ' if prioritized else ''}priority: build a "
                f"{'' if prioritized else 'Prioritized'}{'ReplayBuffer'} (or its MP or sequence twin) "
                f"with it"
            )
        return spec

    def _selector_array(self) -> tuple[str, int, np.dtype]:
        """Name, length and dtype of the selector's array (see :mod:`mpreplay.selectors`)."""
        return selectors.state_array(self._selector_spec.name, self._size)

    def _make_selector(self, array: np.ndarray, create: bool) -> Selector:
        return selectors.make(self._selector_spec, array, self._size, create)

    def _allocate(self, layout: Layout) -> HeapMemory | FileMemory | SharedMemory:
        return HeapMemory(layout) if self._mmap_prefix is None else FileMemory(layout, self._mmap_prefix)

    def _make_lock(self, create: bool) -> ThreadLock:
        # One process: a lock between its threads (a prefetching sampler, the training
        # thread's updates), shared by every handle of this memory (episode writers).
        self._lock = None
        if create:
            self._thread_lock = ThreadLock()
        return self._thread_lock

    def _bind(self, create: bool, rng: np.random.Generator) -> None:
        """Make views of the memory's arrays; ``create`` initialises them."""
        arrays = self._memory.arrays
        self._header = arrays["header"]
        self._generation = arrays["generation"]
        self._selector = self._make_selector(arrays[self._selector_array()[0]], create)
        c = self._compression
        self._fields = {name: arrays[field_array(name)] for name in self._specs if field_array(name) in arrays}
        self._lanes = arrays["lanes"]
        if create:
            if c is None:
                self._lanes[0, [LANE_START, LANE_CURSOR, LANE_END]] = 0, 0, self._size
            else:
                c.lane_bounds(self._size, self._lanes)
        if create:
            manifest.encode(
                self._manifest(self._memory.layout),
                arrays[MANIFEST_ARRAY],
                owner=process_token(os.getpid()),
                created=time.time(),
            )
        self._frames, outputs = (None, None) if c is None else c.make_frames(self._specs, arrays)
        self._sequences = (
            None
            if self._sequence is None
            else Sequences(arrays[SEQUENCE_STEPS_ARRAY], self._lanes, self._sequence.length)
        )
        self._gate = gate = Gate(self._header, arrays["limits"], self._make_lock(create))
        slots = Slots(
            self._header,
            self._lanes,
            self._generation,
            arrays["owner"],
            arrays["state"],
            arrays[WRITERS_ARRAY],
            self._selector,
            self._frames,
            self._sequences,
            *self._times_sampled(),
        )
        # A sequence's samples also carry each step's index in its episode.
        sampled = list(self._fields.items()) + (
            [] if self._sequences is None else [(EPISODE_STEP_ARRAY, arrays[EPISODE_STEP_ARRAY])]
        )
        self._ring = Ring(
            self._header, gate, slots, self._selector, sampled, rng, self._frames, outputs, self._sequences
        )
        self._writer = None if c is None else FrameWriter(c, self._specs, self._ring, arrays)
        if self._sequence is not None:
            self._writer = SequenceWriter(
                self._sequence, self._writer, [flag for flag in (c.done, c.truncated) if flag is not None]
            )
        # One transition goes straight to the kernel (Ring.add_one) unless it is folded or planned first.
        self._bind_calls(self._ring, self._nstep is None and self._writer is None, **self._call_options())

    def _times_sampled(self) -> tuple[np.ndarray | None, int]:
        """Each slot's draw count and the count that retires it (None, 0: no max_times_sampled)."""
        return self._memory.arrays.get(TIMES_SAMPLED_ARRAY), self._max_times_sampled or 0

    def _call_options(self) -> dict[str, Any]:
        """What the per-step calls take beyond the kernel (see ``calls.pyx``)."""
        return {}

    def _manifest(self, layout: Layout) -> dict[str, Any]:
        """What another process needs to read this buffer's memory over ``layout`` (see
        :mod:`mpreplay.manifest`): what the creator writes, and what an attaching process
        expects to find."""
        c = self._compression
        return {
            "class": type(self).__name__,
            "capacity": self._size,
            "fields": {name: {"shape": list(s.shape), "dtype": s.dtype.str} for name, s in self._specs.items()},
            "next_of": [] if c is None else list(c.next_of),
            "stack_compress": [] if c is None else list(c.stack),
            "selector": self._selector_spec.name,
            "max_times_sampled": self._max_times_sampled,
            "sequence": None
            if self._sequence is None
            else {"length": self._sequence.length, "period": self._sequence.period},
            "arrays": [[name, list(shape), dtype, offset] for name, shape, dtype, offset in layout.entries],
            "nbytes": layout.nbytes,
        }

    def close(self) -> None:
        """Release the buffer's memory; later calls raise :class:`BufferClosed`.

        For a shared buffer, the creating process also unlinks the segment, and
        callers blocked in other processes wake up with :class:`BufferClosed`.
        """
        if self._is_open():
            if self._writer is not None:
                self._writer.release_lane()
            if self._memory.is_owner:
                self._ring.close()
        _FORK_SENSITIVE.discard(self)
        self._bind_calls(None, False)
        for name in _VIEWS:
            self.__dict__[name] = _CLOSED
        self._memory.close()

    def _is_open(self) -> bool:
        return isinstance(self.__dict__.get("_ring"), Ring)

    def _check_open(self) -> None:
        """Raise BufferClosed after close(), as every method does."""
        if not self._is_open():
            raise BufferClosed("the replay buffer is closed")

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- cpprb API ------------------------------------------------------------
    def get_buffer_size(self) -> int:
        """Capacity in transitions."""
        return self._ring.size

    def get_stored_size(self) -> int:
        """Number of transitions stored (at most the capacity)."""
        return int(self._header[STORED])

    def get_next_index(self) -> int:
        """Slot the next added transition goes to."""
        return int(self._lanes[0, LANE_CURSOR])

    def get_env_dict(self) -> dict[str, dict[str, Any]]:
        """The normalised field specs."""
        self._check_open()
        return {n: {"shape": s.shape, "dtype": s.dtype} for n, s in self._specs.items()}

    def _add(self, fields: dict[str, Any], priorities: Any, timeout: float | None) -> int | None:
        if timeout is not None:
            timeout = checks.seconds("timeout", timeout)
        if self._nstep is not None:
            return self._add_folded(fields, priorities, timeout)
        if (priorities is None or type(priorities) is float) and self._sequence is None:
            # One transition of Python scalars and exact arrays: the kernel's fast path.
            if priorities is None:
                priority = -1.0
            elif 0.0 <= priorities <= self._ring.max_priority:  # False for NaN
                priority = priorities
            else:
                priority = checks.number("priorities", priorities, low=0.0, high=self._ring.max_priority)
            slot = (
                self._ring.add_one(fields, priority, timeout)
                if self._writer is None
                else self._writer.add_one(fields, priority, timeout)
            )
            if slot >= 0:
                return slot
        k, rows = convert_batch(self._specs, fields)
        if priorities is not None:
            # Checked before anything is written (Ring.update checks its own input).
            priorities = checks.priorities("priorities", priorities, k, max_priority=None)
            self._ring.check_priorities(priorities)
        return self._write(k, rows, priorities, timeout)

    def _write(
        self,
        k: int,
        rows: dict[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
    ) -> int | None:
        if self._writer is not None:
            return self._writer.write(k, rows, priorities, timeout, end_episode)
        return self._store(k, rows, priorities, timeout)

    def _add_folded(self, fields: dict[str, Any], priorities: Any, timeout: float | None) -> int | None:
        """Fold the steps of ``fields``, and their ``priorities`` alongside (prioritized buffers).

        The folders change only once the rows they emit are stored: an add that raises
        (a timeout, bad rows) leaves them as they were, so the same add can be made again."""
        if self._priority_folder is None:
            rows, after = self._nstep.preview_add(**fields)
            slot = self._store_folded(rows, None, timeout)
            self._nstep.commit(after)
            return slot
        k = self._nstep.check(**fields)  # before either folder is asked
        if priorities is None:
            # NaN: "the largest priority stored when the folded row is stored".
            priorities = np.full(k, np.nan)
        else:
            priorities = checks.priorities("priorities", priorities, k, max_priority=None)
            self._ring.check_priorities(priorities)
        rows, after = self._nstep.preview_add(**fields)
        settings = self._nstep_args[2]
        flags = {settings[f]: fields[settings[f]] for f in ("done", "truncated") if settings[f] is not None}
        folded, priorities_after = self._priority_folder.preview_add(priority=priorities, **flags)
        slot = self._store_folded(rows, folded["priority"], timeout)
        self._nstep.commit(after)
        self._priority_folder.commit(priorities_after)
        return slot

    def _store_folded(
        self,
        rows: dict[str, np.ndarray],
        priorities: np.ndarray | None,
        timeout: float | None,
        end_episode: bool = False,
    ) -> int | None:
        """Store what the n-step folder emitted; None when it emitted nothing."""
        k, rows = convert_batch(self._specs, rows)
        if priorities is not None and np.isnan(priorities).any():
            priorities = np.where(np.isnan(priorities), self.default_priority(), priorities)
        return self._write(k, rows, priorities, timeout, end_episode) if k or end_episode else None

    def _store(self, k: int, rows: dict[str, np.ndarray], priorities: np.ndarray | None, timeout: float | None) -> int:
        """Write ``k`` converted rows through the ring protocol."""
        size = self._size
        until = deadline(timeout)
        first = self.get_next_index()
        skip = 0
        if k > size:
            # Only the newest `size` rows would survive: skip the others, in the
            # same reservation (of every slot) that takes the newest.
            skip = k - size
            rows = {n: r[skip:] for n, r in rows.items()}
            priorities = None if priorities is None else priorities[skip:]
            k = size
        start, reserved = self._ring.reserve(k, until, skip=skip)
        try:
            head = min(k, size - start)
            for name, dst in self._fields.items():
                src = rows[name]
                dst[start : start + head] = src[:head]
                dst[: k - head] = src[head:]
        except BaseException:
            self._ring.abandon(start, reserved)
            raise
        self._ring.publish(start, reserved, priorities, deadline=until)
        return first

    def batches(
        self, batch_size: int, *, prefetch: int = 2, timeout: float | None = None, as_torch: bool = False
    ) -> Prefetcher:
        """An endless iterator of ``sample(batch_size)`` batches drawn ``prefetch`` ahead on a
        background thread while the caller trains (see :mod:`mpreplay.prefetch`).

        Each batch's arrays are refilled once the next batch is asked for.  ``timeout``
        bounds each wait for the rate limiter (then ``next()`` raises TimeoutError);
        ``as_torch`` hands out CPU tensors over the same memory.  Close it (or use ``with``)
        to stop the thread.
        """
        batch_size = checks.integer("batch_size", batch_size, low=1)
        return self._prefetcher(lambda out, t: self.sample(batch_size, timeout=t, out=out), prefetch, timeout, as_torch)

    def _prefetcher(
        self,
        draw: Callable[[dict[str, np.ndarray] | None, float | None], dict[str, np.ndarray]],
        prefetch: int,
        timeout: float | None,
        as_torch: bool,
    ) -> Prefetcher:
        self._check_open()
        return Prefetcher(
            draw,
            checks.integer("prefetch", prefetch, low=1),
            checks.seconds("timeout", timeout),
            checks.flag("as_torch", as_torch),
        )

    def get_all_transitions(self, *, indexes: bool = False) -> dict[str, np.ndarray]:
        """Copies of every stored transition, oldest first (lane by lane).

        Safe while other processes write: it holds every transition that was
        complete when it started and was not overwritten before it finished,
        and never a row that is being written.  With ``indexes``, also the slot
        of each row (``"indexes"``, as ``sample`` returns them).
        """
        return self._snapshot(slots=checks.flag("indexes", indexes))[0]

    def _snapshot(
        self,
        priorities: bool = False,
        slots: bool = False,
        copy: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None,
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """``(rows, raw priorities or None)`` of every complete transition, oldest first;
        with ``slots``, ``rows["indexes"]`` holds their slots.  ``copy`` copies the rows
        of slots (None: :meth:`_copy_rows`).

        The set of transitions is taken under the lock, the rows are copied
        without it, and rows overwritten meanwhile are left out.
        """
        listed, guards, raw = self._ring.snapshot(priorities)
        rows = (self._copy_rows if copy is None else copy)(listed)
        keep = self._ring.unchanged(listed, guards)
        if not keep.all():
            rows = {name: r[keep] for name, r in rows.items()}
            raw = None if raw is None else raw[keep]
            listed = listed[keep]
        if slots:
            rows["indexes"] = listed
        return rows, raw

    def _copy_rows(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the rows in ``slots`` (rebuilding compressed fields), without the lock."""
        rows = {name: arr[slots] for name, arr in self._fields.items()}
        if self._compression is not None:
            arrays = self._memory.arrays
            for name, key, nxt, shape, dtype in self._compression.make_frames(self._specs, arrays)[1]:
                out = np.empty((len(slots),) + shape, dtype=dtype)
                self._frames.rebuild_into(key, arrays["nxt"][slots] if nxt else slots, out)
                rows[name] = out
            rows = {name: rows[name] for name in self._specs}
        return rows

    def read(self, indexes: Any) -> dict[str, np.ndarray]:
        """Copies of the transitions in slots ``indexes`` (the ``indexes`` a sample returns).

        Each slot must hold a complete transition (ValueError otherwise, naming the first
        that does not).  Like :meth:`get_all_transitions` it never returns a torn row: a row
        overwritten while it was copied is read again.
        """
        idx = checks.indexes("indexes", indexes)
        bad = np.flatnonzero((idx < 0) | (idx >= self._size))
        if bad.size:
            raise ValueError(
                f"indexes: expected slots in [0, {self._size}), got {int(idx[bad[0]])} at position {int(bad[0])}"
            )
        for _ in range(_READ_ATTEMPTS):
            slots, guards, _ = self._ring.snapshot(False)
            where = np.full(self._size, -1, dtype=np.int64)
            where[slots] = np.arange(len(slots))
            found = where[idx]
            missing = np.flatnonzero(found < 0)
            if missing.size:
                j = int(missing[0])
                raise ValueError(f"indexes: slot {int(idx[j])} (position {j}) holds no complete transition")
            rows = self._copy_rows(idx)
            if self._ring.unchanged(idx, (guards[0][found], guards[1][found])).all():
                return rows
        raise TimeoutError(f"read: the slots were overwritten while being copied {_READ_ATTEMPTS} times in a row")

    def clear(self) -> None:
        """Forget every transition, and the steps an n-step folder holds (the capacity stays)."""
        self._ring.clear()
        self._forget_pending()

    def _forget_pending(self) -> None:
        """Drop the steps the n-step folders hold and the episode a compressed writer is in."""
        if self._nstep is not None:
            self._nstep.clear()
        if self._priority_folder is not None:
            self._priority_folder.clear()
        if self._writer is not None:
            self._writer.reset()

    def on_episode_end(self, *, timeout: float | None = None) -> None:
        """End the current episode (cpprb API): with ``nstep``, store its pending
        steps, folded as if the last one was truncated (they bootstrap); with
        ``next_of``, store the episode's last next observation.

        ``timeout`` bounds the waits for the rate limiter and the lock, as in :meth:`add`;
        on TimeoutError the episode has not ended and nothing changed: call again."""
        timeout = checks.seconds("timeout", timeout)
        if self._nstep is not None:
            rows, after = self._nstep.preview_episode_end()
            priorities, priorities_after = None, None
            if self._priority_folder is not None:
                folded, priorities_after = self._priority_folder.preview_episode_end()
                priorities = folded["priority"]
            self._store_folded(rows, priorities, timeout, end_episode=True)
            self._nstep.commit(after)
            if self._priority_folder is not None:
                self._priority_folder.commit(priorities_after)
        elif self._writer is not None:
            self._writer.write(0, {}, None, timeout, end_episode=True)

    def _make_folders(self) -> None:
        """This writer's own n-step folders: the rows', and (prioritized) the initial priorities'."""
        self._nstep = _make_nstep(self._nstep_args)
        self._priority_folder = (
            _make_priority_folder(self._nstep_args) if isinstance(self, PrioritizedReplayBuffer) else None
        )

    def episode_writer(self) -> ReplayBuffer:
        """A writer for one more stream of episodes into this buffer, in this process.

        A buffer that keeps state between the steps of an episode -- an n-step folder
        (``nstep``), compressed observations (``next_of``, ``stack_compress``: an episode's
        steps sit consecutively in one lane) -- takes one episode at a time from each
        writer.  Code that writes several episodes interleaved (one per sub-environment of
        a vector env, see :mod:`mpreplay.vector_env`) writes each stream through a writer
        of its own: another handle on the same memory, with its own n-step folder and, for
        a compressed buffer, a lane of its own (so create it with ``lanes=`` at least the
        number of writers of every process).  The handle has the buffer's whole API; its
        ``close()`` gives its lane back and never frees the memory.  A buffer without such
        state takes interleaved episodes as they come: it returns itself.
        """
        self._check_open()
        if self._nstep is None and self._writer is None:
            return self
        config = {key: self.__dict__[key] for key in self._CONFIG}
        return _handle(type(self), config, lambda buffer, layout: self._memory.handle())

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
        rows[_DEPTH] = self._memory.arrays["depth"][slots]
        return rows

    def _saved_priorities(self, priorities: Any) -> bool:
        """``save_transitions``'s ``priorities`` flag, checked (prioritized buffers only)."""
        priorities = checks.flag("priorities", priorities)
        if priorities and not isinstance(self, PrioritizedReplayBuffer):
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
        if not isinstance(self, PrioritizedReplayBuffer):
            priorities = None
        ids, lanes = rows.pop(fileformat.EPISODE_ID, None), rows.pop(fileformat.EPISODE_LANE, None)
        k, rows = convert_batch(self._specs, rows)
        if k == 0:
            return 0
        if ids is not None:
            # The file records no step per row: an episode whose oldest rows were overwritten
            # before the save resumes from the older frames its first row's stacks hold.
            episodes = split_episodes(ids, lanes, lambda row: stack_age(rows, row, self._compression.stack))
            load_episodes(self._writer, rows, priorities, episodes)
            return k
        # What add() does, minus two things: n-step rows were folded before they
        # were saved and must not be folded again, and the rows end an episode so
        # that a compressed buffer publishes the last one rather than waiting for
        # a successor that is not in the file.
        self._write(k, rows, priorities, None, end_episode=True)
        return k

    def _file_specs(self) -> dict[str, Any]:
        """The fields a file of this buffer's rows holds."""
        return self._specs

    def _nstep_settings(self) -> tuple[int, float] | None:
        """``(size, gamma)`` of the n-step folding of the stored rows, or None."""
        return None if self._nstep is None else (int(self._nstep.size), float(self._nstep.gamma))

    def stats(self) -> dict[str, float | None]:
        """Counters since creation: stored, inserts, samples, stale updates dropped,
        torn rows resampled, lock wait seconds and lock acquisitions, and how many times
        a process died holding the lock and the next holder repaired the buffer
        (``lock_recoveries``; 0 for a local buffer); ``reserved``, the slots writers
        reserved (what a rate limiter counts as inserted: more than ``inserts`` while
        writes are under way, where a writer died copying, and by the slots a compressed
        buffer gives frames alone), and ``blocked_calls``, the
        calls waiting now for the rate limiter or busy slots; and who holds the lock
        now: ``lock_holder_pid`` and ``lock_held_seconds`` (None when free, and for a
        local buffer), so a call waiting with ``timeout=None`` can be explained."""
        h = self._header
        holder = self._lock.holder() if self._lock is not None else None
        return {
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

    def verify(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Check that the buffer is consistent -- an fsck: under the lock (``timeout`` bounds
        the wait, as in :meth:`add`), every count, the selector's state, the lanes and the
        sequence index are checked against the slot states (see :mod:`mpreplay.consistency`).
        Returns a report (slots, complete, waiting, being written, drawable, lanes); raises
        :class:`~mpreplay.errors.CorruptBufferError` listing every disagreement.  Safe at any
        time, other processes running; taking the lock first repairs what a holder that died
        left, as any call does."""
        return self.inspection().verify(checks.seconds("timeout", timeout))

    def inspection(self) -> Inspection:
        """The operator's and tester's view of this buffer's memory, selector and lock
        (:mod:`mpreplay.inspect`): what the public API does not show, without private names."""
        self._check_open()
        return Inspection(
            self._memory,
            self._gate,
            self._ring,
            self._selector,
            capacity=self._size,
            sequence_length=None if self._sequence is None else self._sequence.length,
            one_lane=self._writer is None,
            selector_name=self._selector_spec.name,
        )


_NSTEP_KEYS = {"size", "gamma", "rew", "next", "done", "truncated"}


def _nstep_args(env_dict: Any, default_dtype: Any, options: Any, Nstep: Any) -> tuple | None:
    """The n-step folder's arguments (picklable, so shared handles can rebuild it)."""
    if Nstep is not None:
        raise TypeError(
            "Nstep: mpreplay's buffers take nstep= (cpprb's spelling, with cpprb's timing, is mpreplay.compat.cpprb's)"
        )
    if options is None:
        return None
    if not isinstance(options, Mapping) or "size" not in options:
        raise TypeError(f"nstep: expected a mapping with at least 'size' (keys {sorted(_NSTEP_KEYS)}), got {options!r}")
    unknown = set(options) - _NSTEP_KEYS
    if unknown:
        raise ValueError(f"nstep: unknown keys {sorted(unknown)}; expected {sorted(_NSTEP_KEYS)}")
    settings = {"gamma": 0.99, "rew": "rew", "next": "next_obs", "done": "done", "truncated": None, **options}
    return (dict(env_dict), default_dtype, settings)


def _make_nstep(args: tuple | None) -> NstepBuffer | None:
    if args is None:
        return None
    env_dict, default_dtype, settings = args
    settings = dict(settings)
    return NstepBuffer(env_dict, settings.pop("size"), settings.pop("gamma"), default_dtype=default_dtype, **settings)


def _make_priority_folder(args: tuple | None) -> NstepBuffer | None:
    """A folder that moves each step's initial priority to the row that starts at that step:
    driven by the same flags as the buffer's folder, it emits its rows in the same order."""
    if args is None:
        return None
    env_dict, default_dtype, settings = args
    flags = {"done": settings["done"], "truncated": settings["truncated"]}
    spec = {"priority": {"dtype": np.float64}}
    for flag in flags.values():
        if flag is not None:
            spec[flag] = {"dtype": parse_env_dict({flag: env_dict[flag]}, default_dtype)[flag].dtype}
    return NstepBuffer(spec, settings["size"], settings["gamma"], rew=None, next=None, **flags)


class PrioritizedReplayBuffer(PrioritizedCalls, ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016), stratified as in Ape-X.

    A transition is drawn with probability ``(p_i + eps)**alpha / sum_j (p_j + eps)**alpha``.
    New transitions without given priorities get the largest priority stored now
    (1.0 in an empty buffer).

    Parameters
    ----------
    alpha : float
        Prioritisation exponent (0 = uniform).
    eps : float
        Added to every priority so none has zero probability.
    new_priority : {"max_stored", "max_ever"}
        What a transition added without a priority gets: the largest priority stored
        now, or the largest ever set (at least 1.0, never falling until ``clear()``:
        cpprb's rule, shared by every process of a shared buffer).
    selector : str or SelectorSpec, optional
        Another selector that draws by priority: ``"max_heap"`` (the highest priority first),
        ``"min_heap"`` (the lowest first), see :mod:`mpreplay.selectors`; or
        ``SelectorSpec("prioritized", alpha=..., eps=..., new_priority=...)``, the default
        (``alpha``, ``eps`` and ``new_priority`` are its options: given ``selector``, they stay
        at their defaults here).
    weights_dtype : numpy dtype
        dtype of ``sample``'s importance ``weights``: float64, or float32 (what a float32
        loss takes without a cast).
    indexes_dtype : numpy dtype
        dtype of ``sample``'s ``indexes``: int64, or uint64 (cpprb's).  ``update_priorities``
        takes either.
    **options
        As for :class:`ReplayBuffer`.
    """

    _CONFIG = ReplayBuffer._CONFIG + ("_float32_weights", "_uint64_indexes")
    _tree: PriorityTree | None  # the prioritized selector's tree, None with another selector

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        selector: str | SelectorSpec | None = None,
        weights_dtype: Any = np.float64,
        indexes_dtype: Any = np.int64,
        **options: Any,
    ):
        given = {"alpha": alpha, "eps": eps, "new_priority": new_priority}
        if selector is None:
            selector = SelectorSpec("prioritized", **given)
        else:
            for name, default in (("alpha", 0.6), ("eps", 1e-4), ("new_priority", "max_stored")):
                if not (type(given[name]) is type(default) and given[name] == default):
                    raise TypeError(
                        f"{name}: an option of the prioritized selector; with selector= give it "
                        f"there: SelectorSpec('prioritized', {name}=...)"
                    )
        self._float32_weights = checks.dtype("weights_dtype", weights_dtype, (np.float64, np.float32)) == np.float32
        self._uint64_indexes = checks.dtype("indexes_dtype", indexes_dtype, (np.int64, np.uint64)) == np.uint64
        super().__init__(size, env_dict, selector=selector, **options)

    def _call_options(self) -> dict[str, Any]:
        return {"float32_weights": self._float32_weights, "uint64_indexes": self._uint64_indexes}

    def _make_selector(self, array: np.ndarray, create: bool) -> Selector:
        selector = super()._make_selector(array, create)
        self._tree = getattr(selector, "tree", None)
        return selector

    @property
    def alpha(self) -> float | None:
        """The prioritisation exponent, or None where the selector has none."""
        return self._selector_spec.kernel_options().get("alpha")

    @property
    def eps(self) -> float | None:
        """What is added to every priority, or None where the selector adds nothing."""
        return self._selector_spec.kernel_options().get("eps")

    def leaf_mass(self) -> tuple[float, float]:
        """``(total, smallest)``: the sum of the leaf weights (p + eps) ** alpha of the stored
        transitions and the smallest positive one (inf when none)."""
        return float(self._selector.total_weight), float(self._selector.smallest_weight)

    def get_max_priority(self) -> float:
        """Largest priority stored now (1.0 when the buffer is empty)."""
        m = self._selector.largest_priority()
        return 1.0 if m == -np.inf else float(m)

    def default_priority(self) -> float:
        """The priority a transition added now without one gets (see ``new_priority``)."""
        return float(self._selector.new_item_priority)

    def clear(self) -> None:
        """Forget every transition (and, with ``new_priority="max_ever"``, the priorities ever set)."""
        super().clear()
        if self._tree is not None and self._selector_spec.kernel_options()["max_ever"]:
            self._tree.forget_max_ever()

    @property
    def max_priority(self) -> float:
        """The largest priority this buffer accepts (``get_max_priority()`` is the largest stored):
        no sum of leaf weights can overflow below it.  It depends on the capacity, alpha and eps."""
        return self._ring.max_priority

    def batches(
        self,
        batch_size: int,
        beta: float = 0.4,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: bool = False,
    ) -> Prefetcher:
        """An endless iterator of ``sample(batch_size, beta)`` batches drawn ``prefetch`` ahead
        on a background thread; see :meth:`ReplayBuffer.batches`.  Priorities may be updated
        from the caller's thread meanwhile."""
        batch_size = checks.integer("batch_size", batch_size, low=1)
        beta = checks.number("beta", beta, low=0.0)
        return self._prefetcher(
            lambda out, t: self.sample(batch_size, beta, timeout=t, out=out), prefetch, timeout, as_torch
        )

    def sample_leaves(self, batch_size: int, *, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Draw as :meth:`sample` does, but give each row's ``leaf`` weight (p + eps) ** alpha and
        slot ``tags`` instead of importance weights.

        For a client that draws from several buffers and weighs the rows across all of
        them (:mod:`mpreplay.sharded`).  A slot's tag changes whenever the slot is
        rewritten: :meth:`slot_tags` tells whether a sampled row is still there.
        """
        return self._ring.sample(
            checks.integer("batch_size", batch_size, low=1), True, -1.0, checks.seconds("timeout", timeout), None, True
        )

    def slot_tags(self, indexes: Any) -> np.ndarray:
        """The current tag of each slot in ``indexes`` (see :meth:`sample_leaves`); -1 while
        a writer holds the slot."""
        return self._ring.tags(checks.indexes("indexes", indexes))


def _attach(cls: type, config: dict[str, Any], name: str) -> ReplayBuffer:
    """Unpickle a shared buffer: map the creator's segment (never owning it), once its manifest
    says it holds the layout this process computes from ``config`` (IncompatibleSegmentError if not)."""

    def attach(buffer: ReplayBuffer, layout: Layout) -> SharedMemory:
        expected = buffer._manifest(layout)
        return SharedMemory(layout, name=name, verify=lambda buf: manifest.check_segment(name, buf, expected))

    return _handle(cls, config, attach)


def _handle(
    cls: type, config: dict[str, Any], memory: Callable[[ReplayBuffer, Layout], HeapMemory | FileMemory | SharedMemory]
) -> ReplayBuffer:
    """A buffer object of ``config`` over existing memory (``memory(buffer, layout)``), which it does not own."""
    obj = cls.__new__(cls)
    obj.__dict__.update(config)
    obj._make_folders()
    obj._memory = memory(obj, obj._layout())
    obj._bind(create=False, rng=np.random.default_rng())
    return obj


class SharedMemoryBuffer:
    """The memory of a buffer is a shared-memory segment behind a process-shared lock.

    Pickling sends a small handle (the segment's name and the buffer's
    configuration); unpickling in another process maps the same segment.
    The creating process owns the segment and unlinks it on ``close()``,
    on garbage collection and at exit; other processes only unmap it.
    """

    _memory: SharedMemory
    _LOCK_NBYTES = LOCK_NBYTES

    def _allocate(self, layout: Layout) -> SharedMemory:
        if self._mmap_prefix is not None:
            raise ValueError(
                "mmap_prefix: a shared buffer lives in a shared-memory segment; only local buffers "
                "map their arrays to files"
            )
        return SharedMemory(layout)

    def _make_lock(self, create: bool) -> SharedLock:
        # A holder that died may have left slots, counters and tree nodes half
        # updated: the next owner makes them agree with the slot states again.
        arrays = self._memory.arrays
        self._thread_lock = None  # processes take the segment's lock
        self._lock = SharedLock(
            arrays["lock"],
            create,
            on_recover=functools.partial(
                recover,
                self._generation,
                arrays["state"],
                self._header,
                self._selector,
                self._sequences,
                *self._times_sampled(),
            ),
            counters=self._header[LOCK_WAIT_NS : LOCK_HOLDS + 1],
        )
        return self._lock

    def _bind(self, create: bool, rng: np.random.Generator) -> None:
        super()._bind(create, rng)
        _FORK_SENSITIVE.add(self)

    def __reduce__(self) -> tuple:
        config = {key: self.__dict__[key] for key in self._CONFIG}
        return _attach, (type(self), config, self._memory.name)

    @property
    def name(self) -> str:
        """Name of the shared-memory segment."""
        return self._memory.name


class MPReplayBuffer(SharedMemoryBuffer, ReplayBuffer):
    """:class:`ReplayBuffer` in shared memory, written and sampled by many processes."""


class MPPrioritizedReplayBuffer(SharedMemoryBuffer, PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` in shared memory, written and sampled by many processes."""


_FORK_SENSITIVE: weakref.WeakSet[ReplayBuffer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child must not replay its parent's random stream, judge
    # priority updates by what its parent sampled, or fold its steps onto
    # the ones its parent had pending.
    for buffer in list(_FORK_SENSITIVE):
        buffer._ring.after_fork(np.random.default_rng())
        buffer._forget_pending()


os.register_at_fork(after_in_child=_after_fork_in_child)
