"""What every buffer is built on: its memory, lock, selector, manifest and kernels put together.

:class:`BufferCore` holds a buffer's configuration and what ``_bind`` assembles over its
memory (views of the arrays, the selector, the gate and its lock, the slot table, the
``Ring``, a compressed or sequence writer), and the steps every public method is made of:
rows written through the ring protocol, snapshots and row copies, release.  The public face
is :class:`mpreplay.buffer.ReplayBuffer`'s (see docs/architecture.md, "Data path").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from . import manifest, removers, selectors
from ._ext.calls import BufferCalls
from ._ext.gate import Gate
from ._ext.lock import SharedLock, ThreadLock
from ._ext.processes import process_token
from ._ext.ring import Ring
from ._ext.schema import (
    EPISODE_STEP_ARRAY,
    GENERATION_ARRAY,
    HEADER_ARRAY,
    LANE_CURSOR,
    LANE_END,
    LANE_START,
    LANES_ARRAY,
    LIMITS_ARRAY,
    MANIFEST_ARRAY,
    NEXT_ARRAY,
    OWNER_ARRAY,
    ROWS_ARRAY,
    SEQUENCE_STEPS_ARRAY,
    STATE_ARRAY,
    TIMES_SAMPLED_ARRAY,
    WRITERS_ARRAY,
    field_array,
    row_layout,
    segment_arrays,
)
from ._ext.selector import Selector
from ._ext.sequences import Sequences
from ._ext.slots import Slots
from .compression import Compression, FrameWriter
from .errors import BufferClosed
from .memory import FileMemory, HeapMemory, Layout, SharedMemory
from .nstep import NstepArgs
from .nstep_stage import NstepStage
from .selectors import SelectorSpec
from .sequences import SequenceSpec, SequenceWriter
from .spec import FieldSpec
from .write_path import RowStore, Store, WritePath

__all__ = ["BufferCore", "Memory", "open_handle"]

Memory = HeapMemory | FileMemory | SharedMemory

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
    "_path",
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

_Buffer = TypeVar("_Buffer", bound="BufferCore")


class BufferCore(BufferCalls):
    """A buffer's configuration and the parts assembled over its memory (see the module's docstring)."""

    _CONFIG: tuple[str, ...] = (  # what a handle carries
        "_size",
        "_specs",
        "_nstep_args",
        "_compression",
        "_mmap_prefix",
        "_thread_lock",
        "_selector_spec",
        "_max_times_sampled",
        "_remover",
    )
    _LOCK_NBYTES = 0  # a local buffer has no lock in its memory: its threads take a ThreadLock
    _PRIORITIZED = False  # whether the class's API gives and updates priorities
    _sequence: SequenceSpec | None = None  # a sequence buffer's (mpreplay.sequence_buffer)

    # The configuration (what a handle carries, _CONFIG).
    _size: int
    _specs: dict[str, FieldSpec]
    _nstep_args: NstepArgs | None
    _compression: Compression | None
    _mmap_prefix: str | None
    _thread_lock: ThreadLock | None
    _selector_spec: SelectorSpec
    _max_times_sampled: int | None
    _remover: str  # its entry in mpreplay.removers
    # This handle's own n-step stage (its folders: the rows', and the initial priorities').
    _nstep: NstepStage | None
    # What _bind assembles over the memory.
    _memory: Memory
    _header: np.ndarray
    _generation: np.ndarray
    _selector: Selector
    _fields: dict[str, np.ndarray]
    _lanes: np.ndarray
    _frames: Any  # a compressed buffer's Frames, else None
    _sequences: Sequences | None
    _lock: SharedLock | None
    _gate: Gate
    _ring: Ring
    _path: WritePath

    def _config(self) -> dict[str, Any]:
        """What a handle on this buffer's memory carries (see :func:`open_handle`)."""
        return {key: self.__dict__[key] for key in self._CONFIG}

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
        prioritized = self._PRIORITIZED
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

    def _make_lock(self, create: bool, slots: Slots) -> ThreadLock | SharedLock:
        # One process: a lock between its threads (a prefetching sampler, the training
        # thread's updates), shared by every handle of this memory (episode writers).
        self._lock = None
        if create:
            self._thread_lock = ThreadLock()
        return self._thread_lock

    def _bind(self, create: bool, rng: np.random.Generator) -> None:
        """Make views of the memory's arrays; ``create`` initialises them."""
        arrays = self._memory.arrays
        self._header = arrays[HEADER_ARRAY]
        self._generation = arrays[GENERATION_ARRAY]
        self._selector = self._make_selector(arrays[self._selector_array()[0]], create)
        c = self._compression
        self._fields = {name: arrays[field_array(name)] for name in self._specs if field_array(name) in arrays}
        self._lanes = arrays[LANES_ARRAY]
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
        slots = Slots(
            self._header,
            self._lanes,
            self._generation,
            arrays[OWNER_ARRAY],
            arrays[STATE_ARRAY],
            arrays[WRITERS_ARRAY],
            self._selector,
            removers.make(self._remover),
            self._frames,
            self._sequences,
            *self._times_sampled(),
        )
        self._gate = gate = Gate(self._header, arrays[LIMITS_ARRAY], self._make_lock(create, slots))
        # A sequence's samples also carry each step's index in its episode.
        sampled = list(self._fields.items()) + (
            [] if self._sequences is None else [(EPISODE_STEP_ARRAY, arrays[EPISODE_STEP_ARRAY])]
        )
        self._ring = Ring(
            self._header, gate, slots, self._selector, sampled, rng, self._frames, outputs, self._sequences
        )
        # The parts get the arrays and kernels they use, never this buffer or a bound method of
        # it: a part that referred back would put the handle in a reference cycle, and a handle
        # dropped without close() would keep its mapping and descriptors until the cyclic
        # collector ran (docs/architecture.md, "Segment lifecycle").
        self._path = WritePath(
            self._specs,
            self._make_storage(arrays),
            self._ring,
            self._nstep,
            self._selector,
        )
        # One transition goes straight to the kernel (Ring.add_one) unless it is folded or planned first.
        self._bind_calls(self._ring, self._path.plain, **self._call_options())

    def _make_storage(self, arrays: dict[str, np.ndarray]) -> Store:
        """The store this handle's rows go to: rows, frames (compression) or sequences."""
        c = self._compression
        if c is None:
            return RowStore(self._ring, self._fields)
        frames = FrameWriter(c, self._specs, self._ring, arrays)
        if self._sequence is None:
            return frames
        # A sequence buffer's steps are always compressed into lanes (Compression.build's in_lanes).
        return SequenceWriter(self._sequence, frames, [flag for flag in (c.done, c.truncated) if flag is not None])

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
            "remover": self._remover,
            "max_times_sampled": self._max_times_sampled,
            "sequence": None
            if self._sequence is None
            else {"length": self._sequence.length, "period": self._sequence.period},
            "arrays": [[name, list(shape), dtype, offset] for name, shape, dtype, offset in layout.entries],
            "nbytes": layout.nbytes,
        }

    def _release(self) -> None:
        """What ``close()`` does: the lane given back, the table closed by its owner, every view replaced."""
        if self._is_open():
            self._path.store.release_lane()
            if self._memory.is_owner:
                self._ring.close()
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

    def __enter__(self: _Buffer) -> _Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

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
            assert self._frames is not None  # a compressed buffer's frame store
            arrays = self._memory.arrays
            for name, key, nxt, shape, dtype in self._compression.make_frames(self._specs, arrays)[1]:
                out = np.empty((len(slots),) + shape, dtype=dtype)
                self._frames.rebuild_into(key, arrays[NEXT_ARRAY][slots] if nxt else slots, out)
                rows[name] = out
            rows = {name: rows[name] for name in self._specs}
        return rows

    def _make_stages(self) -> None:
        """This writer's own stages before its store: n-step folding (see :class:`NstepStage`)."""
        self._nstep = None if self._nstep_args is None else NstepStage(self._nstep_args, self._PRIORITIZED)

    def _forget_pending(self) -> None:
        """Drop the steps the n-step folders hold and the episode a compressed writer is in."""
        self._path.forget()


def open_handle(
    cls: type[_Buffer], config: dict[str, Any], memory: Callable[[Layout, dict[str, Any]], Memory]
) -> _Buffer:
    """A buffer object of ``config`` over existing memory, which it does not own: ``memory(layout,
    expected)`` maps it, given the layout and the manifest this process expects to find there."""
    obj = cls.__new__(cls)
    obj.__dict__.update(config)
    obj._make_stages()
    layout = obj._layout()
    obj._memory = memory(layout, obj._manifest(layout))
    obj._bind(create=False, rng=np.random.default_rng())
    return obj
