"""What cpprb's buffer classes share (:mod:`mpreplay.compat.cpprb.buffers`): :class:`BufferBase`,
one mpreplay buffer behind cpprb's shapes, n-step timing and files, and :class:`PrioritizedBase`,
cpprb's prioritized replay over it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import mpreplay as native  # the native classes, named as the ones here

from ... import checks, fileformat
from .fields import Fields
from .files import read_rows
from .nstep import NstepBuffer

__all__ = ["BufferBase", "PrioritizedBase"]


class BufferBase:
    """What every cpprb buffer class shares: one mpreplay buffer and cpprb's shapes."""

    _fields: Fields
    _native: native.Table  # a native ReplayBuffer, PrioritizedReplayBuffer or their MP twins
    _nstep: NstepBuffer | None = None

    def _bind(self, fields: Fields, buffer: native.Table) -> None:
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

    def _store(self, values: dict[str, Any], priorities: Any) -> int | None:
        """Store one value per field, laid out as cpprb lays values out."""
        return self._native_add(self._fields.reshaped_all(values), priorities)

    def _native_add(self, values: dict[str, Any], priorities: Any) -> int | None:
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

    def __enter__(self) -> BufferBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PrioritizedBase(BufferBase):
    """cpprb's prioritized replay on top of an mpreplay prioritized buffer.

    Comes first in the bases of a class that also derives from ReplayBuffer or MPReplayBuffer.
    """

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

    def _native_add(self, values: dict[str, Any], priorities: Any) -> int | None:
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
