"""cpprb's replay buffer classes, each a thin layer over one mpreplay buffer.

What the layer does, and nothing more:

* **shapes** -- fields are stored in cpprb's shapes (``(1,)`` where none is
  named), so samples come back as cpprb's; ``add`` takes values in any layout
  cpprb reshapes (:class:`~mpreplay.compat.cpprb.fields.Fields`);
* **add** -- keys of no field are ignored and a missing field raises KeyError;
* **priorities** -- new transitions get the largest priority ever set (cpprb's
  running maximum, which starts at 1.0 and only grows: the native buffer's
  ``new_priority="max_ever"``, shared by every process), ``weights`` are float32
  (``weights_dtype=np.float32``) and ``indexes`` uint64 (``indexes_dtype=np.uint64``); a
  single priority is applied to every index;
* **n-step** -- ``Nstep=`` folds with cpprb's timing
  (:class:`~mpreplay.compat.cpprb.nstep.NstepBuffer`), priorities alongside;
* **files** -- ``save_transitions`` writes mpreplay's file format, and
  ``load_transitions`` also reads the files cpprb writes, without unpickling.

Underneath, every call is mpreplay's: whole rows only, stale priority updates
dropped, bad input refused with the buffer left as it was.  Where cpprb has a
plain bug (NaN or negative priorities, sampling an empty buffer, unpickling
files), mpreplay's refusal stands.
"""

from __future__ import annotations

import multiprocessing.context
import os
from collections.abc import Mapping
from multiprocessing import util
from multiprocessing.managers import SyncManager
from typing import Any

import numpy as np

import mpreplay as native  # the native classes, named as the ones here

from ... import checks, fileformat
from .fields import Fields, option_names
from .files import read_rows
from .nstep import NstepBuffer

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "ReverseReplayBuffer",
    "create_buffer",
]

_BACKENDS = ("sharedctypes", "SharedMemory")


def _refuse_options(cls: str, options: Mapping[str, Any]) -> None:
    # cpprb swallows unknown keyword arguments, so a misspelt option does nothing.
    if options:
        raise TypeError(f"{cls}: unknown options {sorted(options)}")


def _check_context(ctx: Any) -> None:
    """cpprb's ``ctx``: None, a multiprocessing context or a SyncManager.  mpreplay's shared
    memory needs none of them; a manager that has shut down is refused as cpprb refuses it."""
    if ctx is None or isinstance(ctx, multiprocessing.context.BaseContext):
        return
    if isinstance(ctx, SyncManager):
        finalizer = getattr(ctx, "shutdown", None)  # a Finalize set by start(), run by shutdown()
        if isinstance(finalizer, util.Finalize) and not finalizer.still_active():
            raise multiprocessing.ProcessError("ctx: the SyncManager has shut down")
        return
    raise TypeError(f"ctx: expected None, a multiprocessing context or a SyncManager, got {type(ctx).__name__}")


class _Buffer:
    """What every cpprb buffer class shares: one mpreplay buffer and cpprb's shapes."""

    _fields: Fields
    _native: native.ReplayBuffer
    _nstep: NstepBuffer | None = None

    def _bind(self, fields: Fields, buffer: native.ReplayBuffer) -> None:
        self._fields = fields
        self._native = buffer
        self._bind_calls()

    def _bind_calls(self) -> None:
        # Bound once: these run on every call.  (Not pickled: see MPReplayBuffer.__getstate__.)
        self._native_add_values = self._native.add
        self._native_sample = self._native.sample
        # One transition of exact values goes from `add` straight to the kernel.
        self._native_add_row = self._native.add_row

    # -- adding ---------------------------------------------------------------
    def add(self, **kwargs: Any) -> int | None:
        """Add one transition, or several with a leading dimension; returns the index of the
        first, or None when an n-step buffer completed none.  Keys of no field are ignored;
        a missing field raises KeyError."""
        if self._nstep is None:
            if (slot := self._native_add_row(kwargs)) >= 0:
                return slot
            try:
                return self._native_add_values(**kwargs)  # what mpreplay takes as it is, at its speed
            except (TypeError, ValueError):
                pass  # nothing was stored: convert as cpprb does, then mpreplay says what is wrong
        values = self._fields.pick(kwargs)
        if self._nstep is not None:
            folded = self._nstep.fold(values)
            if folded is None:
                return None
            values = folded
        return self._store(values, None)

    def _store(self, values: dict[str, Any], priorities: Any) -> int:
        """Store one value per field, laid out as cpprb lays values out."""
        return self._native_add(self._fields.reshaped_all(values), priorities)

    def _native_add(self, values: dict[str, Any], priorities: Any) -> int:
        return self._native_add_values(**values)

    # -- reading --------------------------------------------------------------
    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions uniformly, with replacement."""
        batch = self._native_sample(batch_size)
        del batch["indexes"]  # cpprb's uniform sample has none
        return batch

    def get_all_transitions(self, shuffle: bool = False) -> dict[str, np.ndarray]:
        """Every stored transition in index order (as cpprb: not oldest first once the
        buffer has wrapped), or in a random order (numpy's global generator, as cpprb)
        with ``shuffle``."""
        if checks.flag("shuffle", shuffle):
            rows = self._native.get_all_transitions()
            order = np.random.permutation(len(next(iter(rows.values()))))  # noqa: NPY002 -- as cpprb
            rows = {name: r[order] for name, r in rows.items()}
        else:
            rows = self._rows_by_index()
        return rows

    def _rows_by_index(self) -> dict[str, np.ndarray]:
        """Every stored transition in index order, in mpreplay's shapes."""
        rows = self._native.get_all_transitions(indexes=True)
        order = np.argsort(rows.pop("indexes"), kind="stable")
        return {name: r[order] for name, r in rows.items()}

    def _encode_sample(self, idx: Any) -> dict[str, np.ndarray]:
        """The transitions at indexes ``idx`` (cpprb's name); each must hold one."""
        return self._native.read(np.array(idx, ndmin=1))

    # -- state ----------------------------------------------------------------
    def get_buffer_size(self) -> int:
        """Capacity in transitions."""
        return self._native.get_buffer_size()

    def get_stored_size(self) -> int:
        """Number of transitions stored."""
        return self._native.get_stored_size()

    def get_next_index(self) -> int:
        """Index the next transition goes to."""
        return self._native.get_next_index()

    def is_Nstep(self) -> bool:
        """Whether this buffer folds n steps."""
        return self._nstep is not None

    def clear(self) -> None:
        """Forget every transition (and pending n-step steps)."""
        self._native.clear()
        if self._nstep is not None:
            self._nstep.clear()

    def on_episode_end(self) -> None:
        """End the episode: an n-step buffer stores its pending rows."""
        if self._nstep is not None:
            rows = self._nstep.flush()
            if len(rows["done"]):
                self._store(rows, None)

    # -- files ----------------------------------------------------------------
    def save_transitions(self, file: Any, *, safe: bool = True) -> None:
        """Write every stored transition, in index order as cpprb writes them, to ``file`` in
        mpreplay's file format (plain numeric arrays; :mod:`mpreplay.fileformat`).  ``safe``
        is recorded; the layout is always the plain one."""
        fileformat.write_transitions(
            file, self._rows_by_index(), self._fields.specs, nstep=self._file_nstep(), safe=safe
        )

    def load_transitions(self, file: Any) -> None:
        """Add the transitions of ``file``: one written by :meth:`save_transitions` (or by an
        mpreplay buffer with the same fields), or one written by cpprb's ``save_transitions``,
        read without unpickling anything.  Raises ValueError, storing nothing, for a file of
        other fields or n-step settings, or anything else."""
        k, rows = read_rows(file, self._fields, self._file_nstep())
        if k:
            self._store(rows, None)

    def _file_nstep(self) -> tuple[int, float] | None:
        """``(n, gamma)`` of the rows stored, as a transitions file records them."""
        return None if self._nstep is None else (self._nstep.get_Nstep_size(), self._nstep.gamma)

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Release the memory (mpreplay's addition: cpprb buffers live until collected)."""
        self._native.close()

    def __enter__(self) -> _Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplayBuffer(_Buffer):
    """cpprb's ``ReplayBuffer``: uniform experience replay.

    Parameters
    ----------
    size : int
        Capacity (``1e6`` is accepted).
    env_dict : dict of dict
        cpprb field specs; never changed.
    next_of : str or list of str, optional
        Adds ``next_<key>`` fields.  They are stored as given (no memory is saved; the native
        buffers' ``next_of`` saves it).
    stack_compress : str or list of str, optional
        Accepted; stacks are stored as given (the native ``stack_compress`` saves memory).
    default_dtype : numpy dtype, optional
        dtype of fields that name none (float32).
    Nstep : dict, optional
        ``{"size": n, "gamma": g, "rew": names, "next": names}``: fold n steps as cpprb does.
    mmap_prefix : str, optional
        Keep the arrays in files mapped into memory, field ``<name>`` in
        ``<prefix>_<name>.dat`` as cpprb does (the native ``mmap_prefix``).
    """

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        next_of: Any = None,
        stack_compress: Any = None,
        default_dtype: Any = None,
        Nstep: Mapping[str, Any] | None = None,
        mmap_prefix: str | None = None,
        **kwargs: Any,
    ):
        _refuse_options(type(self).__name__, self._own_options(kwargs))
        fields = Fields.parse(env_dict, default_dtype, next_of)
        for key in option_names("stack_compress", stack_compress):
            if key not in fields.specs:
                raise ValueError(f"stack_compress: {key!r} is not a field of env_dict (fields {list(fields.specs)})")
        if Nstep is not None:
            self._nstep = NstepBuffer(env_dict, Nstep, default_dtype=default_dtype, next_of=next_of)
        self._bind(fields, self._make(checks.capacity("size", size), fields, {**kwargs, "mmap_prefix": mmap_prefix}))
        self._episode_start = 0

    def _own_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments no class in the hierarchy takes."""
        return kwargs

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.ReplayBuffer:
        return native.ReplayBuffer(size, fields.env_dict(), mmap_prefix=options["mmap_prefix"])

    def _inserted(self) -> int:
        inserts = self._native.stats()["inserts"]
        assert inserts is not None  # a counter: only the lock holder's entries are ever None
        return int(inserts)

    def get_current_episode_len(self) -> int:
        """Transitions stored since the episode began."""
        return self._inserted() - self._episode_start

    def on_episode_end(self) -> None:
        """End the episode: store pending n-step rows and start counting a new episode."""
        super().on_episode_end()
        self._episode_start = self._inserted()

    def clear(self) -> None:
        """Forget every transition (and pending n-step steps)."""
        super().clear()
        self._episode_start = self._inserted()


class _Prioritized(_Buffer):
    """cpprb's prioritized replay on top of an mpreplay prioritized buffer.

    Comes first in the bases of a class that also derives from ReplayBuffer or MPReplayBuffer.
    """

    _native: native.PrioritizedReplayBuffer

    def _init_priorities(self, size: int, check_for_update: bool) -> None:
        # Which slots this process sampled: updates of others are dropped (cpprb's
        # check_for_update, and always for shared buffers).  Per process: see __getstate__.
        self._check_for_update = checks.flag("check_for_update", check_for_update)
        self._sampled = np.zeros(size, dtype=bool) if self._check_for_update else None
        self._sampled_pid = os.getpid()
        if self._sampled is None:
            # Nothing to note per sample: cpprb's calls are mpreplay's, bound straight through
            # (mpreplay takes every index and priority layout cpprb takes).
            # Instance attributes over the methods on purpose (mypy checks methods are not reassigned).
            self.sample = self._native.sample  # type: ignore[method-assign]
            self.update_priorities = self._native.update_priorities  # type: ignore[method-assign]
        if self._nstep is not None:
            self._priority_nstep = NstepBuffer(
                {"priority": {"shape": (), "dtype": np.float64}, "done": self._fields.env_dict()["done"]},
                {"size": self._nstep.get_Nstep_size()},
            )

    def _bind_calls(self) -> None:
        super()._bind_calls()
        self._native_update = self._native.update_priorities

    def add(self, *, priorities: Any = None, **kwargs: Any) -> int | None:
        """Add transitions with ``priorities`` (one per transition, or one for all), or the
        largest priority ever set.  See ``ReplayBuffer.add``."""
        if self._nstep is not None:
            return self._add_folded(self._nstep, self._fields.pick(kwargs), priorities)
        if priorities is None and (slot := self._native_add_row(kwargs)) >= 0:
            return slot
        try:
            return self._native_add_values(priorities=priorities, **kwargs)  # mpreplay's fast path
        except (TypeError, ValueError):
            # Nothing was stored: convert as cpprb does, then mpreplay says what is wrong.
            return self._store(self._fields.pick(kwargs), priorities)

    def _add_folded(self, nstep: NstepBuffer, values: dict[str, Any], priorities: Any) -> int | None:
        k = np.size(values["done"])  # one flag per step
        p = np.full(k, self._native.default_priority()) if priorities is None else priorities
        # Both folders take their steps only once everything is known to be good.
        p = checks.priorities("priorities", p, k, max_priority=self._native.max_priority)
        rows = nstep.fold(values)
        folded = self._priority_nstep.fold({"priority": p, "done": values["done"]})
        if rows is None or folded is None:  # the two fold the same steps: both complete rows or neither
            return None
        return self._store(rows, folded["priority"])

    def on_episode_end(self) -> None:
        """End the episode: an n-step buffer stores its pending rows with their priorities."""
        if self._nstep is not None:
            rows, priorities = self._nstep.flush(), self._priority_nstep.flush()["priority"]
            if len(priorities):
                self._store(rows, priorities)
        self._episode_ended()

    def _episode_ended(self) -> None:
        """What the uniform class does at an episode end besides n-step rows."""

    def _native_add(self, values: dict[str, Any], priorities: Any) -> int:
        return self._native_add_values(priorities=priorities, **values)

    def sample(self, batch_size: int, beta: float = 0.4) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions in proportion to their priority, with ``weights``
        (float32) and ``indexes`` (uint64)."""
        batch = self._native_sample(batch_size, beta)
        if self._sampled is not None:
            self._own_sampled()[batch["indexes"]] = True
        return batch

    def _own_sampled(self) -> np.ndarray:
        sampled = self._sampled
        assert sampled is not None  # called only where updates are checked (check_for_update, shared)
        if self._sampled_pid != os.getpid():  # a forked child has sampled nothing yet
            sampled, self._sampled_pid = np.zeros_like(sampled), os.getpid()
            self._sampled = sampled
        return sampled

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Set the priorities of sampled transitions; one number sets them all.

        Updates of slots overwritten since they were sampled are dropped (always), and of
        slots this process has not sampled (with ``check_for_update``, and for shared buffers).
        """
        if self._sampled is not None:
            idx = checks.indexes("indexes", indexes)
            priorities = checks.priorities("priorities", priorities, len(idx), max_priority=None)
            seen = self._own_sampled()
            inside = (idx >= 0) & (idx < len(seen))
            # Slots outside the buffer are kept so that mpreplay refuses them by name.
            keep = ~inside | seen[np.where(inside, idx, 0)]
            indexes, priorities = idx[keep], priorities[keep]
        self._native_update(indexes, priorities)

    def get_max_priority(self) -> float:
        """The largest priority ever set (1.0 before any), which new transitions get."""
        return self._native.default_priority()

    def clear(self) -> None:
        """Forget every transition, and the priorities ever set."""
        super().clear()
        if self._sampled is not None:
            self._sampled[:] = False
        if self._nstep is not None:
            self._priority_nstep.clear()


class PrioritizedReplayBuffer(_Prioritized, ReplayBuffer):
    """cpprb's ``PrioritizedReplayBuffer``: proportional prioritized replay.

    ``alpha``, ``eps`` and ``check_for_update`` as in cpprb; every other option as
    for :class:`ReplayBuffer`.
    """

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        alpha: float = 0.6,
        Nstep: Mapping[str, Any] | None = None,
        eps: float = 1e-4,
        check_for_update: bool = False,
        **kwargs: Any,
    ):
        super().__init__(size, env_dict, Nstep=Nstep, alpha=alpha, eps=eps, **kwargs)
        self._init_priorities(self.get_buffer_size(), check_for_update)

    def _own_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if k not in ("alpha", "eps")}

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.PrioritizedReplayBuffer:
        return native.PrioritizedReplayBuffer(
            size,
            fields.env_dict(),
            alpha=options["alpha"],
            eps=options["eps"],
            new_priority="max_ever",
            weights_dtype=np.float32,
            indexes_dtype=np.uint64,
            mmap_prefix=options["mmap_prefix"],
        )

    def _episode_ended(self) -> None:
        self._episode_start = self._inserted()


class MPReplayBuffer(_Buffer):
    """cpprb's ``MPReplayBuffer``: uniform replay shared by processes (mpreplay's shared memory).

    ``ctx`` (a multiprocessing context or a SyncManager) and ``backend``
    (``"sharedctypes"`` or ``"SharedMemory"``) are checked as cpprb checks them and
    otherwise unused: the buffer lives in one shared-memory segment whatever they are.
    It pickles to a small handle, so it can be passed to processes of any start method.
    """

    # Which slots this process sampled, of the prioritized subclass: reset when unpickled.
    _sampled: np.ndarray | None

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        default_dtype: Any = None,
        logger: Any = None,
        ctx: Any = None,
        backend: str = "sharedctypes",
        **kwargs: Any,
    ):
        _refuse_options(type(self).__name__, self._own_options(kwargs))
        _check_context(ctx)
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
        fields = Fields.parse(env_dict, default_dtype)
        self._bind(fields, self._make(checks.capacity("size", size), fields, kwargs))

    def _own_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.ReplayBuffer:
        return native.MPReplayBuffer(size, fields.env_dict())

    def __getstate__(self) -> dict[str, Any]:
        # The mpreplay buffer travels as its small handle; what this process bound and
        # sampled stays here.
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_native_")}
        if state.get("_sampled") is not None:
            state["_sampled"] = np.zeros(0, dtype=bool)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind_calls()
        if self.__dict__.get("_sampled") is not None:
            self._sampled = np.zeros(self.get_buffer_size(), dtype=bool)
            self._sampled_pid = os.getpid()


class MPPrioritizedReplayBuffer(_Prioritized, MPReplayBuffer):
    """cpprb's ``MPPrioritizedReplayBuffer``: prioritized replay shared by processes.

    As in cpprb, a priority update is dropped unless this process sampled the slot and it
    was not overwritten since.  New transitions get the largest priority any process has
    set (the running maximum lives in the shared segment, as cpprb shares its own).
    """

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        alpha: float = 0.6,
        eps: float = 1e-4,
        ctx: Any = None,
        **kwargs: Any,
    ):
        super().__init__(size, env_dict, ctx=ctx, alpha=alpha, eps=eps, **kwargs)
        self._init_priorities(self.get_buffer_size(), True)

    def _own_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if k not in ("alpha", "eps")}

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.MPPrioritizedReplayBuffer:
        return native.MPPrioritizedReplayBuffer(
            size,
            fields.env_dict(),
            alpha=options["alpha"],
            eps=options["eps"],
            new_priority="max_ever",
            weights_dtype=np.float32,
            indexes_dtype=np.uint64,
        )


class ReverseReplayBuffer(ReplayBuffer):
    """cpprb's ``ReverseReplayBuffer``: Reverse Experience Replay (Rotinov 2019).

    Each ``sample`` takes ``batch_size`` transitions ``stride`` apart, going back from a
    start that moves back by one transition per call and returns to the newest once it
    lags ``2 * stride`` behind it.
    """

    def __init__(
        self, size: Any, env_dict: Mapping[str, Mapping[str, Any]] | None = None, *, stride: int = 300, **kwargs: Any
    ):
        super().__init__(size, env_dict, **kwargs)
        self._stride = checks.integer("stride", stride, low=1)
        self._start = 0

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """The next ``batch_size`` transitions of the reverse sweep."""
        batch_size = checks.integer("batch_size", batch_size, low=1)
        stored, newest_end = self.get_stored_size(), self.get_next_index()
        if stored == 0:
            raise ValueError("sample: the buffer holds no transition yet")
        lag = newest_end - self._start + (stored if newest_end <= self._start else 0)
        if lag >= 2 * self._stride:
            self._start = (newest_end or stored) - 1
        else:
            self._start = (self._start or stored) - 1
        return self._encode_sample((self._start - self._stride * np.arange(batch_size)) % stored)


def create_buffer(
    size: Any, env_dict: Mapping[str, Mapping[str, Any]] | None = None, *, prioritized: bool = False, **kwargs: Any
) -> ReplayBuffer:
    """A :class:`ReplayBuffer`, or a :class:`PrioritizedReplayBuffer` with ``prioritized``."""
    cls = PrioritizedReplayBuffer if checks.flag("prioritized", prioritized) else ReplayBuffer
    return cls(size, env_dict, **kwargs)
