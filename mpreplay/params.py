"""A shared, versioned parameter store: the learner publishes weights, actors read them.

The Ape-X pattern: one learner process trains and now and then publishes its
weights; many actor processes pick up the newest set when it suits them::

    store = ParameterStore({"w": np.zeros((64, 4), np.float32), "b": np.zeros(4, np.float32)})
    # learner                                # actor
    version = store.publish(weights)         got = store.read_if_newer(seen)
                                             if got is not None:
                                                 weights, seen = got

A store pickles to a small handle (the segment's name and layout) that
attaches in the receiving process, so it can be handed to
:func:`mpreplay.launcher.launch` or to a ``multiprocessing.Process`` under any
start method.  The process that created the store owns the segment and
unlinks it on :meth:`ParameterStore.close`.

Consistency: a seqlock
----------------------
A counter sits in front of the arrays.  :meth:`~ParameterStore.publish`
makes it odd, copies the arrays, then makes it even again; the version is the
counter halved.  :meth:`~ParameterStore.read` notes the counter, copies the
arrays, and re-reads the counter: the copy is returned only when the counter
was even and has not moved, otherwise the read is retried.  A reader therefore
never returns a torn mix of two versions, and a reader never blocks the writer.

Memory ordering.  The counter is an aligned 8-byte word, loaded and stored as
one access.  On x86-64 the hardware keeps stores in program order and loads in
program order, so the writer's "odd, arrays, even" and the reader's "counter,
arrays, counter" are seen in that order by the other side and the protocol is
exact.  Weakly ordered CPUs (ARM64) may reorder those accesses and Python
has no fence to forbid it: there the protocol leans on each step being a
separate numpy call with interpreter work in between, which makes a reorder
across steps unlikely but is not a guarantee.

Single writer.  Only one process may publish at a time: two concurrent
publishes would interleave their copies under one counter and readers could
accept the mix.  Have the learner own publishing.

A writer that dies mid-publish leaves the counter odd.  Readers then retry
until ``timeout`` seconds pass and raise :class:`ParameterStoreTimeout`
instead of spinning forever; the next :meth:`~ParameterStore.publish` (e.g. by
a restarted learner) makes the store readable again.

PyTorch state dicts are accepted wherever arrays are (``torch`` is not a
dependency: tensors are recognised only when torch is already imported).
Tensors are stored as numpy arrays; :meth:`~ParameterStore.read` returns
tensors for the keys whose template value was a tensor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypeVar, overload

import numpy as np

from . import checks
from .memory import Layout, SharedMemory

__all__ = ["ParameterStore", "ParameterStoreTimeout"]

_SEQ = "seq"
_PREFIX = "param/"  # keeps user keys apart from the counter in the layout

_Out = TypeVar("_Out", bound=Mapping[str, Any])  # read(out=...) returns the caller's own mapping


class ParameterStoreTimeout(TimeoutError):
    """No consistent set of parameters could be read in time.

    The usual cause is a writer that died in the middle of a publish.
    """


def _as_array(value: Any, what: str) -> np.ndarray:
    if checks.is_tensor(value):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        raise TypeError(f"{what}: expected a numeric array or tensor, got dtype {array.dtype}")
    return array


def _writable_view(value: Any, what: str) -> np.ndarray:
    """The memory of ``value`` (a numpy array or CPU tensor) as a numpy array, to copy into."""
    if checks.is_tensor(value):
        value = value.detach().numpy()  # shares the tensor's storage
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array or CPU tensor to copy into, got {type(value).__name__}")
    if not value.flags.writeable:
        raise ValueError(f"{what}: the array is read-only")
    return value


def _pause(attempt: int) -> None:
    # Spin briefly (a publish takes microseconds), then back off to at most 1 ms.
    # (The exponent is capped: 2 ** attempt would overflow a float after ~1,000 tries.)
    time.sleep(0 if attempt < 16 else 1e-6 * 2.0 ** min(attempt - 16, 10))


class ParameterStore:
    """Named arrays in shared memory, published as a whole under a version number.

    Parameters
    ----------
    template : mapping of str to array or tensor
        Names, shapes and dtypes of the parameters (a torch ``state_dict`` works).
        Its values are the initial contents, version 0.
    timeout : float
        Seconds a read keeps retrying before it raises :class:`ParameterStoreTimeout`
        (0: a read tries once).

    Like a shared buffer, it pickles to a handle that attaches to the same memory in the
    process that unpickles it: the learner publishes, every actor reads the latest version.

    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> from mpreplay import ParameterStore
    >>> store = ParameterStore({"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)})
    >>> actor_side = pickle.loads(pickle.dumps(store))  # what an actor process receives
    >>> store.publish({"w": np.ones((2, 2), np.float32), "b": np.full(2, 0.5, np.float32)})
    1
    >>> params, version = actor_side.read()
    >>> version, params["b"]
    (1, array([0.5, 0.5], dtype=float32))
    >>> actor_side.read_if_newer(1) is None  # nothing newer than version 1
    True
    >>> actor_side.close(); store.close()
    """

    def __init__(self, template: Mapping[str, Any], *, timeout: float = 5.0):
        timeout = checks.seconds("timeout", timeout, allow_none=False)
        if not isinstance(template, Mapping) or not template:
            raise ValueError(f"template: expected a non-empty mapping of names to arrays, got {template!r}")
        arrays = {}
        for key, value in template.items():
            if not isinstance(key, str):
                raise TypeError(f"template: keys must be str, got {key!r}")
            arrays[key] = _as_array(value, f"template[{key!r}]")
        spec = [(key, array.shape, array.dtype.str, checks.is_tensor(template[key])) for key, array in arrays.items()]
        self._bind(SharedMemory(self._layout(spec)), spec, timeout)
        for key, array in arrays.items():
            self._arrays[key][...] = array

    @classmethod
    def _attach(cls, name: str, spec: list[tuple[str, tuple[int, ...], str, bool]], timeout: float) -> ParameterStore:
        store = cls.__new__(cls)
        store._bind(SharedMemory(cls._layout(spec), name=name), spec, timeout)
        return store

    @staticmethod
    def _layout(spec: list[tuple[str, tuple[int, ...], str, bool]]) -> Layout:
        layout = Layout()
        layout.add(_SEQ, (1,), np.uint64)
        for key, shape, dtype, _ in spec:
            layout.add(_PREFIX + key, shape, dtype)
        return layout

    def _bind(self, memory: SharedMemory, spec: list[tuple[str, tuple[int, ...], str, bool]], timeout: float) -> None:
        self._memory = memory
        self._spec = spec
        self.timeout = timeout
        self._seq: np.ndarray | None = memory.arrays[_SEQ]
        self._arrays = {key: memory.arrays[_PREFIX + key] for key, *_ in spec}

    def __reduce__(self):
        self._counter()  # a closed store has nothing to hand over
        return ParameterStore._attach, (self._memory.name, self._spec, self.timeout)

    @property
    def name(self) -> str:
        """Name of the shared-memory segment."""
        return self._memory.name

    @property
    def version(self) -> int:
        """Version of the last complete publish (0 for the template)."""
        return int(self._counter()[0]) // 2

    def _counter(self) -> np.ndarray:
        if self._seq is None:
            raise ValueError("the ParameterStore is closed")
        return self._seq

    def publish(self, params: Mapping[str, Any]) -> int:
        """Copy ``params`` (every key of the template) into the store; return the new version.

        Values are converted with numpy's "same_kind" casting.  Bad input
        raises before anything changes.  Only one process may publish at a time.
        """
        seq = self._counter()
        arrays = self._check(params)
        start = int(seq[0]) | 1  # odd while copying; already odd if a writer died mid-publish
        seq[0] = start
        for key, dst in self._arrays.items():
            np.copyto(dst, arrays[key], casting="same_kind")
        seq[0] = start + 1
        return (start + 1) // 2

    def _check(self, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(params, Mapping):
            raise TypeError(f"params: expected a mapping of names to arrays, got {type(params).__name__}")
        self._check_keys(params, "params")
        arrays = {}
        for key, dst in self._arrays.items():
            array = _as_array(params[key], f"params[{key!r}]")
            if array.shape != dst.shape:
                raise ValueError(f"params[{key!r}]: expected shape {dst.shape}, got {array.shape}")
            if not np.can_cast(array.dtype, dst.dtype, casting="same_kind"):
                raise TypeError(f"params[{key!r}]: cannot store dtype {array.dtype} as {dst.dtype}")
            arrays[key] = array
        return arrays

    def _check_keys(self, given: Mapping[str, Any], what: str) -> None:
        missing = [key for key in self._arrays if key not in given]
        extra = [key for key in given if key not in self._arrays]
        if missing or extra:
            raise ValueError(f"{what}: expected the keys {list(self._arrays)}; missing {missing}, unknown {extra}")

    @overload
    def read(self, out: None = None) -> tuple[dict[str, Any], int]: ...
    @overload
    def read(self, out: _Out) -> tuple[_Out, int]: ...
    def read(self, out: Mapping[str, Any] | None = None) -> tuple[Mapping[str, Any], int]:
        """A consistent copy of the parameters and its version.

        Without ``out``, returns new arrays (tensors for keys whose template
        value was a tensor).  With ``out`` (a dict of numpy arrays or CPU
        tensors with the template's keys and shapes), copies into it and
        returns it; if the read times out, ``out``'s contents are unspecified.
        In a loop, reuse an ``out``: fresh allocations can cost more than the copy.

        Raises :class:`ParameterStoreTimeout` when no consistent copy could
        be made within ``timeout`` seconds (a writer died mid-publish).
        """
        seq = self._counter()
        dest = self._fresh() if out is None else self._destination(out)
        deadline = None
        attempt = 0
        while True:
            before = int(seq[0])
            if before % 2 == 0:
                for key, src in self._arrays.items():
                    np.copyto(dest[key], src)
                if int(seq[0]) == before:
                    break
            if deadline is None:  # set at the first failed try: a read that succeeds never reads the clock
                deadline = time.monotonic() + self.timeout
            if time.monotonic() >= deadline:
                raise ParameterStoreTimeout(
                    f"no consistent read of parameter store {self.name!r} within {self.timeout} s: "
                    f"a publish is stuck (counter {before}); did the writer die mid-publish?"
                )
            _pause(attempt)
            attempt += 1
        if out is not None:
            return out, before // 2
        return self._to_user(dest), before // 2

    @overload
    def read_if_newer(self, last_version: int, out: None = None) -> tuple[dict[str, Any], int] | None: ...
    @overload
    def read_if_newer(self, last_version: int, out: _Out) -> tuple[_Out, int] | None: ...
    def read_if_newer(
        self, last_version: int, out: Mapping[str, Any] | None = None
    ) -> tuple[Mapping[str, Any], int] | None:
        """Like :meth:`read`, but None (and no copy) unless a version newer than ``last_version`` exists."""
        if self.version <= last_version:
            return None
        return self.read(out)

    def _fresh(self) -> dict[str, np.ndarray]:
        return {key: np.empty_like(src) for key, src in self._arrays.items()}

    def _destination(self, out: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(out, Mapping):
            raise TypeError(f"out: expected a mapping of names to arrays, got {type(out).__name__}")
        self._check_keys(out, "out")
        dest = {}
        for key, src in self._arrays.items():
            view = _writable_view(out[key], f"out[{key!r}]")
            if view.shape != src.shape:
                raise ValueError(f"out[{key!r}]: expected shape {src.shape}, got {view.shape}")
            if not np.can_cast(src.dtype, view.dtype, casting="same_kind"):
                raise TypeError(f"out[{key!r}]: cannot hold dtype {src.dtype} in {view.dtype}")
            dest[key] = view
        return dest

    def _to_user(self, arrays: dict[str, Any]) -> dict[str, Any]:
        tensor_keys = [key for key, _, _, is_tensor in self._spec if is_tensor]
        if tensor_keys:
            import torch  # the template held tensors, so torch is installed

            for key in tensor_keys:
                arrays[key] = torch.from_numpy(arrays[key])
        return arrays

    def close(self) -> None:
        """Unmap the store; the creating process also unlinks the segment (idempotent)."""
        self._seq = None
        self._arrays = {}
        self._memory.close()

    def __enter__(self) -> ParameterStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._seq is None else f"version {self.version}"
        return f"ParameterStore({self.name!r}, keys={[key for key, *_ in self._spec]}, {state})"
