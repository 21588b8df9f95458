"""The replay table: one class, built from parts by one constructor.

A :class:`Table` is a slot store (slots in lanes, their generations, owners and states; the
fields side by side in rows, or frames), a selector (what ``sample`` draws), a remover (what a
write replaces when it needs room), a rate limiter, and optionally frame compression, sequences
and n-step folding -- in this process's memory or a shared-memory segment.  Its constructor
takes the parts by name (:class:`~mpreplay.table_config.TableConfig` checks them together); the
cpprb-named classes of :mod:`mpreplay.buffers` are thin factories over it with their defaults.
A table pickles to a handle that attaches to the same memory in another process, assembled from
the same configuration by the same steps.  See docs/architecture.md, "Data path".

The class states every method's signature; what the longer ones do, documented there, lives in
:mod:`mpreplay.table_assembly` (building the parts over the memory, attaching, restoring),
:mod:`mpreplay.table_reads` (batches, snapshots, priorities, counters) and
:mod:`mpreplay.table_writes` (the write path's calls, loading files).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np

from . import checks, lifetime, table_assembly, table_reads, table_writes
from ._ext.calls import TableCalls
from ._ext.gate import Gate
from ._ext.lock import SharedLock
from ._ext.schema import ENDED_REMOVED, LANE_CURSOR, LIMITS_ARRAY, STORED
from ._ext.selector import Selector
from ._ext.sequences import Sequences
from ._ext.table_handle import TableHandle
from .errors import BufferClosed, read_only
from .inspect import Inspection
from .limiter import RateLimiter
from .memory import SharedMemory, segment_name, unlink_segment
from .prefetch import Prefetcher
from .selectors import SelectorSpec
from .sequences import SequenceSpec
from .spec import Batch, EnvDict, FieldOptions, TensorBatch
from .table_assembly import Memory
from .table_config import TableConfig
from .write_path import WritePath

if TYPE_CHECKING:  # numpy's unions, shown by name in signatures and the reference
    from numpy.typing import ArrayLike, DTypeLike

__all__ = ["Table", "BufferClosed"]

_Table = TypeVar("_Table", bound="Table")

_Method = TypeVar("_Method", bound=Callable[..., Any])


def described_by(implementation: Callable[..., object]) -> Callable[[_Method], _Method]:
    """A method of :class:`Table` whose behaviour, and so its docstring, is ``implementation``'s
    (a function of :mod:`mpreplay.table_reads` or :mod:`mpreplay.table_writes` taking the table):
    the class states the signature, which type checkers and the reference read from it."""

    def describe(method: _Method) -> _Method:
        method.__doc__ = implementation.__doc__
        return method

    return describe


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
        memory = table_assembly.new_memory(config, None if name is None else segment_name(name))
        if rate_limiter is not None:
            memory.arrays[LIMITS_ARRAY][:] = rate_limiter.to_array()
        self._assemble(config, memory, True, np.random.default_rng(seed))

    # -- assembly: mpreplay/table_assembly.py --------------------------------------
    _assemble = table_assembly.assemble
    _manifest = table_assembly.manifest_of

    def __reduce__(self) -> tuple[Any, ...]:
        if not isinstance(self._memory, SharedMemory):
            raise TypeError(
                f"a local {type(self).__name__} does not pickle: its memory is this process's; build it with "
                "shared=True (or the MP class) to hand it to other processes"
            )
        self._check_open()
        return table_assembly.attach, (type(self), self._config, self._memory.name, self._readonly)

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
        table_assembly.FORK_SENSITIVE.discard(self)
        self._bind_calls(None, False)
        table_assembly.drop_parts(self)
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

    # -- reading: mpreplay/table_reads.py -----------------------------------------
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
    @described_by(table_reads.batches)
    def batches(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: bool = False,
    ) -> Prefetcher[Batch] | Prefetcher[TensorBatch]:
        return table_reads.batches(self, batch_size, beta, prefetch, timeout, as_torch)

    @described_by(table_reads.get_all_transitions)
    def get_all_transitions(self, *, indexes: bool = False) -> Batch:
        return table_reads.get_all_transitions(self, indexes=indexes)

    @described_by(table_reads.read)
    def read(self, indexes: ArrayLike) -> Batch:
        return table_reads.read(self, indexes)

    _snapshot = table_reads.snapshot
    _copy_rows = table_reads.copy_rows

    @described_by(table_reads.get_max_priority)
    def get_max_priority(self) -> float:
        return table_reads.get_max_priority(self)

    @described_by(table_reads.default_priority)
    def default_priority(self) -> float:
        return table_reads.default_priority(self)

    @property
    def max_priority(self) -> float:
        """The largest priority this table accepts (``get_max_priority()`` is the largest stored):
        no sum of leaf weights can overflow below it."""
        return self._handle.max_priority

    @described_by(table_reads.leaf_mass)
    def leaf_mass(self) -> tuple[float, float]:
        return table_reads.leaf_mass(self)

    @described_by(table_reads.sample_leaves)
    def sample_leaves(self, batch_size: int, *, timeout: float | None = None) -> dict[str, np.ndarray]:
        return table_reads.sample_leaves(self, batch_size, timeout=timeout)

    @described_by(table_reads.slot_tags)
    def slot_tags(self, indexes: ArrayLike) -> np.ndarray:
        return table_reads.slot_tags(self, indexes)

    @described_by(table_reads.save_transitions)
    def save_transitions(
        self,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        compress: bool = True,
        priorities: bool = False,
        safe: bool | None = None,
    ) -> None:
        table_reads.save_transitions(self, file, compress=compress, priorities=priorities, safe=safe)

    @described_by(table_reads.stats)
    def stats(self) -> dict[str, float | None]:
        return table_reads.stats(self)

    @described_by(table_reads.verify)
    def verify(self, *, timeout: float | None = None) -> dict[str, object]:
        return table_reads.verify(self, timeout=timeout)

    @described_by(table_reads.inspection)
    def inspection(self) -> Inspection:
        return table_reads.inspection(self)

    # -- writing: mpreplay/table_writes.py ----------------------------------------
    _make_store = table_writes.make_store
    _add = table_writes.add_rows

    @described_by(table_writes.on_episode_end)
    def on_episode_end(self, *, timeout: float | None = None) -> None:
        table_writes.on_episode_end(self, timeout=timeout)

    @described_by(table_writes.writer_state_dict)
    def writer_state_dict(self) -> dict[str, np.ndarray]:
        return table_writes.writer_state_dict(self)

    @described_by(table_writes.load_writer_state_dict)
    def load_writer_state_dict(self, state_dict: Mapping[str, np.ndarray]) -> None:
        table_writes.load_writer_state_dict(self, state_dict)

    @described_by(table_writes.clear)
    def clear(self) -> None:
        table_writes.clear(self)

    @described_by(table_writes.load_transitions)
    def load_transitions(self, file: str | os.PathLike[str] | IO[bytes]) -> int:
        return table_writes.load_transitions(self, file)

    @described_by(table_reads.checkpoint)
    def checkpoint(
        self, path: str | os.PathLike[str], *, timeout: float | None = None, compress: bool = False
    ) -> dict[str, Any]:
        return table_reads.checkpoint(self, path, timeout=timeout, compress=compress)
