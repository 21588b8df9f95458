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

from ... import checks
from .base import BufferBase, PrioritizedBase
from .fields import Fields, option_names
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


class ReplayBuffer(BufferBase):
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
        env_dict: Mapping[str, object] | None = None,
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

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.Table:
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


class PrioritizedReplayBuffer(PrioritizedBase, ReplayBuffer):
    """cpprb's ``PrioritizedReplayBuffer``: proportional prioritized replay.

    ``alpha``, ``eps`` and ``check_for_update`` as in cpprb; every other option as
    for :class:`ReplayBuffer`.
    """

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, object] | None = None,
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

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.Table:
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


class MPReplayBuffer(BufferBase):
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
        env_dict: Mapping[str, object] | None = None,
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

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.Table:
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


class MPPrioritizedReplayBuffer(PrioritizedBase, MPReplayBuffer):
    """cpprb's ``MPPrioritizedReplayBuffer``: prioritized replay shared by processes.

    As in cpprb, a priority update is dropped unless this process sampled the slot and it
    was not overwritten since.  New transitions get the largest priority any process has
    set (the running maximum lives in the shared segment, as cpprb shares its own).
    """

    def __init__(
        self,
        size: Any,
        env_dict: Mapping[str, object] | None = None,
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

    def _make(self, size: int, fields: Fields, options: dict[str, Any]) -> native.Table:
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

    def __init__(self, size: Any, env_dict: Mapping[str, object] | None = None, *, stride: int = 300, **kwargs: Any):
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
    size: Any, env_dict: Mapping[str, object] | None = None, *, prioritized: bool = False, **kwargs: Any
) -> ReplayBuffer:
    """A :class:`ReplayBuffer`, or a :class:`PrioritizedReplayBuffer` with ``prioritized``."""
    cls = PrioritizedReplayBuffer if checks.flag("prioritized", prioritized) else ReplayBuffer
    return cls(size, env_dict, **kwargs)
