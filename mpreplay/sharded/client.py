"""The learner's side of sharded replay: batches split over the shards by their priority mass."""

from __future__ import annotations

import collections
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .. import checks
from .._ext.selector import importance_weights_of
from ..spec import FieldOptions
from .keys import MAX_SHARD_IDS, shard_index, split_index
from .transport import LocalLink, ShardUnavailable
from .transport import link as connect

__all__ = ["ShardLostWarning", "ShardedReplay"]

_PER_SHARD_ONLY = ("lock_holder_pid", "lock_held_seconds")  # stats() entries that do not add up across shards


class ShardLostWarning(RuntimeWarning):
    """A shard stopped answering and was dropped from the split."""


@dataclass
class _Shard:
    id: int
    link: LocalLink
    total: float
    min: float
    stored: int
    capacity: int
    max_priority: float  # the largest priority its buffer accepts
    updates: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # not sent yet

    def take_updates(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The updates not sent yet, as ``(keys, priorities)`` (``(None, None)`` when there are none)."""
        if not self.updates:
            return None, None
        keys, priorities = (np.concatenate(a) for a in zip(*self.updates, strict=True))
        self.updates.clear()
        return keys, priorities


@dataclass
class _Round:
    """One call to each shard for several batches, split by the shares known at launch."""

    shards: list[_Shard]
    shares: np.ndarray  # (shards,)
    counts: np.ndarray  # (batches, shards)
    calls: list[Any] = field(default_factory=list)  # one per shard, made with its link
    carried: list[int] = field(default_factory=list)  # priority updates riding with each shard's call


@dataclass
class _Batch:
    """Rows drawn for one batch, waiting for their importance weights."""

    rows: dict[str, np.ndarray]
    indexes: np.ndarray
    probabilities: np.ndarray
    min_probability: float


def _split(shares: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """How many of ``k`` draws each shard gets: systematic sampling over the shares, so the
    expected count is exactly ``k * share`` and the actual one its floor or ceiling."""
    edges = np.cumsum(shares)
    edges /= edges[-1]
    edges[-1] = 1.0  # every position < 1 lands in a shard, never past a last empty one
    positions = (np.arange(k) + rng.random()) / k
    return np.bincount(np.searchsorted(edges, positions, side="right"), minlength=len(shares))


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1 and parts[0].flags.writeable:
        return parts[0]
    # Parts arriving over Ray are read-only views of its object store: copy.
    return np.concatenate(parts)


class ShardedReplay:
    """A learner's prioritized replay over several shard servers, with a local buffer's API.

    Parameters
    ----------
    shards : iterable
        :class:`ShardServer` objects (local transport) or Ray actor handles of
        servers.  More can join later (:meth:`add_shard`, ``discover``).
    prefetch : int
        Calls kept in flight per shard (0: fetch when ``sample`` is called).
    batches_per_call : int
        Batches each call fetches: more amortises the round trip.
    max_updates_in_flight : int
        Calls carrying only priority updates that may be outstanding before ``update_priorities`` waits.
    timeout : float, optional
        A shard that does not answer within this many seconds is dropped
        (None: only when Ray reports it dead; 0: one whose answer is not
        there yet when the client looks).
    discover : str, optional
        Name prefix of Ray shard servers to add by name (e.g. :data:`SHARD_NAME_PREFIX`),
        at start and every ``rediscover_every`` seconds during ``sample``.
    namespace : str, optional
        Ray namespace of those names (default: the driver's).
    rediscover_every : float
        Seconds between two look-ups of named shard servers (with ``discover``).
    seed : int, optional
        Seed of the split between shards.

    See the module documentation for the sampling math, the index format and
    what happens when shards come and go.  A client is meant for one thread.
    """

    def __init__(
        self,
        shards: Iterable[Any] = (),
        *,
        prefetch: int = 2,
        batches_per_call: int = 8,
        max_updates_in_flight: int = 16,
        timeout: float | None = None,
        discover: str | None = None,
        namespace: str | None = None,
        rediscover_every: float = 10.0,
        seed: int | None = None,
    ):
        self._prefetch = checks.integer("prefetch", prefetch, low=0)
        self._per_call = checks.integer("batches_per_call", batches_per_call, low=1)
        self._max_updates = checks.integer("max_updates_in_flight", max_updates_in_flight, low=1)
        self._timeout = checks.seconds("timeout", timeout)
        if discover is not None and not isinstance(discover, str):
            raise TypeError(f"discover: expected a name prefix (str), got {type(discover).__name__}")
        self._discover, self._namespace = discover, namespace
        self._rediscover_every = checks.seconds("rediscover_every", rediscover_every, allow_none=False)
        self._rng = np.random.default_rng(seed)
        self._shards: dict[int, _Shard] = {}
        self._next_id = 0
        self._spec: dict[str, Any] | None = None
        self._rounds: collections.deque[_Round] = collections.deque()
        self._ready: collections.deque[_Batch] = collections.deque()
        self._batch_size = 0
        self._updates: collections.deque[tuple[_Shard, Any, int]] = collections.deque()
        self._lost = 0
        self._lost_updates = 0
        self._last_discovery = -np.inf
        for shard in shards:
            self.add_shard(shard)
        if discover is not None:
            self.discover()

    # -- membership ----------------------------------------------------------------------------
    def add_shard(self, shard: Any) -> int:
        """Add a shard server (a :class:`ShardServer` or a Ray handle of one); returns its id.

        A server already present keeps its id.  Its buffer must have the
        same fields, alpha and eps as the others'.  Raises
        :class:`ShardUnavailable` if the server does not answer.
        """
        link = connect(shard)
        for s in self._shards.values():
            if s.link.key == link.key:
                return s.id
        if self._next_id >= MAX_SHARD_IDS:
            raise RuntimeError(f"add_shard: this client has used all {MAX_SHARD_IDS} shard ids; make a new client")
        info = link.call("describe", timeout=self._timeout)
        spec = {k: info[k] for k in ("env_dict", "alpha", "eps")}
        if self._spec is None:
            self._spec = spec
        elif spec != self._spec:
            raise ValueError(f"shard: its buffer has {spec}, the other shards' have {self._spec}")
        sid, self._next_id = self._next_id, self._next_id + 1
        self._shards[sid] = _Shard(
            sid, link, info["total"], info["min"], info["stored"], info["capacity"], info["max_priority"]
        )
        self._discard_prefetched()  # they were split without the new shard
        return sid

    def discover(self) -> list[int]:
        """Add every live Ray shard server named with the ``discover`` prefix; returns the new ids."""
        import ray

        if self._discover is None:
            raise ValueError("discover: this client was made without a name prefix (discover=...)")
        self._last_discovery = time.monotonic()
        namespace = self._namespace or ray.get_runtime_context().namespace
        known = {s.link.key for s in self._shards.values()}
        added = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] != namespace or not entry["name"].startswith(self._discover):
                continue
            try:
                handle = ray.get_actor(entry["name"], namespace=namespace)
            except ValueError:  # it died since it was listed
                continue
            if handle._actor_id.hex() in known:
                continue
            try:
                added.append(self.add_shard(handle))
            except ShardUnavailable:
                continue
        return added

    def shard_ids(self) -> list[int]:
        """Ids of the shards sampled from now."""
        return sorted(self._shards)

    def _drop(self, shard: _Shard, reason: str) -> None:
        if self._shards.pop(shard.id, None) is None:
            return
        self._lost += 1
        self._lost_updates += sum(len(keys) for keys, _ in shard.updates)
        warnings.warn(
            f"shard {shard.id} is gone ({reason}); sampling goes on over {len(self._shards)} shard(s)",
            ShardLostWarning,
            stacklevel=3,
        )

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions over all shards in proportion to their priority.

        Returns the fields plus ``indexes`` (see :func:`split_indexes`) and
        importance ``weights`` = (N·P(i))^-β / max_j (N·P(j))^-β over all shards.
        """
        batch_size, beta = (
            checks.integer("batch_size", batch_size, low=1),
            checks.number("beta", beta, low=0.0, high=1.0),
        )
        if batch_size != self._batch_size:
            self._discard_prefetched()
            self._batch_size = batch_size
        if self._discover is not None and time.monotonic() - self._last_discovery >= self._rediscover_every:
            self.discover()
        while not self._ready:
            if not self._rounds:
                self._launch(self._per_call)
            self._collect(self._rounds.popleft())
        while len(self._rounds) < self._prefetch:
            self._launch(self._per_call)
        batch = self._ready.popleft()
        out = dict(batch.rows)
        out["indexes"] = batch.indexes
        # (N P_i)^-β / (N P_min)^-β: the buffers' own weights, over the probabilities of all shards.
        out["weights"] = importance_weights_of(batch.probabilities, batch.min_probability, beta)
        return out

    def _discard_prefetched(self) -> None:
        # Nothing of these was handed out, so dropping them biases nothing.
        self._rounds.clear()
        self._ready.clear()

    def _launch(self, batches: int) -> None:
        shards = [s for s in self._shards.values() if s.total > 0.0]
        if not shards:
            if not self._shards:
                raise RuntimeError("sample: no shard left to sample from")
            self._refresh()
            shards = [s for s in self._shards.values() if s.total > 0.0]
            if not shards:
                raise ValueError("sample: the shards hold no transition yet")
        totals = np.array([s.total for s in shards])
        shares = totals / totals.sum()
        counts = np.stack([_split(shares, self._batch_size, self._rng) for _ in range(batches)])
        rnd = _Round(shards, shares, counts)
        for j, shard in enumerate(shards):
            keys, priorities = shard.take_updates()
            rnd.carried.append(0 if keys is None else len(keys))
            rnd.calls.append(shard.link.submit("sample", counts[:, j].tolist(), keys, priorities))
        self._rounds.append(rnd)

    def _refresh(self) -> None:
        """Ask every shard for its mass (when none has any we know of)."""
        for shard in list(self._shards.values()):
            try:
                shard.total, shard.min, shard.stored = (
                    shard.link.call("describe", timeout=self._timeout)[k] for k in ("total", "min", "stored")
                )
            except ShardUnavailable as exc:
                self._drop(shard, str(exc))

    def _collect(self, rnd: _Round) -> None:
        """Wait for a round's replies and turn complete batches into ready ones; draw the rest again."""
        replies: list[dict[str, Any] | None] = []
        for shard, call, carried in zip(rnd.shards, rnd.calls, rnd.carried, strict=True):
            try:
                reply = shard.link.wait(call, self._timeout)
            except ShardUnavailable as exc:
                self._lost_updates += carried
                self._drop(shard, str(exc))
                reply = None
            else:
                if shard.id in self._shards:
                    shard.total, shard.min, shard.stored = reply["total"], reply["min"], reply["stored"]
            replies.append(reply)
        if any(r is None for r in replies):
            self._rounds.clear()  # split with a shard that is gone
        redraw = 0
        for b in range(len(rnd.counts)):
            batch = self._assemble(rnd, replies, b)
            if batch is None:
                redraw += 1
            else:
                self._ready.append(batch)
        if redraw:
            self._launch(redraw)
            self._collect(self._rounds.pop())

    def _assemble(self, rnd: _Round, replies: list[dict[str, Any] | None], b: int) -> _Batch | None:
        parts: list[tuple[int, dict[str, Any]]] = []
        probabilities, floor = [], np.inf
        for j, (shard, reply) in enumerate(zip(rnd.shards, replies, strict=True)):
            count = rnd.counts[b, j]
            part = None if reply is None else reply["batches"][b]
            if count and (part is None or len(part["keys"]) != count):
                return None  # the shard died or emptied: this batch is drawn again
            if reply is None or not reply["total"] > 0.0:
                continue
            scale = rnd.shares[j] / reply["total"]
            floor = min(floor, scale * reply["min"])
            if count and part is not None:  # count implies part (checked above)
                parts.append((shard.id, part))
                probabilities.append(scale * part["leaf"])
        rows = {name: _concat([p[name] for _, p in parts]) for name in parts[0][1] if name not in ("keys", "leaf")}
        indexes = np.concatenate([shard_index(sid, p["keys"]) for sid, p in parts])
        p = np.concatenate(probabilities)
        # Leaves can move between a draw and the mass read after it: the
        # smallest probability is at most that of any row drawn.
        return _Batch(rows, indexes, p, min(floor, float(p.min())))

    # -- priorities ----------------------------------------------------------------------------
    def update_priorities(self, indexes: ArrayLike, priorities: ArrayLike) -> None:
        """Send new priorities of sampled transitions to their shards, without waiting
        (they ride with the shards' next sample calls).

        An update whose slot was overwritten since it was sampled, or whose
        shard is gone, is dropped (see :meth:`stats`).  Bad input raises here,
        queuing nothing: a priority above what its shard's buffer accepts too.
        """
        idx = checks.indexes("indexes", indexes)
        ids, keys = split_index(idx)
        bad = np.flatnonzero((idx < 0) | (ids >= self._next_id))
        if bad.size:
            raise ValueError(
                f"indexes: expected indexes this client's sample() returned, got {idx[bad[0]]} at position {bad[0]}"
            )
        limits = np.full(self._next_id, np.inf)  # a gone shard's updates are dropped: any finite value does
        for sid, held in self._shards.items():
            limits[sid] = held.max_priority
        p = checks.priorities("priorities", priorities, len(idx), max_priority=limits[ids])
        for sid in np.unique(ids).tolist():
            mine = ids == sid
            shard = self._shards.get(sid)
            if shard is None:
                self._lost_updates += int(np.count_nonzero(mine))
                continue
            shard.updates.append((keys[mine], p[mine]))
            if len(shard.updates) >= 2 * self._per_call:  # no sample call came to carry them
                self._send_updates(shard)

    def _send_updates(self, shard: _Shard) -> None:
        keys, priorities = shard.take_updates()
        if keys is None:
            return
        self._updates.append((shard, shard.link.submit("update_priorities", keys, priorities), len(keys)))
        while len(self._updates) > self._max_updates:
            self._settle(*self._updates.popleft())

    def _settle(self, shard: _Shard, pending: Any, count: int) -> None:
        try:
            shard.link.wait(pending, self._timeout)
        except ShardUnavailable as exc:
            self._lost_updates += count
            self._drop(shard, str(exc))

    def flush(self) -> None:
        """Send every priority update not sent yet and wait until all are applied (or dropped)."""
        for shard in list(self._shards.values()):
            self._send_updates(shard)
        while self._updates:
            self._settle(*self._updates.popleft())

    # -- the rest of a buffer's API ------------------------------------------------------------
    def _gather(self, method: str, *args: Any) -> dict[int, Any]:
        pending = [(s, s.link.submit(method, *args)) for s in list(self._shards.values())]
        out = {}
        for shard, call in pending:
            try:
                out[shard.id] = shard.link.wait(call, self._timeout)
            except ShardUnavailable as exc:
                self._drop(shard, str(exc))
        return out

    def get_stored_size(self) -> int:
        """Transitions stored over all shards now."""
        return sum(info["stored"] for info in self._gather("describe").values())

    def get_buffer_size(self) -> int:
        """Capacity over all shards."""
        return sum(s.capacity for s in self._shards.values())

    def get_env_dict(self) -> dict[str, FieldOptions]:
        """The shards' field specs."""
        if self._spec is None:
            raise ValueError("get_env_dict: no shard was added yet")
        return dict(self._spec["env_dict"])

    def stats(self) -> dict[str, Any]:
        """Counters summed over the live shards (after waiting for pending updates),
        plus ``shards`` (live), ``shards_lost``, ``updates_to_lost_shards``
        and ``per_shard`` (each live shard's own counters and lock holder, by id)."""
        self.flush()
        per_shard = self._gather("stats")
        out: dict[str, Any] = collections.Counter()
        for counters in per_shard.values():
            out.update({k: v for k, v in counters.items() if k not in _PER_SHARD_ONLY})
        out = dict(out)
        out.update(
            shards=len(self._shards),
            shards_lost=self._lost,
            updates_to_lost_shards=self._lost_updates,
            per_shard=per_shard,
        )
        return out

    def save_transitions(self, path: str, **kwargs: Any) -> dict[int, Any]:
        """Every shard saves its transitions on its own node to ``path.format(shard=id)``.

        With more than one shard, ``path`` must contain ``{shard}``.
        Returns what each shard's ``save_transitions`` returned, by id.
        """
        if len(self._shards) > 1 and "{shard}" not in path:
            raise ValueError(f"path: expected a '{{shard}}' placeholder to tell the shards' files apart, got {path!r}")
        pending = [
            (s, s.link.submit("save_transitions", path.format(shard=s.id), **kwargs)) for s in self._shards.values()
        ]
        return {s.id: s.link.wait(call, self._timeout) for s, call in pending}
