"""The server of one node's shard: its prioritized buffer, sampled and updated by key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import selectors
from ..table import Table
from .keys import MAX_SLOTS, key_of, keys_valid, split_keys, tags_match

__all__ = ["ShardServer"]


class ShardServer:
    """Serves one node's prioritized buffer to a :class:`ShardedReplay`.

    Run it as a Ray actor on the node that holds the buffer
    (:func:`start_shard_servers` does), or in-process for the local transport.

    Parameters
    ----------
    buffer : mpreplay.Table (an MPPrioritizedReplayBuffer, say), or a callable returning one
        The buffer served.  A shared buffer's handle attaches in the server's
        process (the server never unlinks it); a callable runs in the
        server's process, which then owns the buffer (and its segment) and
        releases it on :meth:`close`.  Actors on the node get a handle from
        :meth:`buffer`.  Its selector must draw in proportion to priority
        (``"prioritized"``): the client weighs the shards by their total priority,
        which an ordered selector (``"max_heap"``, ``"min_heap"``) does not give.

    One server is meant to be called by one thread at a time (as a Ray actor
    is, by default).
    """

    def __init__(self, buffer: Table | Callable[[], Table]):
        made = False
        if not isinstance(buffer, Table) and callable(buffer):
            buffer, made = buffer(), True
        if not isinstance(buffer, Table):
            raise TypeError(
                f"buffer: expected a replay table (e.g. MPPrioritizedReplayBuffer) or a callable returning one, "
                f"got {type(buffer).__name__}"
            )
        try:
            _check_servable(buffer)
        except BaseException:
            if made:  # nobody else holds what this server made
                buffer.close()
            raise
        self._buffer = buffer
        self._stale = 0

    def buffer(self) -> Table:
        """The served buffer; over Ray a shared buffer arrives as a handle
        that attaches on the caller's node (call it from that node)."""
        return self._buffer

    def describe(self) -> dict[str, Any]:
        """What a client checks before it samples: field specs, alpha, eps, capacity, the largest
        priority the buffer accepts and the current mass."""
        b = self._buffer
        return {
            "env_dict": b.get_env_dict(),
            "alpha": b.alpha,
            "eps": b.eps,
            "capacity": b.get_buffer_size(),
            "max_priority": b.max_priority,
            **self._mass(),
        }

    def _mass(self) -> dict[str, Any]:
        total, smallest = self._buffer.leaf_mass()
        return {"total": total, "min": smallest, "stored": self._buffer.get_stored_size()}

    def sample(
        self, counts: Sequence[int], keys: np.ndarray | None = None, priorities: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Apply priority updates (as :meth:`update_priorities`, when ``keys`` is given),
        then draw one batch of ``counts[j]`` transitions for each ``j``.

        Returns ``{"batches": [...], "total", "min", "stored"}``: the mass
        after the draws, and per count either None (count 0, or the buffer
        holds nothing) or the fields plus ``keys`` (generation tag and slot
        of each row, see :func:`split_indexes`) and ``leaf`` (leaf weights).
        Importance weights are left to the client: they need every shard's minimum.
        """
        if keys is not None:
            assert priorities is not None  # the client sends keys and priorities together
            self.update_priorities(keys, priorities)
        b = self._buffer
        batches: list[dict[str, np.ndarray] | None] = []
        for count in counts:
            if count < 1 or not b.leaf_mass()[0] > 0.0:
                batches.append(None)
                continue
            batch = b.sample_leaves(int(count))
            slots = batch.pop("indexes")
            batch["keys"] = key_of(batch.pop("tags"), slots)
            batches.append(batch)
        return {"batches": batches, **self._mass()}

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set priorities of sampled rows (``keys`` from :meth:`sample`); returns how many were dropped.

        An update is dropped when its slot was overwritten since it was
        sampled, or is being written now.
        """
        keys = np.asarray(keys, dtype=np.int64)
        sampled, slots = split_keys(keys)
        bad = np.flatnonzero(~keys_valid(keys) | (slots >= self._buffer.get_buffer_size()))
        if bad.size:
            raise ValueError(f"keys: expected keys from this shard's sample(), got {keys[bad[0]]} at position {bad[0]}")
        live = tags_match(self._buffer.slot_tags(slots), sampled)
        dropped = int(live.size - np.count_nonzero(live))
        self._stale += dropped
        self._buffer.update_priorities(slots[live], np.asarray(priorities, dtype=np.float64)[live])
        return dropped

    def stats(self) -> dict[str, float | None]:
        """The buffer's ``stats()``; ``stale_updates_dropped`` includes the updates this server dropped."""
        out = self._buffer.stats()
        dropped = out["stale_updates_dropped"]
        assert dropped is not None  # a counter: only the lock holder's entries are ever None
        out["stale_updates_dropped"] = dropped + self._stale
        return out

    def save_transitions(self, *args: Any, **kwargs: Any) -> Any:
        """``buffer.save_transitions(*args, **kwargs)``: the file is written on the server's node."""
        save = getattr(self._buffer, "save_transitions", None)
        if save is None:
            raise NotImplementedError("save_transitions: this version's buffers cannot save transitions")
        return save(*args, **kwargs)

    def node_id(self) -> str | None:
        """The Ray node this server runs on (None outside Ray)."""
        try:
            import ray
        except ImportError:
            return None
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None

    def close(self) -> None:
        """Release the buffer (unlinking its segment if this server created it)."""
        self._buffer.close()


def _check_servable(buffer: Table) -> None:
    """Raise ValueError unless a client can sample ``buffer`` as one shard among others."""
    if buffer.get_buffer_size() > MAX_SLOTS:
        raise ValueError(
            f"buffer: a shard holds at most {MAX_SLOTS} transitions, got a capacity of {buffer.get_buffer_size()}"
        )
    entry = buffer.config.selector.entry
    if not entry.proportional:
        accepted = [e.name for e in selectors.SELECTORS if e.proportional]
        raise ValueError(
            f"buffer: selector {entry.name!r} ({entry.description}) cannot be sharded: a client splits each "
            f"batch over the shards by their total priority, and this selector does not draw in proportion "
            f"to it; expected a selector that does: {', '.join(map(repr, accepted))}"
        )
