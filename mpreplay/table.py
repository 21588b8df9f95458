"""The replay table: one class, built from parts by one constructor.

A :class:`Table` is a slot store (slots in lanes, their generations, owners and states; the
fields side by side in rows, or frames), a selector (what ``sample`` draws), a remover (what a
write replaces when it needs room), a rate limiter, and optionally frame compression, sequences
and n-step folding -- in this process's memory or a shared-memory segment.  Its constructor
takes the parts by name (:class:`~mpreplay.table_config.TableConfig` checks them together); the
cpprb-named classes of :mod:`mpreplay.buffers` are thin factories over it with their defaults.
A table pickles to a handle that attaches to the same memory in another process, assembled from
the same configuration by the same steps.  See docs/architecture.md, "Data path".
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np

from . import checks, deprecated, lifetime, manifest, removers, selectors
from ._ext.calls import TableCalls
from ._ext.gate import Gate
from ._ext.lock import SharedLock
from ._ext.processes import process_token
from ._ext.schema import (
    ENDED_REMOVED,
    EPISODE_STEP_ARRAY,
    GENERATION_ARRAY,
    HEADER_ARRAY,
    INSERTS,
    LANE_CURSOR,
    LANE_END,
    LANE_START,
    LANES_ARRAY,
    LIMITS_ARRAY,
    LOCK_ARRAY,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    MANIFEST_ARRAY,
    NEXT_ARRAY,
    OWNER_ARRAY,
    RESERVED,
    SAMPLES,
    SEQUENCE_STEPS_ARRAY,
    STALE,
    STATE_ARRAY,
    STORED,
    TIMES_SAMPLED_ARRAY,
    TORN,
    WAITERS,
    WRITERS_ARRAY,
    field_array,
)
from ._ext.selector import Selector
from ._ext.sequences import Sequences
from ._ext.slots import Slots
from ._ext.table_handle import TableHandle
from .checkpoint import Source as CheckpointSource
from .checkpoint import write as write_checkpoint
from .errors import BufferClosed, read_only
from .frame_store import FrameStore
from .inspect import Inspection
from .limiter import RateLimiter
from .memory import FileMemory, HeapMemory, Layout, SharedMemory, segment_name, unlink_segment
from .nstep_stage import NstepStage
from .prefetch import Prefetcher, as_drawn, as_tensors
from .saved_episodes import EpisodeStore
from .selectors import SelectorSpec
from .sequences import SequenceSpec, SequenceStore
from .spec import Batch, EnvDict, FieldOptions, TensorBatch
from .table_config import EPISODE_STEP, TableConfig
from .table_files import load_table, save_table, table_layout
from .write_path import RowStore, Store, WritePath

if TYPE_CHECKING:  # numpy's unions, shown by name in signatures and the reference
    from numpy.typing import ArrayLike, DTypeLike

__all__ = ["Table", "BufferClosed"]

_Table = TypeVar("_Table", bound="Table")
Memory = HeapMemory | FileMemory | SharedMemory

# Times read() copies rows that writers keep overwriting before it gives up.
_READ_ATTEMPTS = 100


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


class Table(TableCalls):
    """A replay table built from parts: the one class every buffer is.

    Parameters
    ----------
    size : int
        Capacity in slots (transitions, or a sequence table's steps).
    env_dict : mapping
        cpprb-style field specs, e.g. ``{"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}``;
        a missing shape means a scalar, a missing dtype ``default_dtype`` (float32 when None).
    selector : str or SelectorSpec
        What ``sample`` draws (:mod:`mpreplay.selectors`): ``"uniform"`` (the default),
        ``"prioritized"``, ``"fifo"``, ``"lifo"``, ``"max_heap"``, ``"min_heap"``, or a
        ``SelectorSpec`` with options.  One that draws by priority takes ``add(priorities=)`` and
        ``update_priorities``, and its samples carry importance ``weights``.
    remover : str
        What a write replaces when it needs room (:mod:`mpreplay.removers`): ``"fifo"`` (the
        ring's oldest rows, the default) or ``"keep_unread"`` (none: the write waits for room).
    rate_limiter : RateLimiter, optional
        :class:`~mpreplay.MinSize` or :class:`~mpreplay.SampleToInsertRatio`: ``sample`` and
        ``add`` wait (``timeout`` seconds at most) until it lets them through.
        :class:`~mpreplay.Queue` or :class:`~mpreplay.Stack` (``size`` items, each sampled once)
        also choose the selector, the remover and ``max_times_sampled=1``.
    max_times_sampled : int, optional
        Retire an item once it has been sampled this many times (Reverb's option).
    shared : bool
        In a shared-memory segment that every process can map (the table pickles to a handle
        that attaches to it), or (False) in this process's memory.
    name : str, optional
        A shared table's name, by which any process of the same user joins it
        (:func:`mpreplay.attach`): its segment is ``mpreplay-<name>`` (``name`` itself if it
        starts so).  None: a name made of this process's pid and a random part.
    persist : bool
        A shared table that outlives this process, however it ends (SIGKILL included): it
        stays until ``mpreplay rm`` or ``close(unlink=True)`` by any handle.  Otherwise it ends
        with its creator, and every surviving handle's next call raises
        :class:`~mpreplay.TableGone`.
    nstep : mapping, optional
        Fold rewards over n steps before storing: ``{"size": n, "gamma": 0.99, "rew": "rew",
        "next": "next_obs", "done": "done", "truncated": None}``; rows then carry ``discount``.
    next_of, stack_compress : str or list of str, optional
        Store these observations once (``next_<key>`` rebuilt from the next slot), and stacked
        observations (last axis = stack) as single frames, rebuilt on sample.
    lanes : int
        Writers at once of a compressed or sequence table: each fills a lane of ``size // lanes``.
    sequence : SequenceSpec, optional
        Store steps and sample sequences of them (R2D2), cut as it says.
    default_dtype, seed, mmap_prefix, weights_dtype, indexes_dtype
        The dtype of fields that name none; the seed of the draws; a local table's arrays in
        files of this prefix (cpprb's option); the dtypes ``sample`` hands importance weights
        (float64 or float32) and indexes (int64 or uint64) out as.

    A combination the table cannot keep its promises with is refused with a ValueError naming
    the argument.  One table object is meant for one thread at a time (a learner's
    :meth:`batches` samples on a thread of its own); a shared table is safe across processes,
    one object per process.

    A shared table lives in a shared-memory segment that the object which built it owns
    (unless it is ``persist``: then nobody does).  :func:`mpreplay.attach` joins it by name
    from any process of the same user, read-write or read-only.  Pickled (``pickle``, a
    ``multiprocessing`` argument, a Ray object), it becomes a small
    handle -- the segment's name and the table's configuration -- that attaches to the same
    segment in the process that unpickles it, once the segment's manifest matches
    (:class:`~mpreplay.IncompatibleSegmentError` otherwise).  Every handle adds to and samples
    the same rows, with its own random stream.  ``close()`` on a handle releases its mapping;
    on the owner it also unlinks the segment.

    Examples
    --------
    Any selector, remover and rate limiter with any storage: a shared table that draws the
    highest priority first.

    >>> import pickle
    >>> import numpy as np
    >>> from mpreplay import Table
    >>> table = Table(100, {"obs": {"shape": (2,)}, "rew": {}}, selector="max_heap", shared=True)
    >>> table.add(obs=np.zeros((3, 2)), rew=[0.0, 1.0, 2.0], priorities=[1.0, 5.0, 3.0])
    0
    >>> handle = pickle.loads(pickle.dumps(table))  # what another process would receive
    >>> handle.sample(2)["rew"]  # priorities 5 and 3
    array([1., 2.], dtype=float32)
    >>> table.config.selector.name, table.config.shared
    ('max_heap', True)
    >>> handle.close(); table.close()
    """

    _SHARED = False  # the default of ``shared`` (the MP classes: True)
    # What _assemble builds over the memory.
    _config: TableConfig
    _memory: Memory
    _readonly: bool  # attached read-only: the writing calls refuse
    _header: np.ndarray
    _generation: np.ndarray
    _lanes: np.ndarray
    _selector: Selector
    _fields: dict[str, np.ndarray]
    _frames: Any  # a compressed table's Frames, else None
    _sequences: Sequences | None
    _lock: SharedLock | None  # a shared table's (a local one's threads take its memory's ThreadLock)
    _gate: Gate
    _handle: TableHandle
    _path: WritePath

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        *,
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        shared: bool | None = None,
        name: str | None = None,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        sequence: SequenceSpec | None = None,
        default_dtype: DTypeLike | None = None,
        seed: int | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        Nstep: None = None,  # noqa: N803 -- cpprb's spelling, refused naming nstep=
    ) -> None:
        config = TableConfig.build(
            size,
            env_dict,
            selector=selector,
            remover=remover,
            rate_limiter=rate_limiter,
            max_times_sampled=max_times_sampled,
            shared=self._SHARED if shared is None else shared,
            persist=persist,
            nstep=nstep,
            next_of=next_of,
            stack_compress=stack_compress,
            lanes=lanes,
            sequence=sequence,
            default_dtype=default_dtype,
            mmap_prefix=mmap_prefix,
            weights_dtype=weights_dtype,
            indexes_dtype=indexes_dtype,
            cpprb_nstep=Nstep,
        )
        if name is not None:
            name = checks.table_name("name", name)
            if not config.shared:
                raise ValueError("name: only a shared table has a name that processes join it by; build it shared=True")
        memory = _new_memory(config, None if name is None else segment_name(name))
        if rate_limiter is not None:
            memory.arrays[LIMITS_ARRAY][:] = rate_limiter.to_array()
        self._assemble(config, memory, True, np.random.default_rng(seed))

    # -- assembly: the same steps for a new table, a handle in another process, an episode writer
    def _assemble(
        self, config: TableConfig, memory: Memory, create: bool, rng: np.random.Generator, readonly: bool = False
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
        # One transition goes straight to the kernel (TableHandle.add_one) unless it is folded or planned first.
        self._bind_calls(
            self._handle, self._path.plain, config.by_priority, config.float32_weights, config.uint64_indexes, readonly
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
            _FORK_SENSITIVE.add(self)

    def _make_store(self, arrays: Mapping[str, np.ndarray]) -> tuple[Store, EpisodeStore | None]:
        """The store this handle's rows go to -- rows, frames (compression) or sequences -- and,
        where it keeps episodes in lanes, the same store as the writer a file's episodes load through."""
        config, c = self._config, self._config.compression
        if c is None:
            return RowStore(self._handle, self._fields), None
        frames = FrameStore(c, config.specs, self._handle, arrays)
        if config.sequence is None:
            return frames, frames
        # A sequence table's steps are always compressed into lanes (Compression.build's in_lanes).
        steps = SequenceStore(config.sequence, frames, [flag for flag in (c.done, c.truncated) if flag is not None])
        return steps, steps

    def _manifest(self, layout: Layout) -> dict[str, Any]:
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

    def __reduce__(self) -> tuple[Any, ...]:
        if not isinstance(self._memory, SharedMemory):
            raise TypeError(
                f"a local {type(self).__name__} does not pickle: its memory is this process's; build it with "
                "shared=True (or the MP class) to hand it to other processes"
            )
        self._check_open()
        return _attach, (type(self), self._config, self._memory.name, self._readonly)

    def episode_writer(self: _Table) -> _Table:
        """A writer for one more stream of episodes into this table, in this process.

        A table that keeps state between the steps of an episode -- an n-step folder
        (``nstep``), compressed observations (``next_of``, ``stack_compress``: an episode's
        steps sit consecutively in one lane) -- takes one episode at a time from each
        writer.  Code that writes several episodes interleaved (one per sub-environment of
        a vector env, see :mod:`mpreplay.vector_env`) writes each stream through a writer
        of its own: another handle on the same memory, with its own n-step folder and, for
        a compressed table, a lane of its own (so create it with ``lanes=`` at least the
        number of writers of every process).  The handle has the table's whole API; its
        ``close()`` gives its lane back and never frees the memory.  A table without such
        state takes interleaved episodes as they come: it returns itself.
        """
        self._check_open()
        if self._readonly:
            raise read_only("episode_writer")
        if self._path.plain:
            return self
        writer = type(self).__new__(type(self))
        writer._assemble(self._config, self._memory.handle(), False, np.random.default_rng())
        return writer

    def _after_fork(self) -> None:
        # A forked child must not replay its parent's random stream, judge priority updates
        # by what its parent sampled, or fold its steps onto the ones its parent had pending.
        self._handle.after_fork(np.random.default_rng())
        self._path.forget()

    # -- lifecycle ------------------------------------------------------------------------
    def close(self, *, unlink: bool | None = None) -> None:
        """Release the table's memory; later calls raise :class:`BufferClosed`.

        For a shared table that is not persistent, the creating process also unlinks the
        segment, and callers blocked in other processes wake up with :class:`BufferClosed`.
        A persistent table stays for every process until a handle closes with ``unlink=True``
        (or ``mpreplay rm``): then the other handles' calls raise
        :class:`~mpreplay.TableGone`.  ``unlink`` is refused (ValueError) where it
        cannot be done: ``True`` on another process's table that is not persistent,
        ``False`` on the creator's (it ends with its creator), either on a local table.
        """
        if unlink is not None:
            lifetime.check_unlink(self._memory, checks.flag("unlink", unlink), self._config.persist, self._readonly)
        if self._is_open():
            self._path.store.release_lane()
            if self._memory.is_owner:
                self._handle.close()
            elif unlink:
                assert isinstance(self._memory, SharedMemory)  # check_unlink refused a local table's
                self._gate.close(ENDED_REMOVED)
                unlink_segment(self._memory.name)
        _FORK_SENSITIVE.discard(self)
        self._bind_calls(None, False)
        for name in _PARTS:
            self.__dict__[name] = _CLOSED
        self._memory.close()

    def _is_open(self) -> bool:
        return isinstance(self.__dict__.get("_handle"), TableHandle)

    def _check_open(self) -> None:
        if not self._is_open():
            raise BufferClosed("the replay buffer is closed")

    def __enter__(self: _Table) -> _Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def name(self) -> str | None:
        """The name of the shared-memory segment, or None for a local table."""
        return self._memory.name if isinstance(self._memory, SharedMemory) else None

    # -- what the table is built from -------------------------------------------------
    @property
    def config(self) -> TableConfig:
        """What this table is built from (see :class:`~mpreplay.table_config.TableConfig`)."""
        return self._config

    def get_buffer_size(self) -> int:
        """Capacity in slots."""
        return self._handle.size

    def get_stored_size(self) -> int:
        """Number of complete transitions (a sequence table's: steps) stored."""
        return int(self._header[STORED])

    def get_next_index(self) -> int:
        """Slot the next added transition goes to (the first lane's cursor)."""
        return int(self._lanes[0, LANE_CURSOR])

    def get_env_dict(self) -> dict[str, FieldOptions]:
        """The normalised field specs."""
        self._check_open()
        return {n: {"shape": s.shape, "dtype": s.dtype} for n, s in self._config.specs.items()}

    @property
    def sequence_length(self) -> int | None:
        """The steps of a sampled sequence, padding included, or None for a table of transitions."""
        return None if self._config.sequence is None else self._config.sequence.length

    @property
    def period(self) -> int | None:
        """How many steps apart an episode's sequences start, or None for a table of transitions."""
        return None if self._config.sequence is None else self._config.sequence.period

    @property
    def alpha(self) -> float | None:
        """The prioritisation exponent, or None where the selector has none."""
        return self._config.selector.kernel_options().get("alpha")

    @property
    def eps(self) -> float | None:
        """What is added to every priority, or None where the selector adds nothing."""
        return self._config.selector.kernel_options().get("eps")

    # -- writing ----------------------------------------------------------------------
    def _add(self, fields: dict[str, Any], priorities: Any, timeout: float | None) -> int:
        if self._readonly:
            raise read_only("add")
        if timeout is not None:
            timeout = checks.seconds("timeout", timeout)
        return self._path.add(fields, priorities, timeout)

    def on_episode_end(self, *, timeout: float | None = None) -> None:
        """End the current episode (cpprb API): with ``nstep``, store its pending steps, folded
        as if the last one was truncated (they bootstrap); with ``next_of``, store the episode's
        last next observation.  ``timeout`` bounds the waits as in :meth:`add`; on TimeoutError
        the episode has not ended and nothing changed: call again."""
        if self._readonly:
            raise read_only("on_episode_end")
        self._path.end_episode(checks.seconds("timeout", timeout))

    def writer_state_dict(self) -> dict[str, np.ndarray]:
        """What this handle's writer holds between adds -- an n-step folder's pending steps --
        as copies of plain arrays by name (empty without ``nstep``): an actor saves them beside
        the table's checkpoint (``np.savez(file, **state)``) and, restarted, gives them to
        :meth:`load_writer_state_dict` so that no step is lost or stored twice.  A compressed
        table's writer keeps its episode's frames in its lane, and an episode open when its
        writer stops ends there: TypeError (start a new episode)."""
        stage = self._writer_stage("writer_state_dict")
        return {} if stage is None else stage.state_dict()

    def load_writer_state_dict(self, state_dict: Mapping[str, np.ndarray]) -> None:
        """Take the pending steps of ``state_dict`` (from :meth:`writer_state_dict` of a table of
        the same configuration) as this handle's writer's, dropping the ones it holds;
        ValueError naming the first entry that differs, changing nothing."""
        stage = self._writer_stage("load_writer_state_dict")
        if stage is None:
            checks.state_arrays("state_dict", state_dict, {})
        else:
            stage.load_state_dict(state_dict)

    def _writer_stage(self, call: str) -> NstepStage | None:
        self._check_open()
        if self._config.compression is not None:
            raise TypeError(
                f"{call}: a compressed or sequence table's open episode ends when its writer stops "
                "(its frames are in its lane); a restarted writer starts a new episode"
            )
        return self._path.nstep

    def clear(self) -> None:
        """Forget every item, the steps an n-step folder holds and what the selector keeps of
        the priorities ever set (the capacity stays)."""
        if self._readonly:
            raise read_only("clear")
        self._handle.clear()
        self._selector.forget_history()
        self._path.forget()

    # -- reading ----------------------------------------------------------------------
    @overload
    def batches(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: Literal[False] = False,
    ) -> Prefetcher[Batch]: ...
    @overload
    def batches(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: Literal[True],
    ) -> Prefetcher[TensorBatch]: ...
    def batches(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: bool = False,
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

    def get_all_transitions(self, *, indexes: bool = False) -> Batch:
        """Copies of every stored transition (a sequence table's: step, with ``episode_step``),
        oldest first -- lane by lane, or in an ordered selector's order of insertion.

        Safe while other processes write: it holds every row that was complete when it started
        and was not overwritten before it finished, and never a row that is being written.
        With ``indexes``, also the slot of each row (``"indexes"``, as ``sample`` returns them).
        """
        return self._snapshot(slots=checks.flag("indexes", indexes))[0]

    def read(self, indexes: ArrayLike) -> Batch:
        """Copies of the rows in slots ``indexes`` (the ``indexes`` a sample returns).

        Each slot must hold a complete row (ValueError otherwise, naming the first that does
        not).  Like :meth:`get_all_transitions` it never returns a torn row: a row overwritten
        while it was copied is read again.
        """
        idx = checks.indexes("indexes", indexes)
        size = self._config.size
        bad = np.flatnonzero((idx < 0) | (idx >= size))
        if bad.size:
            raise ValueError(
                f"indexes: expected slots in [0, {size}), got {int(idx[bad[0]])} at position {int(bad[0])}"
            )
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

    def _snapshot(
        self,
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

    def _copy_rows(self, slots: np.ndarray) -> dict[str, np.ndarray]:
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

    # -- priorities -------------------------------------------------------------------
    def get_max_priority(self) -> float:
        """Largest priority stored now (1.0 when none is)."""
        m = self._selector.largest_priority()
        return 1.0 if m == -np.inf else float(m)

    def default_priority(self) -> float:
        """The priority an item added now without one gets (the selector's ``new_priority`` rule)."""
        return float(self._selector.new_item_priority)

    @property
    def max_priority(self) -> float:
        """The largest priority this table accepts (``get_max_priority()`` is the largest stored):
        no sum of leaf weights can overflow below it."""
        return self._handle.max_priority

    def leaf_mass(self) -> tuple[float, float]:
        """``(total, smallest)``: the sum of the drawable items' weights and the smallest positive
        one (inf when none)."""
        return float(self._selector.total_weight), float(self._selector.smallest_weight)

    def sample_leaves(self, batch_size: int, *, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Draw as :meth:`sample` does, but give each row's ``leaf`` weight and slot ``tags``
        instead of importance weights: for a client that draws from several tables and weighs
        the rows across all of them (:mod:`mpreplay.sharded`).  A slot's tag changes whenever
        the slot is rewritten: :meth:`slot_tags` tells whether a sampled row is still there."""
        return self._handle.sample(
            checks.integer("batch_size", batch_size, low=1), True, -1.0, checks.seconds("timeout", timeout), None, True
        )

    def slot_tags(self, indexes: ArrayLike) -> np.ndarray:
        """The current tag of each slot in ``indexes`` (see :meth:`sample_leaves`); -1 while a
        writer holds the slot."""
        return self._handle.tags(checks.indexes("indexes", indexes))

    # -- files ------------------------------------------------------------------------
    def save_transitions(
        self,
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

    def checkpoint(self, path: str | os.PathLike[str], *, timeout: float | None = None) -> dict[str, Any]:
        """Write the table's whole state to folder ``path`` in its own layout -- rows and
        frames as stored, priorities and the selector's state, counters, the rate limiter,
        lanes, and this handle's random stream -- replacing the checkpoint there atomically;
        :func:`mpreplay.restore` builds the table again (see docs/run-for-days.md).

        Other processes may write and sample meanwhile: the lock is held only while the
        per-slot state is copied (``timeout`` bounds the wait for it); rows and frames are
        copied after, and a row changed meanwhile is left out whole.  An episode open in a
        lane ends at the checkpoint.  ``path`` must not exist, or be a checkpoint or an empty
        folder (ValueError otherwise: nothing else is ever replaced).  Returns the checkpoint's
        manifest (its figures: ``stored``, ``rows_left_out``, ``data_nbytes``, ``cut_seconds``)."""
        self._check_open()
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
        return write_checkpoint(path, source, timeout=checks.seconds("timeout", timeout))

    def load_transitions(self, file: str | os.PathLike[str] | IO[bytes]) -> int:
        """Append the rows of a file written by :meth:`save_transitions` (or cpprb's); returns
        how many.  The whole file is read and checked first: a bad one
        (:class:`~mpreplay.fileformat.TransitionFileError`) or one that does not fit
        (ValueError) changes nothing.  A compressed or sequence table gives back each saved
        episode whole, in its lane and in the order saved (see docs/files.md)."""
        self._check_open()
        if self._readonly:
            raise read_only("load_transitions")
        return load_table(file, self._config, self._path)

    # -- watching -------------------------------------------------------------------------
    def stats(self) -> dict[str, float | None]:
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

    def verify(self, *, timeout: float | None = None) -> dict[str, object]:
        """Check that the table is consistent -- an fsck: under the lock (``timeout`` bounds the
        wait), every count, the selector's state, the lanes and the sequence index are checked
        against the slot states (see :mod:`mpreplay.consistency`).  Returns a report (slots,
        complete, waiting, being written, drawable, lanes); raises
        :class:`~mpreplay.errors.CorruptBufferError` listing every disagreement.  Safe at any
        time, other processes running; taking the lock first repairs what a holder that died
        left, as any call does."""
        return self.inspection().verify(checks.seconds("timeout", timeout))

    def inspection(self) -> Inspection:
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


def _attach(cls: type[_Table], config: TableConfig, name: str, readonly: bool = False) -> _Table:
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


def _new_memory(config: TableConfig, name: str | None = None) -> Memory:
    """Fresh zeroed memory for a table of ``config``: a shared segment (under ``name``, else a
    fresh one; nobody's if the table persists), files of its ``mmap_prefix``, or the heap."""
    layout = table_layout(config)
    if config.shared:
        return SharedMemory(layout, create_as=name, persist=config.persist)
    if config.mmap_prefix is not None:
        return FileMemory(layout, config.mmap_prefix)
    return HeapMemory(layout)


def _restored(
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
    table._assemble(config, _new_memory(config, name), True, rng)
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


_FORK_SENSITIVE: weakref.WeakSet[Table] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for table in list(_FORK_SENSITIVE):
        table._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
