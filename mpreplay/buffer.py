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

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import checks, removers
from ._ext.schema import (
    INSERTS,
    LANE_CURSOR,
    LIMITS_ARRAY,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    RESERVED,
    SAMPLES,
    STALE,
    STORED,
    TORN,
    WAITERS,
)
from .buffer_core import open_handle
from .buffer_files import BufferFiles
from .compression import Compression, with_next_fields
from .errors import BufferClosed
from .inspect import Inspection
from .limiter import ExactlyOnce, RateLimiter
from .nstep import nstep_args
from .prefetch import Prefetcher
from .selectors import SelectorSpec
from .spec import parse_env_dict

__all__ = ["ReplayBuffer", "BufferClosed"]


# Times read() copies rows that writers keep overwriting before it gives up.
_READ_ATTEMPTS = 100


class ReplayBuffer(BufferFiles):
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
        remover: str | None = None,
    ):
        size = checks.capacity("size", size)
        if isinstance(rate_limiter, ExactlyOnce):
            selector, max_times_sampled, remover = rate_limiter.buffer_options(
                selector,
                max_times_sampled,
                remover,
                prioritized=self._PRIORITIZED,
                sequences=self._sequence is not None,
            )
        self._remover = removers.entry("fifo" if remover is None else remover).name
        if not removers.entry(self._remover).overwrites and self._sequence is not None:
            raise ValueError(
                f"remover: a sequence buffer takes no {self._remover!r} remover: its items are sequences, which "
                "no sample retires, so its writes would wait for ever"
            )
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
        self._nstep_args = nstep_args(env_dict, default_dtype, nstep, Nstep)
        self._make_stages()
        self._specs = parse_env_dict(self._nstep.rows.output_env_dict() if self._nstep else env_dict, default_dtype)
        self._specs = with_next_fields(self._specs, next_of)
        if (next_of is not None or stack_compress is not None) and not removers.entry(self._remover).frames:
            framed = [n for n in removers.names() if removers.entry(n).frames]
            raise ValueError(
                f"remover: {self._remover!r} replaces rows whose frames the next steps of an episode read; "
                f"a compressed buffer (next_of, stack_compress) takes {framed}"
            )
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
            self._memory.arrays[LIMITS_ARRAY][:] = rate_limiter.to_array()
        self._bind(create=True, rng=np.random.default_rng(seed))

    def close(self) -> None:
        """Release the buffer's memory; later calls raise :class:`BufferClosed`.

        For a shared buffer, the creating process also unlinks the segment, and
        callers blocked in other processes wake up with :class:`BufferClosed`.
        """
        self._release()

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
        return self._path.add(fields, priorities, timeout)

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

    def on_episode_end(self, *, timeout: float | None = None) -> None:
        """End the current episode (cpprb API): with ``nstep``, store its pending
        steps, folded as if the last one was truncated (they bootstrap); with
        ``next_of``, store the episode's last next observation.

        ``timeout`` bounds the waits for the rate limiter and the lock, as in :meth:`add`;
        on TimeoutError the episode has not ended and nothing changed: call again."""
        self._path.end_episode(checks.seconds("timeout", timeout))

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
        if self._path.plain:
            return self
        return open_handle(type(self), self._config(), lambda layout, expected: self._memory.handle())

    # Documented as the buffer's own methods (the reference lists a class's own members).
    save_transitions = BufferFiles.save_transitions
    load_transitions = BufferFiles.load_transitions

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
            one_lane=self._compression is None,
            selector_name=self._selector_spec.name,
        )
