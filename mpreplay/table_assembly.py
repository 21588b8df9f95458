"""How a :class:`mpreplay.Table` is put together over its memory, by the same steps for a new
table, a handle that another process unpickles or attaches by name, an episode writer, and a
table restored from a checkpoint.

:func:`assemble` and :func:`manifest_of` are methods of :class:`~mpreplay.Table` (the class names
them in its body); the parts they build get the arrays and kernels they use, never the table.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import lifetime, manifest, removers, selectors
from ._ext.gate import Gate
from ._ext.lock import SharedLock
from ._ext.processes import process_token
from ._ext.schema import (
    EPISODE_STEP_ARRAY,
    GENERATION_ARRAY,
    HEADER_ARRAY,
    LANE_CURSOR,
    LANE_END,
    LANE_START,
    LANES_ARRAY,
    LIMITS_ARRAY,
    LOCK_ARRAY,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    MANIFEST_ARRAY,
    OWNER_ARRAY,
    SEQUENCE_STEPS_ARRAY,
    STATE_ARRAY,
    TIMES_SAMPLED_ARRAY,
    WRITERS_ARRAY,
    field_array,
)
from ._ext.sequences import Sequences
from ._ext.slots import Slots
from ._ext.table_handle import TableHandle
from .errors import BufferClosed
from .memory import FileMemory, HeapMemory, Layout, SharedMemory
from .nstep_stage import NstepStage
from .table_config import TableConfig
from .table_files import table_layout
from .write_path import WritePath

if TYPE_CHECKING:
    from .table import Table

__all__ = ["FORK_SENSITIVE", "Memory", "assemble", "attach", "drop_parts", "manifest_of", "new_memory", "restored"]

Memory = HeapMemory | FileMemory | SharedMemory
_Table = TypeVar("_Table", bound="Table")


class _Closed:
    """What a closed table holds in place of each of its parts: any use raises BufferClosed.
    (A class-level ``__getattr__`` on the table would do the same, but it would slow every
    attribute lookup of the hot methods.)"""

    __slots__ = ()

    def _closed(self, *args: Any, **kwargs: Any) -> Any:
        raise BufferClosed("the replay buffer is closed")

    __getattr__ = __getitem__ = __setitem__ = __iter__ = __len__ = __call__ = _closed


_CLOSED = _Closed()
# The parts over a table's memory: close() replaces them with _CLOSED.
_PARTS = (
    "_header",
    "_generation",
    "_lanes",
    "_selector",
    "_fields",
    "_frames",
    "_sequences",
    "_gate",
    "_handle",
    "_path",
    "_lock",
)


def drop_parts(table: Table) -> None:
    """Put :data:`_CLOSED` in place of every part of a closed ``table``: its calls raise BufferClosed."""
    for name in _PARTS:
        table.__dict__[name] = _CLOSED


def assemble(
    self: Table, config: TableConfig, memory: Memory, create: bool, rng: np.random.Generator, readonly: bool = False
) -> None:
    """Build the parts over ``memory``; ``create`` initialises it; ``readonly``: a handle
    whose writing calls refuse (:class:`~mpreplay.ReadOnlyError`)."""
    self._config, self._memory, self._readonly = config, memory, readonly
    arrays = memory.arrays
    c, size = config.compression, config.size
    self._header, self._generation, self._lanes = (
        arrays[HEADER_ARRAY],
        arrays[GENERATION_ARRAY],
        arrays[LANES_ARRAY],
    )
    self._selector = selectors.make(
        config.selector, arrays[selectors.state_array(config.selector.name, size)[0]], size, create
    )
    self._fields = {name: arrays[field_array(name)] for name in config.specs if field_array(name) in arrays}
    if create:
        if c is None:
            self._lanes[0, [LANE_START, LANE_CURSOR, LANE_END]] = 0, 0, size
        else:
            c.lane_bounds(size, self._lanes)
    self._frames, outputs = (None, None) if c is None else c.make_frames(config.specs, arrays)
    length = None if config.sequence is None else config.sequence.length
    self._sequences = None if length is None else Sequences(arrays[SEQUENCE_STEPS_ARRAY], self._lanes, length)
    slots = Slots(
        self._header,
        self._lanes,
        self._generation,
        arrays[OWNER_ARRAY],
        arrays[STATE_ARRAY],
        arrays[WRITERS_ARRAY],
        self._selector,
        removers.make(config.remover),
        self._frames,
        self._sequences,
        arrays.get(TIMES_SAMPLED_ARRAY),
        config.max_times_sampled or 0,
    )
    if config.shared:
        # A holder that died may have left slots, counters and selector state half
        # updated: the next owner makes them agree with the slot states again.
        self._lock = lock = SharedLock(
            arrays[LOCK_ARRAY],
            create,
            on_recover=slots.recover,
            counters=self._header[LOCK_WAIT_NS : LOCK_HOLDS + 1],
        )
        assert isinstance(memory, SharedMemory)
        # The creator's token is in the manifest, which a new table writes last: its own.
        creator = process_token(os.getpid()) if create else manifest.creator_token(arrays[MANIFEST_ARRAY])
        lifetime.watch(lock, memory, self._header, None if config.persist else creator)
    else:
        assert not isinstance(memory, SharedMemory)  # a local table's memory carries its lock
        self._lock, lock = None, memory.thread_lock
    self._gate = Gate(self._header, arrays[LIMITS_ARRAY], lock)
    # A sequence's samples also carry each step's index in its episode.
    sampled = list(self._fields.items()) + (
        [] if length is None else [(EPISODE_STEP_ARRAY, arrays[EPISODE_STEP_ARRAY])]
    )
    self._handle = TableHandle(
        self._header, self._gate, slots, self._selector, sampled, rng, self._frames, outputs, self._sequences
    )
    nstep = None if config.nstep is None else NstepStage(config.nstep, config.by_priority)
    # The parts get the arrays and kernels they use, never this table or a bound method of it:
    # a part that referred back would put the table in a reference cycle, and a handle dropped
    # without close() would keep its mapping and descriptors until the cyclic collector ran.
    store, episodes = self._make_store(arrays)
    self._path = WritePath(config.specs, store, self._handle, nstep, self._selector, episodes)
    # Rows go straight to the kernel (TableHandle.add_one, add_rows) unless they are folded first.
    self._bind_calls(
        self._handle,
        self._path.plain,
        config.by_priority,
        config.float32_weights,
        config.uint64_indexes,
        readonly,
        self._path.frames,
    )
    if create:
        # Written last: a process that finds the segment by name attaches once the manifest is there.
        manifest.encode(
            self._manifest(memory.layout),
            arrays[MANIFEST_ARRAY],
            owner=process_token(os.getpid()),
            created=time.time(),
        )
    if config.shared:
        FORK_SENSITIVE.add(self)


def manifest_of(self: Table, layout: Layout) -> dict[str, Any]:
    """What another process needs to read this table's memory over ``layout`` (see
    :mod:`mpreplay.manifest`): what the creator writes, and what an attaching process
    expects to find."""
    config, c = self._config, self._config.compression
    return {
        "class": type(self).__name__,
        "capacity": config.size,
        "fields": {name: {"shape": list(s.shape), "dtype": s.dtype.str} for name, s in config.specs.items()},
        "next_of": [] if c is None else list(c.next_of),
        "stack_compress": [] if c is None else list(c.stack),
        "selector": config.selector.name,
        "remover": config.remover,
        "max_times_sampled": config.max_times_sampled,
        "sequence": None
        if config.sequence is None
        else {"length": config.sequence.length, "period": config.sequence.period},
        "arrays": [[name, list(shape), dtype, offset] for name, shape, dtype, offset in layout.entries],
        "nbytes": layout.nbytes,
        "persist": config.persist,
        "build": config.arguments,
    }


def attach(cls: type[_Table], config: TableConfig, name: str, readonly: bool = False) -> _Table:
    """Unpickle a shared table (and :func:`mpreplay.attach` one by name): map the segment
    (never owning it), once its manifest says it holds the layout this process computes from
    ``config`` (IncompatibleSegmentError if not), and assemble the parts over it as the creator
    did; ``readonly``: a handle that refuses to write."""
    table = cls.__new__(cls)
    layout = table_layout(config)
    table._config = config  # what _manifest describes
    expected = table._manifest(layout)
    memory = SharedMemory(layout, name=name, verify=lambda buf: manifest.check_segment(name, buf, expected))
    table._assemble(config, memory, False, np.random.default_rng(), readonly)
    return table


def new_memory(config: TableConfig, name: str | None = None) -> Memory:
    """Fresh zeroed memory for a table of ``config``: a shared segment (under ``name``, else a
    fresh one; nobody's if the table persists), files of its ``mmap_prefix``, or the heap."""
    layout = table_layout(config)
    if config.shared:
        return SharedMemory(layout, create_as=name, persist=config.persist)
    if config.mmap_prefix is not None:
        return FileMemory(layout, config.mmap_prefix)
    return HeapMemory(layout)


def restored(
    cls: type[_Table],
    config: TableConfig,
    rng: np.random.Generator,
    fill: Callable[[dict[str, np.ndarray]], None],
    repair: bool,
    name: str | None,
) -> _Table:
    """A new table of ``config`` whose arrays ``fill`` writes (a checkpoint's), drawing from
    ``rng``; ``repair``: the arrays hold rows left out (retired in the slot states), to be made to agree
    with the rest as after a writer's death (see :mod:`mpreplay.checkpoint`)."""
    table = cls.__new__(cls)
    table._assemble(config, new_memory(config, name), True, rng)
    try:
        table._gate.hold()
        try:
            fill(table._memory.arrays)
        finally:
            table._gate.let_go()
        if repair:
            table._handle.repair()
    except BaseException:
        table.close()
        raise
    return table


# The shared tables of this process: a forked child gives each a random stream of its own.
FORK_SENSITIVE: weakref.WeakSet[Table] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for table in list(FORK_SENSITIVE):
        table._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
